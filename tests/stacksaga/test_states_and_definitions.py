"""States, transitions, history folding, and saga definitions (no Cassandra needed)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacksaga_store.errors import IllegalTransitionError, SagaDefinitionError
from stacksaga_store.saga.definition import Saga, SagaPayload, Step, StepContext, idempotency_key
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    LIFECYCLE_EXECUTOR,
    PARKED_STATUSES,
    TRANSITIONS,
    Event,
    ExecutionType,
    NextAction,
    NextKind,
    RunningStatus,
    TryoutRecord,
    TryoutStatus,
    lifetime_started_at,
    next_action,
    progress,
    transition,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = ("inventory", "payment", "shipping")


async def noop(ctx: StepContext) -> None:
    return None


def history(*rows: tuple[str, ExecutionType, TryoutStatus]) -> list[TryoutRecord]:
    return [TryoutRecord(i, name, kind, status, T0) for i, (name, kind, status) in enumerate(rows)]


E, C = ExecutionType.EXECUTE, ExecutionType.COMPENSATE
OK, RETRY, FAIL = (
    TryoutStatus.SUCCESS,
    TryoutStatus.RETRYABLE_ERROR,
    TryoutStatus.NON_RETRYABLE_ERROR,
)


def test_final_and_parked_statuses_have_no_way_out_but_admin_restore() -> None:
    for (status, event), _ in TRANSITIONS.items():
        if status in FINAL_STATUSES:
            pytest.fail(f"final {status} has a transition on {event}")
        if status in PARKED_STATUSES:
            assert event in (Event.ADMIN_RESTORED_FORWARD, Event.ADMIN_RESTORED_REVERT)


def test_every_status_is_reachable_from_started() -> None:
    reached, frontier = {RunningStatus.STARTED}, [RunningStatus.STARTED]
    while frontier:
        status = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is status and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(RunningStatus)


@pytest.mark.parametrize(
    ("status", "event"),
    [
        (RunningStatus.PROCESS_COMPLETED, Event.RESUMED),
        (RunningStatus.FROZEN, Event.RESUMED),
        (RunningStatus.FROZEN, Event.ADMIN_RESTORED_FORWARD),
        (RunningStatus.IN_PROGRESS, Event.ADMIN_RESTORED_REVERT),
        (RunningStatus.COMPENSATING, Event.STEP_SUCCEEDED),
        (RunningStatus.QUARANTINED, Event.LIFETIME_EXPIRED),
    ],
)
def test_illegal_transitions_are_refused(status: RunningStatus, event: Event) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{event.value} is not allowed"):
        transition(status, event)


def test_next_action_walks_forward_then_back_in_reverse() -> None:
    compensable = frozenset({"inventory", "shipping"})  # payment has no compensation here
    status = RunningStatus.IN_PROGRESS
    assert next_action(status, STEPS, compensable, progress(STEPS, [])) == NextAction(
        NextKind.EXECUTE, "inventory"
    )
    rows = history(("inventory", E, OK), ("payment", E, RETRY), ("payment", E, OK))
    done = progress(STEPS, rows)
    assert done.attempts[("payment", E)] == 2
    assert next_action(status, STEPS, compensable, done) == NextAction(NextKind.EXECUTE, "shipping")
    rows = history(("inventory", E, OK), ("payment", E, OK), ("shipping", E, FAIL))
    reverting = RunningStatus.COMPENSATING
    # shipping failed (not compensated), payment has no compensation: inventory is next.
    assert next_action(reverting, STEPS, compensable, progress(STEPS, rows)) == NextAction(
        NextKind.COMPENSATE, "inventory"
    )
    rows.append(TryoutRecord(3, "inventory", C, OK, T0))
    assert next_action(reverting, STEPS, compensable, progress(STEPS, rows)).kind is (
        NextKind.REVERT_COMPLETE
    )


def test_lifecycle_rows_and_lifetime_restart() -> None:
    rows = history(("inventory", E, OK))
    rows.append(
        TryoutRecord(
            1,
            LIFECYCLE_EXECUTOR,
            ExecutionType.QUARANTINE,
            TryoutStatus.QUARANTINED,
            T0 + timedelta(days=2),
        )
    )
    rows.append(
        TryoutRecord(
            2,
            LIFECYCLE_EXECUTOR,
            ExecutionType.ADMIN_RESTORE,
            TryoutStatus.RESTORED,
            T0 + timedelta(days=3),
        )
    )
    assert progress(STEPS, rows).executed == ("inventory",)
    assert lifetime_started_at(T0, rows) == T0 + timedelta(days=3)


@given(st.lists(st.sampled_from([OK, RETRY]), min_size=0, max_size=12))
def test_forward_histories_execute_steps_in_order(outcomes: list[TryoutStatus]) -> None:
    """Feed outcomes one at a time through next_action: steps finish strictly in order."""
    rows: list[TryoutRecord] = []
    for outcome in outcomes:
        action = next_action(
            RunningStatus.IN_PROGRESS, STEPS, frozenset(STEPS), progress(STEPS, rows)
        )
        if action.kind is NextKind.COMPLETE:
            break
        assert action.kind is NextKind.EXECUTE
        rows.append(TryoutRecord(len(rows), str(action.step_name), E, outcome, T0))
    executed = progress(STEPS, rows).executed
    assert executed == STEPS[: len(executed)]


def test_idempotency_key_is_stable_and_distinct() -> None:
    transaction = uuid.UUID(int=7)
    first = idempotency_key(transaction, "payment", E)
    assert first == idempotency_key(transaction, "payment", E)
    assert first != idempotency_key(transaction, "payment", C)
    assert first != idempotency_key(uuid.UUID(int=8), "payment", E)
    assert uuid.UUID(first).version == 5


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Saga("order", ()), "has no steps"),
        (lambda: Saga("order", (Step("a", noop), Step("a", noop))), "'a' is used twice"),
        (lambda: Saga("bad name!", (Step("a", noop),)), "saga name 'bad name!'"),
        (lambda: Saga("order", ("a",)), "item 0 is str, not a Step"),  # type: ignore[arg-type]
        (lambda: Step("a:b", noop), "step name 'a:b'"),
        (lambda: Step("pay", lambda ctx: None), "execute must be an async function"),  # type: ignore[arg-type,return-value]
        (lambda: Step("pay", noop, compensate=print), "compensate must be an async function"),  # type: ignore[arg-type]
        (lambda: Step("pay", noop, timeout=timedelta(0)), "timeout must be above 0"),
        (lambda: Saga("s", tuple(Step(f"s{i}", noop) for i in range(101))), "max 100"),
    ],
)
def test_bad_saga_definitions_name_the_problem(build: object, fragment: str) -> None:
    with pytest.raises(SagaDefinitionError, match=None) as caught:
        build()  # type: ignore[operator]
    assert fragment in str(caught.value)


def test_async_callable_objects_are_accepted_as_steps() -> None:
    class Charge:
        async def __call__(self, ctx: StepContext) -> None:
            return None

    assert Saga("order", (Step("pay", Charge(), Charge()),)).compensable == {"pay"}


def test_payload_round_trip_and_refusal_of_non_json() -> None:
    payload = SagaPayload("order", STEPS, {"n": 1}, {"charge": "k"})
    assert SagaPayload.decode(payload.encode()) == payload
    with pytest.raises(Exception, match="not JSON"):
        SagaPayload("order", STEPS, {"when": object()}, {}).encode()
