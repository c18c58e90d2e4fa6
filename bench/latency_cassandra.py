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
  region's sidecar. Reference: the fast-quorum RTT plus one RTT to the nearest Cassandra
  quorum (the coordinator's QUORUM read of the data through its local node).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from pathlib import Path
from typing import Any

from accord.topology import fast_quorum_size
from accord_cassandra.client import AsyncClient, TransactionError
from bench.clusters import BenchSidecars, CassandraHandle, region_of, wan_cassandra
from bench.lwt import LwtClient, schema
from bench.lwt import preload as lwt_preload
from bench.report import Progress, figure, note
from bench.wan import LAYER_PROXY, RttMatrix, nearest_quorum_rtt_ms, percentiles
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


def run(*, matrix: RttMatrix, quick: bool) -> dict[str, Any]:
    count = 5 if quick else 60
    pause_seconds = max(matrix.pairs.values()) * 3 / 1000
    keyspace = f"accord_bench_wan_{uuid.uuid4().hex[:8]}"
    with wan_cassandra(matrix, NODES) as cassandra:
        results = _measure(cassandra, keyspace, matrix, count, pause_seconds)
    part: dict[str, Any] = {
        "cassandra": cassandra.description,
        "internode_link_stats": cassandra.internode_link_stats,
        "per_region_count": count,
    }
    part.update(_figures(results, matrix, cassandra, count))
    return part


def _measure(
    cassandra: CassandraHandle, keyspace: str, matrix: RttMatrix, count: int, pause: float
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
        results: dict[str, dict[str, LoadResult]] = {"LWT conditional set": {}}
        for index, session in enumerate(sessions):
            region = REGIONS[index]
            lwt = LwtClient(session, keyspace)
            own = keys[index * count * 2 : (index + 1) * count * 2]
            progress = Progress(f"LWT from region {region}", count)
            results["LWT conditional set"][region] = asyncio.run(
                closed_loop_calls(
                    lambda i, lwt=lwt, own=own: lwt.conditional_set(own[i], INITIAL_BALANCE, 0),
                    inflight=1,
                    count=count,
                    pause_seconds=0.05,
                    progress=progress,
                )
            )
        with tempfile.TemporaryDirectory(prefix="bench-latency-cassandra-") as folder:
            sidecars = _sidecars(Path(folder), cassandra, keyspace, matrix)
            note("starting 3 sidecars on the delayed Cassandra cluster")
            with sidecars:
                results.update(asyncio.run(_accord(sidecars, keyspace, keys, count, pause)))
    finally:
        for driver in drivers:
            driver.shutdown()
    return results


def _sidecars(
    folder: Path, cassandra: CassandraHandle, keyspace: str, matrix: RttMatrix
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
    )
    sidecars.write_configs()
    # Each sidecar's driver keeps to its own region's node (see the module docstring).
    import yaml

    for node_id, sidecar in sidecars.sidecars.items():
        config = yaml.safe_load(sidecar.config_path.read_text())
        config["cassandra"]["contact_points"] = [cassandra.contact_points[node_id - 1]]
        config["cassandra"]["local_datacenter"] = region_of(node_id)
        sidecar.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    return sidecars


async def _accord(
    sidecars: BenchSidecars, keyspace: str, keys: list[str], count: int, pause: float
) -> dict[str, dict[str, LoadResult]]:
    clients = {n: AsyncClient(s.address, timeout=30.0) for n, s in sidecars.sidecars.items()}
    rng = random.Random(3)
    results: dict[str, dict[str, LoadResult]] = {
        "Accord conditional set": {},
        "Accord transfer": {},
    }
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

            for name, call in (
                ("Accord conditional set", one_set),
                ("Accord transfer", one_transfer),
            ):
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


def _figures(
    results: dict[str, dict[str, LoadResult]],
    matrix: RttMatrix,
    cassandra: CassandraHandle,
    count: int,
) -> dict[str, Any]:
    fast = fast_quorum_size(NODES, NODES)
    slow = NODES // 2 + 1
    rows = []
    p50s: dict[str, list[float]] = {name: [] for name in results}
    for region in REGIONS:
        fast_rtt = nearest_quorum_rtt_ms(matrix, region, REGIONS, fast)
        quorum_rtt = nearest_quorum_rtt_ms(matrix, region, REGIONS, slow)
        references = {
            "LWT conditional set": (2 * quorum_rtt, f"2 x {quorum_rtt:g} (v2 claim)"),
            "Accord conditional set": (fast_rtt + quorum_rtt, f"{fast_rtt:g} + {quorum_rtt:g}"),
            "Accord transfer": (fast_rtt + quorum_rtt, f"{fast_rtt:g} + {quorum_rtt:g}"),
        }
        for name, by_region in results.items():
            result = by_region.get(region, LoadResult())
            figures = percentiles(result.latencies_ms)
            reference, how = references[name]
            p50 = figures.get("p50")
            p50s[name].append(p50 or 0.0)
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
        f"keyspace NetworkTopologyStrategy A:1 B:1 C:1. Every internode connection went "
        f"through the proxy in front of its target node, delayed by the sender's region "
        f"(recognised from Cassandra's handshake; unrecognised connections: "
        f"{', '.join(unmatched) or 'none'}). LWT: client pinned to its region's node, "
        f"UPDATE ... IF balance >= 0, SERIAL, commit ONE, one at a time, 50 ms apart. Accord: "
        f"3 sidecars behind per-link proxies, store: cassandra at QUORUM through the region's "
        f"node only, one at a time with a 3 x max-RTT pause. {count} operations per region "
        f"and kind. 'p50 / quorum RTT' counts round trips to the nearest Cassandra quorum."
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
    return {"figures": [figure_rows], "targets": []}
