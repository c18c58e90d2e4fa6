"""``make demo-kafka``: a 3-step saga flowing through a real Kafka broker, with a duplicate.

Starts one KRaft broker and one Cassandra node (local JVMs, deleted afterwards), applies the
saga schema, runs two step workers in one consumer group and starts an order saga through
Kafka. Its first step command is published twice: one delivery runs the step, the other is
turned away (STALE or ALREADY_COMMITTED). The outcomes topic is printed as it flows, then
the transaction's tryout history, and how often each step's logic ran (once each).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from accord_cassandra.launcher import ClusterSpec, LocalCluster
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka
from stacksaga_store.kafka.messages import Outcome
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import StepEvent
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.schema import apply_schema
from stacksaga_store.store.states import FINAL_STATUSES

__all__ = ["main"]

ENV_CASSANDRA_IP = "STACKSAGA_KAFKA_DEMO_CASSANDRA_IP"
KEYSPACE = "stacksaga_kafka_demo"


def _settings(bootstrap: str) -> StackSagaSettings:
    return load_settings(
        cassandra={
            "write-protection": {
                "default-mode": "RELAXED_WITH_DEDUP",
                "domains": {"payment-saga": {"mode": "STRICT", "lease-duration": "30s"}},
            },
            "schema": {"replication-strategy": "SimpleStrategy", "replication-factor": 1},
        },
        instance={"region": "demo", "cluster": "demo", "service-name": "orders"},
        kafka={"bootstrap-servers": bootstrap, "topic-prefix": "demo", "group-id": "demo-workers"},
    )


def _saga(ran: Counter[str]) -> Saga:
    def step(name: str) -> Any:
        async def run(ctx: StepContext) -> dict[str, Any]:
            ran[name] += 1
            print(f"    [logic] {name} ran (attempt {ctx.attempt}, key {ctx.idempotency_key})")
            return {name: "done"}

        return run

    steps = (
        Step("reserve-stock", step("reserve-stock"), step("release-stock")),
        Step("charge-card", step("charge-card"), step("refund-card")),
        Step("ship", step("ship")),
    )
    return Saga("order", steps, domain="payment-saga")


async def _watch(settings: StackSagaSettings, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        settings.kafka.outcomes_topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    o = Outcome.decode(record.value)
                    nxt = f" -> publishes {o.next_step}" if o.next_step else ""
                    skipped = " (duplicate skipped)" if o.outcome != "EXECUTED" else ""
                    print(
                        f"  outcome: {o.step} by {o.worker}: {o.outcome}{skipped}, "
                        f"saga {o.status}{nxt}"
                    )
    finally:
        await consumer.stop()


async def _run(settings: StackSagaSettings, driver_config: DriverConfig, deadline: float) -> int:
    runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
    ran: Counter[str] = Counter()
    saga = _saga(ran)
    orchestrator = runtime.orchestrator(sagas=[saga])
    publisher = StepPublisher(orchestrator, settings.kafka)
    workers = [StepWorker(orchestrator, settings.kafka, name=f"worker-{i}") for i in (1, 2)]
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(settings, stop))
    try:
        await publisher.start()
        for worker in workers:
            await worker.start()
        txn = await publisher.start_saga(saga, {"order": 42, "item": "book"})
        print(f"saga {txn} started; its first step command is published twice")
        await publisher.publish(saga, StepEvent(txn, saga.step_names[0]))
        view = await orchestrator.read(txn)
        while view.status not in FINAL_STATUSES and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            view = await orchestrator.read(txn)
        await asyncio.sleep(1.0)  # let the last outcomes print
        # The final status is written with the last step, its tryout row right after.
        view = await orchestrator.read(txn)
        print(f"\ntransaction {txn}: {view.status.value}")
        for tryout in view.tryouts:
            print(f"  #{tryout.tryout_index} {tryout.executor:<14} {tryout.status.value}")
        print(f"step logic runs: {dict(ran)}")
        ok = view.status.value == "PROCESS_COMPLETED" and set(ran.values()) == {1}
        print("demo-kafka " + ("finished as expected" if ok else "did NOT end as expected"))
        return 0 if ok else 1
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)
        for worker in workers:
            await worker.stop()
        await publisher.stop()
        await runtime.close()


def main(*, seconds: float = 120.0) -> int:
    started = time.monotonic()
    cassandra_ip = os.environ.get(ENV_CASSANDRA_IP, "127.0.74.1")
    with tempfile.TemporaryDirectory(prefix="stacksaga-kafka-demo-") as base:
        kafka = LocalKafka(BrokerSpec(brokers=1), Path(base) / "kafka")
        cluster = LocalCluster(
            ClusterSpec(nodes=1, first_ip=cassandra_ip, cluster_name="kafka_demo"),
            Path(base) / "cassandra",
        )
        try:
            print(f"starting a Kafka broker on {kafka.spec.bootstrap_servers} ...")
            kafka.start()
            print(f"  ready in {kafka.started_seconds:.1f} s, rss {kafka.rss_mib(1):.0f} MiB")
            print(f"starting a Cassandra node on {cassandra_ip} ...")
            cluster.start()
            settings = _settings(kafka.spec.bootstrap_servers)
            driver_config = DriverConfig(
                contact_points=((cassandra_ip, cluster.native_port),),
                local_datacenter="datacenter1",
                session_keyspace=KEYSPACE,
                request_timeout=timedelta(seconds=20),
                origin="<demo-kafka>",
            )
            db, session = connect_sync(settings, driver_config)
            try:
                apply_schema(session, KEYSPACE, settings.cassandra.schema_)
            finally:
                db.shutdown()
            print(f"both up after {time.monotonic() - started:.1f} s\n")
            code = asyncio.run(_run(settings, driver_config, time.monotonic() + seconds))
            print(f"demo took {time.monotonic() - started:.1f} s in all")
            return code
        finally:
            cluster.stop(clean=True)
            kafka.stop(clean=True)
