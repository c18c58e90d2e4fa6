"""The orchestrator: runs sagas on the event store, step by step, under write protection.

Theory of operation
-------------------
:meth:`Orchestrator.start` registers the restore watchdog (recovery engine), writes the
es_transaction row (STARTED) and *drives* the saga. Driving is a loop over
:func:`stacksaga_store.store.states.next_action`, which reads the position off the tryout history:

* EXECUTE/COMPENSATE a step: one *invocation*, under its execution marker
  (:class:`~stacksaga_store.store.protection.WriteProtection`, mode from the saga's domain). On
  success the new status and payload are written under the marker, then the tryout row is
  appended. On failure the tryout row comes first, then the status (a crash in between is
  repaired on the next load by :meth:`_reconcile`, which trusts the history); a retryable
  failure writes its retry pointer before both;
* COMPLETE / REVERT_COMPLETE: the final status (normally already written with the last step),
  then the watchdog is released;
* NONE: the transaction is final or parked.

Failures: a retryable one pauses the saga (FAILED_WITH_RETRYABLE_ERROR or
REVERT_FAILED_WITH_RETRYABLE_ERROR) and hands it to the recovery engine
(:class:`~stacksaga_store.saga.handoff.RecoveryHandoff`), which later calls :meth:`resume`. A
permanent one in a forward step turns the saga around (COMPENSATING, compensations in reverse
order); a permanent one in a compensation freezes it (es_frozen_transaction, with the reason).

Before every invocation the transaction's age is checked against ``transaction.lifetime`` on the
injected clock; an expired one is quarantined instead of run. :meth:`admin_restore` takes a
frozen or quarantined transaction back (fresh lifetime, new watchdog, the failed compensation's
FAILED marker removed) and drives it again at once.

:meth:`deliver` is the event-driven entry point (Kafka-style): it runs exactly one step
invocation if, and only if, it is the transaction's next action, and never records anything
for a duplicate delivery that the marker turned away.

Each drive loop is bounded (2 x steps + 3 iterations): every iteration either appends a tryout
or ends the loop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from stacksaga_store.clock import Clock, SystemClock
from stacksaga_store.config.settings import ConsistencyMode, StackSagaSettings
from stacksaga_store.errors import (
    InvariantViolation,
    LeaseBusyError,
    LeaseFencedError,
    LeaseFenceRefusedError,
    LeaseLostError,
    SagaDefinitionError,
    StepError,
    check_state,
)
from stacksaga_store.saga.classify import is_retryable
from stacksaga_store.saga.definition import Saga, SagaPayload, Step, StepContext, idempotency_key
from stacksaga_store.saga.handoff import NoRecoveryHandoff, RecoveryHandoff, RetryRequest
from stacksaga_store.store.accord_store import FENCE_PART, StateChangeConflict
from stacksaga_store.store.cql import Prepared
from stacksaga_store.store.events import CassandraEventStore, new_transaction_id
from stacksaga_store.store.model import FencingRow, RestorePath, TransactionKey, TransactionView
from stacksaga_store.store.protection import GuardOutcome, MarkerKey, WriteProtection
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    LIFECYCLE_EXECUTOR,
    PARKED_STATUSES,
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
    step_id,
    transition,
)

__all__ = ["DeliveryOutcome", "Orchestrator", "SagaOutcome", "StepEvent", "StepFence"]

logger = logging.getLogger(__name__)

ERROR_TEXT_MAX = 500
_RETRY_PENDING = (
    RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
    RunningStatus.REVERT_FAILED_WITH_RETRYABLE_ERROR,
)
_FORWARD = (RunningStatus.STARTED, RunningStatus.IN_PROGRESS)
_ACTION_FOR = {
    ExecutionType.EXECUTE: NextKind.EXECUTE,
    ExecutionType.COMPENSATE: NextKind.COMPENSATE,
}


class DeliveryOutcome(StrEnum):
    """What one step invocation (or one delivery of it) came to."""

    EXECUTED = "EXECUTED"
    FAILED_RETRYABLE = "FAILED_RETRYABLE"
    FAILED_PERMANENTLY = "FAILED_PERMANENTLY"
    ALREADY_COMMITTED = "ALREADY_COMMITTED"
    ALREADY_FAILED = "ALREADY_FAILED"
    LEASE_BUSY = "LEASE_BUSY"
    LEASE_LOST = "LEASE_LOST"
    STALE = "STALE"  # not the transaction's next action (duplicate or out-of-date event)
    QUARANTINED = "QUARANTINED"


class StepFence(Protocol):
    """The range lease a Retry-Node's resume runs under (see :meth:`Orchestrator.resume`)."""

    def token(self) -> str | None:
        """The lease's epoch as text while the lease holds; None once it is lost."""
        ...

    def fencing_row(self) -> FencingRow | None:
        """Where the lease's epoch is persisted (a coordinator's lease), else None. The accord
        mode makes each state change of the dispatch conditional on that row."""
        ...

    def refused(self) -> None:
        """The store refused a write on this lease's epoch (the range moved): the lease is
        lost for good, whatever its clock says; :meth:`token` is None from now on."""
        ...


@dataclass(frozen=True, slots=True)
class StepEvent:
    """An event asking for one step invocation, e.g. from a Kafka topic."""

    transaction_id: uuid.UUID
    step_name: str
    execution_type: ExecutionType = ExecutionType.EXECUTE
    # A recovery re-entry (Retry-Node retry or restore, long after the run it replaces): a
    # marker that is final while its tryout row is missing is healed as :meth:`resume` heals
    # it (recorded, carried on) instead of turned away.
    heal: bool = False


@dataclass(frozen=True, slots=True)
class SagaOutcome:
    """Where a saga stands after the orchestrator stopped driving it."""

    transaction_id: uuid.UUID
    status: RunningStatus
    aggregate: Mapping[str, Any]
    last_error: str | None = None
    note: str | None = None
    # The invocation outcome that stopped the drive before the saga got anywhere: another
    # holder's marker lease (LEASE_BUSY) or a lost lease (LEASE_LOST). A Retry-Node keeps its
    # row then, since nobody is known to carry the saga on.
    stopped_by: DeliveryOutcome | None = None


@dataclass(slots=True)
class _Run:
    """The orchestrator's in-memory copy of one transaction while it drives it."""

    key: TransactionKey
    saga: Saga
    status: RunningStatus
    payload: SagaPayload
    created_at: datetime
    tryouts: list[TryoutRecord]
    restore_path: RestorePath | None = None

    def outcome(
        self, note: str | None = None, stopped_by: DeliveryOutcome | None = None
    ) -> SagaOutcome:
        return SagaOutcome(
            transaction_id=self.key.transaction_id,
            status=self.status,
            aggregate=MappingProxyType(dict(self.payload.aggregate)),
            last_error=self.payload.last_error,
            note=note,
            stopped_by=stopped_by,
        )


class _StepFailed(Exception):
    """Wraps whatever user code raised, so it is never confused with a store error."""

    def __init__(self, error: BaseException, retryable: bool) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class _StepDone:
    payload: SagaPayload
    status: RunningStatus
    encoded: bytes


class Orchestrator:
    """Runs registered sagas. One instance per process; safe to use from many tasks."""

    def __init__(
        self,
        *,
        store: CassandraEventStore,
        protection: WriteProtection,
        settings: StackSagaSettings,
        recovery: RecoveryHandoff | None = None,
        clock: Clock | None = None,
        sagas: Iterable[Saga] = (),
    ) -> None:
        self.store = store
        self.protection = protection
        self.settings = settings
        self.recovery: RecoveryHandoff = recovery or NoRecoveryHandoff()
        if isinstance(self.recovery, NoRecoveryHandoff):
            # Recovery is on by default only through stacksaga_store.open_runtime; an
            # orchestrator built without it must not pass for a recovered one.
            logger.warning(
                "orchestrator without a recovery engine: no restore watchdog is written and "
                "failed steps wait for a manual resume (stacksaga_store.open_runtime runs one)"
            )
        self.clock: Clock = clock or SystemClock()
        self._sagas: dict[str, Saga] = {}
        for saga in sagas:
            self.register(saga)

    # -- definitions ------------------------------------------------------------------------

    def register(self, saga: Saga) -> None:
        """Make a saga startable and resumable here. A name maps to one definition."""
        if not isinstance(saga, Saga):
            raise SagaDefinitionError(f"expected a Saga, got {type(saga).__name__}")
        existing = self._sagas.get(saga.name)
        if existing is not None and existing is not saga:
            raise SagaDefinitionError(f"a different saga named {saga.name!r} is registered")
        self._sagas[saga.name] = saga

    @property
    def sagas(self) -> tuple[Saga, ...]:
        """The registered definitions."""
        return tuple(self._sagas.values())

    def _saga(self, name: str) -> Saga:
        saga = self._sagas.get(name)
        if saga is None:
            raise SagaDefinitionError(f"saga {name!r} is not registered with this orchestrator")
        return saga

    # -- entry points -----------------------------------------------------------------------

    async def start(
        self,
        saga: Saga | str,
        aggregate: Mapping[str, Any],
        *,
        transaction_id: uuid.UUID | None = None,
    ) -> SagaOutcome:
        """Create a transaction and drive it as far as it goes now."""
        return await self._drive(await self._create(saga, aggregate, transaction_id))

    async def create(
        self,
        saga: Saga | str,
        aggregate: Mapping[str, Any],
        *,
        transaction_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Create a transaction without running a step, for event-driven flows that then
        publish the first :class:`StepEvent` (see :meth:`deliver`)."""
        run = await self._create(saga, aggregate, transaction_id)
        return run.key.transaction_id

    async def _create(
        self, saga: Saga | str, aggregate: Mapping[str, Any], transaction_id: uuid.UUID | None
    ) -> _Run:
        definition = self._saga(saga if isinstance(saga, str) else saga.name)
        key = TransactionKey.of(self.settings.instance, transaction_id or new_transaction_id())
        now = self._now()
        payload = SagaPayload(definition.name, definition.step_names, dict(aggregate), {})
        encoded = payload.encode()
        # Seed order: the watchdog first, so a crash right after creation is still restored.
        # (Each ``state_change`` is one Accord transaction in the accord commit mode.)
        async with self.store.state_change("start"):
            path = await self.recovery.register_watchdog(key, now)
            await self.store.create(
                key, status=RunningStatus.STARTED, payload=encoded, now=now, restore_path=path
            )
        logger.info("saga started: txn=%s saga=%s", key, definition.name)
        return _Run(key, definition, RunningStatus.STARTED, payload, now, [], path)

    async def resume(
        self, transaction_id: uuid.UUID, *, fence: StepFence | None = None
    ) -> SagaOutcome:
        """Re-invoke a transaction (the recovery engine's Retry and Restore call this).

        Final and parked transactions are returned as they are. With a ``fence`` (a
        Retry-Node's range lease) the resume checks it before every step and raises
        :class:`~stacksaga_store.errors.LeaseFencedError` once it is lost, and STRICT steps
        commit only under the epoch they started with
        (:meth:`~stacksaga_store.store.protection.WriteProtection.run`).
        """
        run = await self._load(transaction_id)
        if run.status in FINAL_STATUSES or run.status in PARKED_STATUSES:
            return run.outcome("nothing to resume")
        run.status = transition(run.status, Event.RESUMED)
        await self._reconcile(run)
        return await self._drive(run, fence)

    async def deliver(self, event: StepEvent) -> DeliveryOutcome:
        """Run one step invocation if it is the transaction's next action (see module doc)."""
        run = await self._load(event.transaction_id)
        if run.status in FINAL_STATUSES or run.status in PARKED_STATUSES:
            return DeliveryOutcome.STALE
        if await self._quarantine_if_expired(run):
            return DeliveryOutcome.QUARANTINED
        if run.status in _RETRY_PENDING:
            run.status = transition(run.status, Event.RESUMED)
        await self._reconcile(run)
        action = self._next(run)
        wanted = _ACTION_FOR.get(event.execution_type)
        if wanted is None or action.kind is not wanted or action.step_name != event.step_name:
            return DeliveryOutcome.STALE
        return await self._invoke(
            run, run.saga.step(event.step_name), event.execution_type, heal_skips=event.heal
        )

    async def admin_restore(self, transaction_id: uuid.UUID, *, drive: bool = True) -> SagaOutcome:
        """Take a FROZEN or QUARANTINED transaction back and drive it again now.

        FROZEN resumes compensation (the failed compensation runs again, same idempotency key);
        QUARANTINED resumes in the direction it was going. Either gets a fresh lifetime.
        ``drive=False`` only takes it back (event-driven flows then publish its next step).
        """
        run = await self._load(transaction_id)
        done = progress(run.saga.step_names, run.tryouts)
        reverting = done.reverting or run.status is RunningStatus.FROZEN
        event = Event.ADMIN_RESTORED_REVERT if reverting else Event.ADMIN_RESTORED_FORWARD
        status = transition(run.status, event)  # IllegalTransitionError unless parked
        now = self._now()
        async with self.store.state_change("unfreeze"):
            await self._append(
                run, LIFECYCLE_EXECUTOR, ExecutionType.ADMIN_RESTORE, TryoutStatus.RESTORED, now
            )
            run.payload = replace(run.payload, suspended_from=None, last_error=None)
            run.status = status
            path = await self.recovery.register_watchdog(run.key, now)
            run.restore_path = path or run.restore_path
            await self.store.unfreeze(
                run.key, status=status, payload=run.payload.encode(), now=now, restore_path=path
            )
            await self._reset_failed_marker(run)
        logger.info("admin restore: txn=%s now=%s", run.key, status.value)
        if not drive:
            return run.outcome("restored; not driven")
        return await self._drive(run)

    async def read(self, transaction_id: uuid.UUID) -> TransactionView:
        """The transaction with its whole tryout history (one read per table)."""
        return await self.store.read(self._key(transaction_id))

    # -- driving ------------------------------------------------------------------------------

    async def _drive(self, run: _Run, fence: StepFence | None = None) -> SagaOutcome:
        for _ in range(2 * len(run.saga.steps) + 3):
            if fence is not None and fence.token() is None:
                raise LeaseFencedError(f"{run.key}: range lease lost; stopped between steps")
            if await self._quarantine_if_expired(run):
                return run.outcome("lifetime expired")
            action = self._next(run)
            if action.kind is NextKind.NONE:
                return run.outcome()
            if action.kind is NextKind.COMPLETE:
                await self._finish(run, Event.LAST_STEP_SUCCEEDED, fence)
                return run.outcome()
            if action.kind is NextKind.REVERT_COMPLETE:
                await self._finish(run, Event.LAST_COMPENSATION_SUCCEEDED, fence)
                return run.outcome()
            check_state(action.step_name is not None, "a step action names its step")
            kind = ExecutionType(action.kind.value)
            step = run.saga.step(str(action.step_name))
            result = await self._invoke(run, step, kind, heal_skips=True, fence=fence)
            if result is DeliveryOutcome.LEASE_BUSY:
                return run.outcome(f"another worker holds the lease of {step.name}", result)
            if result is DeliveryOutcome.LEASE_LOST:
                return run.outcome(f"lease of {step.name} lost; another worker took over", result)
            if result is DeliveryOutcome.FAILED_RETRYABLE or run.status in PARKED_STATUSES:
                return run.outcome()
        check_state(False, f"{run.key}: drive loop did not converge")
        return run.outcome()

    def _next(self, run: _Run) -> NextAction:
        done = progress(run.saga.step_names, run.tryouts)
        return next_action(run.status, run.saga.step_names, run.saga.compensable, done)

    async def _finish(self, run: _Run, event: Event, fence: StepFence | None = None) -> None:
        """Write a final status the last invocation did not already write, then release."""
        try:
            async with self.store.state_change("finish", fence=_fencing_row(fence)):
                if run.status not in FINAL_STATUSES:
                    run.status = transition(run.status, event)
                    await self.store.write_state(
                        run.key, run.status, run.payload.encode(), self._now()
                    )
                await self._release(run)
        except StateChangeConflict as exc:
            _raise_if_fenced(exc, fence, run.key, "completion")
            raise

    async def _invoke(
        self,
        run: _Run,
        step: Step,
        kind: ExecutionType,
        *,
        heal_skips: bool,
        fence: StepFence | None = None,
    ) -> DeliveryOutcome:
        """One step invocation and its outcome's writes: one state change (accord: one
        transaction, refused if another worker recorded the invocation first)."""
        try:
            async with self.store.state_change("step", fence=_fencing_row(fence)):
                return await self._invoke_step(run, step, kind, heal_skips=heal_skips, fence=fence)
        except LeaseFenceRefusedError:
            _lose(fence)
            raise
        except StateChangeConflict as exc:
            _raise_if_fenced(exc, fence, run.key, step.name)
            logger.warning("txn=%s step=%s: %s", run.key, step.name, exc)
            fresh = await self._load(run.key.transaction_id)
            run.payload, run.status, run.tryouts = fresh.payload, fresh.status, fresh.tryouts
            run.restore_path = fresh.restore_path
            return DeliveryOutcome.LEASE_LOST

    async def _invoke_step(
        self,
        run: _Run,
        step: Step,
        kind: ExecutionType,
        *,
        heal_skips: bool,
        fence: StepFence | None = None,
    ) -> DeliveryOutcome:
        """One step invocation under its marker; updates ``run`` and the store."""
        policy = self.settings.cassandra.write_protection.policy_for(run.saga.domain)
        marker = MarkerKey(run.key, step_id(step.name, kind))
        attempt = progress(run.saga.step_names, run.tryouts).attempts.get((step.name, kind), 0)
        # Decided before user code runs: a bug in the state table must not pass for a step error.
        success = transition(run.status, self._success_event(run, step, kind))

        async def action() -> _StepDone:
            done = await self._call_step(run, step, kind, attempt + 1, success)
            if fence is not None and policy.mode is not ConsistencyMode.STRICT:
                await self._refuse_if_taken_over(run, step, kind, fence)
            return done

        try:
            result = await self.protection.run(
                marker,
                policy,
                action,
                result_writes=lambda done: [self._state_write(run, done)],
                is_final_failure=lambda error: (
                    not (
                        isinstance(error, LeaseLostError)
                        or (isinstance(error, _StepFailed) and error.retryable)
                    )
                ),
                fence=fence.token if fence is not None else None,
                epoch=_fenced_epoch(fence),
            )
        except _StepFailed as failure:
            return await self._on_failure(run, step, kind, attempt + 1, failure)
        except LeaseBusyError as exc:
            logger.info("txn=%s: %s", run.key, exc)
            return DeliveryOutcome.LEASE_BUSY
        except LeaseLostError as exc:
            logger.warning("txn=%s: %s", run.key, exc)
            return DeliveryOutcome.LEASE_LOST
        if result.outcome is GuardOutcome.EXECUTED:
            done = result.value
            if done is None:
                raise InvariantViolation("an executed step has a result")
            run.payload, run.status = done.payload, done.status
            await self._append(run, step.name, kind, TryoutStatus.SUCCESS, self._now())
            if run.status in FINAL_STATUSES:
                await self._release(run)
            return DeliveryOutcome.EXECUTED
        if not heal_skips:
            return DeliveryOutcome(result.outcome.value)
        return await self._heal(run, step, kind, result.outcome, attempt + 1)

    async def _refuse_if_taken_over(
        self, run: _Run, step: Step, kind: ExecutionType, fence: StepFence
    ) -> None:
        """RELAXED_WITH_DEDUP, after the step ran under a fence: if the range moved meanwhile
        and the history shows the invocation finished by someone else (the range's new
        holder), write nothing. Its status would be older than the new holder's, which may
        have finished the saga by now and released its watchdog: overwritten, the saga would
        sit unfinished with nothing left to recover it. (STRICT refuses on the epoch alone.)
        If nobody finished it, the result is written as usual, so the new holder skips it."""
        if fence.token() is not None:
            return
        if (step.name, kind) in _finished(await self.store.read_tryouts(run.key)):
            raise LeaseLostError(
                f"{run.key} step {step.name}: the range moved while the step ran and its new "
                "holder recorded the step; this result is not written"
            )

    async def _call_step(
        self, run: _Run, step: Step, kind: ExecutionType, attempt: int, status: RunningStatus
    ) -> _StepDone:
        """Run user code; everything it raises comes out as _StepFailed."""
        function = step.execute if kind is ExecutionType.EXECUTE else step.compensate
        if function is None:
            raise InvariantViolation(f"step {step.name} has no {kind.value.lower()}")
        hints = dict(run.payload.revert_hints)
        context = StepContext(
            transaction_id=run.key.transaction_id,
            saga_name=run.saga.name,
            step_name=step.name,
            execution_type=kind,
            idempotency_key=idempotency_key(run.key.transaction_id, step.name, kind),
            attempt=attempt,
            aggregate=MappingProxyType(dict(run.payload.aggregate)),
            revert_hints=hints,
        )
        try:
            returned = await asyncio.wait_for(function(context), step.timeout.total_seconds())
            if returned is not None and not isinstance(returned, Mapping):
                raise TypeError(
                    f"step {step.name!r} returned {type(returned).__name__}; "
                    "return a mapping (merged into the aggregate) or None"
                )
            aggregate = {**run.payload.aggregate, **(returned or {})}
            payload = replace(run.payload, aggregate=aggregate, revert_hints=hints, last_error=None)
            return _StepDone(payload, status, payload.encode())
        except Exception as error:
            # Transients retry, business errors compensate; the step's, then the saga's
            # classifier override (stacksaga_store.saga.classify).
            retryable = is_retryable(error, step.classify, run.saga.classify)
            raise _StepFailed(error, retryable) from error

    def _success_event(self, run: _Run, step: Step, kind: ExecutionType) -> Event:
        done = progress(run.saga.step_names, run.tryouts)
        if kind is ExecutionType.EXECUTE:
            last = step.name == run.saga.step_names[-1]
            return Event.LAST_STEP_SUCCEEDED if last else Event.STEP_SUCCEEDED
        remaining = [
            name
            for name in done.executed
            if name in run.saga.compensable and name not in done.compensated and name != step.name
        ]
        return Event.COMPENSATION_SUCCEEDED if remaining else Event.LAST_COMPENSATION_SUCCEEDED

    def _state_write(self, run: _Run, done: _StepDone) -> tuple[Prepared, Sequence[Any]]:
        write = self.store.state_write(run.key, done.status, done.encoded, self._now())
        return write.prepared, write.params

    async def _on_failure(
        self, run: _Run, step: Step, kind: ExecutionType, attempt: int, failure: _StepFailed
    ) -> DeliveryOutcome:
        now = self._now()
        text = str(failure)[:ERROR_TEXT_MAX]
        forward = kind is ExecutionType.EXECUTE
        tryout_status = (
            TryoutStatus.RETRYABLE_ERROR if failure.retryable else TryoutStatus.NON_RETRYABLE_ERROR
        )
        logger.info(
            "txn=%s step=%s %s failed (%s): %s",
            run.key,
            step.name,
            kind.value,
            tryout_status.value,
            text,
        )
        if failure.retryable:
            # The retry pointer first: once it is durable, a crash before the tryout or the
            # status is written still retries the saga in its next window (a retry row of an
            # active saga is resumed); written last, the same crash left it to the watchdog.
            await self.recovery.schedule_retry(
                RetryRequest(run.key, step.name, kind, attempt, text, now)
            )
        await self._append(run, step.name, kind, tryout_status, now)
        run.payload = replace(run.payload, last_error=f"{step.name}: {text}")
        if failure.retryable:
            event = Event.STEP_FAILED_RETRYABLE if forward else Event.COMPENSATION_FAILED_RETRYABLE
            run.status = transition(run.status, event)
            await self.store.write_state(run.key, run.status, run.payload.encode(), now)
            return DeliveryOutcome.FAILED_RETRYABLE
        if forward:
            run.status = transition(run.status, Event.STEP_FAILED_PERMANENTLY)
            await self.store.write_state(run.key, run.status, run.payload.encode(), now)
            return DeliveryOutcome.FAILED_PERMANENTLY
        run.status = transition(run.status, Event.COMPENSATION_FAILED_PERMANENTLY)
        reason = f"COMPENSATION_FAILED step={step.name}: {text}"
        await self.store.freeze(
            run.key, status=run.status, payload=run.payload.encode(), reason=reason, now=now
        )
        await self._release(run)
        logger.warning("txn=%s frozen: %s", run.key, reason)
        return DeliveryOutcome.FAILED_PERMANENTLY

    async def _heal(
        self, run: _Run, step: Step, kind: ExecutionType, outcome: GuardOutcome, attempt: int
    ) -> DeliveryOutcome:
        """The marker says an earlier run finished this invocation but its tryout is missing
        (it died in between): record that, take over its result, carry on."""
        if outcome is GuardOutcome.ALREADY_FAILED:
            error = StepError("an earlier attempt failed permanently (marker FAILED)")
            return await self._on_failure(run, step, kind, attempt, _StepFailed(error, False))
        fresh = await self._load(run.key.transaction_id)
        run.payload, run.status, run.tryouts = fresh.payload, fresh.status, fresh.tryouts
        run.restore_path = fresh.restore_path
        if (step.name, kind) in _finished(run.tryouts):
            return DeliveryOutcome.ALREADY_COMMITTED
        await self._append(run, step.name, kind, TryoutStatus.ALREADY_COMMITTED, self._now())
        if run.status not in FINAL_STATUSES:
            return DeliveryOutcome.ALREADY_COMMITTED
        await self._release(run)
        return DeliveryOutcome.ALREADY_COMMITTED

    # -- lifetime, restore, bookkeeping ----------------------------------------------------

    async def _quarantine_if_expired(self, run: _Run) -> bool:
        lifetime = self.settings.cassandra.transaction.lifetime
        started = lifetime_started_at(run.created_at, run.tryouts)
        now = self._now()
        if now - started <= lifetime:
            return False
        previous = run.status
        run.status = transition(previous, Event.LIFETIME_EXPIRED)
        async with self.store.state_change("freeze"):
            await self._append(
                run, LIFECYCLE_EXECUTOR, ExecutionType.QUARANTINE, TryoutStatus.QUARANTINED, now
            )
            run.payload = replace(run.payload, suspended_from=previous.value)
            reason = (
                f"LIFETIME_EXPIRED: older than {lifetime} (since {started.isoformat()}) "
                f"while {previous.value}"
            )
            await self.store.freeze(
                run.key, status=run.status, payload=run.payload.encode(), reason=reason, now=now
            )
            await self._release(run)
        logger.warning("txn=%s quarantined: %s", run.key, reason)
        return True

    async def _reset_failed_marker(self, run: _Run) -> None:
        action = self._next(run)
        if action.kind not in (NextKind.EXECUTE, NextKind.COMPENSATE):
            return
        kind = ExecutionType(action.kind.value)
        marker = MarkerKey(run.key, step_id(str(action.step_name), kind))
        policy = self.settings.cassandra.write_protection.policy_for(run.saga.domain)
        if await self.protection.reset_failed(marker, policy):
            logger.info(
                "txn=%s: FAILED marker of %s removed for the restore", run.key, marker.step_id
            )

    async def _release(self, run: _Run) -> None:
        await self.recovery.release_watchdog(run.key, run.restore_path, run.status)

    async def _append(
        self,
        run: _Run,
        executor: str,
        kind: ExecutionType,
        status: TryoutStatus,
        now: datetime,
    ) -> None:
        expected = len(run.tryouts)
        record = await self.store.append_tryout(
            run.key, expected, executor=executor, execution_type=kind, status=status, now=now
        )
        if record.tryout_index != expected:
            # Someone appended concurrently (a duplicate delivery): take the full history.
            run.tryouts = list(await self.store.read_tryouts(run.key))
            return
        run.tryouts.append(record)

    async def _reconcile(self, run: _Run) -> None:
        """Trust the history over the status when a crash left them apart (see module doc)."""
        done = progress(run.saga.step_names, run.tryouts)
        if done.reverting and run.status in _FORWARD:
            run.status = transition(run.status, Event.STEP_FAILED_PERMANENTLY)
            await self.store.write_state(run.key, run.status, run.payload.encode(), self._now())

    async def _load(self, transaction_id: uuid.UUID) -> _Run:
        view = await self.store.read(self._key(transaction_id))
        payload = SagaPayload.decode(view.record.payload)
        saga = self._saga(payload.saga)
        if payload.steps != saga.step_names:
            raise SagaDefinitionError(
                f"transaction {transaction_id} started with steps {list(payload.steps)}; "
                f"saga {saga.name!r} now has {list(saga.step_names)}"
            )
        return _Run(
            key=view.key,
            saga=saga,
            status=view.status,
            payload=payload,
            created_at=view.record.created_at,
            tryouts=list(view.tryouts),
            restore_path=view.record.restore_path,
        )

    def _key(self, transaction_id: uuid.UUID) -> TransactionKey:
        return TransactionKey.of(self.settings.instance, transaction_id)

    def _now(self) -> datetime:
        # Cassandra keeps milliseconds; truncating here keeps memory and store identical.
        now = self.clock.now()
        return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _fencing_row(fence: StepFence | None) -> FencingRow | None:
    return None if fence is None else fence.fencing_row()


def _fenced_epoch(fence: StepFence | None) -> int | None:
    """The lease's epoch where the coordinator persists it (STRICT claims it in ordered mode)."""
    row = _fencing_row(fence)
    return None if row is None else row.epoch


def _lose(fence: StepFence | None) -> None:
    if fence is not None:
        fence.refused()


def _raise_if_fenced(
    conflict: StateChangeConflict, fence: StepFence | None, key: TransactionKey, what: str
) -> None:
    """A change refused by its epoch condition ends the dispatch's lease, not just this
    change: the node would otherwise go on (and dispatch the saga again) under an epoch the
    store already knows is over, running steps it can never record."""
    if fence is None or not any(part.startswith(FENCE_PART) for part in conflict.parts):
        return
    fence.refused()
    raise LeaseFenceRefusedError(
        f"{key} {what}: refused by the range lease's epoch condition ({conflict}); "
        "the lease is lost"
    ) from conflict


def _finished(tryouts: Sequence[TryoutRecord]) -> set[tuple[str, ExecutionType]]:
    return {
        (tryout.executor, tryout.execution_type)
        for tryout in tryouts
        if tryout.status in (TryoutStatus.SUCCESS, TryoutStatus.ALREADY_COMMITTED)
    }
