"""Recovery engine figures on a real Cassandra node: starts, re-invocations, tombstones.

``run(quick=..., profile=...)`` starts one Cassandra node through the project's launcher on
127.0.78.1 (``STACKSAGA_BENCH_RECOVERY_NODE_IP`` moves it; ``STACKSAGA_BENCH_CONTACT_POINT=
host[:port]`` uses a running node), three Accord sidecars on it for the ``accord`` commit
mode, and measures:

* ``starts[mode]``: saga starts per second in each commit mode, two ways: ``create`` (the
  watchdog plus es_transaction, no step) and ``saga`` (a whole one-step saga: create, the
  step under its RELAXED marker, completion and the watchdog's release); with writes per start
  counted by the client (``client_mutations``: rows the store wrote, Tier 1-4 amortised) and by
  the server (``server_writes``: ``system_views.local_write_latency`` counts, which include
  the rows Accord's sidecar replicas apply, once per replica), and Accord transactions;
* ``reinvocations[n]``: re-invocations per second with ``n`` = 1 and 2 Retry-Node *processes*
  splitting the ring (static halves), each resuming real FAILED_WITH_RETRYABLE_ERROR sagas
  from one window of the directory (64 writer instances), started together behind a barrier;
* ``tombstones``: Cassandra's own trace of the Retry-Node's Tier-5 reads ("Read N live rows
  and M tombstone cells") for an even (retry) bucket, and for an odd (restore) bucket whose
  sagas all completed, in both modes; plus the Tier-3/Tier-4 reads of a pass.

The starts phases run after unmeasured warm-up rounds of both modes on the same node
(``warm_up_rounds`` in the JSON keeps their figures): a fresh JVM spends its first minutes of
load compiling. Then each concurrency runs in rounds, the modes' order alternating
(``*_rounds`` in the JSON); the table gives medians.

Nothing asserts on time; the figures are whatever this machine gives. ``python -m bench
recovery [--quick] [--profile]`` writes them as JSON, Markdown and PNG (bench/report.py);
``python -m bench.recovery_engine [--quick] [--profile]`` prints the JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from bench.clusters import DDL_TIMEOUT, existing_cluster_disposable
from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.recovery.writer import instance_token
from stacksaga_store.ring.leases import StaticLeaseSource, split_ring
from stacksaga_store.saga.definition import Saga, SagaPayload, Step, StepContext
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.extension_schema import (
    apply_accord_schema,
    apply_coordination_schema,
    default_accord_keyspace,
)
from stacksaga_store.store.schema import apply_schema

BENCH_NODE_IP = "127.0.78.1"
NODE_IP_ENV = "STACKSAGA_BENCH_RECOVERY_NODE_IP"
CONTACT_POINT_ENV = "STACKSAGA_BENCH_CONTACT_POINT"
T0 = datetime(2031, 6, 1, 10, 0, 30, tzinfo=UTC)
WRITER_INSTANCES = 64
# Starts per measured phase. 400 was a burst, not a rate: the ordered mode's 128-in-flight
# create phase ended in 0.13 s, inside Cassandra's memtable, and read 2-3x its steady rate.
STARTS_PER_PHASE = 2000
# Starts per mode and kind in the unmeasured warm-up round. On a fresh node the JIT compiles
# for the first minute of load (C2 threads took 0.5-0.6 of this machine's 2 cores through the
# first accord phases): unwarmed, the first phases measured the compiler, not the modes.
WARM_UP_STARTS = 2000
# Warm-up rounds. One was not enough for the accord mode's path through Cassandra (IN reads,
# batches with timestamps): in consecutive rounds on a fresh node Cassandra spent 2.62, 1.15,
# 0.82 and 0.66 ms of CPU per accord create (the ordered mode 1.07, 0.63, 0.40, 0.19), and a
# measured phase after one round took 1.57 ms per create at 32 in flight and 0.50 at 128
# minutes later: it measured the JIT, not the mode.
WARM_UP_ROUNDS = 3
# Measured rounds of each concurrency, the modes' order alternating between rounds: a phase
# pays for the flushes and compactions the phase before it left (Cassandra CPU per accord
# create ran 0.66-1.61 ms in consecutive rounds on one node), so one round in a fixed order
# favoured whichever mode ran first. The table gives medians; the JSON keeps every round.
MEASURED_ROUNDS = 3
_TRACE = re.compile(r"Read (\d+) live rows? and (\d+) tombstone cells?")


def _saga() -> Saga:
    async def nothing(ctx: StepContext) -> None:
        return None

    return Saga("bench", (Step("work", nothing),))


def _settings(service: str, recovery: dict[str, Any]) -> StackSagaSettings:
    return load_settings(
        cassandra={
            "schema": {"replication-strategy": "SimpleStrategy", "replication-factor": 1},
            "transaction": {"lifetime": "30d"},
            "recovery": {
                "bucket-size": 50_000,
                "concurrency": 100,
                "restore": {"delay-windows": 5},
                **recovery,
            },
        },
        instance={"region": "bench", "cluster": "bench", "service-name": service},
    )


def _driver(contact_point: tuple[str, int], keyspace: str) -> DriverConfig:
    return DriverConfig(
        contact_points=(contact_point,),
        local_datacenter="datacenter1",
        session_keyspace=keyspace,
        request_timeout=timedelta(seconds=30),
        origin="<bench>",
    )


async def _bounded(count: int, concurrency: int, job: Callable[[int], Any]) -> float:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with semaphore:
            await job(index)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return time.perf_counter() - started


def _server_writes(session: Any, keyspaces: tuple[str, ...]) -> int:
    rows = session.execute("SELECT keyspace_name, count FROM system_views.local_write_latency")
    return sum(int(row["count"]) for row in rows if row["keyspace_name"] in keyspaces)


# -- starts per commit mode ------------------------------------------------------------------


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _starts(
    contact_point: tuple[str, int],
    keyspace: str,
    recovery: dict[str, Any],
    quick: bool,
    *,
    concurrency: int = 32,
    sidecar_pids: list[int] | None = None,
    cassandra_pids: Sequence[int] = (),
    count: int | None = None,
) -> dict[str, Any]:
    """``cassandra_pids``: the node this run launched, for its CPU per start (empty: a
    running node's, not measured). ``count``: starts per kind (default STARTS_PER_PHASE)."""
    count = 40 if quick else (count or STARTS_PER_PHASE)
    concurrency = min(concurrency, 8) if quick else concurrency
    settings = _settings(f"starts-{uuid.uuid4().hex[:6]}", recovery)
    runtime = await open_runtime(settings, driver_config=_driver(contact_point, keyspace))
    keyspaces = (keyspace, default_accord_keyspace(keyspace))
    figures: dict[str, Any] = {"count": count, "concurrency": concurrency}
    try:
        engine = await RecoveryEngine.open(runtime, clock=ManualClock(T0))
        orchestrator = engine.orchestrator(sagas=[_saga()])
        # Opens the window's buckets (Tier 1-4) in both modes: one start per write lane (the
        # ordered mode has one), so both modes are measured in steady state.
        for _ in engine.writer.instance_ids:
            await orchestrator.create("bench", {})
        session = runtime.cql.session
        for name, job in (
            ("create", lambda i: orchestrator.create("bench", {"i": i})),
            ("saga", lambda i: orchestrator.start("bench", {"i": i})),
        ):
            runtime.cql.counts.reset()
            accord_before = engine.gateway.transactions if engine.gateway else 0
            retries_before = engine.gateway.retries if engine.gateway else 0
            server_before = await asyncio.to_thread(_server_writes, session, keyspaces)
            sidecar_cpu, own_cpu = _cpu_seconds(sidecar_pids or []), _cpu_seconds([os.getpid()])
            cassandra_cpu = _cpu_seconds(cassandra_pids)
            seconds = await _bounded(count, concurrency, job)
            sidecar_cpu = _cpu_seconds(sidecar_pids or []) - sidecar_cpu
            own_cpu = _cpu_seconds([os.getpid()]) - own_cpu
            cassandra_cpu = _cpu_seconds(cassandra_pids) - cassandra_cpu
            server_after = await asyncio.to_thread(_server_writes, session, keyspaces)
            accord_after = engine.gateway.transactions if engine.gateway else 0
            figures[name] = {
                # Whole-machine load (other tenants included) and this run's own CPU: the
                # accord mode's rate is bounded by the sidecars' CPU on a 2-core machine.
                "load_average_1m": round(os.getloadavg()[0], 1),
                "sidecar_cpu_ms_per_start": round(1000 * sidecar_cpu / count, 2),
                "client_cpu_ms_per_start": round(1000 * own_cpu / count, 2),
                "cassandra_cpu_ms_per_start": (
                    round(1000 * cassandra_cpu / count, 2) if cassandra_pids else None
                ),
                # Transactions sent again (unknown outcome, overload, refused connection).
                "accord_retries": (engine.gateway.retries - retries_before)
                if engine.gateway
                else 0,
                "starts_per_second": round(count / seconds, 1),
                "client_mutations_per_start": round(runtime.cql.counts.mutations / count, 2),
                "client_requests_per_start": round(runtime.cql.counts.requests / count, 2),
                "server_writes_per_start": round((server_after - server_before) / count, 2),
                "accord_transactions_per_start": round((accord_after - accord_before) / count, 2),
            }
        await engine.close()
    finally:
        await runtime.close()
    return figures


# -- re-invocations per Retry-Node -------------------------------------------------------------


def _bulk_load(
    session: Any, keyspace: str, scope: DirectoryScope, rows: int, windows: WindowMath
) -> None:
    """FAILED_WITH_RETRYABLE_ERROR sagas with retry pointers in window W+1 of T0."""
    from cassandra.concurrent import execute_concurrent_with_args

    window = windows.shift(windows.window_at(T0), 1)
    date, minute = window.date_of_year, windows.minute_of_day(window)
    payload = SagaPayload("bench", ("work",), {}, {}).encode()
    instances = [str(uuid.uuid4()) for _ in range(WRITER_INSTANCES)]
    txns = [uuid.uuid4() for _ in range(rows)]
    scope_values = tuple(scope.params())
    statements = {
        "txn": session.prepare(
            f"INSERT INTO {keyspace}.es_transaction (region, cluster, service_name, "
            "transaction_id, running_status, created_at, updated_at, payload) "
            "VALUES (?, ?, ?, ?, 'FAILED_WITH_RETRYABLE_ERROR', ?, ?, ?)"
        ),
        "t5": session.prepare(
            f"INSERT INTO {keyspace}.es_recovery_transactions_by_instance (region, cluster, "
            "service_name, date_of_year, minute_of_day, instance_id, bucket_index, "
            "transaction_id) VALUES (?, ?, ?, ?, ?, ?, 0, ?)"
        ),
        "t3": session.prepare(
            f"INSERT INTO {keyspace}.es_instances_by_recovery_window (region, cluster, "
            "service_name, date_of_year, minute_of_day, instance_id_token, instance_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        ),
        "t4": session.prepare(
            f"INSERT INTO {keyspace}.es_buckets_by_instance (region, cluster, service_name, "
            "date_of_year, minute_of_day, instance_id, bucket_index) VALUES (?, ?, ?, ?, ?, ?, 0)"
        ),
    }

    def run(name: str, args: list[tuple[Any, ...]]) -> None:
        execute_concurrent_with_args(
            session, statements[name], args, concurrency=64, raise_on_first_error=True
        )

    run("txn", [(*scope_values, t, T0, T0, payload) for t in txns])
    run(
        "t5",
        [
            (*scope_values, date, minute, instances[i % len(instances)], t)
            for i, t in enumerate(txns)
        ],
    )
    run("t3", [(*scope_values, date, minute, instance_token(i), i) for i in instances])
    run("t4", [(*scope_values, date, minute, i) for i in instances])
    session.execute(
        f"INSERT INTO {keyspace}.es_recovery_windows_by_day (region, cluster, service_name, "
        "date_of_year, minute_of_day) VALUES (%s, %s, %s, %s, %s)",
        (*scope_values, date, minute),
    )
    session.execute(
        f"INSERT INTO {keyspace}.es_days_by_year (region, cluster, service_name, year, "
        "date_of_year) VALUES (%s, %s, %s, %s, %s)",
        (*scope_values, window.year, date),
    )


async def _node_process(job: dict[str, Any]) -> dict[str, Any]:
    """One Retry-Node process: connect, wait at the barrier, one pass, report."""
    settings = _settings(job["service"], {"concurrency": job["concurrency"]})
    runtime = await open_runtime(
        settings, driver_config=_driver((job["host"], job["port"]), job["keyspace"])
    )
    try:
        engine = await RecoveryEngine.open(runtime, clock=ManualClock(T0 + timedelta(minutes=1)))
        token_range = split_ring(job["nodes"])[job["index"]]
        node = engine.retry_node(
            engine.orchestrator(sagas=[_saga()]),
            StaticLeaseSource(job["service"], token_range=token_range, members=job["nodes"]),
        )
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        barrier = Path(job["barrier"])
        while not barrier.exists():
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        report = await node.run_pass()
        seconds = time.perf_counter() - started
        await engine.close()
        return {"dispatched": report.dispatched, "failed": report.failed, "seconds": seconds}
    finally:
        await runtime.close()


async def _reinvocations(
    contact_point: tuple[str, int], keyspace: str, nodes: int, quick: bool, work: Path
) -> dict[str, Any]:
    rows = 300 if quick else 3000
    service = f"reinvoke-{nodes}-{uuid.uuid4().hex[:6]}"
    settings = _settings(service, {})
    cluster, session = connect_sync(settings, _driver(contact_point, keyspace))
    try:
        await asyncio.to_thread(
            _bulk_load, session, keyspace, DirectoryScope.of(settings.instance), rows, WindowMath(1)
        )
    finally:
        cluster.shutdown()
    barrier = work / f"go-{service}"
    children = []
    for index in range(nodes):
        job = {
            "service": service,
            "keyspace": keyspace,
            "host": contact_point[0],
            "port": contact_point[1],
            "nodes": nodes,
            "index": index,
            "concurrency": 100,
            "barrier": str(barrier),
        }
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.recovery_engine", "--retry-node", json.dumps(job)],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a Retry-Node process did not start")
        barrier.touch()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=600)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    dispatched = sum(r["dispatched"] for r in results)
    wall = max(r["seconds"] for r in results)
    return {
        "rows": rows,
        "dispatched": dispatched,
        "failed": sum(r["failed"] for r in results),
        "reinvocations_per_second_total": round(dispatched / wall, 1),
        "reinvocations_per_second_per_node": [
            round(r["dispatched"] / r["seconds"], 1) for r in results
        ],
    }


# -- tombstones per Retry-Node query -------------------------------------------------------------


def _trace(session: Any, statement: str, params: tuple[Any, ...]) -> dict[str, int]:
    result = session.execute(statement, params, trace=True)
    live = tombstones = 0
    for event in result.get_query_trace(max_wait_sec=10).events:
        match = _TRACE.search(event.description or "")
        if match:
            live += int(match.group(1))
            tombstones += int(match.group(2))
    return {"live_rows": live, "tombstone_cells": tombstones}


async def _tombstones(
    contact_point: tuple[str, int], keyspace: str, recovery: dict[str, Any], quick: bool
) -> dict[str, Any]:
    count = 50 if quick else 500
    service = f"tomb-{uuid.uuid4().hex[:6]}"
    settings = _settings(service, recovery)
    runtime = await open_runtime(settings, driver_config=_driver(contact_point, keyspace))
    try:
        clock = ManualClock(T0)
        engine = await RecoveryEngine.open(runtime, clock=clock)
        orchestrator = engine.orchestrator(sagas=[_saga()])
        writer = engine.writer
        from stacksaga_store.saga.handoff import RetryRequest
        from stacksaga_store.store.model import TransactionKey
        from stacksaga_store.store.states import ExecutionType

        for index in range(count):
            await orchestrator.start("bench", {"i": index})  # completes: watchdog released
            key = TransactionKey.of(settings.instance, uuid.uuid4())
            await writer.schedule_retry(
                RetryRequest(key, "work", ExecutionType.EXECUTE, 1, "503", clock.now())
            )
        windows = writer.windows
        restore = windows.restore_window(clock.now(), 5)
        retry = windows.retry_window(clock.now())
        select = (
            f"SELECT transaction_id FROM {keyspace}.es_recovery_transactions_by_instance WHERE "
            "region = %s AND cluster = %s AND service_name = %s AND date_of_year = %s AND "
            "minute_of_day = %s AND instance_id = %s AND bucket_index = %s LIMIT 500"
        )
        scope = tuple(DirectoryScope.of(settings.instance).params())
        session = runtime.cql.session

        def tier5_key(window: Any, instance_id: str, bucket: int) -> tuple[Any, ...]:
            return (*scope, window.date_of_year, windows.minute_of_day(window), instance_id, bucket)

        async def traced(window: Any, bucket: int) -> dict[str, int]:
            """The bucket's read, summed over the writer's lanes (accord: 16 instance ids)."""
            total = {"live_rows": 0, "tombstone_cells": 0}
            for instance_id in writer.instance_ids:
                found = await asyncio.to_thread(
                    _trace, session, select, tier5_key(window, instance_id, bucket)
                )
                total = {name: total[name] + found[name] for name in total}
            return total

        figures: dict[str, Any] = {
            "sagas": count,
            "lanes": len(writer.instance_ids),
            "tier5_even_bucket_read": await traced(retry, 0),
            "tier5_odd_bucket_read": await traced(restore, 1),
        }
        # What a real pass reads: every query of the Retry-Node at the restore window.
        clock.advance(timedelta(minutes=6))
        live = await engine.commit.bucket_live(engine.writer.scope, _bucket(writer, restore))
        figures["odd_bucket_live_count"] = live
        figures["odd_bucket_read_by_pass"] = live != 0
        await engine.close()
        return figures
    finally:
        await runtime.close()


def _bucket(writer: Any, window: Any) -> Any:
    from stacksaga_store.recovery.directory import BucketRef

    return BucketRef(window, writer.instance_id, 1)


# -- driver -------------------------------------------------------------------------------------


async def _run_on(
    contact_point: tuple[str, int],
    quick: bool,
    profile: bool,
    *,
    drop: bool = True,
    cassandra_pids: Sequence[int] = (),
) -> dict[str, Any]:
    from accord_cassandra.cluster import LocalSidecars

    keyspace = f"recovery_bench_{uuid.uuid4().hex[:8]}"
    settings = _settings("setup", {})
    schema = settings.cassandra.schema_
    cluster, session = connect_sync(settings, _driver(contact_point, keyspace))
    report: dict[str, Any] = {}
    try:
        apply_schema(session, keyspace, schema)
        apply_coordination_schema(session, keyspace, schema)
        apply_accord_schema(session, default_accord_keyspace(keyspace), schema)
        with tempfile.TemporaryDirectory(prefix="recovery-bench-") as work:
            sidecars = LocalSidecars(
                directory=Path(work) / "sidecars",
                nodes=3,
                replication_factor=3,
                store="cassandra",
                cassandra={
                    "contact_points": [contact_point[0]],
                    "port": contact_point[1],
                    "keyspaces": [keyspace],
                },
            )
            async with running(sidecars, 90.0):
                report.update(
                    await _measure(
                        contact_point, keyspace, sidecars, quick, profile, work, cassandra_pids
                    )
                )
        if drop:
            for name in (keyspace, default_accord_keyspace(keyspace)):
                session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=DDL_TIMEOUT)
    finally:
        cluster.shutdown()
    return report


class Startable(Protocol):
    def start(self, timeout: float) -> None: ...

    def stop(self) -> None: ...


@contextlib.asynccontextmanager
async def running(processes: Startable, timeout: float) -> AsyncIterator[None]:
    """``processes`` started, and stopped afterwards, also when starting them failed
    halfway: LocalSidecars.start raises after some sidecars are already running (one that
    did not bind, a timeout), and those would outlive the bench."""
    try:
        await asyncio.to_thread(processes.start, timeout)
        yield
    finally:
        await asyncio.to_thread(processes.stop)


async def _measure(
    contact_point: tuple[str, int],
    keyspace: str,
    sidecars: Any,
    quick: bool,
    profile: bool,
    work: str,
    cassandra_pids: Sequence[int] = (),
) -> dict[str, Any]:
    report: dict[str, Any] = {}
    modes = {
        "ordered": {},
        "accord": {"commit-mode": "accord", "accord": {"sidecars": sidecars.addresses()}},
    }
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    pids = [sidecar.process.pid for sidecar in sidecars.sidecars.values() if sidecar.process]
    warm_up_started = time.perf_counter()
    report["warm_up_rounds"] = [
        {
            name: await _starts(
                contact_point,
                keyspace,
                recovery,
                quick,
                sidecar_pids=pids if name == "accord" else [],
                cassandra_pids=cassandra_pids,
                count=WARM_UP_STARTS,
            )
            for name, recovery in modes.items()
        }
        for _ in range(1 if quick else WARM_UP_ROUNDS)
    ]
    report["warm_up_seconds"] = round(time.perf_counter() - warm_up_started, 1)
    # Both modes at the usual 32 starts in flight, then at 128: if the accord mode were
    # bound by its commit latency, more in flight would raise its rate.
    for key, concurrency in (("starts", 32), ("starts_128_in_flight", 128)):
        rounds: list[dict[str, Any]] = []
        for index in range(1 if quick else MEASURED_ROUNDS):
            order = list(modes.items())
            if index % 2:
                order.reverse()
            rounds.append(
                {
                    name: await _starts(
                        contact_point,
                        keyspace,
                        recovery,
                        quick,
                        concurrency=concurrency,
                        sidecar_pids=pids if name == "accord" else [],
                        cassandra_pids=cassandra_pids,
                    )
                    for name, recovery in order
                }
            )
        report[key] = median_rounds(rounds)
        report[f"{key}_rounds"] = rounds
    report["tombstones"] = {
        name: await _tombstones(contact_point, keyspace, recovery, quick)
        for name, recovery in modes.items()
    }
    if profiler is not None:
        profiler.disable()
        report["profile_top"] = _top(profiler)
    report["reinvocations"] = {
        f"{n}_node{'s' if n > 1 else ''}": await _reinvocations(
            contact_point, keyspace, n, quick, Path(work)
        )
        for n in (1, 2)
    }
    return report


def median_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and kind, the median of each figure over ``rounds``; for every mode, its
    rate relative to the ordered mode's *in the same round* (``of_ordered``: median, min,
    max), since the two ran side by side there."""
    out: dict[str, Any] = {}
    for mode in rounds[0]:
        merged: dict[str, Any] = {"concurrency": rounds[0][mode]["concurrency"]}
        for kind in ("create", "saga"):
            items = [r[mode][kind] for r in rounds]
            figure: dict[str, Any] = {}
            for name, first in items[0].items():
                values = [item[name] for item in items]
                numbers = [v for v in values if isinstance(v, int | float)]
                figure[name] = (
                    round(statistics.median(numbers), 2) if len(numbers) == len(values) else first
                )
            ratios = [
                r[mode][kind]["starts_per_second"] / r["ordered"][kind]["starts_per_second"]
                for r in rounds
            ]
            figure["of_ordered"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
            merged[kind] = figure
        out[mode] = merged
    return out


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Tables (and bar plots) for ``python -m bench recovery`` (bench/report.py format)."""
    from bench.report import figure

    layer = f"plain loopback; {report.get('cassandra', 'Cassandra')}; 3 Accord sidecars"
    starts = report["starts"]
    modes = list(starts)
    rows = []
    for key in ("starts", "starts_128_in_flight"):
        for mode in report.get(key, {}):
            for kind in ("create", "saga"):
                item = report[key][mode][kind]
                ratio = item["of_ordered"]
                spread = (
                    ""
                    if ratio["min"] == ratio["max"]
                    else f" ({ratio['min']:.0%}-{ratio['max']:.0%})"
                )
                rows.append(
                    [
                        mode,
                        kind,
                        report[key][mode]["concurrency"],
                        item["starts_per_second"],
                        f"{ratio['median']:.0%}{spread}",
                        item["client_mutations_per_start"],
                        item["server_writes_per_start"],
                        item["accord_transactions_per_start"],
                        item.get("sidecar_cpu_ms_per_start", "—") if mode == "accord" else "—",
                        item.get("cassandra_cpu_ms_per_start") or "—",
                        item.get("client_cpu_ms_per_start", "—"),
                        item.get("accord_retries", "—") if mode == "accord" else "—",
                        item.get("load_average_1m", "—"),
                    ]
                )
    reinvocations = report["reinvocations"]
    tombstones = report["tombstones"]
    return [
        figure(
            "starts",
            "Saga starts per second and writes per start, per commit mode",
            layer=layer,
            method="create = watchdog + es_transaction; saga = a whole one-step saga; after an "
            f"unmeasured warm-up of both modes ({WARM_UP_ROUNDS} rounds of {WARM_UP_STARTS} of "
            "each kind, 32 in flight) on the same node; medians of "
            f"{MEASURED_ROUNDS} rounds (1 with --quick), the modes' order alternating, "
            "'of ordered' the median (min-max) of each round's "
            "ratio. Client writes counted by the store's CqlSession; server "
            "writes from Cassandra's system_views.local_write_latency (partition updates; Accord "
            "rows once: one writing sidecar per shard).",
            columns=[
                "mode",
                "what",
                "in flight",
                "starts/s",
                "of ordered",
                "client writes/start",
                "server writes/start",
                "accord txns/start",
                "sidecar CPU ms/start",
                "Cassandra CPU ms/start",
                "client CPU ms/start",
                "accord retries",
                "load avg (1 min)",
            ],
            rows=rows,
            plot={
                "kind": "bar",
                "x": modes,
                "series": {
                    kind: [starts[m][kind]["starts_per_second"] for m in modes]
                    for kind in ("create", "saga")
                },
                "ylabel": "starts / s",
                "logy": True,
            },
        ),
        figure(
            "reinvocations",
            "Re-invocations per second with 1 and 2 Retry-Node processes",
            layer=layer,
            method="real Orchestrator.resume of one-step sagas from one window, 64 writer "
            "instances, concurrency 100, static ring halves, processes released together.",
            columns=["nodes", "rows", "total/s", "per node/s"],
            rows=[
                [
                    name,
                    item["rows"],
                    item["reinvocations_per_second_total"],
                    ", ".join(str(v) for v in item["reinvocations_per_second_per_node"]),
                ]
                for name, item in reinvocations.items()
            ],
            plot={
                "kind": "bar",
                "x": list(reinvocations),
                "series": {
                    "total/s": [i["reinvocations_per_second_total"] for i in reinvocations.values()]
                },
                "ylabel": "re-invocations / s",
            },
        ),
        figure(
            "tombstones",
            "Tombstone cells read per Retry-Node Tier-5 query (Cassandra trace)",
            layer=layer,
            method="TRACING of the Retry-Node's Tier-5 page reads (summed over the writer's "
            "lanes); the odd bucket's sagas all completed (both modes delete each released "
            "watchdog row).",
            columns=["mode", "bucket", "live rows", "tombstone cells", "read by the pass"],
            rows=[
                [
                    mode,
                    bucket,
                    tombstones[mode][f"tier5_{bucket}_bucket_read"]["live_rows"],
                    tombstones[mode][f"tier5_{bucket}_bucket_read"]["tombstone_cells"],
                    True if bucket == "even" else tombstones[mode]["odd_bucket_read_by_pass"],
                ]
                for mode in tombstones
                for bucket in ("even", "odd")
            ],
        ),
    ]


def _top(profiler: cProfile.Profile, entries: int = 15) -> list[str]:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(entries)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-entries:]


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    """Measure and return the figures (see the module docstring)."""
    report: dict[str, Any] = {"suite": "recovery_engine", "cores": os.cpu_count()}
    existing = os.environ.get(CONTACT_POINT_ENV)
    if existing:
        host, _, port = existing.partition(":")
        report["cassandra"] = f"existing node {existing}"
        drop = not existing_cluster_disposable()
        report.update(asyncio.run(_run_on((host, int(port or 9042)), quick, profile, drop=drop)))
        report["figures"] = figures(report)
        return report
    from accord_cassandra.launcher import ClusterSpec, LocalCluster

    node_ip = os.environ.get(NODE_IP_ENV, BENCH_NODE_IP)
    with tempfile.TemporaryDirectory(prefix="recovery-bench-node-") as base_dir:
        spec = ClusterSpec(nodes=1, first_ip=node_ip, cluster_name="recovery_bench")
        cluster = LocalCluster(spec, Path(base_dir))
        try:
            cluster.start()
            pid = cluster.node_pid(1)
            report["cassandra"] = f"1 local node, Cassandra {spec.version}, heap {spec.heap_mb} MiB"
            node = (node_ip, spec.native_port)
            pids = [pid] if pid is not None else []
            report.update(asyncio.run(_run_on(node, quick, profile, cassandra_pids=pids)))
        finally:
            cluster.stop(clean=True)
    report["figures"] = figures(report)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--retry-node":
        print(json.dumps(asyncio.run(_node_process(json.loads(sys.argv[2])))))
    else:
        print(
            json.dumps(run(quick="--quick" in sys.argv, profile="--profile" in sys.argv), indent=2)
        )
