"""Saga store throughput on a real Cassandra node: starts/s, writes per start, step cost.

``run(quick=..., profile=...)`` starts one Cassandra node through the project's launcher on
127.0.77.1 (``STACKSAGA_BENCH_NODE_IP`` moves it; ``STACKSAGA_BENCH_CONTACT_POINT=host[:port]``
uses a running node instead), applies the schema to a throw-away
keyspace and measures, for a 3-step saga whose steps do nothing (so the figures are the
store's own cost):

* ``create_per_second``: transactions created (watchdog hand-off + es_transaction insert);
* ``saga_runs_per_second``: whole sagas (create + 3 guarded steps + tryouts), ``concurrency``
  of them in flight, for STRICT and RELAXED_WITH_DEDUP;
* ``statements_per_saga``: what one saga sends, counted by the client (mutations = rows
  written, including LWTs and batch members; requests = round trips);
* ``step_latency_ms``: one guarded step (deliver) at a time, p50/p99, per mode, with the
  statements one step costs.

Figures are from whatever machine runs it; nothing here asserts on time. ``python -m
bench.saga_store [--quick] [--profile]`` prints the dict as JSON.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cassandra import DriverException, OperationTimedOut

from bench.clusters import existing_cluster_disposable
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import Orchestrator, StepEvent
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.schema import apply_schema

# An address no other fixture of the project uses, so the bench can run beside the tests.
BENCH_NODE_IP = "127.0.77.1"
NODE_IP_ENV = "STACKSAGA_BENCH_NODE_IP"
CONTACT_POINT_ENV = "STACKSAGA_BENCH_CONTACT_POINT"
MODES = {"STRICT": "payment-saga", "RELAXED_WITH_DEDUP": "notification-saga"}


def _saga(domain: str) -> Saga:
    async def nothing(ctx: StepContext) -> None:
        return None

    steps = tuple(Step(name, nothing, nothing) for name in ("inventory", "payment", "shipping"))
    return Saga(f"bench-{domain}", steps, domain=domain)


def _settings(service: str) -> Any:
    return load_settings(
        cassandra={
            "write-protection": {
                "domains": {
                    "payment-saga": {"mode": "STRICT", "lease-duration": "5s"},
                    "notification-saga": {"mode": "RELAXED_WITH_DEDUP"},
                }
            },
            "schema": {"replication-strategy": "SimpleStrategy", "replication-factor": 1},
        },
        instance={"region": "bench", "cluster": "bench", "service-name": service},
    )


async def _bounded(count: int, concurrency: int, job: Any) -> float:
    """Run job(i) for i < count with at most `concurrency` in flight; seconds taken."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with semaphore:
            await job(index)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return time.perf_counter() - started


async def _measure(runtime: StoreRuntime, quick: bool) -> dict[str, Any]:
    sagas = 30 if quick else 400
    concurrency = 8 if quick else 32
    steps = 20 if quick else 200
    orchestrator = runtime.orchestrator(sagas=[_saga(domain) for domain in MODES.values()])
    report: dict[str, Any] = {"sagas": sagas, "concurrency": concurrency, "steps": steps}

    runtime.cql.counts.reset()
    seconds = await _bounded(
        sagas, concurrency, lambda i: orchestrator.create("bench-payment-saga", {"i": i})
    )
    report["create_per_second"] = round(sagas / seconds, 1)
    report["statements_per_create"] = _per(runtime, sagas)

    for mode, domain in MODES.items():
        runtime.cql.counts.reset()
        seconds = await _bounded(
            sagas, concurrency, lambda i, d=domain: orchestrator.start(f"bench-{d}", {"i": i})
        )
        report.setdefault("saga_runs_per_second", {})[mode] = round(sagas / seconds, 1)
        report.setdefault("statements_per_saga", {})[mode] = _per(runtime, sagas)
        report.setdefault("step_latency_ms", {})[mode] = await _step_cost(
            runtime, orchestrator, domain, steps
        )
    return report


async def _step_cost(
    runtime: StoreRuntime, orchestrator: Orchestrator, domain: str, steps: int
) -> dict[str, Any]:
    """One guarded step at a time: latency and statements of a deliver() (which also reads
    the transaction: 3 single-partition reads)."""
    transaction_ids = [
        await orchestrator.create(f"bench-{domain}", {"i": index}) for index in range(steps)
    ]
    latencies: list[float] = []
    runtime.cql.counts.reset()
    for transaction_id in transaction_ids:
        started = time.perf_counter()
        await orchestrator.deliver(StepEvent(transaction_id, "inventory"))
        latencies.append((time.perf_counter() - started) * 1000)
    ordered = sorted(latencies)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "mean": round(statistics.fmean(ordered), 2),
        "statements_per_step": _per(runtime, steps),
    }


def _per(runtime: StoreRuntime, count: int) -> dict[str, float]:
    snapshot = runtime.cql.counts.snapshot()
    per = {kind: round(value / count, 2) for kind, value in snapshot["by_kind"].items()}
    per["mutations"] = round(snapshot["mutations"] / count, 2)
    per["requests"] = round(snapshot["requests"] / count, 2)
    per["batches"] = round(snapshot["batches"] / count, 2)
    return per


async def _run_on(
    contact_point: tuple[str, int], quick: bool, profile: bool, *, drop: bool = True
) -> dict[str, Any]:
    keyspace = f"stacksaga_bench_{uuid.uuid4().hex[:8]}"
    settings = _settings("bench-service")
    config = DriverConfig(
        contact_points=(contact_point,),
        local_datacenter="datacenter1",
        session_keyspace=keyspace,
        request_timeout=DriverConfig().request_timeout * 10,
        origin="<bench>",
    )
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, keyspace, settings.cassandra.schema_)
        runtime = await open_runtime(settings, driver_config=config)
        profiler = cProfile.Profile() if profile else None
        try:
            if profiler is not None:
                profiler.enable()
            report = await _measure(runtime, quick)
            if profiler is not None:
                profiler.disable()
                report["profile_top"] = _top(profiler)
        finally:
            await runtime.close()
        try:
            # Clean-up only: a slow schema change on a loaded machine must not fail the run.
            if drop:
                session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        except (OperationTimedOut, DriverException) as error:
            report["cleanup_error"] = f"keyspace {keyspace} not dropped: {error}"
    finally:
        cluster.shutdown()
    return report


def _top(profiler: cProfile.Profile, entries: int = 15) -> list[str]:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(entries)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-entries:]


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    """Measure and return the figures (see the module docstring)."""
    report: dict[str, Any] = {"suite": "saga_store"}
    existing = os.environ.get(CONTACT_POINT_ENV)
    if existing:
        host, _, port = existing.partition(":")
        report["cassandra"] = f"existing node {existing}"
        drop = not existing_cluster_disposable()
        report.update(asyncio.run(_run_on((host, int(port or 9042)), quick, profile, drop=drop)))
        return report
    from accord_cassandra.launcher import ClusterSpec, LocalCluster

    node_ip = os.environ.get(NODE_IP_ENV, BENCH_NODE_IP)
    with tempfile.TemporaryDirectory(prefix="stacksaga-bench-") as base_dir:
        spec = ClusterSpec(nodes=1, first_ip=node_ip, cluster_name="stacksaga_bench")
        cluster = LocalCluster(spec, Path(base_dir))
        cluster.start()
        try:
            report["cassandra"] = f"1 local node, Cassandra {spec.version}, heap {spec.heap_mb} MiB"
            report.update(asyncio.run(_run_on((node_ip, spec.native_port), quick, profile)))
        finally:
            cluster.stop(clean=True)
    return report


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv, profile="--profile" in sys.argv), indent=2))
