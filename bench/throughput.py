"""throughput: Accord vs Cassandra LWT at saturation on one real 3-node Cassandra, same run.

Setup: a 3-node Cassandra 5.0 (``paxos_variant: v2``; launched on 127.0.88.1-3, or the
cluster named by ``BENCH_CASSANDRA_CONTACT_POINTS``), one keyspace with RF 3, and 3 sidecars
(``store: cassandra``, QUORUM reads and writes) on loopback. No WAN emulation: this suite
measures capacity, not distance.

Workloads, over ``keys`` accounts chosen uniformly (little contention: the point is
saturation, not conflicts):

* *Accord conditional set*: ``LET row; IF row.balance >= 0; SET balance = v`` (1 partition);
* *Accord transfer*: the 2-partition transfer (2 reads, a condition, 2 writes);
* *LWT conditional set*: ``UPDATE lwt_accounts SET balance = ? WHERE id = ? IF balance >= 0``
  (Paxos v2, SERIAL, commit ONE) on its own table (see :mod:`bench.lwt`).

Saturation: closed loops at increasing numbers of operations in flight; each level runs every
workload in turn (the order rotates between rounds, so background load drifts hit them
alike) and the figure is the median over rounds. Peak = the best level. CPU per operation:
sidecars and Cassandra JVMs from /proc, the load generator from its own process time.

Cassandra writes per Accord row write: the sidecars' ``accord_store_writes_total`` (write
statements their data stores executed), summed over the sidecars from the start of a run
until it stops growing after the run (replicas apply after the client hears the outcome),
divided by the rows the run's applied transactions wrote (1 per conditional set, 2 per
transfer). Each write statement goes to Cassandra at the configured CL, so this is the
count of client-request writes Cassandra serves for one row written through Accord.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from accord_cassandra.client import AsyncClient, TransactionError
from accord_cassandra.cluster import metrics_of
from bench.clusters import DDL_TIMEOUT, BenchSidecars, CassandraHandle, bench_cassandra
from bench.lwt import LwtClient, schema
from bench.lwt import preload as lwt_preload
from bench.profiling import sidecar_profile
from bench.report import Progress, figure, note
from bench.wan import LAYER_NONE, percentiles
from bench.workload import (
    INITIAL_BALANCE,
    LoadError,
    LoadResult,
    closed_loop_calls,
    conditional_set,
    cpu_seconds,
    preload,
    transfer,
)

ACCORD_SET = "Accord conditional set (1 partition)"
ACCORD_TRANSFER = "Accord transfer (2 partitions)"
LWT_SET = "LWT conditional set (1 partition)"
WORKLOADS = (ACCORD_SET, ACCORD_TRANSFER, LWT_SET)
TARGET_RATIO = 2.0
# Rows an applied transaction of each Accord workload writes.
ROWS_PER_OP = {ACCORD_SET: 1, ACCORD_TRANSFER: 2}
STORE_WRITES = "accord_store_writes_total"


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    plan = {
        "keys": 500 if quick else 10_000,
        "inflight_levels": [16] if quick else [8, 32, 96],
        "rounds": 1 if quick else 2,
        "seconds_per_run": 3.0 if quick else 15.0,
        # Untimed load first: fresh JVMs interpret before they compile, and the first
        # seconds of each workload would otherwise measure the JIT, not the system.
        "warmup_seconds_per_workload": 0.0 if quick else 20.0,
    }
    report: dict[str, Any] = {
        "suite": "throughput",
        "title": "Accord vs Cassandra LWT at saturation, same 3-node cluster, same run",
        "layer": LAYER_NONE,
        "plan": plan,
    }
    with bench_cassandra(3) as cassandra:
        report["cassandra"] = cassandra.description
        keyspace = f"accord_bench_{uuid.uuid4().hex[:8]}"
        runs = _on_cluster(cassandra, keyspace, plan, profile, report)
    report["runs"] = runs
    report.update(_figures(runs, plan, report["cassandra"], profiled=profile))
    return report


def _on_cluster(
    cassandra: CassandraHandle,
    keyspace: str,
    plan: dict[str, Any],
    profile: bool,
    report: dict[str, Any],
) -> list[dict[str, Any]]:
    from accord_cassandra.launcher import driver_cluster

    driver = driver_cluster(cassandra.contact_points, cassandra.native_port, timeout=30.0)
    session = driver.connect()
    try:
        for statement in schema(
            keyspace, replication="{'class': 'SimpleStrategy', 'replication_factor': 3}"
        ):
            session.execute(statement, timeout=DDL_TIMEOUT)
        keys = [f"acct{i:06d}" for i in range(plan["keys"])]
        note(f"preloading {len(keys)} LWT accounts")
        lwt_preload(session, keyspace, keys)
        with tempfile.TemporaryDirectory(prefix="bench-throughput-") as folder:
            sidecars = BenchSidecars(
                Path(folder),
                nodes=3,
                store="cassandra",
                cassandra={
                    "contact_points": cassandra.contact_points,
                    "port": cassandra.native_port,
                    "keyspaces": [keyspace],
                },
                profile=profile,
            )
            note("starting 3 sidecars on Cassandra")
            with sidecars:
                runs = asyncio.run(
                    _measure(
                        sidecars, LwtClient(session, keyspace), keyspace, keys, plan, cassandra
                    )
                )
            if profile:
                report["profile_top"] = sidecar_profile(
                    [sidecars.profile_path(n) for n in sidecars.sidecars]
                )
        if not cassandra.disposable:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=DDL_TIMEOUT)
    finally:
        driver.shutdown()
    return runs


async def _measure(
    sidecars: BenchSidecars,
    lwt: LwtClient,
    keyspace: str,
    keys: list[str],
    plan: dict[str, Any],
    cassandra: CassandraHandle,
) -> list[dict[str, Any]]:
    clients = [AsyncClient(s.address, timeout=30.0) for s in sidecars.sidecars.values()]
    sidecar_pids = [s.process.pid for s in sidecars.sidecars.values() if s.process is not None]
    metrics = [s.metrics_address for s in sidecars.sidecars.values()]
    rng = random.Random(7)
    try:
        await preload(clients[0], keys, keyspace=keyspace, label="preload Accord accounts")
        operations = _operations(clients, lwt, keyspace, keys, rng)
        warmup = plan["warmup_seconds_per_workload"]
        if warmup:
            for name in WORKLOADS:
                note(f"warm-up: {name} for {warmup:g} s")
                await closed_loop_calls(operations[name], inflight=16, seconds=warmup)
        runs = []
        total = len(plan["inflight_levels"]) * plan["rounds"] * len(WORKLOADS)
        done = 0
        for round_index in range(plan["rounds"]):
            for inflight in plan["inflight_levels"]:
                shift = round_index % len(WORKLOADS)
                for name in (*WORKLOADS[shift:], *WORKLOADS[:shift]):
                    done += 1
                    note(f"[{done}/{total}] {name}, {inflight} in flight")
                    # Settled first: the replicas may still apply the previous run's writes.
                    writes_before = await _settled_store_writes(metrics)
                    result, cpu = await _timed(
                        operations[name],
                        inflight,
                        plan["seconds_per_run"],
                        sidecar_pids,
                        cassandra.pids,
                    )
                    summary = _summary(name, inflight, round_index, result, cpu)
                    if name in ROWS_PER_OP:
                        writes = await _settled_store_writes(metrics) - writes_before
                        rows = result.applied * ROWS_PER_OP[name]
                        summary["cassandra_writes"] = writes
                        summary["accord_row_writes"] = rows
                        summary["cassandra_writes_per_row_write"] = (
                            round(writes / rows, 3) if rows else None
                        )
                    runs.append(summary)
    finally:
        for client in clients:
            await client.close()
    return runs


def _operations(
    clients: list[AsyncClient],
    lwt: LwtClient,
    keyspace: str,
    keys: list[str],
    rng: random.Random,
) -> dict[str, Callable[[int], Awaitable[bool]]]:
    async def accord(index: int, make: Any) -> bool:
        try:
            answer = await clients[index % len(clients)].transact(make())
        except TransactionError as error:
            raise LoadError(error.code) from None
        return answer.applied

    def value() -> int:
        return INITIAL_BALANCE + rng.randrange(1000)

    def accord_set(index: int) -> Awaitable[bool]:
        return accord(index, lambda: conditional_set(rng.choice(keys), value(), 0, keyspace))

    def accord_transfer(index: int) -> Awaitable[bool]:
        source, target = rng.sample(keys, 2)
        return accord(index, lambda: transfer(source, target, 1, keyspace))

    def lwt_set(index: int) -> Awaitable[bool]:
        return lwt.conditional_set(rng.choice(keys), value(), 0)

    return {ACCORD_SET: accord_set, ACCORD_TRANSFER: accord_transfer, LWT_SET: lwt_set}


async def _store_writes(addresses: list[str]) -> int:
    figures = await asyncio.gather(*(asyncio.to_thread(metrics_of, a) for a in addresses))
    return int(sum(f.get(STORE_WRITES, 0.0) for f in figures))


async def _settled_store_writes(addresses: list[str], seconds: float = 30.0) -> int:
    """The sidecars' write count once it stopped growing (two equal readings 1 s apart)."""
    deadline = time.monotonic() + seconds
    last = await _store_writes(addresses)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await _store_writes(addresses)
        if now == last:
            break
        last = now
    return last


async def _timed(
    call: Callable[[int], Awaitable[bool]],
    inflight: int,
    seconds: float,
    sidecar_pids: list[int],
    cassandra_pids: list[int],
) -> tuple[LoadResult, dict[str, float]]:
    progress = Progress("  operations", None, every_seconds=5.0)
    before = (cpu_seconds(sidecar_pids), cpu_seconds(cassandra_pids), time.process_time())
    result = await closed_loop_calls(call, inflight=inflight, seconds=seconds, progress=progress)
    after = (cpu_seconds(sidecar_pids), cpu_seconds(cassandra_pids), time.process_time())
    cpu = {
        "sidecars": after[0] - before[0],
        "cassandra": after[1] - before[1],
        "load_generator": after[2] - before[2],
    }
    return result, cpu


def _summary(
    name: str, inflight: int, round_index: int, result: LoadResult, cpu: dict[str, float]
) -> dict[str, Any]:
    committed = result.committed
    per = {k: round(1000 * v / committed, 3) if committed else None for k, v in cpu.items()}
    return {
        "workload": name,
        "inflight": inflight,
        "round": round_index,
        "ops_per_second": round(committed / result.seconds, 1) if result.seconds else 0.0,
        "latency_ms": percentiles(result.latencies_ms),
        "applied": result.applied,
        "declined": result.declined,
        "errors": result.errors,
        "cpu_ms_per_op": per,
        "seconds": round(result.seconds, 2),
    }


def _median_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (workload, inflight): the run with the median throughput over rounds."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for item in runs:
        grouped.setdefault((item["workload"], item["inflight"]), []).append(item)
    chosen = {}
    for key, items in grouped.items():
        ordered = sorted(items, key=lambda r: r["ops_per_second"])
        chosen[key] = ordered[(len(ordered) - 1) // 2]
        chosen[key] = dict(chosen[key])
        chosen[key]["ops_per_second_rounds"] = [r["ops_per_second"] for r in items]
        chosen[key]["ops_per_second_median"] = statistics.median(r["ops_per_second"] for r in items)
    return chosen


def _figures(
    runs: list[dict[str, Any]], plan: dict[str, Any], cassandra: str, *, profiled: bool
) -> dict[str, Any]:
    medians = _median_runs(runs)
    levels = plan["inflight_levels"]
    method = (
        f"{cassandra}; one keyspace RF 3; 3 sidecars (store: cassandra, QUORUM) on loopback; "
        f"{plan['keys']} accounts chosen uniformly; closed loops for "
        f"{plan['seconds_per_run']:g} s per (workload, in-flight level), workloads in rotating "
        f"order, median of {plan['rounds']} round(s). Accord clients spread over the 3 "
        f"sidecars; LWT through one driver session (token-aware). Untimed warm-up of "
        f"{plan['warmup_seconds_per_workload']:g} s per workload first. LWT: UPDATE ... IF balance "
        f">= 0, SERIAL, commit ONE. No WAN emulation. Everything (3 JVMs, 3 sidecars, the "
        f"load generator) shares this machine's CPUs."
        + (" Sidecars ran under cProfile (slower than unprofiled)." if profiled else "")
    )
    rows = []
    for (name, inflight), item in sorted(medians.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        cpu = item["cpu_ms_per_op"]
        rows.append(
            [
                name,
                inflight,
                item["ops_per_second_median"],
                item["latency_ms"].get("p50"),
                item["latency_ms"].get("p99"),
                sum(item["errors"].values()),
                cpu.get("sidecars"),
                cpu.get("cassandra"),
                cpu.get("load_generator"),
                item.get("cassandra_writes_per_row_write"),
            ]
        )
    peak = {
        name: max(
            (medians[(name, level)]["ops_per_second_median"] for level in levels), default=0.0
        )
        for name in WORKLOADS
    }
    lwt_peak = peak[LWT_SET]
    ratio_set = round(peak[ACCORD_SET] / lwt_peak, 3) if lwt_peak else None
    ratio_transfer = round(peak[ACCORD_TRANSFER] / lwt_peak, 3) if lwt_peak else None
    figures = [
        figure(
            "saturation",
            "Throughput vs operations in flight",
            layer=LAYER_NONE,
            method=method,
            columns=[
                "workload",
                "in flight",
                "ops/s",
                "p50 ms",
                "p99 ms",
                "errors",
                "CPU ms/op sidecars",
                "CPU ms/op Cassandra",
                "CPU ms/op load generator",
                "Cassandra writes per Accord row write",
            ],
            rows=rows,
            plot={
                "kind": "line",
                "series": {
                    name: [
                        [level, medians[(name, level)]["ops_per_second_median"]] for level in levels
                    ]
                    for name in WORKLOADS
                },
                "xlabel": "operations in flight",
                "ylabel": "operations per second",
            },
        ),
        figure(
            "peak",
            "Peak throughput and ratios to LWT",
            layer=LAYER_NONE,
            method=method + " Peak = best in-flight level of each workload.",
            columns=["workload", "peak ops/s", "ratio to LWT conditional set"],
            rows=[
                [ACCORD_SET, peak[ACCORD_SET], ratio_set],
                [ACCORD_TRANSFER, peak[ACCORD_TRANSFER], ratio_transfer],
                [LWT_SET, lwt_peak, 1.0 if lwt_peak else None],
            ],
            plot={
                "kind": "bar",
                "x": list(WORKLOADS),
                "series": {"peak ops/s": [peak[name] for name in WORKLOADS]},
                "ylabel": "operations per second",
            },
        ),
    ]
    targets = [
        {
            "target": f"Accord >= {TARGET_RATIO} x LWT throughput, single-partition "
            "conditional updates (peak vs peak)",
            "measured": ratio_set,
            "met": ratio_set is not None and ratio_set >= TARGET_RATIO,
        },
        {
            "target": "Cassandra writes per Accord row write = 1 (single-partition "
            "conditional set)",
            "measured": _writes_per_row(runs)[ACCORD_SET],
            "met": _writes_per_row(runs)[ACCORD_SET] == 1.0,
        },
    ]
    return {
        "figures": figures,
        "targets": targets,
        "peak_ops_per_second": peak,
        "ratios": {"accord_set_to_lwt": ratio_set, "accord_transfer_to_lwt": ratio_transfer},
        "cassandra_writes_per_row_write": _writes_per_row(runs),
    }


def _writes_per_row(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per Accord workload, over all its runs: Cassandra writes / Accord row writes."""
    out: dict[str, float | None] = {}
    for name in ROWS_PER_OP:
        writes = sum(r.get("cassandra_writes", 0) for r in runs if r["workload"] == name)
        rows = sum(r.get("accord_row_writes", 0) for r in runs if r["workload"] == name)
        out[name] = round(writes / rows, 3) if rows else None
    return out
