"""The seed's retry and restore scenarios end to end through Kafka: the Retry-Node re-enters
each saga by publishing its next step command (``KafkaReentry``), and a worker of the group runs
it. Real broker, real Cassandra, the recovery engine on a manual clock (windows and delays are
moved by the test, not waited for).

Every run of a step's logic records which context ran it: a worker (its tasks inherit the
context the worker was started in) or anything else. A re-entry that bypassed Kafka would run
the step in the Retry-Node's dispatch, outside every worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import NonRetryableStepError, RetryableStepError
from stacksaga_store.kafka.messages import decode_step
from stacksaga_store.kafka.reentry import KafkaReentry
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.retry_node import RetryNode
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.cql import StatementKind
from stacksaga_store.store.protection import MarkerKey
from stacksaga_store.store.states import ExecutionType, RunningStatus, TryoutStatus, step_id
from tests.kafka._helpers import effects, read_topic, wait_caught_up, wait_final
from tests.stacksaga.conftest import run

MINUTE = timedelta(minutes=1)
DELAY_WINDOWS = 3
DEADLINE = 180.0
RUNNER: contextvars.ContextVar[str] = contextvars.ContextVar("runner", default="outside-worker")

Logic = Callable[[StepContext, str], Any]


class Rig:
    """One process's worker, publisher, recovery engine and Retry-Node, on a manual clock."""

    def __init__(
        self,
        runtime: StoreRuntime,
        engine: RecoveryEngine,
        clock: ManualClock,
        orchestrator: Orchestrator,
        publisher: StepPublisher,
        worker: StepWorker,
        reentry: KafkaReentry,
        node: RetryNode,
    ) -> None:
        self.runtime = runtime
        self.engine = engine
        self.clock = clock
        self.orchestrator = orchestrator
        self.publisher = publisher
        self.worker = worker
        self.reentry = reentry
        self.node = node

    async def close(self) -> None:
        await self.worker.stop()
        await self.publisher.stop()
        await self.engine.close()
        await self.runtime.close()

    async def advance_and_pass(self, windows: int) -> None:
        """Move the clock ``windows`` windows on and run one Retry-Node pass."""
        self.clock.advance(windows * MINUTE)
        await self.node.run_pass()

    async def step_commands(self, saga: Saga, txn: uuid.UUID) -> list[tuple[str, str]]:
        kafka = self.runtime.settings.kafka
        records = await read_topic(kafka, kafka.steps_topic(saga.domain))
        commands = [decode_step(r.value) for r in records if r.key == str(txn).encode()]
        return [(c.execution_type.value, c.step_name) for c in commands]


async def _rig(
    overrides: dict[str, Any], driver_config: DriverConfig, service: str, saga_of: Any
) -> tuple[Rig, Saga]:
    overrides["cassandra"]["recovery"] = {
        "window-interval-minutes": 1,
        "retry": {"lookback-days": 2},
        "restore": {"delay-windows": DELAY_WINDOWS},
    }
    overrides["cassandra"]["transaction"] = {"lifetime": "24h"}
    settings = load_settings(**overrides)
    runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    clock = ManualClock(now)
    engine = await RecoveryEngine.open(runtime, clock=clock)
    saga = await saga_of(runtime)
    orchestrator = engine.orchestrator(sagas=[saga])
    kafka = settings.kafka
    publisher = StepPublisher(orchestrator, kafka)
    await publisher.start()
    reentry = KafkaReentry(orchestrator, publisher)
    node = engine.retry_node(orchestrator, StaticLeaseSource(service), reenter=reentry.resume)
    worker = StepWorker(orchestrator, kafka, name="w1")

    async def start_worker() -> None:
        RUNNER.set("worker")  # inherited by the worker's fetch loop and step tasks
        await worker.start()

    await asyncio.create_task(start_worker())
    return Rig(runtime, engine, clock, orchestrator, publisher, worker, reentry, node), saga


def _saga_factory(name: str, decide: Callable[[str, StepContext], None]) -> Any:
    """reserve (undo: release) -> charge (undo: refund) -> notify, STRICT domain. Each run of a
    step's logic inserts an effect row (worker = who ran it), then ``decide`` may raise."""

    async def build(runtime: StoreRuntime) -> Saga:
        keyspace = runtime.driver_config.keyspace
        insert = await runtime.cql.prepare(
            f"INSERT INTO {keyspace}.kafka_effects (transaction_id, step, run, worker) "
            "VALUES (?, ?, now(), ?)",
            kind=StatementKind.WRITE,
            table="kafka_effects",
        )

        def logic(label: str) -> Any:
            async def body(ctx: StepContext) -> dict[str, Any]:
                decide(label, ctx)  # a failure here ran no business logic: no effect row
                await runtime.cql.execute(insert, [ctx.transaction_id, label, RUNNER.get()])
                return {f"{label}_done": True}

            return body

        steps = (
            Step("reserve", logic("reserve"), logic("release")),
            Step("charge", logic("charge"), logic("refund")),
            Step("notify", logic("notify")),
        )
        return Saga(name, steps, domain="payment-saga")

    return build


async def _wait_status(
    orchestrator: Orchestrator, txn: uuid.UUID, wanted: RunningStatus
) -> RunningStatus:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while True:
        status = (await orchestrator.read(txn)).status
        if status is wanted:
            return status
        if loop.time() > end:
            raise AssertionError(f"{txn} is {status.value}, not {wanted.value}, after {DEADLINE} s")
        await asyncio.sleep(0.3)


async def _runs(rig: Rig, txn: uuid.UUID) -> list[tuple[str, str]]:
    """(step, who ran it) of every run of a step's logic, sorted."""
    loop = asyncio.get_running_loop()
    keyspace = rig.runtime.driver_config.keyspace
    rows = await loop.run_in_executor(None, effects, rig.runtime.cql.session, keyspace, txn)
    return sorted((step, who) for step, who, _ in rows)


def test_retryable_failure_is_retried_in_the_next_window_through_kafka(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
    service_name: str,
) -> None:
    """charge fails retryably once on the worker; the Retry-Node's pass in the next window
    publishes charge again; a worker runs it and the saga completes, each effect once."""
    failures = {"charge": 1}

    def decide(label: str, ctx: StepContext) -> None:
        if failures.get(label, 0) > 0:
            failures[label] -= 1
            raise RetryableStepError(f"{label}: HTTP 503")

    async def body() -> None:
        rig, saga = await _rig(
            kafka_overrides(), driver_config, service_name, _saga_factory("retry-saga", decide)
        )
        try:
            txn = await rig.publisher.start_saga(saga, {"order": 1})
            await _wait_status(rig.orchestrator, txn, RunningStatus.FAILED_WITH_RETRYABLE_ERROR)
            # The retry row is in W+1: a pass in W finds nothing.
            await rig.node.run_pass()
            assert (await rig.orchestrator.read(txn)).status is (
                RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            )
            await rig.advance_and_pass(1)
            assert rig.reentry.published == 1
            statuses = await wait_final(rig.orchestrator, [txn], DEADLINE)
            assert statuses[txn] is RunningStatus.PROCESS_COMPLETED
            assert await _runs(rig, txn) == [
                ("charge", "worker"),
                ("notify", "worker"),
                ("reserve", "worker"),
            ]
            commands = await rig.step_commands(saga, txn)
            assert commands.count(("EXECUTE", "charge")) == 2, commands
            # The watchdog's pickup later re-runs nothing.
            await rig.advance_and_pass(DELAY_WINDOWS + 1)
            kafka = rig.runtime.settings.kafka
            await wait_caught_up(kafka, kafka.group_id, kafka.steps_topic(saga.domain))
            assert len(await _runs(rig, txn)) == 3
        finally:
            await rig.close()

    run(body())


def test_stalled_sagas_are_restored_through_kafka_after_the_watchdog_delay(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
    service_name: str,
) -> None:
    """Two sagas created whose first command was never published (the publisher died right
    after creating them): nothing moves until the watchdog delay has passed; then the
    Retry-Node publishes their first step, and the workers complete one and compensate the
    other (its charge is refused)."""

    def decide(label: str, ctx: StepContext) -> None:
        if label == "charge" and ctx.aggregate.get("refuse"):
            raise NonRetryableStepError("card refused")

    async def body() -> None:
        rig, saga = await _rig(
            kafka_overrides(), driver_config, service_name, _saga_factory("restore-saga", decide)
        )
        try:
            completes = await rig.orchestrator.create(saga, {"order": 1})
            compensates = await rig.orchestrator.create(saga, {"order": 2, "refuse": True})
            await rig.advance_and_pass(DELAY_WINDOWS - 1)  # before the delay: not restored
            assert rig.reentry.published == 0
            await asyncio.sleep(1.0)
            for txn in (completes, compensates):
                assert (await rig.orchestrator.read(txn)).status is RunningStatus.STARTED
                assert await _runs(rig, txn) == []

            await rig.advance_and_pass(2)
            assert rig.reentry.published == 2
            statuses = await wait_final(rig.orchestrator, [completes, compensates], DEADLINE)
            assert statuses[completes] is RunningStatus.PROCESS_COMPLETED
            assert statuses[compensates] is RunningStatus.REVERT_COMPLETED
            assert await _runs(rig, completes) == [
                ("charge", "worker"),
                ("notify", "worker"),
                ("reserve", "worker"),
            ]
            assert await _runs(rig, compensates) == [("release", "worker"), ("reserve", "worker")]
            for txn in (completes, compensates):
                commands = await rig.step_commands(saga, txn)
                assert commands[0] == ("EXECUTE", "reserve"), commands
        finally:
            await rig.close()

    run(body())


def test_restore_heals_a_step_whose_marker_committed_before_its_tryout(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
    service_name: str,
) -> None:
    """A worker died between reserve's COMMITTED marker and its tryout row (and before it
    published charge). A plain redelivery of reserve is turned away by the marker; the
    restore's command carries ``heal``, so the worker records reserve as ALREADY_COMMITTED
    without running it, and the saga carries on through the topic."""

    async def body() -> None:
        rig, saga = await _rig(
            kafka_overrides(), driver_config, service_name, _saga_factory("heal-saga", _never)
        )
        try:
            txn = await rig.orchestrator.create(saga, {"order": 1})
            view = await rig.orchestrator.read(txn)
            policy = rig.runtime.settings.cassandra.write_protection.policy_for(saga.domain)

            async def action() -> bytes:
                return view.record.payload

            await rig.runtime.protection.run(
                MarkerKey(view.key, step_id("reserve", ExecutionType.EXECUTE)),
                policy,
                action,
                result_writes=lambda payload: [],
                is_final_failure=lambda error: True,
            )
            await rig.advance_and_pass(DELAY_WINDOWS + 1)
            statuses = await wait_final(rig.orchestrator, [txn], DEADLINE)
            assert statuses[txn] is RunningStatus.PROCESS_COMPLETED
            assert await _runs(rig, txn) == [("charge", "worker"), ("notify", "worker")]
            tryouts = (await rig.orchestrator.read(txn)).tryouts
            assert tryouts[0].status is TryoutStatus.ALREADY_COMMITTED, tryouts
        finally:
            await rig.close()

    run(body())


def _never(label: str, ctx: StepContext) -> None:
    pass


def test_frozen_saga_admin_restore_goes_through_kafka(
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
    service_name: str,
) -> None:
    """charge is refused, its undo (release) fails permanently once: FROZEN. The admin
    restore publishes release again; a worker runs it and the saga is REVERT_COMPLETED."""
    release_failures = [1]

    def decide(label: str, ctx: StepContext) -> None:
        if label == "charge":
            raise NonRetryableStepError("card refused")
        if label == "release" and release_failures[0] > 0:
            release_failures[0] -= 1
            raise NonRetryableStepError("warehouse says no")

    async def body() -> None:
        rig, saga = await _rig(
            kafka_overrides(), driver_config, service_name, _saga_factory("frozen-saga", decide)
        )
        try:
            txn = await rig.publisher.start_saga(saga, {"order": 1})
            await _wait_status(rig.orchestrator, txn, RunningStatus.FROZEN)
            assert await _runs(rig, txn) == [("reserve", "worker")]
            outcome = await rig.reentry.admin_restore(txn)
            statuses = await wait_final(rig.orchestrator, [txn], DEADLINE)
            assert statuses[txn] is RunningStatus.REVERT_COMPLETED
            assert await _runs(rig, txn) == [("release", "worker"), ("reserve", "worker")]
            commands = await rig.step_commands(saga, txn)
            assert commands.count(("COMPENSATE", "reserve")) == 2, commands
            assert outcome.status is RunningStatus.COMPENSATING, outcome
        finally:
            await rig.close()

    run(body())
