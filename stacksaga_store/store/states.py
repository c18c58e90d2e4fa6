"""Every state and transition of a saga transaction, in one place.

Rule: anything that decides a transaction's ``running_status`` or its next action lives here,
as data or pure functions, and nothing else in the package writes a status it did not get from
:func:`transition`. (h11's ``_state.py`` rule.)

Running status (``es_transaction.running_status``)
--------------------------------------------------
::

    STARTED / IN_PROGRESS ──STEP_SUCCEEDED──────────► IN_PROGRESS
    STARTED / IN_PROGRESS ──LAST_STEP_SUCCEEDED─────► PROCESS_COMPLETED               (final)
    STARTED / IN_PROGRESS ──STEP_FAILED_RETRYABLE───► FAILED_WITH_RETRYABLE_ERROR
    FAILED_WITH_RETRYABLE_ERROR ──RESUMED───────────► IN_PROGRESS
    STARTED / IN_PROGRESS ──STEP_FAILED_PERMANENTLY─► COMPENSATING
    COMPENSATING ──COMPENSATION_SUCCEEDED───────────► COMPENSATING
    COMPENSATING ──LAST_COMPENSATION_SUCCEEDED──────► REVERT_COMPLETED                (final)
    COMPENSATING ──COMPENSATION_FAILED_RETRYABLE────► REVERT_FAILED_WITH_RETRYABLE_ERROR
    REVERT_FAILED_WITH_RETRYABLE_ERROR ──RESUMED────► COMPENSATING
    COMPENSATING ──COMPENSATION_FAILED_PERMANENTLY──► FROZEN                          (parked)
    any active status ──LIFETIME_EXPIRED────────────► QUARANTINED                     (parked)
    FROZEN ──ADMIN_RESTORED_REVERT──────────────────► COMPENSATING
    QUARANTINED ──ADMIN_RESTORED_FORWARD / _REVERT──► IN_PROGRESS / COMPENSATING
    STARTED / IN_PROGRESS / COMPENSATING ──RESUMED──► unchanged (restore of a crashed run)

:data:`TRANSITIONS` is exactly this table; a test walks it.

* STARTED: es_transaction written, restore watchdog registered, no step finished yet.
* IN_PROGRESS: forward steps running; at least one finished.
* FAILED_WITH_RETRYABLE_ERROR: a forward step raised a retryable error; the transaction was
  handed to the recovery engine (Retry, window W+1). RESUMED goes back to IN_PROGRESS.
* COMPENSATING: a forward step failed permanently; compensations run in reverse order.
* REVERT_FAILED_WITH_RETRYABLE_ERROR: a compensation raised a retryable error; handed to the
  recovery engine like a forward retry. RESUMED goes back to COMPENSATING.
* PROCESS_COMPLETED, REVERT_COMPLETED: final. The seed's restore pickup skips these two.
* FROZEN: a compensation failed permanently ("terminated"); a row in es_frozen_transaction holds
  the reason; only an admin restore moves it (back to COMPENSATING, retrying that compensation).
* QUARANTINED: the transaction outlived ``transaction.lifetime`` ("disabled"); also a row in
  es_frozen_transaction; not re-exposed to the recovery engine; an admin restore resumes it in
  the direction it was going, with a fresh lifetime.

Tryout history (``es_transaction_tryout``)
------------------------------------------
One row per attempt, ``tryout_index`` 0, 1, 2, ... without gaps. ``executor`` is the step name
(or ``stacksaga`` for lifecycle rows), ``execution_type`` an :class:`ExecutionType`, ``status``
a :class:`TryoutStatus`. The position of a saga is *derived* from this history
(:func:`progress`), never stored separately, so the history and the position cannot disagree.

Execution markers (``es_execution_markers.execution_state``)
-------------------------------------------------------------
``LEASED:<holder>`` (STRICT, with a TTL), ``COMMITTED`` (the seed's permanent marker), and
``FAILED`` (extension: the invocation failed permanently, so a late duplicate delivery must not
run it either). Step id: ``<step name>:<EXECUTE|COMPENSATE>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from stacksaga_store.errors import IllegalTransitionError, check_state

__all__ = [
    "FINAL_STATUSES",
    "LIFECYCLE_EXECUTOR",
    "PARKED_STATUSES",
    "TRANSITIONS",
    "Event",
    "ExecutionType",
    "MarkerState",
    "NextAction",
    "NextKind",
    "Progress",
    "RunningStatus",
    "TryoutRecord",
    "TryoutStatus",
    "lifetime_started_at",
    "next_action",
    "progress",
    "step_id",
    "transition",
]


class RunningStatus(StrEnum):
    STARTED = "STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    FAILED_WITH_RETRYABLE_ERROR = "FAILED_WITH_RETRYABLE_ERROR"
    COMPENSATING = "COMPENSATING"
    REVERT_FAILED_WITH_RETRYABLE_ERROR = "REVERT_FAILED_WITH_RETRYABLE_ERROR"
    PROCESS_COMPLETED = "PROCESS_COMPLETED"
    REVERT_COMPLETED = "REVERT_COMPLETED"
    FROZEN = "FROZEN"
    QUARANTINED = "QUARANTINED"


FINAL_STATUSES = frozenset({RunningStatus.PROCESS_COMPLETED, RunningStatus.REVERT_COMPLETED})
# Parked: out of the active set until an admin restores them.
PARKED_STATUSES = frozenset({RunningStatus.FROZEN, RunningStatus.QUARANTINED})
_ACTIVE = tuple(s for s in RunningStatus if s not in FINAL_STATUSES | PARKED_STATUSES)


class Event(StrEnum):
    STEP_SUCCEEDED = "STEP_SUCCEEDED"
    LAST_STEP_SUCCEEDED = "LAST_STEP_SUCCEEDED"
    STEP_FAILED_RETRYABLE = "STEP_FAILED_RETRYABLE"
    STEP_FAILED_PERMANENTLY = "STEP_FAILED_PERMANENTLY"
    COMPENSATION_SUCCEEDED = "COMPENSATION_SUCCEEDED"
    LAST_COMPENSATION_SUCCEEDED = "LAST_COMPENSATION_SUCCEEDED"
    COMPENSATION_FAILED_RETRYABLE = "COMPENSATION_FAILED_RETRYABLE"
    COMPENSATION_FAILED_PERMANENTLY = "COMPENSATION_FAILED_PERMANENTLY"
    RESUMED = "RESUMED"
    LIFETIME_EXPIRED = "LIFETIME_EXPIRED"
    ADMIN_RESTORED_FORWARD = "ADMIN_RESTORED_FORWARD"
    ADMIN_RESTORED_REVERT = "ADMIN_RESTORED_REVERT"


def _build_transitions() -> dict[tuple[RunningStatus, Event], RunningStatus]:
    s, e = RunningStatus, Event
    forward = (s.STARTED, s.IN_PROGRESS)
    table: dict[tuple[RunningStatus, Event], RunningStatus] = {}
    for status in forward:
        table[status, e.STEP_SUCCEEDED] = s.IN_PROGRESS
        table[status, e.LAST_STEP_SUCCEEDED] = s.PROCESS_COMPLETED
        table[status, e.STEP_FAILED_RETRYABLE] = s.FAILED_WITH_RETRYABLE_ERROR
        table[status, e.STEP_FAILED_PERMANENTLY] = s.COMPENSATING
        # A restore re-invocation of a transaction whose process died mid-flight.
        table[status, e.RESUMED] = status
    table[s.FAILED_WITH_RETRYABLE_ERROR, e.RESUMED] = s.IN_PROGRESS
    table[s.COMPENSATING, e.COMPENSATION_SUCCEEDED] = s.COMPENSATING
    table[s.COMPENSATING, e.LAST_COMPENSATION_SUCCEEDED] = s.REVERT_COMPLETED
    table[s.COMPENSATING, e.COMPENSATION_FAILED_RETRYABLE] = s.REVERT_FAILED_WITH_RETRYABLE_ERROR
    table[s.COMPENSATING, e.COMPENSATION_FAILED_PERMANENTLY] = s.FROZEN
    table[s.COMPENSATING, e.RESUMED] = s.COMPENSATING
    table[s.REVERT_FAILED_WITH_RETRYABLE_ERROR, e.RESUMED] = s.COMPENSATING
    for status in _ACTIVE:
        table[status, e.LIFETIME_EXPIRED] = s.QUARANTINED
    table[s.FROZEN, e.ADMIN_RESTORED_REVERT] = s.COMPENSATING
    table[s.QUARANTINED, e.ADMIN_RESTORED_FORWARD] = s.IN_PROGRESS
    table[s.QUARANTINED, e.ADMIN_RESTORED_REVERT] = s.COMPENSATING
    return table


TRANSITIONS: dict[tuple[RunningStatus, Event], RunningStatus] = _build_transitions()


def transition(status: RunningStatus, event: Event) -> RunningStatus:
    """The status after ``event``; raises IllegalTransitionError for a pair not in the table."""
    try:
        return TRANSITIONS[status, event]
    except KeyError:
        raise IllegalTransitionError(f"{event.value} is not allowed in {status.value}") from None


class ExecutionType(StrEnum):
    EXECUTE = "EXECUTE"
    COMPENSATE = "COMPENSATE"
    # Lifecycle rows written by the store itself (executor LIFECYCLE_EXECUTOR).
    QUARANTINE = "QUARANTINE"
    ADMIN_RESTORE = "ADMIN_RESTORE"


LIFECYCLE_EXECUTOR = "stacksaga"


class TryoutStatus(StrEnum):
    SUCCESS = "SUCCESS"
    RETRYABLE_ERROR = "RETRYABLE_ERROR"
    NON_RETRYABLE_ERROR = "NON_RETRYABLE_ERROR"
    # The step's marker was already COMMITTED (an earlier run finished but died before writing
    # its tryout): recorded so the history shows the step as done.
    ALREADY_COMMITTED = "ALREADY_COMMITTED"
    # Lifecycle rows.
    QUARANTINED = "QUARANTINED"
    RESTORED = "RESTORED"


class MarkerState(StrEnum):
    """es_execution_markers.execution_state values other than a lease."""

    COMMITTED = "COMMITTED"
    FAILED = "FAILED"


LEASE_PREFIX = "LEASED:"


def step_id(step_name: str, execution_type: ExecutionType) -> str:
    """The marker's clustering key for one step invocation."""
    check_state(
        execution_type in (ExecutionType.EXECUTE, ExecutionType.COMPENSATE),
        f"no marker for {execution_type}",
    )
    return f"{step_name}:{execution_type.value}"


@dataclass(frozen=True, slots=True)
class TryoutRecord:
    """One es_transaction_tryout row."""

    tryout_index: int
    executor: str
    execution_type: ExecutionType
    status: TryoutStatus
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a saga stands, derived from its tryout history."""

    executed: tuple[str, ...]  # forward steps done, in order
    compensated: frozenset[str]
    failed_step: str | None  # the forward step that failed permanently, if any
    attempts: dict[tuple[str, ExecutionType], int]

    @property
    def reverting(self) -> bool:
        return self.failed_step is not None


_DONE = (TryoutStatus.SUCCESS, TryoutStatus.ALREADY_COMMITTED)


def progress(step_names: Sequence[str], tryouts: Sequence[TryoutRecord]) -> Progress:
    """Fold the history into a :class:`Progress`. Pure; the history must be in index order."""
    executed: list[str] = []
    compensated: set[str] = set()
    failed: str | None = None
    attempts: dict[tuple[str, ExecutionType], int] = {}
    known = set(step_names)
    for expected_index, tryout in enumerate(tryouts):
        check_state(tryout.tryout_index == expected_index, "tryout history has a gap")
        if tryout.executor == LIFECYCLE_EXECUTOR:
            continue
        check_state(tryout.executor in known, f"history names unknown step {tryout.executor}")
        key = (tryout.executor, tryout.execution_type)
        attempts[key] = attempts.get(key, 0) + 1
        if tryout.execution_type is ExecutionType.EXECUTE:
            if tryout.status in _DONE and tryout.executor not in executed:
                executed.append(tryout.executor)
            elif tryout.status is TryoutStatus.NON_RETRYABLE_ERROR:
                failed = tryout.executor
        elif tryout.status in _DONE:
            compensated.add(tryout.executor)
    order = {name: index for index, name in enumerate(step_names)}
    check_state(
        [order[name] for name in executed] == list(range(len(executed))),
        "forward steps finished out of order",
    )
    return Progress(tuple(executed), frozenset(compensated), failed, attempts)


class NextKind(StrEnum):
    EXECUTE = "EXECUTE"
    COMPENSATE = "COMPENSATE"
    COMPLETE = "COMPLETE"  # every forward step done: PROCESS_COMPLETED
    REVERT_COMPLETE = "REVERT_COMPLETE"  # every compensation done: REVERT_COMPLETED
    NONE = "NONE"  # final or parked: nothing to run


@dataclass(frozen=True, slots=True)
class NextAction:
    kind: NextKind
    step_name: str | None = None


def next_action(
    status: RunningStatus,
    step_names: Sequence[str],
    compensable: frozenset[str],
    done: Progress,
) -> NextAction:
    """What the orchestrator runs next. Steps without a compensation are skipped in reverse."""
    if status in FINAL_STATUSES or status in PARKED_STATUSES:
        return NextAction(NextKind.NONE)
    if done.reverting:
        for name in reversed(done.executed):
            if name in compensable and name not in done.compensated:
                return NextAction(NextKind.COMPENSATE, name)
        return NextAction(NextKind.REVERT_COMPLETE)
    for name in step_names:
        if name not in done.executed:
            return NextAction(NextKind.EXECUTE, name)
    return NextAction(NextKind.COMPLETE)


def lifetime_started_at(created_at: datetime, tryouts: Sequence[TryoutRecord]) -> datetime:
    """The lifetime runs from creation, or from the latest admin restore (a fresh lifetime)."""
    started = created_at
    for tryout in tryouts:
        if tryout.execution_type is ExecutionType.ADMIN_RESTORE:
            started = max(started, tryout.created_at)
    return started
