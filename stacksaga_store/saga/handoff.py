"""The interface to the recovery engine (seed Part 4), which a later issue implements.

The orchestrator is the seed's *Standard-Node*: it tells the recovery engine three things and
never waits on it for anything else.

========================  =====================================================================
call                      seed Part 4
========================  =====================================================================
``register_watchdog``     onTransactionStart: restore watchdog row at W + delay-windows (odd
                          bucket); the returned :class:`RestorePath` is stored in
                          es_transaction.restore_* by the orchestrator.
``schedule_retry``        onTransientFailure: retry pointer at W+1 (even bucket).
``release_watchdog``      onTransactionComplete: delete the watchdog row. Also called when a
                          transaction is frozen or quarantined (not re-exposed to recovery).
========================  =====================================================================

Contract (ordering and durability)
----------------------------------
* ``register_watchdog`` returns only after the watchdog row is durable. It runs *before* the
  es_transaction row is written, so a crash in between leaves a watchdog pointing at a
  transaction that does not exist; the recovery engine must drop such rows at pickup.
* ``schedule_retry`` runs *before* the failed tryout and the FAILED_WITH_RETRYABLE_ERROR (or
  REVERT_FAILED_WITH_RETRYABLE_ERROR) status are written, and must be durable on return: a
  crash after it, before either write, still retries the saga in its next window (the engine
  resumes an active saga found under a retry pointer). If it raises, nothing of the failure
  is recorded and the restore watchdog still covers the transaction.
* ``release_watchdog`` is best effort: the seed's restore pickup skips final statuses, so a
  watchdog that outlives its transaction costs one status read.
* To re-invoke a transaction the engine calls ``Orchestrator.resume(transaction_id)``, which is
  safe to call for any status (final and parked ones are left alone) and skips steps whose
  execution marker is already COMMITTED.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from stacksaga_store.store.model import RestorePath, TransactionKey
from stacksaga_store.store.states import ExecutionType, RunningStatus

__all__ = [
    "HandoffCall",
    "NoRecoveryHandoff",
    "RecordingRecoveryHandoff",
    "RecoveryHandoff",
    "RetryRequest",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """A transient failure handed to the recovery engine."""

    key: TransactionKey
    step_name: str
    execution_type: ExecutionType
    attempt: int
    error: str
    failed_at: datetime


class RecoveryHandoff(Protocol):
    """What the orchestrator tells the recovery engine (see the module docstring)."""

    async def register_watchdog(
        self, key: TransactionKey, started_at: datetime
    ) -> RestorePath | None:
        """Write the restore watchdog; returns its path, or None if there is no engine."""
        ...

    async def schedule_retry(self, request: RetryRequest) -> None:
        """Write the retry pointer for a transient failure."""
        ...

    async def release_watchdog(
        self, key: TransactionKey, path: RestorePath | None, status: RunningStatus
    ) -> None:
        """Delete the watchdog: the transaction ended (or was frozen or quarantined)."""
        ...


class NoRecoveryHandoff:
    """No recovery engine: retries wait for a manual ``resume``. Logs what it drops."""

    async def register_watchdog(
        self, key: TransactionKey, started_at: datetime
    ) -> RestorePath | None:
        return None

    async def schedule_retry(self, request: RetryRequest) -> None:
        logger.info(
            "retry needed but no recovery engine: txn=%s step=%s type=%s attempt=%d error=%s",
            request.key,
            request.step_name,
            request.execution_type.value,
            request.attempt,
            request.error,
        )

    async def release_watchdog(
        self, key: TransactionKey, path: RestorePath | None, status: RunningStatus
    ) -> None:
        return None


@dataclass(frozen=True, slots=True)
class HandoffCall:
    """One call a :class:`RecordingRecoveryHandoff` saw."""

    method: str
    key: TransactionKey
    detail: object


class RecordingRecoveryHandoff:
    """Remembers every call, in order; for tests and the demo.

    ``path`` is returned from ``register_watchdog`` so the restore columns get exercised.
    """

    CALLS_MAX = 100_000

    def __init__(self, path: RestorePath | None = None) -> None:
        self.path = path
        self.calls: list[HandoffCall] = []

    def _record(self, call: HandoffCall) -> None:
        # A bound on memory: a long demo or bench must not grow this without limit.
        if len(self.calls) >= self.CALLS_MAX:
            del self.calls[: self.CALLS_MAX // 2]
        self.calls.append(call)

    async def register_watchdog(
        self, key: TransactionKey, started_at: datetime
    ) -> RestorePath | None:
        self._record(HandoffCall("register_watchdog", key, started_at))
        return self.path

    async def schedule_retry(self, request: RetryRequest) -> None:
        self._record(HandoffCall("schedule_retry", request.key, request))

    async def release_watchdog(
        self, key: TransactionKey, path: RestorePath | None, status: RunningStatus
    ) -> None:
        self._record(HandoffCall("release_watchdog", key, status))

    def retries(self) -> list[RetryRequest]:
        return [c.detail for c in self.calls if isinstance(c.detail, RetryRequest)]

    def methods_for(self, key: TransactionKey) -> list[str]:
        return [c.method for c in self.calls if c.key == key]
