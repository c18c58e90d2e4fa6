"""The recovery engine's retries and restores, re-entering through the steps topics.

A Kafka-driven service hands :meth:`KafkaReentry.resume` to its Retry-Node
(``RecoveryEngine.retry_node(..., reenter=reentry.resume)``). Instead of running the saga's
next step in the Retry-Node's process, it publishes that step's command to the saga domain's
steps topic (key = transaction id, ``acks=all``, awaited), so a worker of the consumer group
runs it under the domain's write protection and commits its offset only after the marker, as
for every other step. What counts as "next" is what :meth:`Orchestrator.deliver` will accept:
the transaction's next action, with a retry-pending status read as resumed (deliver resumes
it the same way).

* Final or parked: nothing is published (the watchdog pickup treats it as done).
* COMPLETE / REVERT_COMPLETE (the last step committed, the final status or the watchdog
  release was lost): ``Orchestrator.resume``, which runs no step, finishes it here.
* The command carries ``heal``: a step whose marker is final while its tryout row is missing
  (a worker died in between) is recorded and carried on by the worker, as the in-process
  resume heals it; a plain delivery turns it away, which would leave the saga stuck.
* The fence (the Retry-Node's range lease) is checked before publishing; once lost,
  LeaseFencedError, so the row stays for the range's next holder. A command published by a
  holder that lost its lease meanwhile is only a duplicate: the marker turns it away.

The dispatch counts as done once the broker acknowledged the command; if the worker's
delivery then fails retryably again, the orchestrator writes a new retry row (window W+1) as
it does for an in-process run, and the saga's watchdog stays armed throughout.

:meth:`KafkaReentry.admin_restore` is the admin restore of a FROZEN or QUARANTINED saga
(``Orchestrator.admin_restore(drive=False)``, then the next command on the topic).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from types import MappingProxyType

from stacksaga_store.errors import LeaseFencedError
from stacksaga_store.kafka.worker import StepPublisher
from stacksaga_store.saga.definition import SagaPayload
from stacksaga_store.saga.orchestrator import Orchestrator, SagaOutcome, StepEvent, StepFence
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    PARKED_STATUSES,
    Event,
    ExecutionType,
    NextKind,
    RunningStatus,
    next_action,
    progress,
    transition,
)

__all__ = ["KafkaReentry"]

logger = logging.getLogger(__name__)

_RETRY_PENDING = (
    RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
    RunningStatus.REVERT_FAILED_WITH_RETRYABLE_ERROR,
)


class KafkaReentry:
    """Resumes sagas by publishing their next step command (module docstring)."""

    def __init__(self, orchestrator: Orchestrator, publisher: StepPublisher) -> None:
        self.orchestrator = orchestrator
        self.publisher = publisher
        self.published = 0

    async def resume(
        self, transaction_id: uuid.UUID, *, fence: StepFence | None = None
    ) -> SagaOutcome:
        """The Retry-Node's re-invocation (``stacksaga_store.recovery.retry_node.Reentry``)."""
        view = await self.orchestrator.read(transaction_id)
        payload = SagaPayload.decode(view.record.payload)
        status = view.status
        outcome = SagaOutcome(
            transaction_id=transaction_id,
            status=status,
            aggregate=MappingProxyType(dict(payload.aggregate)),
            last_error=payload.last_error,
        )
        if status in FINAL_STATUSES or status in PARKED_STATUSES:
            return replace(outcome, note="nothing to resume")
        saga = next(s for s in self.orchestrator.sagas if s.name == payload.saga)
        wanted = transition(status, Event.RESUMED) if status in _RETRY_PENDING else status
        action = next_action(
            wanted, saga.step_names, saga.compensable, progress(saga.step_names, view.tryouts)
        )
        if action.kind in (NextKind.COMPLETE, NextKind.REVERT_COMPLETE):
            return await self.orchestrator.resume(transaction_id, fence=fence)
        if action.kind not in (NextKind.EXECUTE, NextKind.COMPENSATE) or not action.step_name:
            return replace(outcome, note="no step to publish")
        if fence is not None and fence.token() is None:
            raise LeaseFencedError(f"txn={transaction_id}: range lease lost; nothing published")
        kind = ExecutionType(action.kind.value)
        event = StepEvent(transaction_id, action.step_name, kind, heal=True)
        await self.publisher.publish(saga, event)
        self.published += 1
        note = f"re-entered through Kafka: {event.execution_type.value} {event.step_name}"
        logger.info("txn=%s: %s", transaction_id, note)
        return replace(outcome, note=note)

    async def admin_restore(self, transaction_id: uuid.UUID) -> SagaOutcome:
        """Take a FROZEN or QUARANTINED saga back and publish its next step command."""
        await self.orchestrator.admin_restore(transaction_id, drive=False)
        return await self.resume(transaction_id)
