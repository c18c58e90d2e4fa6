"""Saga steps driven through a real Kafka broker, on a real Cassandra node.

Kafka delivers at least once; these tests make it deliver more than once on purpose (every
step command published twice, a partition replayed from offset 0 by a second group, a worker
SIGKILLed before its offset commit) and count how often each step's logic ran in the
``kafka_effects`` table.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.kafka import KafkaProperties
from stacksaga_store.config.settings import load_settings
from stacksaga_store.kafka.messages import Outcome, encode_step
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.orchestrator import StepEvent
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.states import ExecutionType, RunningStatus, step_id
from tests.kafka._helpers import effects, read_topic, wait_caught_up, wait_final
from tests.kafka._sagas import STEPS, order_saga
from tests.stacksaga.conftest import run

ROOT = Path(__file__).resolve().parents[2]
SAGAS = {
    "STRICT": ("order-strict", "payment-saga"),
    "RELAXED": ("order-relaxed", "notification-saga"),
}
PROCESS_DEADLINE = 120.0


async def _setup(
    overrides: dict[str, Any], driver_config: DriverConfig
) -> tuple[StoreRuntime, dict[str, Saga], Any]:
    settings = load_settings(**overrides)
    # The worker retries a busy lease itself, with a short backoff: waiting out a 60 s
    # lease in the protection would stall the partition for a step that takes milliseconds.
    runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
    keyspace = runtime.driver_config.keyspace
    sagas = {
        mode: await order_saga(runtime.cql, keyspace, name=name, domain=domain)
        for mode, (name, domain) in SAGAS.items()
    }
    return runtime, sagas, runtime.orchestrator(sagas=list(sagas.values()))


async def _effects(runtime: StoreRuntime, txn: uuid.UUID) -> list[tuple[str, str, int]]:
    loop = asyncio.get_running_loop()
    keyspace = runtime.driver_config.keyspace
    return await loop.run_in_executor(None, effects, runtime.cql.session, keyspace, txn)


async def _marker_written(runtime: StoreRuntime, txn: uuid.UUID, step: str) -> int:
    instance = runtime.settings.instance
    keyspace = runtime.driver_config.keyspace

    def query() -> int:
        row = runtime.cql.session.execute(
            f"SELECT execution_state, WRITETIME(execution_state) AS written "
            f"FROM {keyspace}.es_execution_markers WHERE region = %s AND cluster = %s AND "
            "service_name = %s AND transaction_id = %s AND step_id = %s",
            [
                instance.region,
                instance.cluster,
                instance.service_name,
                txn,
                step_id(step, ExecutionType.EXECUTE),
            ],
        ).one()
        assert row is not None and row["execution_state"] == "COMMITTED", row
        return int(row["written"])

    return await asyncio.get_running_loop().run_in_executor(None, query)


async def _duplicate_every_command(
    kafka: KafkaProperties, topic: str, stop: asyncio.Event, sent: set[tuple[str, str]]
) -> None:
    """Watch the outcomes topic; publish each next-step command a second time."""
    consumer = AIOKafkaConsumer(
        kafka.outcomes_topic,
        bootstrap_servers=kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    outcome = Outcome.decode(record.value)
                    if outcome.next_step is None or outcome.next_type is None:
                        continue
                    key = (str(outcome.transaction_id), outcome.next_step)
                    if key in sent:
                        continue
                    sent.add(key)
                    event = StepEvent(outcome.transaction_id, outcome.next_step, outcome.next_type)
                    await producer.send_and_wait(topic, encode_step(event), key=record.key)
    finally:
        await producer.stop()
        await consumer.stop()


@pytest.mark.parametrize("mode", ["STRICT", "RELAXED"])
def test_duplicate_and_replayed_step_events_run_each_step_once(
    mode: str,
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    """Every step command is published twice, then a second consumer group replays the
    steps topic from offset 0. STRICT: each step's logic ran exactly once. RELAXED: no run
    of a step's logic is later than its COMMITTED marker, and the replay ran nothing."""

    async def body() -> None:
        runtime, sagas, orchestrator = await _setup(kafka_overrides(), driver_config)
        kafka = runtime.settings.kafka
        saga = sagas[mode]
        topic = kafka.steps_topic(saga.domain)
        publisher = StepPublisher(orchestrator, kafka)
        await publisher.start()
        workers = [StepWorker(orchestrator, kafka, name=f"w{i}") for i in range(2)]
        stop = asyncio.Event()
        sent: set[tuple[str, str]] = set()
        duplicator = asyncio.create_task(_duplicate_every_command(kafka, topic, stop, sent))
        try:
            for worker in workers:
                await worker.start()
            txns = []
            for i in range(6):
                txn = uuid.uuid4()
                await publisher.start_saga(saga, {"order": i}, transaction_id=txn)
                # The first command, published a second time.
                await publisher.publish(saga, StepEvent(txn, STEPS[0]))
                txns.append(txn)
            statuses = await wait_final(orchestrator, txns)
            assert set(statuses.values()) == {RunningStatus.PROCESS_COMPLETED}
            await wait_caught_up(kafka, kafka.group_id, topic)
            stop.set()
            await duplicator
            # Every step after the first was also published a second time (the first one
            # too, when a duplicate's outcome was read before the step's tryout was written).
            assert sent >= {(str(t), s) for t in txns for s in STEPS[1:]}
            before = {txn: await _effects(runtime, txn) for txn in txns}

            replay_kafka = kafka.model_copy(update={"group_id": f"{kafka.group_id}-replay"})
            replay = StepWorker(orchestrator, replay_kafka, name="replay")
            await replay.start()
            try:
                await wait_caught_up(replay_kafka, replay_kafka.group_id, topic)
            finally:
                await replay.stop()
            assert replay.counts.get("EXECUTED", 0) == 0, replay.counts
            assert replay.counts.get("STALE", 0) >= 2 * len(txns) * len(STEPS), replay.counts

            for txn in txns:
                runs = await _effects(runtime, txn)
                assert runs == before[txn], "the replay ran a step's logic"
                steps_run = sorted(step for step, _, _ in runs)
                if mode == "STRICT":
                    assert steps_run == sorted(STEPS), (txn, runs)
                else:
                    assert set(steps_run) == set(STEPS), (txn, runs)
                    for step in STEPS:
                        committed_at = await _marker_written(runtime, txn, step)
                        late = [w for s, _, w in runs if s == step and w > committed_at]
                        assert not late, f"{txn} {step} ran after its marker was committed"
            executed = sum(w.counts.get("EXECUTED", 0) for w in workers)
            if mode == "STRICT":
                assert executed == len(txns) * len(STEPS)
        finally:
            stop.set()
            await asyncio.gather(duplicator, return_exceptions=True)
            for worker in workers:
                await worker.stop()
            await publisher.stop()
            await runtime.close()

    run(body())


class _WorkerProcess:
    """tests/kafka/_worker_proc.py in a subprocess; its stdout lines are collected."""

    def __init__(self, job: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kafka._worker_proc", json.dumps(job)],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.strip())
                self._changed.notify_all()

    def wait_line(self, prefix: str, timeout: float = PROCESS_DEADLINE) -> str:
        with self._changed:
            found = self._changed.wait_for(
                lambda: (
                    any(x.startswith(prefix) for x in self.lines) or self.proc.poll() is not None
                ),
                timeout,
            )
            matches = [x for x in self.lines if x.startswith(prefix)]
        assert found and matches, f"worker never printed {prefix!r}; exit {self.proc.poll()}"
        return matches[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)  # EOF once the process is gone
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()


def test_sigkill_before_the_offset_commit_redelivers_and_strict_runs_the_step_once(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
    node_driver_text: str,
) -> None:
    """Worker A runs `charge` (marker COMMITTED, tryout written) and is SIGKILLed before it
    publishes the next event or commits the offset. Worker B gets the partition, the charge
    command again, and finishes the saga; charge's logic ran once."""
    overrides = kafka_overrides()
    job = {
        "overrides": overrides,
        "driver": node_driver_text,
        "sagas": [list(SAGAS["STRICT"])],
        "name": "A",
        "hang_after": "charge",
    }
    worker_a = _WorkerProcess(job)

    async def body() -> None:
        runtime, sagas, orchestrator = await _setup(overrides, driver_config)
        kafka = runtime.settings.kafka
        publisher = StepPublisher(orchestrator, kafka)
        await publisher.start()
        worker_b: StepWorker | None = None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, worker_a.wait_line, "READY")
            txn = await publisher.start_saga(sagas["STRICT"], {"order": 1})
            hung = await loop.run_in_executor(None, worker_a.wait_line, "HUNG")
            assert hung == f"HUNG {txn} charge"
            await loop.run_in_executor(None, worker_a.kill)
            worker_b = StepWorker(orchestrator, kafka, name="B")
            await worker_b.start()
            statuses = await wait_final(orchestrator, [txn])
            assert statuses[txn] is RunningStatus.PROCESS_COMPLETED
            runs = sorted(step for step, _, _ in await _effects(runtime, txn))
            assert runs == sorted(STEPS), runs
            outcomes = [
                Outcome.decode(r.value) for r in await read_topic(kafka, kafka.outcomes_topic)
            ]
            redelivered = [o for o in outcomes if o.worker == "B" and o.step == "charge"]
            assert redelivered, f"worker B never got the charge command again: {outcomes}"
            assert all(o.outcome in ("STALE", "ALREADY_COMMITTED") for o in redelivered)
        finally:
            if worker_b is not None:
                await worker_b.stop()
            await publisher.stop()
            await runtime.close()

    try:
        run(body())
    finally:
        worker_a.kill()


def test_poison_events_go_to_the_dead_letter_topic_and_the_partition_keeps_flowing(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    """Bad bytes and a command for an unknown transaction, on the partition of a live saga
    (same key), ahead of its first command: both land on the dead-letter topic with their
    reason, and the saga behind them completes."""

    async def body() -> None:
        runtime, sagas, orchestrator = await _setup(kafka_overrides(), driver_config)
        kafka = runtime.settings.kafka
        saga = sagas["RELAXED"]
        topic = kafka.steps_topic(saga.domain)
        publisher = StepPublisher(orchestrator, kafka)
        await publisher.start()
        worker = StepWorker(orchestrator, kafka, name="w")
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await producer.start()
        try:
            txn = uuid.uuid4()
            key = str(txn).encode()
            await producer.send_and_wait(topic, b"\xff\x00 not json", key=key)
            unknown = StepEvent(uuid.uuid4(), "reserve")
            await producer.send_and_wait(topic, encode_step(unknown), key=key)
            await worker.start()
            await publisher.start_saga(saga, {"order": 7}, transaction_id=txn)
            statuses = await wait_final(orchestrator, [txn])
            assert statuses[txn] is RunningStatus.PROCESS_COMPLETED
            # Offsets are committed after the dead-letter send: once caught up, both are there.
            await wait_caught_up(kafka, kafka.group_id, topic)
            dead = await read_topic(kafka, kafka.dead_letter_topic)
            reasons = sorted(dict(r.headers)["stacksaga.reason"].decode() for r in dead)
            assert len(dead) == 2, reasons
            assert reasons[0].startswith("undecodable"), reasons
            assert reasons[1].startswith("unknown saga or transaction"), reasons
            assert {r.value for r in dead} == {b"\xff\x00 not json", encode_step(unknown)}
        finally:
            await producer.stop()
            await worker.stop()
            await publisher.stop()
            await runtime.close()

    run(body())


def test_rebalance_under_load_every_saga_completes_once(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    """20 STRICT sagas with slow steps on two workers; a third worker joins mid-run (and is
    given partitions), then one of the first two leaves (the other two take its partitions).
    Every saga completes and every step's logic ran once; one saga is turned around
    (fail_at), so compensations flow through Kafka too."""

    async def body() -> None:
        runtime, sagas, orchestrator = await _setup(kafka_overrides(), driver_config)
        kafka = runtime.settings.kafka
        saga = sagas["STRICT"]
        publisher = StepPublisher(orchestrator, kafka)
        await publisher.start()
        workers = [StepWorker(orchestrator, kafka, name=f"w{i}") for i in range(3)]
        running: list[StepWorker] = []
        try:
            for worker in workers[:2]:
                await worker.start()
                running.append(worker)
            txns = [
                await publisher.start_saga(
                    saga, {"order": i, "hold": 0.2, **({"fail_at": "charge"} if i == 0 else {})}
                )
                for i in range(20)
            ]
            await _wait_progress(orchestrator, txns, steps=10)
            await workers[2].start()  # joins: a rebalance while steps run
            running.append(workers[2])
            await _wait_for(lambda: bool(workers[2].assigned), "the joiner gets partitions")
            every = len(workers[0].topics) * kafka.partitions  # one steps topic per domain
            await workers[0].stop()  # leaves: another rebalance
            running.remove(workers[0])
            await _wait_for(
                lambda: len(workers[1].assigned) + len(workers[2].assigned) == every,
                "the two remaining workers hold every partition",
            )
            statuses = await wait_final(orchestrator, txns)
            assert statuses[txns[0]] is RunningStatus.REVERT_COMPLETED
            assert {statuses[t] for t in txns[1:]} == {RunningStatus.PROCESS_COMPLETED}
            for txn in txns:
                runs = sorted(step for step, _, _ in await _effects(runtime, txn))
                expected = ["charge", "release", "reserve"] if txn == txns[0] else sorted(STEPS)
                assert runs == expected, (txn, runs)
            assert all(w.counts.get("DEAD_LETTER", 0) == 0 for w in workers)
        finally:
            for worker in running:
                await worker.stop()
            await publisher.stop()
            await runtime.close()

    run(body())


async def _wait_progress(orchestrator: Any, txns: list[uuid.UUID], *, steps: int) -> None:
    """Until the sagas together have at least ``steps`` tryout rows."""
    deadline = asyncio.get_running_loop().time() + PROCESS_DEADLINE
    while True:
        done = 0
        for txn in txns:
            done += len((await orchestrator.read(txn)).tryouts)
        if done >= steps:
            return
        assert asyncio.get_running_loop().time() < deadline, f"only {done} steps done"
        await asyncio.sleep(0.2)


async def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + PROCESS_DEADLINE
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.1)
