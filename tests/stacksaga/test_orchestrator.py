"""The saga API on real Cassandra: order of compensation, frozen and quarantined transactions,
admin restore, retry hand-off, crash healing, and what each step costs in statements.

Reference: seed 000, Part 2 (event store tables) and the Properties Reference
(transaction.lifetime); peers.md section 1 (StackSaga's executor and error semantics).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.errors import (
    IllegalTransitionError,
    NonRetryableStepError,
    RetryableStepError,
)
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.handoff import RecordingRecoveryHandoff
from stacksaga_store.saga.orchestrator import DeliveryOutcome, Orchestrator, StepEvent
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.store.model import RestorePath
from stacksaga_store.store.protection import MarkerKey
from stacksaga_store.store.states import (
    LIFECYCLE_EXECUTOR,
    ExecutionType,
    RunningStatus,
    TryoutStatus,
    step_id,
)
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

Opener = Callable[..., Coroutine[Any, Any, StoreRuntime]]
DOMAINS = {"STRICT": "payment-saga", "RELAXED_WITH_DEDUP": "notification-saga"}
E, C = ExecutionType.EXECUTE, ExecutionType.COMPENSATE


class Script:
    """Step behaviour switched per test, and a journal of what ran with which key."""

    def __init__(self) -> None:
        self.fail: dict[tuple[str, ExecutionType], list[Exception]] = {}
        self.journal: list[tuple[str, ExecutionType, str, int]] = []
        self.hints_seen: dict[str, Any] = {}

    def step(self, name: str, *, compensable: bool = True) -> Step:
        async def execute(ctx: StepContext) -> dict[str, Any]:
            self._record(ctx)
            ctx.revert_hints[name] = f"{name}-receipt"
            return {name: "done"}

        async def compensate(ctx: StepContext) -> None:
            self._record(ctx)
            self.hints_seen[name] = ctx.revert_hints.get(name)

        return Step(name, execute, compensate if compensable else None)

    def _record(self, ctx: StepContext) -> None:
        self.journal.append((ctx.step_name, ctx.execution_type, ctx.idempotency_key, ctx.attempt))
        pending = self.fail.get((ctx.step_name, ctx.execution_type))
        if pending:
            raise pending.pop(0)

    def ran(self) -> list[tuple[str, ExecutionType]]:
        return [(name, kind) for name, kind, _, _ in self.journal]


def order_saga(script: Script, domain: str) -> Saga:
    return Saga(
        "order",
        (
            script.step("inventory"),
            script.step("audit", compensable=False),
            script.step("payment"),
            script.step("shipping"),
        ),
        domain=domain,
    )


def history(view: Any) -> list[tuple[str, str, str]]:
    return [(t.executor, t.execution_type.value, t.status.value) for t in view.tryouts]


async def with_orchestrator(
    opener: Opener,
    body: Callable[[Orchestrator, StoreRuntime], Coroutine[Any, Any, Any]],
    *,
    sagas: list[Saga],
    recovery: RecordingRecoveryHandoff | None = None,
    clock: ManualClock | None = None,
    **settings: Any,
) -> Any:
    runtime = await opener(**settings)
    try:
        orchestrator = runtime.orchestrator(sagas=sagas, recovery=recovery, clock=clock)
        return await body(orchestrator, runtime)
    finally:
        await runtime.close()


@pytest.mark.parametrize("mode", ["STRICT", "RELAXED_WITH_DEDUP"])
def test_success_writes_one_tryout_per_step(open_store: Opener, mode: str) -> None:
    script = Script()
    recovery = RecordingRecoveryHandoff(RestorePath("2026-01-01", 1024, "pod-a", 1))

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        outcome = await orchestrator.start("order", {"order_id": 7})
        assert outcome.status is RunningStatus.PROCESS_COMPLETED
        assert outcome.aggregate == {
            "order_id": 7,
            "inventory": "done",
            "audit": "done",
            "payment": "done",
            "shipping": "done",
        }
        view = await orchestrator.read(outcome.transaction_id)
        assert history(view) == [
            (name, "EXECUTE", "SUCCESS") for name in ("inventory", "audit", "payment", "shipping")
        ]
        assert [t.tryout_index for t in view.tryouts] == [0, 1, 2, 3]
        assert view.record.restore_path == recovery.path
        assert recovery.methods_for(view.key) == ["register_watchdog", "release_watchdog"]

    run(
        with_orchestrator(
            open_store, body, sagas=[order_saga(script, DOMAINS[mode])], recovery=recovery
        )
    )


@pytest.mark.parametrize("mode", ["STRICT", "RELAXED_WITH_DEDUP"])
def test_permanent_failure_compensates_in_reverse_with_revert_hints(
    open_store: Opener, mode: str
) -> None:
    script = Script()
    script.fail[("shipping", E)] = [NonRetryableStepError("address does not exist")]

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        outcome = await orchestrator.start("order", {})
        assert outcome.status is RunningStatus.REVERT_COMPLETED
        # Reverse order; audit has no compensation; the failed step is not compensated.
        assert script.ran() == [
            ("inventory", E),
            ("audit", E),
            ("payment", E),
            ("shipping", E),
            ("payment", C),
            ("inventory", C),
        ]
        assert script.hints_seen == {"payment": "payment-receipt", "inventory": "inventory-receipt"}
        view = await orchestrator.read(outcome.transaction_id)
        assert history(view)[3:] == [
            ("shipping", "EXECUTE", "NON_RETRYABLE_ERROR"),
            ("payment", "COMPENSATE", "SUCCESS"),
            ("inventory", "COMPENSATE", "SUCCESS"),
        ]
        assert view.frozen is None

    run(with_orchestrator(open_store, body, sagas=[order_saga(script, DOMAINS[mode])]))


def test_a_non_step_exception_counts_as_non_retryable(open_store: Opener) -> None:
    script = Script()
    script.fail[("inventory", E)] = [KeyError("sku")]

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        outcome = await orchestrator.start("order", {})
        assert outcome.status is RunningStatus.REVERT_COMPLETED
        assert outcome.last_error == "inventory: KeyError: 'sku'"

    run(with_orchestrator(open_store, body, sagas=[order_saga(script, DOMAINS["STRICT"])]))


@pytest.mark.parametrize("mode", ["STRICT", "RELAXED_WITH_DEDUP"])
def test_failed_compensation_freezes_then_admin_restore_finishes_it(
    open_store: Opener, mode: str
) -> None:
    script = Script()
    script.fail[("shipping", E)] = [NonRetryableStepError("no such address")]
    script.fail[("payment", C)] = [NonRetryableStepError("refund endpoint 500")]
    recovery = RecordingRecoveryHandoff()

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        frozen = await orchestrator.start("order", {})
        assert frozen.status is RunningStatus.FROZEN
        view = await orchestrator.read(frozen.transaction_id)
        assert view.frozen is not None
        assert view.frozen.reason == (
            "COMPENSATION_FAILED step=payment: NonRetryableStepError: refund endpoint 500"
        )
        assert ("inventory", C) not in script.ran(), "compensation must stop at the failure"
        assert recovery.methods_for(view.key)[-1] == "release_watchdog"
        # Parked: neither the recovery engine nor a late event moves it.
        assert (await orchestrator.resume(frozen.transaction_id)).status is RunningStatus.FROZEN
        late = await orchestrator.deliver(StepEvent(frozen.transaction_id, "payment", C))
        assert late is DeliveryOutcome.STALE

        restored = await orchestrator.admin_restore(frozen.transaction_id)

        assert restored.status is RunningStatus.REVERT_COMPLETED
        refunds = [entry for entry in script.journal if entry[:2] == ("payment", C)]
        assert len(refunds) == 2
        assert refunds[0][2] == refunds[1][2], "a retried invocation keeps its idempotency key"
        assert refunds[1][3] == 2
        view = await orchestrator.read(frozen.transaction_id)
        assert view.frozen is None
        assert history(view)[-4:] == [
            ("payment", "COMPENSATE", "NON_RETRYABLE_ERROR"),
            (LIFECYCLE_EXECUTOR, "ADMIN_RESTORE", "RESTORED"),
            ("payment", "COMPENSATE", "SUCCESS"),
            ("inventory", "COMPENSATE", "SUCCESS"),
        ]
        with pytest.raises(IllegalTransitionError):
            await orchestrator.admin_restore(frozen.transaction_id)

    run(
        with_orchestrator(
            open_store, body, sagas=[order_saga(script, DOMAINS[mode])], recovery=recovery
        )
    )


def test_retryable_failure_is_handed_off_and_resumed_with_the_same_key(open_store: Opener) -> None:
    script = Script()
    script.fail[("payment", E)] = [RetryableStepError("HTTP 503"), RetryableStepError("HTTP 503")]
    recovery = RecordingRecoveryHandoff()

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        paused = await orchestrator.start("order", {})
        assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
        assert paused.last_error == "payment: RetryableStepError: HTTP 503"
        [retry] = recovery.retries()
        assert (retry.step_name, retry.execution_type, retry.attempt) == ("payment", E, 1)
        again = await orchestrator.resume(paused.transaction_id)
        assert again.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
        done = await orchestrator.resume(paused.transaction_id)
        assert done.status is RunningStatus.PROCESS_COMPLETED
        payments = [entry for entry in script.journal if entry[:2] == ("payment", E)]
        assert [attempt for *_, attempt in payments] == [1, 2, 3]
        assert len({key for _, _, key, _ in payments}) == 1
        assert [r.attempt for r in recovery.retries()] == [1, 2]

    run(
        with_orchestrator(
            open_store, body, sagas=[order_saga(script, DOMAINS["STRICT"])], recovery=recovery
        )
    )


def test_lifetime_quarantine_with_an_injected_clock_and_restore(open_store: Opener) -> None:
    script = Script()
    script.fail[("payment", E)] = [RetryableStepError("HTTP 503")]
    clock = ManualClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        paused = await orchestrator.start("order", {})
        assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
        clock.advance(timedelta(minutes=59))
        # Still inside the 1h lifetime: a resume that fails again stays active.
        script.fail[("payment", E)] = [RetryableStepError("HTTP 503")]
        assert (await orchestrator.resume(paused.transaction_id)).status is (
            RunningStatus.FAILED_WITH_RETRYABLE_ERROR
        )
        clock.advance(timedelta(minutes=2))
        before = len(script.journal)

        quarantined = await orchestrator.resume(paused.transaction_id)

        assert quarantined.status is RunningStatus.QUARANTINED
        assert len(script.journal) == before, "an expired transaction must not run a step"
        view = await orchestrator.read(paused.transaction_id)
        assert view.frozen is not None
        assert view.frozen.reason.startswith("LIFETIME_EXPIRED: older than 1:00:00")
        assert view.frozen.frozen_at == clock.now()
        assert history(view)[-1] == (LIFECYCLE_EXECUTOR, "QUARANTINE", "QUARANTINED")
        assert (await orchestrator.resume(paused.transaction_id)).status is (
            RunningStatus.QUARANTINED
        )

        clock.advance(timedelta(days=3))
        restored = await orchestrator.admin_restore(paused.transaction_id)

        assert restored.status is RunningStatus.PROCESS_COMPLETED
        assert (await orchestrator.read(paused.transaction_id)).frozen is None

    run(
        with_orchestrator(
            open_store,
            body,
            sagas=[order_saga(script, DOMAINS["STRICT"])],
            clock=clock,
            transaction={"lifetime": "1h"},
        )
    )


def test_resume_heals_a_step_whose_marker_committed_before_its_tryout(open_store: Opener) -> None:
    """A process that died between the COMMITTED marker and its tryout row: the resume must
    not run the step again, must record it, and must carry on (seed Part 4 restore pickup)."""
    script = Script()

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        transaction_id = await orchestrator.create("order", {})
        view = await orchestrator.read(transaction_id)
        policy = runtime.settings.cassandra.write_protection.policy_for("payment-saga")
        marker = MarkerKey(view.key, step_id("inventory", E))

        async def action() -> bytes:
            return view.record.payload

        await runtime.protection.run(
            marker,
            policy,
            action,
            result_writes=lambda payload: [],
            is_final_failure=lambda error: True,
        )
        outcome = await orchestrator.resume(transaction_id)
        assert outcome.status is RunningStatus.PROCESS_COMPLETED
        assert ("inventory", E) not in script.ran()
        assert history(await orchestrator.read(transaction_id))[0] == (
            "inventory",
            "EXECUTE",
            TryoutStatus.ALREADY_COMMITTED.value,
        )

    run(with_orchestrator(open_store, body, sagas=[order_saga(script, DOMAINS["STRICT"])]))


def test_deliver_runs_only_the_next_step(open_store: Opener) -> None:
    script = Script()

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        transaction_id = await orchestrator.create("order", {})
        early = await orchestrator.deliver(StepEvent(transaction_id, "payment"))
        assert early is DeliveryOutcome.STALE
        assert await orchestrator.deliver(StepEvent(transaction_id, "inventory")) is (
            DeliveryOutcome.EXECUTED
        )
        assert await orchestrator.deliver(StepEvent(transaction_id, "inventory")) is (
            DeliveryOutcome.STALE
        )
        assert script.ran() == [("inventory", E)]

    run(with_orchestrator(open_store, body, sagas=[order_saga(script, DOMAINS["STRICT"])]))


@pytest.mark.parametrize(
    ("default_mode", "domain", "marker_kinds"),
    [
        # STRICT: LWT acquire + LWT commit on the marker.
        ("RELAXED_WITH_DEDUP", "payment-saga", {"lwt:es_execution_markers": 2}),
        # RELAXED: one plain read, then the marker rides in the logged batch.
        (
            "STRICT",
            "notification-saga",
            {"read:es_execution_markers": 1, "write:es_execution_markers": 1},
        ),
    ],
)
def test_per_domain_mode_override_decides_the_statements(
    open_store: Opener, default_mode: str, domain: str, marker_kinds: dict[str, int]
) -> None:
    script = Script()
    saga = Saga("one", (script.step("only"),), domain=domain)

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        transaction_id = await orchestrator.create("one", {})
        runtime.cql.counts.reset()
        assert await orchestrator.deliver(StepEvent(transaction_id, "only")) is (
            DeliveryOutcome.EXECUTED
        )
        counts = {k: v for k, v in runtime.cql.counts.by_table.items() if "markers" in k}
        assert counts == marker_kinds
        assert runtime.cql.counts.by_table["lwt:es_transaction_tryout"] == 1

    run(with_orchestrator(open_store, body, sagas=[saga], default_mode=default_mode))


def test_concurrent_tryout_appends_never_overwrite(open_store: Opener) -> None:
    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        transaction_id = await orchestrator.create("order", {})
        key = (await orchestrator.read(transaction_id)).key
        now = datetime(2026, 1, 1, tzinfo=UTC)
        # Ten writers all believe index 0 is next.
        records = await asyncio.gather(
            *(
                runtime.events.append_tryout(
                    key, 0, executor=f"w{i}", execution_type=E, status=TryoutStatus.SUCCESS, now=now
                )
                for i in range(10)
            )
        )
        assert sorted(r.tryout_index for r in records) == list(range(10))
        stored = await runtime.events.read_tryouts(key)
        assert sorted(t.executor for t in stored) == sorted(f"w{i}" for i in range(10))

    run(with_orchestrator(open_store, body, sagas=[order_saga(Script(), DOMAINS["STRICT"])]))


def test_reading_an_unknown_transaction_says_so(open_store: Opener) -> None:
    from stacksaga_store.errors import TransactionNotFoundError

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        with pytest.raises(TransactionNotFoundError, match="no transaction"):
            await orchestrator.read(uuid.uuid4())

    run(with_orchestrator(open_store, body, sagas=[]))


def test_retryable_compensation_failure_is_handed_off_then_completed(open_store: Opener) -> None:
    script = Script()
    script.fail[("payment", E)] = [NonRetryableStepError("card declined")]
    script.fail[("inventory", C)] = [RetryableStepError("warehouse API timeout")]
    recovery = RecordingRecoveryHandoff()

    async def body(orchestrator: Orchestrator, runtime: StoreRuntime) -> None:
        paused = await orchestrator.start("order", {})
        assert paused.status is RunningStatus.REVERT_FAILED_WITH_RETRYABLE_ERROR
        [retry] = recovery.retries()
        assert (retry.step_name, retry.execution_type) == ("inventory", C)
        done = await orchestrator.resume(paused.transaction_id)
        assert done.status is RunningStatus.REVERT_COMPLETED
        assert script.ran()[-2:] == [("inventory", C), ("inventory", C)]

    run(
        with_orchestrator(
            open_store, body, sagas=[order_saga(script, DOMAINS["STRICT"])], recovery=recovery
        )
    )


def test_cli_demo_runs_against_the_test_node(
    cassandra_node: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from stacksaga_store.__main__ import main
    from stacksaga_store.demo import DEMO_KEYSPACE

    contact = f"{cassandra_node.contact_points[0]}:{cassandra_node.native_port}"
    try:
        assert main(["demo", "--contact-point", contact]) == 0
    finally:
        session = cassandra_node.connect()
        session.execute(f"DROP KEYSPACE IF EXISTS {DEMO_KEYSPACE}", timeout=120)
    out = capsys.readouterr().out
    assert "demo finished as expected" in out
    for status in ("PROCESS_COMPLETED", "REVERT_COMPLETED", "FROZEN", "ADMIN_RESTORE"):
        assert status in out
