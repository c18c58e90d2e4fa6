"""Saga steps through a real Kafka broker vs direct execution, same Cassandra node, same run.

``run(quick=..., profile=...)`` starts one KRaft broker (127.0.73.9, ``STACKSAGA_BENCH_KAFKA_IP``
moves it; ``STACKSAGA_BENCH_KAFKA_BOOTSTRAP=host:port`` uses a running one) and one Cassandra
node (127.0.77.1 as bench.saga_store, ``STACKSAGA_BENCH_CONTACT_POINT`` uses a running one),
and measures a 3-step saga whose steps do nothing, for STRICT and RELAXED_WITH_DEDUP:

* ``kafka.sagas_per_second``: ``count`` sagas started at once through Kafka (two workers of one
  group in this process, 3 partitions), until all are PROCESS_COMPLETED;
* ``kafka.saga_latency_ms`` / ``kafka.step_latency_ms``: one saga at a time, start to final,
  and between consecutive outcome events of a saga (broker timestamps), p50/p99;
* ``direct.*``: the same sagas through ``Orchestrator.start`` (no Kafka);
* ``cpu_ms_per_step``: CPU of this process (client, workers, driver) and of the broker JVM
  over the Kafka runs, divided by the steps executed;
* ``broker``: start seconds and RSS.

Figures are from whatever machine runs it; nothing asserts on time. ``python -m bench kafka``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka
from stacksaga_store.kafka.messages import Outcome
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.schema import apply_schema
from stacksaga_store.store.states import FINAL_STATUSES

KAFKA_IP_ENV = "STACKSAGA_BENCH_KAFKA_IP"
KAFKA_BOOTSTRAP_ENV = "STACKSAGA_BENCH_KAFKA_BOOTSTRAP"
CONTACT_POINT_ENV = "STACKSAGA_BENCH_CONTACT_POINT"
NODE_IP_ENV = "STACKSAGA_BENCH_NODE_IP"
MODES = {"STRICT": "payment-saga", "RELAXED_WITH_DEDUP": "notification-saga"}
STEPS = 3


def _saga(domain: str) -> Saga:
    async def nothing(ctx: StepContext) -> None:
        return None

    steps = tuple(Step(f"s{i}", nothing, nothing) for i in range(STEPS))
    return Saga(f"bench-{domain}", steps, domain=domain)


def _settings(bootstrap: str, prefix: str) -> StackSagaSettings:
    return load_settings(
        cassandra={
            "write-protection": {
                "default-mode": "RELAXED_WITH_DEDUP",
                "domains": {
                    "payment-saga": {"mode": "STRICT", "lease-duration": "30s"},
                    "notification-saga": {"mode": "RELAXED_WITH_DEDUP"},
                },
            },
            "schema": {"replication-strategy": "SimpleStrategy", "replication-factor": 1},
        },
        instance={"region": "bench", "cluster": "bench", "service-name": prefix},
        kafka={"bootstrap-servers": bootstrap, "topic-prefix": prefix, "group-id": prefix},
    )


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 1), "p99": round(p99, 1), "n": len(values)}


async def _wait_final(orchestrator: Orchestrator, txns: list[uuid.UUID]) -> None:
    pending = set(txns)
    deadline = time.monotonic() + 600
    while pending and time.monotonic() < deadline:
        for txn in list(pending):
            if (await orchestrator.read(txn)).status in FINAL_STATUSES:
                pending.discard(txn)
        if pending:
            await asyncio.sleep(0.05)
    if pending:
        raise RuntimeError(f"{len(pending)} sagas not final after 600 s")


def _jvm_cpu_seconds(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _step_gaps(settings: StackSagaSettings, txns: set[uuid.UUID]) -> list[float]:
    """Milliseconds between consecutive outcome events of each saga (broker timestamps)."""
    consumer = AIOKafkaConsumer(
        settings.kafka.outcomes_topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    stamps: dict[uuid.UUID, list[int]] = {}
    try:
        idle = 0
        while idle < 5:
            batch = await consumer.getmany(timeout_ms=200)
            idle = 0 if batch else idle + 1
            for records in batch.values():
                for record in records:
                    outcome = Outcome.decode(record.value)
                    if outcome.transaction_id in txns and outcome.outcome == "EXECUTED":
                        stamps.setdefault(outcome.transaction_id, []).append(record.timestamp)
    finally:
        await consumer.stop()
    gaps: list[float] = []
    for times in stamps.values():
        times.sort()
        gaps.extend(float(b - a) for a, b in itertools.pairwise(times))
    return gaps


async def _kafka_mode(
    runtime: StoreRuntime, settings: StackSagaSettings, saga: Saga, count: int, serial: int
) -> dict[str, Any]:
    orchestrator = runtime.orchestrator(sagas=[saga])
    publisher = StepPublisher(orchestrator, settings.kafka)
    await publisher.start()
    workers = [StepWorker(orchestrator, settings.kafka, name=f"bench-{i}") for i in range(2)]
    try:
        for worker in workers:
            await worker.start()
        await _wait_final(orchestrator, [await publisher.start_saga(saga, {"warm": 1})])
        started = time.monotonic()
        txns = list(
            await asyncio.gather(*(publisher.start_saga(saga, {"n": i}) for i in range(count)))
        )
        await _wait_final(orchestrator, txns)
        elapsed = time.monotonic() - started
        latencies: list[float] = []
        serial_txns: set[uuid.UUID] = set()
        for i in range(serial):
            begun = time.monotonic()
            txn = await publisher.start_saga(saga, {"serial": i})
            serial_txns.add(txn)
            await _wait_final(orchestrator, [txn])
            latencies.append((time.monotonic() - begun) * 1000)
        gaps = await _step_gaps(settings, serial_txns)
        return {
            "sagas_per_second": round(count / elapsed, 1),
            "saga_latency_ms": _pct(latencies),
            "step_latency_ms": _pct(gaps),
            "steps_executed": sum(w.counts.get("EXECUTED", 0) for w in workers),
        }
    finally:
        for worker in workers:
            await worker.stop()
        await publisher.stop()


async def _direct_mode(
    runtime: StoreRuntime, saga: Saga, count: int, serial: int
) -> dict[str, Any]:
    orchestrator = runtime.orchestrator(sagas=[saga])
    await orchestrator.start(saga, {"warm": 1})
    started = time.monotonic()
    await asyncio.gather(*(orchestrator.start(saga, {"n": i}) for i in range(count)))
    elapsed = time.monotonic() - started
    latencies = []
    for i in range(serial):
        begun = time.monotonic()
        await orchestrator.start(saga, {"serial": i})
        latencies.append((time.monotonic() - begun) * 1000)
    return {"sagas_per_second": round(count / elapsed, 1), "saga_latency_ms": _pct(latencies)}


async def _measure(
    bootstrap: str, contact_point: tuple[str, int], broker_pid: int | None, quick: bool
) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    settings = _settings(bootstrap, prefix)
    keyspace = f"stacksaga_kbench_{uuid.uuid4().hex[:8]}"
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
    finally:
        cluster.shutdown()
    count, serial = (10, 5) if quick else (100, 30)
    runtime = await open_runtime(settings, driver_config=config, lease_waits_max=0)
    report: dict[str, Any] = {"sagas": count, "serial_sagas": serial, "steps_per_saga": STEPS}
    try:
        for mode, domain in MODES.items():
            saga = _saga(domain)
            cpu0, jvm0 = time.process_time(), _jvm_cpu_seconds(broker_pid)
            through_kafka = await _kafka_mode(runtime, settings, saga, count, serial)
            cpu1, jvm1 = time.process_time(), _jvm_cpu_seconds(broker_pid)
            steps = max(1, through_kafka["steps_executed"])
            cpu = {"client_ms": round((cpu1 - cpu0) * 1000 / steps, 2)}
            if jvm0 is not None and jvm1 is not None:
                cpu["broker_ms"] = round((jvm1 - jvm0) * 1000 / steps, 2)
            report[mode] = {
                "kafka": through_kafka,
                "direct": await _direct_mode(runtime, saga, count, serial),
                "cpu_ms_per_step": cpu,
            }
    finally:
        await runtime.close()
    return report


def _with_cassandra(bootstrap: str, broker_pid: int | None, quick: bool) -> dict[str, Any]:
    existing = os.environ.get(CONTACT_POINT_ENV)
    if existing:
        host, _, port = existing.partition(":")
        return asyncio.run(_measure(bootstrap, (host, int(port or 9042)), broker_pid, quick))
    from accord_cassandra.launcher import ClusterSpec, LocalCluster

    node_ip = os.environ.get(NODE_IP_ENV, "127.0.77.1")
    with tempfile.TemporaryDirectory(prefix="stacksaga-kbench-") as base_dir:
        cluster = LocalCluster(
            ClusterSpec(nodes=1, first_ip=node_ip, cluster_name="kafka_bench"), Path(base_dir)
        )
        cluster.start()
        try:
            return asyncio.run(
                _measure(bootstrap, (node_ip, cluster.native_port), broker_pid, quick)
            )
        finally:
            cluster.stop(clean=True)


def _figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for mode in MODES:
        kafka, direct = report[mode]["kafka"], report[mode]["direct"]
        cpu = report[mode]["cpu_ms_per_step"]
        rows.append(
            [
                mode,
                kafka["sagas_per_second"],
                direct["sagas_per_second"],
                f"{kafka['saga_latency_ms'].get('p50')} / {kafka['saga_latency_ms'].get('p99')}",
                f"{direct['saga_latency_ms'].get('p50')} / {direct['saga_latency_ms'].get('p99')}",
                f"{kafka['step_latency_ms'].get('p50')} / {kafka['step_latency_ms'].get('p99')}",
                cpu.get("client_ms"),
                cpu.get("broker_ms", "-"),
            ]
        )
    return [
        {
            "title": "3-step saga: through Kafka vs direct (Orchestrator.start)",
            "layer": "real KRaft broker (one JVM) and one real Cassandra node, loopback",
            "method": (
                f"{report['sagas']} sagas at once for sagas/s; {report['serial_sagas']} one at a "
                "time for latencies; step latency = gap between a saga's outcome events"
            ),
            "columns": [
                "mode",
                "kafka sagas/s",
                "direct sagas/s",
                "kafka saga ms p50/p99",
                "direct saga ms p50/p99",
                "kafka step ms p50/p99",
                "client CPU ms/step",
                "broker CPU ms/step",
            ],
            "rows": rows,
        }
    ]


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    """Measure and return the figures (see the module docstring); ``profile`` is unused."""
    report: dict[str, Any] = {"suite": "kafka"}
    existing = os.environ.get(KAFKA_BOOTSTRAP_ENV)
    if existing:
        report["broker"] = f"existing broker {existing}"
        report.update(_with_cassandra(existing, None, quick))
        report["figures"] = _figures(report)
        return report
    with tempfile.TemporaryDirectory(prefix="stacksaga-kbench-broker-") as base_dir:
        spec = BrokerSpec(brokers=1, first_ip=os.environ.get(KAFKA_IP_ENV, "127.0.73.9"))
        kafka = LocalKafka(spec, Path(base_dir))
        kafka.start()
        try:
            report["broker"] = {
                "version": spec.version,
                "heap_mb": spec.heap_mb,
                "start_seconds": round(kafka.started_seconds or 0.0, 1),
                "rss_mib_after_start": round(kafka.rss_mib(1) or 0.0),
            }
            report.update(_with_cassandra(spec.bootstrap_servers, kafka.pid(1), quick))
            report["broker"]["rss_mib_after_run"] = round(kafka.rss_mib(1) or 0.0)
        finally:
            kafka.stop(clean=True)
    report["figures"] = _figures(report)
    report["notes"] = [f"broker: {report['broker']}"]
    return report
