"""Accord on Cassandra vs Cassandra LWT, one transaction at a time, under the emulated WAN.

Part of the ``latency`` suite (outside ``--quick``, or with ``BENCH_LATENCY_CASSANDRA=1``).

Setup: 3 Cassandra nodes, node *i* in region/datacenter A, B, C, whose internode links
(storage port) each go through a delay proxy (:func:`bench.clusters.wan_cassandra`); one
keyspace with NetworkTopologyStrategy ``{A: 1, B: 1, C: 1}``; 3 sidecars behind their own
per-link proxies (as in the latency suite), ``store: cassandra`` at QUORUM, each sidecar's
driver confined to its own region's node (``local_datacenter``), so every Cassandra hop
between regions crosses a proxy.

Per region, one operation at a time from a client in that region:

* LWT: ``UPDATE ... IF balance >= 0`` (Paxos v2, SERIAL, commit ONE) pinned to the region's
  node as coordinator. Reference lines: 2 round trips to the nearest quorum (the Paxos v2
  claim) and 4 (Paxos v1).
* Accord: the single-partition conditional set and the 2-partition transfer through the
  region's sidecar, in two configurations on the same cluster, each with fresh sidecars and
  keys:

  - *default*: every replica votes on the fast path (fast quorum 3 of 3), the data read and
    the one writer's write at QUORUM (``shared_storage``);
  - *near electorate*: as default, but with the WAN variant's electorate (what the
    electorate alone changes);
  - *WAN + via*: as WAN, and a sidecar whose own floor is above the RTT to another region
    plus that region's floor hands its transactions to that sidecar (``coordinate_via``;
    C via A for the default matrix: 40 + 20 ms against 80 + 40 ms);
  - *WAN*: the electorate of 2 whose fast quorum is nearest summed over the regions
    (:func:`bench.wan.nearest_electorate`; A and B for the default matrix), every replica
    writing its own outcome and reading at LOCAL_QUORUM through its own region's node
    (docs/sidecars.md, "Consistency levels", for why that is safe).

  Reference: the fast quorum's RTT (PreAccept), plus the read's Cassandra round trip (0 at
  LOCAL_QUORUM: the region's own node), plus the nearest slow quorum's RTT (the outcome is
  journaled by a quorum before the client hears it; docs/accord.md).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.topology import fast_quorum_size
from accord_cassandra.client import AsyncClient, TransactionError
from bench.clusters import BenchSidecars, CassandraHandle, region_of, wan_cassandra
from bench.lwt import LwtClient, schema
from bench.lwt import preload as lwt_preload
from bench.report import Progress, figure, note
from bench.wan import (
    LAYER_PROXY,
    RttMatrix,
    fast_quorum_rtt_ms,
    nearest_electorate,
    nearest_quorum_rtt_ms,
    percentiles,
)
from bench.workload import (
    INITIAL_BALANCE,
    LoadError,
    LoadResult,
    closed_loop_calls,
    conditional_set,
    preload,
    transfer,
)

NODES = 3
REGIONS = [region_of(n) for n in range(1, NODES + 1)]
SET = "conditional set"
LWT = "LWT conditional set"
TARGET_VS_LWT = 1.0
GOAL_VS_LWT = 0.75
TRANSFER = "transfer"


@dataclass(frozen=True)
class Variant:
    """One Accord sidecar configuration measured against the same cluster."""

    name: str
    electorate: tuple[int, ...]  # sidecar ids voting on the fast path
    local_reads: bool  # LOCAL_QUORUM through the region's node, every replica writing
    # sidecar id -> the sidecar coordinating its transactions (coordinate_via)
    via: dict[int, int] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if len(self.electorate) < NODES:
            extra["electorate_size"] = len(self.electorate)
            extra["electorate_preference"] = list(self.electorate)
        if self.local_reads:
            extra["shared_storage"] = False
        return extra

    def describe(self) -> str:
        voters = "".join(region_of(n) for n in self.electorate)
        level = "LOCAL_QUORUM, every replica writes" if self.local_reads else "QUORUM, one writer"
        via = "".join(
            f", {region_of(n)} coordinates via {region_of(m)}" for n, m in sorted(self.via.items())
        )
        return f"electorate {voters}, {level}{via}"

    def own_ms(self, matrix: RttMatrix, region: str) -> float:
        """The network floor of a transaction coordinated in ``region`` (see _reference)."""
        voters = [region_of(n) for n in self.electorate]
        fast = fast_quorum_rtt_ms(
            matrix, region, voters, fast_quorum_size(NODES, len(self.electorate))
        )
        quorum = nearest_quorum_rtt_ms(matrix, region, REGIONS, NODES // 2 + 1)
        return fast + (0.0 if self.local_reads else quorum) + quorum

    def floor_ms(self, matrix: RttMatrix, region: str) -> tuple[float, str]:
        """This variant's network floor from ``region``, through its delegate if any."""
        node = REGIONS.index(region) + 1
        if node in self.via:
            other = region_of(self.via[node])
            hop = matrix.rtt_ms(region, other)
            own = self.own_ms(matrix, other)
            return hop + own, f"{hop:g} to {other} + {own:g} there"
        return self.own_ms(matrix, region), ""


def delegates(matrix: RttMatrix, variant: Variant) -> dict[int, int]:
    """Each sidecar whose transactions finish sooner coordinated by another (RTT to it plus
    its own floor): sidecar id -> that other's id."""
    chosen = {}
    for node in range(1, NODES + 1):
        region = region_of(node)
        best, best_ms = None, variant.own_ms(matrix, region)
        for other in range(1, NODES + 1):
            if other == node:
                continue
            ms = matrix.rtt_ms(region, region_of(other)) + variant.own_ms(matrix, region_of(other))
            if ms < best_ms:
                best, best_ms = other, ms
        if best is not None:
            chosen[node] = best
    return chosen


def variants(matrix: RttMatrix) -> list[Variant]:
    near = nearest_electorate(matrix, REGIONS, NODES - 1, fast_quorum_size(NODES, NODES - 1))
    electorate = tuple(i + 1 for i in near)
    wan = Variant("WAN", electorate, local_reads=True)
    return [
        Variant("default", tuple(range(1, NODES + 1)), local_reads=False),
        Variant("near electorate", electorate, local_reads=False),
        wan,
        Variant("WAN + via", electorate, local_reads=True, via=delegates(matrix, wan)),
    ]


def run(*, matrix: RttMatrix, quick: bool) -> dict[str, Any]:
    count = 5 if quick else 60
    pause_seconds = max(matrix.pairs.values()) * 3 / 1000
    keyspace = f"accord_bench_wan_{uuid.uuid4().hex[:8]}"
    chosen = variants(matrix)
    with wan_cassandra(matrix, NODES) as cassandra:
        results = _measure(cassandra, keyspace, matrix, count, pause_seconds, chosen)
    part: dict[str, Any] = {
        "cassandra": cassandra.description,
        "internode_link_stats": cassandra.internode_link_stats,
        "per_region_count": count,
        "variants": {v.name: v.describe() for v in chosen},
    }
    part.update(_figures(results, matrix, cassandra, count, chosen))
    return part


def _measure(
    cassandra: CassandraHandle,
    keyspace: str,
    matrix: RttMatrix,
    count: int,
    pause: float,
    chosen: list[Variant],
) -> dict[str, dict[str, LoadResult]]:
    from accord_cassandra.launcher import driver_cluster

    drivers = [
        driver_cluster([ip], cassandra.native_port, only=ip, timeout=30.0)
        for ip in cassandra.contact_points
    ]
    try:
        sessions = [driver.connect() for driver in drivers]
        replication = "{'class': 'NetworkTopologyStrategy', 'A': 1, 'B': 1, 'C': 1}"
        for statement in schema(keyspace, replication=replication):
            sessions[0].execute(statement)
        keys = [f"k{i:05d}" for i in range(NODES * count * 2)]
        note(f"preloading {len(keys)} LWT accounts")
        lwt_preload(sessions[0], keyspace, keys)
        results: dict[str, dict[str, LoadResult]] = {}

        def lwt_run(label: str) -> None:
            results[label] = {}
            for index, session in enumerate(sessions):
                region = REGIONS[index]
                lwt = LwtClient(session, keyspace)
                own = keys[index * count * 2 : (index + 1) * count * 2]

                def call(i: int, lwt: LwtClient = lwt, own: list[str] = own) -> Awaitable[bool]:
                    return lwt.conditional_set(own[i], INITIAL_BALANCE, 0)

                results[label][region] = asyncio.run(
                    closed_loop_calls(
                        call,
                        inflight=1,
                        count=count,
                        pause_seconds=0.05,
                        progress=Progress(f"{label} from region {region}", count),
                    )
                )

        for index, variant in enumerate(chosen):
            # Fresh keys per variant: each starts from the balance the condition expects.
            own_keys = [f"v{index}{key}" for key in keys]
            # LWT again next to each variant: on a shared machine the load drifts over the
            # suite, and each ratio compares operations measured minutes apart at most.
            lwt_run(f"{LWT} ({variant.name})")
            with tempfile.TemporaryDirectory(prefix="bench-latency-cassandra-") as folder:
                sidecars = _sidecars(Path(folder), cassandra, keyspace, matrix, variant)
                note(f"starting 3 sidecars on the delayed Cassandra cluster ({variant.name})")
                with sidecars:
                    results.update(
                        asyncio.run(_accord(sidecars, keyspace, own_keys, count, pause, variant))
                    )
    finally:
        for driver in drivers:
            driver.shutdown()
    return results


def _sidecars(
    folder: Path, cassandra: CassandraHandle, keyspace: str, matrix: RttMatrix, variant: Variant
) -> BenchSidecars:
    sidecars = BenchSidecars(
        folder,
        nodes=NODES,
        store="cassandra",
        cassandra={
            "contact_points": cassandra.contact_points,
            "port": cassandra.native_port,
            "keyspaces": [keyspace],
        },
        matrix=matrix,
        extra=variant.config(),
    )
    sidecars.write_configs()
    # Each sidecar's driver keeps to its own region's node (see the module docstring).
    import yaml

    for node_id, sidecar in sidecars.sidecars.items():
        config = yaml.safe_load(sidecar.config_path.read_text())
        config["cassandra"]["contact_points"] = [cassandra.contact_points[node_id - 1]]
        config["cassandra"]["local_datacenter"] = region_of(node_id)
        if variant.local_reads:
            config["cassandra"]["consistency"] = "LOCAL_QUORUM"
        if node_id in variant.via:
            config["coordinate_via"] = variant.via[node_id]
        sidecar.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    return sidecars


async def _accord(
    sidecars: BenchSidecars,
    keyspace: str,
    keys: list[str],
    count: int,
    pause: float,
    variant: Variant,
) -> dict[str, dict[str, LoadResult]]:
    clients = {n: AsyncClient(s.address, timeout=30.0) for n, s in sidecars.sidecars.items()}
    rng = random.Random(3)
    set_name = f"Accord {SET} ({variant.name})"
    transfer_name = f"Accord {TRANSFER} ({variant.name})"
    results: dict[str, dict[str, LoadResult]] = {set_name: {}, transfer_name: {}}
    try:
        await preload(clients[1], keys, keyspace=keyspace, label="preload Accord accounts")
        await asyncio.sleep(1.0)
        for node, client in sorted(clients.items()):
            region = region_of(node)
            own = keys[(node - 1) * count * 2 : node * count * 2]

            async def one_set(i: int, client: AsyncClient = client, own: list[str] = own) -> bool:
                return await _transact(
                    client, conditional_set(own[i], INITIAL_BALANCE, 0, keyspace)
                )

            async def one_transfer(
                i: int, client: AsyncClient = client, own: list[str] = own
            ) -> bool:
                source, target = rng.sample(own, 2)
                return await _transact(client, transfer(source, target, 1, keyspace))

            for name, call in ((set_name, one_set), (transfer_name, one_transfer)):
                results[name][region] = await closed_loop_calls(
                    call,
                    inflight=1,
                    count=count,
                    pause_seconds=pause,
                    progress=Progress(f"{name} from region {region}", count),
                )
    finally:
        for client in clients.values():
            await client.close()
    return results


async def _transact(client: AsyncClient, transaction: Any) -> bool:
    try:
        answer = await client.transact(transaction)
    except TransactionError as error:
        raise LoadError(error.code) from None
    return answer.applied


def _reference(
    name: str, region: str, matrix: RttMatrix, chosen: list[Variant]
) -> tuple[float, str]:
    """The network floor of one operation from ``region``, and how it adds up."""
    slow = NODES // 2 + 1
    quorum_rtt = nearest_quorum_rtt_ms(matrix, region, REGIONS, slow)
    if name.startswith("LWT"):
        return 2 * quorum_rtt, f"2 x {quorum_rtt:g} (v2 claim)"
    variant = next(v for v in chosen if name.endswith(f"({v.name})"))
    total, via = variant.floor_ms(matrix, region)
    if via:
        return total, via
    voters = [region_of(n) for n in variant.electorate]
    fast_rtt = fast_quorum_rtt_ms(
        matrix, region, voters, fast_quorum_size(NODES, len(variant.electorate))
    )
    read_rtt = 0.0 if variant.local_reads else quorum_rtt
    return total, f"{fast_rtt:g} + {read_rtt:g} + {quorum_rtt:g}"


def _figures(
    results: dict[str, dict[str, LoadResult]],
    matrix: RttMatrix,
    cassandra: CassandraHandle,
    count: int,
    chosen: list[Variant],
) -> dict[str, Any]:
    slow = NODES // 2 + 1
    rows = []
    p50s: dict[str, list[float]] = {name: [] for name in results}
    ratios: dict[str, list[float]] = {v.name: [] for v in chosen}
    for region in REGIONS:
        quorum_rtt = nearest_quorum_rtt_ms(matrix, region, REGIONS, slow)
        for name, by_region in results.items():
            variant_name = name[name.rindex("(") + 1 : -1]
            lwt = percentiles(results[f"{LWT} ({variant_name})"][region].latencies_ms)
            lwt_p50 = lwt.get("p50")
            result = by_region.get(region, LoadResult())
            figures = percentiles(result.latencies_ms)
            reference, how = _reference(name, region, matrix, chosen)
            p50 = figures.get("p50")
            p50s[name].append(p50 or 0.0)
            versus_lwt = round(p50 / lwt_p50, 2) if p50 and lwt_p50 else None
            for variant in chosen:
                if name == f"Accord {SET} ({variant.name})" and versus_lwt is not None:
                    ratios[variant.name].append(versus_lwt)
            rows.append(
                [
                    region,
                    name,
                    how,
                    reference,
                    p50,
                    figures.get("p90"),
                    figures.get("p99"),
                    round(p50 / reference, 2) if p50 and reference else None,
                    round(p50 / quorum_rtt, 2) if p50 and quorum_rtt else None,
                    versus_lwt,
                    sum(result.errors.values()),
                ]
            )
    unmatched = sorted(
        {
            source
            for stats in cassandra.internode_link_stats.values()
            for source in stats.get("sources", [])
            if str(source).startswith("unmatched")
        }
    )
    method = (
        f"{cassandra.description}; node i in datacenter A/B/C (GossipingPropertyFileSnitch); "
        f"Accord variants: "
        f"{'; '.join(f'{v.name} = {v.describe()}' for v in chosen)}; "
        f"keyspace NetworkTopologyStrategy A:1 B:1 C:1. Every internode connection went "
        f"through the proxy in front of its target node, delayed by the sender's region "
        f"(recognised from Cassandra's handshake; unrecognised connections: "
        f"{', '.join(unmatched) or 'none'}). LWT: client pinned to its region's node, "
        f"UPDATE ... IF balance >= 0, SERIAL, commit ONE, one at a time, 50 ms apart, "
        f"measured again just before each Accord variant ('LWT ... (variant)'), which is "
        f"the LWT that variant's 'p50 / LWT' divides by. Accord: "
        f"3 sidecars behind per-link proxies, store: cassandra through the region's node "
        f"only, one at a time with a 3 x max-RTT pause. {count} operations per region, kind "
        f"and variant. Reference = fast-quorum RTT + read RTT + slow-quorum RTT (outcome "
        f"journaled); 'p50 / quorum RTT' counts round trips to the nearest Cassandra "
        f"quorum; 'p50 / LWT' divides by the same region's LWT p50 measured next to it."
    )
    figure_rows = figure(
        "cassandra_wan",
        "Accord on Cassandra vs LWT under the emulated WAN, one operation at a time",
        layer=f"{LAYER_PROXY}, on Cassandra's internode links and the sidecars' peer links",
        method=method,
        columns=[
            "region",
            "operation",
            "reference (ms)",
            "reference ms",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p50 / reference",
            "p50 / quorum RTT",
            "p50 / LWT",
            "errors",
        ],
        rows=rows,
        plot={
            "kind": "bar",
            "x": [f"region {r}" for r in REGIONS],
            "series": p50s,
            "ylabel": "p50 latency (ms)",
        },
    )
    targets = []
    for variant in chosen:
        worst = max(ratios[variant.name]) if ratios[variant.name] else None
        for bound, word in ((TARGET_VS_LWT, "target"), (GOAL_VS_LWT, "goal")):
            targets.append(
                {
                    "target": f"Accord conditional set p50 <= {bound} x LWT p50 in every "
                    f"region ({word}; {variant.name}: {variant.describe()}; worst region)",
                    "measured": worst,
                    "met": worst is not None and worst <= bound,
                }
            )
    return {"figures": [figure_rows], "targets": targets}
