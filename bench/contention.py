"""contention: fast-path share and latency of conflicting transfers, with clock skew and the
reorder buffer off and on, across 3 emulated regions.

Setup: as the latency suite (3 sidecars, embedded store, per-link delay proxies, RTT matrix
``BENCH_RTT_MS``). Load: every region's client runs transfers between two accounts drawn
from a Zipf distribution (exponent ``BENCH_ZIPF_S``, default 1.0, over ``keys`` accounts), 4 in
flight per region, for a fixed time. Hot accounts make transactions conflict, so replicas
often witness a later timestamp first and refuse the fast path.

Clock skew: the sidecar has no skew knob, so the bench shifts each sidecar's clock itself
(:mod:`bench.sidecar_wrapper`: the Accord node's wall clock reads machine time + offset);
offsets ``BENCH_SKEW_MS`` (default 0,+10,-10 for A,B,C). The real sidecars run, not the
simulator. Reorder buffer: ``timing.reorder_buffer_ms`` = ``BENCH_REORDER_MS`` (default 60:
the largest one-way delay, 40 ms, plus the skew spread, 20 ms), which holds each PreAccept
until local time passes its timestamp + the buffer, so replicas take them in timestamp order.

Every configuration runs on fresh sidecars; the sum of all balances is checked afterwards
(transfers conserve it).
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from accord_cassandra.client import AsyncClient, Transaction
from bench.clusters import BenchSidecars, bench_nice, raise_own_priority, region_of
from bench.latency import matrix_from_environment
from bench.profiling import sidecar_profile
from bench.report import Progress, figure, note
from bench.wan import LAYER_PROXY, RttMatrix, percentiles
from bench.workload import (
    INITIAL_BALANCE,
    KEYSPACE,
    TABLE,
    LoadResult,
    Zipf,
    closed_loop,
    cpu_ms_per_txn,
    fast_path_share,
    measured,
    preload,
    transfer,
)

NODES = 3
INFLIGHT_PER_REGION = 4
AUDIT_BATCH = 64


def _skews() -> dict[int, float]:
    values = [float(v) for v in os.environ.get("BENCH_SKEW_MS", "0,10,-10").split(",")]
    if len(values) != NODES:
        raise ValueError("BENCH_SKEW_MS wants one offset per region (A,B,C)")
    return {node: values[node - 1] for node in range(1, NODES + 1)}


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    nice = bench_nice()
    niceness = raise_own_priority(nice)
    matrix = matrix_from_environment()
    skews = _skews()
    reorder_ms = int(os.environ.get("BENCH_REORDER_MS", "60"))
    zipf_s = float(os.environ.get("BENCH_ZIPF_S", "1.0"))
    keys = 200 if quick else 1000
    seconds = 4.0 if quick else 30.0
    configurations = [
        ("no skew, buffer off", {}, 0),
        ("no skew, buffer on", {}, reorder_ms),
        ("skew, buffer off", skews, 0),
        ("skew, buffer on", skews, reorder_ms),
    ]
    report: dict[str, Any] = {
        "suite": "contention",
        "title": "Fast-path share and latency under contention, clock skew, reorder buffer",
        "layer": LAYER_PROXY,
        "rtt_matrix_ms": matrix.describe(),
        "plan": {
            "keys": keys,
            "zipf_s": zipf_s,
            "seconds_per_configuration": seconds,
            "inflight_per_region": INFLIGHT_PER_REGION,
            "clock_offsets_ms": {region_of(n): v for n, v in skews.items()},
            "reorder_buffer_ms": reorder_ms,
        },
        "niceness": {"sidecars_and_proxies": nice, "load_generator": niceness},
        "hot_key_share": round(Zipf(keys, zipf_s, random.Random(0)).top_share(1), 4),
    }
    results = []
    for index, (name, offsets, buffer_ms) in enumerate(configurations):
        profiled = profile and index == len(configurations) - 1
        with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
            cluster = BenchSidecars(
                Path(folder),
                nodes=NODES,
                matrix=matrix,
                clock_offset_ms=offsets,
                extra={"timing": {"reorder_buffer_ms": buffer_ms}},
                profile=profiled,
                nice=nice,
            )
            note(f"configuration {name}: starting 3 sidecars")
            with cluster:
                outcome = asyncio.run(
                    _measure(cluster, keys=keys, zipf_s=zipf_s, seconds=seconds, label=name)
                )
            if profiled:
                report["profile_top"] = sidecar_profile(
                    [cluster.profile_path(n) for n in cluster.sidecars]
                )
        outcome.update(name=name, offsets=offsets, buffer_ms=buffer_ms)
        results.append(outcome)
    report["configurations"] = [
        {k: v for k, v in r.items() if k not in ("result", "by_node")} for r in results
    ]
    report["figures"] = _figures(results, matrix, report["plan"], profiled=profile)
    return report


async def _measure(
    cluster: BenchSidecars, *, keys: int, zipf_s: float, seconds: float, label: str
) -> dict[str, Any]:
    clients = {n: AsyncClient(s.address, timeout=30.0) for n, s in cluster.sidecars.items()}
    metrics = [s.metrics_address for s in cluster.sidecars.values()]
    pids = [s.process.pid for s in cluster.sidecars.values() if s.process is not None]
    names = [f"acct{i:05d}" for i in range(keys)]
    try:
        await preload(clients[1], names)
        await asyncio.sleep(1.0)
        progress = Progress(f"{label}: transactions", None, every_seconds=3.0)

        def maker(node: int) -> Any:
            zipf = Zipf(keys, zipf_s, random.Random(node))

            def make(_: int) -> Transaction:
                source, target = zipf.distinct_pair()
                return transfer(names[source], names[target], 1)

            return make

        async def everyone() -> dict[int, LoadResult]:
            parts = await asyncio.gather(
                *(
                    closed_loop(
                        client,
                        maker(node),
                        inflight=INFLIGHT_PER_REGION,
                        seconds=seconds,
                        progress=progress,
                    )
                    for node, client in sorted(clients.items())
                )
            )
            return dict(zip(sorted(clients), parts, strict=True))

        by_node, counters = await measured(metrics, everyone, pids)
        # Let in-flight Applies land before the audit reads every account.
        await asyncio.sleep(1.0)
        total = await _audit(clients[2], names)
    finally:
        for client in clients.values():
            await client.close()
    merged = LoadResult()
    for part in by_node.values():
        merged.merge(part)
    return {
        "by_node": by_node,
        "result": merged,
        "counters": counters,
        "fast_path_share": fast_path_share(counters),
        "latency_ms": percentiles(merged.latencies_ms),
        "latency_by_region_ms": {
            region_of(n): percentiles(r.latencies_ms) for n, r in sorted(by_node.items())
        },
        "txns_per_second": round(merged.committed / merged.seconds, 1) if merged.seconds else 0,
        "applied": merged.applied,
        "declined": merged.declined,
        "errors": merged.errors,
        "sidecar_cpu_ms_per_txn": cpu_ms_per_txn(counters, merged.committed),
        "total_conserved": total == keys * INITIAL_BALANCE,
        "total": total,
    }


async def _audit(client: AsyncClient, names: list[str]) -> int:
    total = 0
    for start in range(0, len(names), AUDIT_BATCH):
        audit = Transaction()
        for index, name in enumerate(names[start : start + AUDIT_BATCH]):
            audit.let(f"r{index}", KEYSPACE, TABLE, name)
        answer = await client.transact(audit)
        total += sum(int(row["balance"]) for row in answer.rows.values() if row)  # type: ignore[call-overload]
    return total


def _figures(
    results: list[dict[str, Any]], matrix: RttMatrix, plan: dict[str, Any], *, profiled: bool
) -> list[dict[str, Any]]:
    matrix_text = ", ".join(f"{k} {v:g} ms" for k, v in matrix.describe().items())
    offsets = ", ".join(f"{k} {v:+g} ms" for k, v in plan["clock_offsets_ms"].items())
    method = (
        f"3 sidecars (embedded store) in regions A, B, C behind per-link delay proxies, RTT "
        f"{matrix_text}. Transfers between 2 of {plan['keys']} accounts drawn from Zipf "
        f"(s = {plan['zipf_s']:g}), {plan['inflight_per_region']} in flight per region, "
        f"{plan['seconds_per_configuration']:g} s per configuration on fresh sidecars. Skew: "
        f"each sidecar's clock shifted by bench/sidecar_wrapper.py ({offsets}); the sidecar "
        f"itself has no skew knob. Buffer on: timing.reorder_buffer_ms = "
        f"{plan['reorder_buffer_ms']}. Fast-path share = fast / (fast + slow) decisions from "
        f"all coordinators' counters; latency client-side over every committed transaction."
        + (" The last configuration ran under cProfile." if profiled else "")
    )
    rows = []
    for r in results:
        latency = r["latency_ms"]
        counters = r["counters"]
        rows.append(
            [
                r["name"],
                r["fast_path_share"],
                latency.get("p50"),
                latency.get("p90"),
                latency.get("p99"),
                r["txns_per_second"],
                int(counters.get("accord_recoveries_total", 0)),
                int(counters.get("accord_invalidations_total", 0)),
                sum(r["errors"].values()),
                r["sidecar_cpu_ms_per_txn"],
                r["total_conserved"],
            ]
        )
    names = [r["name"] for r in results]
    region_rows = [
        [r["name"], region, figures.get("p50"), figures.get("p99"), figures.get("count")]
        for r in results
        for region, figures in r["latency_by_region_ms"].items()
    ]
    return [
        figure(
            "fast_path_share",
            "Fast-path share under Zipf contention: skew and reorder buffer",
            layer=LAYER_PROXY,
            method=method,
            columns=[
                "configuration",
                "fast-path share",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "txns/s",
                "recoveries",
                "invalidations",
                "errors",
                "sidecar CPU ms / txn",
                "total conserved",
            ],
            rows=rows,
            plot={
                "kind": "bar",
                "x": names,
                "series": {"fast-path share": [r["fast_path_share"] or 0 for r in results]},
                "ylabel": "fast / (fast + slow)",
            },
        ),
        figure(
            "latency",
            "Commit latency under Zipf contention",
            layer=LAYER_PROXY,
            method=method,
            columns=["configuration", "region", "p50 ms", "p99 ms", "txns"],
            rows=region_rows,
            plot={
                "kind": "bar",
                "x": names,
                "series": {
                    "p50": [r["latency_ms"].get("p50") or 0 for r in results],
                    "p90": [r["latency_ms"].get("p90") or 0 for r in results],
                    "p99": [r["latency_ms"].get("p99") or 0 for r in results],
                },
                "ylabel": "ms",
            },
        ),
    ]
