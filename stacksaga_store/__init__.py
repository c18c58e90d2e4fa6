"""StackSaga Cassandra event store and saga API for Python (seed 000, Parts 1-3).

Theory of operation
-------------------
A *saga* (:class:`Saga`) is an ordered list of *steps* (:class:`Step`), each an async
``execute`` and an optional async ``compensate``. :class:`Orchestrator` runs a saga as a
*transaction* whose state lives in Cassandra, in the seed's tables:

* ``es_transaction``: one row per transaction: status, JSON payload (aggregate and revert
  hints), timestamps and the restore watchdog's path;
* ``es_transaction_tryout``: one row per attempt (*tryout*), append-only, index 0, 1, 2, ...;
  the saga's position is derived from it (:mod:`stacksaga_store.states`);
* ``es_execution_markers``: one row per step invocation, written by write protection
  (:mod:`stacksaga_store.protection`) so a step's business logic runs once per marker:
  STRICT (LWT lease with a TTL, then a permanent COMMITTED) or RELAXED_WITH_DEDUP (a read check,
  then result and marker in one logged batch), per saga domain;
* ``es_frozen_transaction``: transactions parked because a compensation failed (FROZEN) or they
  outlived ``transaction.lifetime`` (QUARANTINED); :meth:`Orchestrator.admin_restore` takes them
  back;
* the five recovery-directory tables of the recovery engine (seed Part 4), which plugs in
  through :class:`~stacksaga_store.recovery.RecoveryHandoff`:
  :class:`~stacksaga_store.writer.RecoveryWriter` is the Standard-Node side,
  :class:`~stacksaga_store.retry_node.RetryNode` walks the directory on a token-range lease
  from the ring coordinator (:mod:`stacksaga_store.coordinator`), Node-0 compacts
  (:mod:`stacksaga_store.compaction`), and :class:`~stacksaga_store.engine.RecoveryEngine`
  wires them onto a runtime; see docs/recovery-engine.md.

Configuration (:func:`load_settings`) carries every property of the seed's Properties Reference;
the Cassandra connection comes from a DataStax-format HOCON file (:mod:`stacksaga_store.driver`).

Glossary: *invocation* = one step's execute (or compensate) within one transaction, retried
under the same idempotency key; *delivery* = one attempt to run an invocation (a Kafka
redelivery is a second delivery of the same invocation); *parked* = FROZEN or QUARANTINED.

Module map: config, durations, hocon, driver (configuration); cql (asyncio bridge); schema,
extension_schema; model, states, store (event store); protection (write protection); saga,
orchestrator, recovery (saga API); runtime (wiring); demo; ``__main__`` (CLI). Recovery engine:
windows, directory, directory_show, commit_modes, writer, retry_node, compaction, ring,
coordinator, lease_client, recovery_metrics, engine; ``v1`` (generated gRPC code).
"""

from __future__ import annotations

from stacksaga_store.clock import Clock, ManualClock, SystemClock
from stacksaga_store.config import (
    CommitModeName,
    ConsistencyMode,
    StackSagaSettings,
    load_settings,
)
from stacksaga_store.engine import RecoveryEngine
from stacksaga_store.errors import (
    ConfigError,
    NonRetryableStepError,
    RetryableStepError,
    SagaDefinitionError,
    StackSagaError,
)
from stacksaga_store.orchestrator import DeliveryOutcome, Orchestrator, SagaOutcome, StepEvent
from stacksaga_store.recovery import NoRecoveryHandoff, RecordingRecoveryHandoff, RecoveryHandoff
from stacksaga_store.retry_node import RetryNode, SagaDispatcher
from stacksaga_store.ring import StaticLeaseSource
from stacksaga_store.runtime import StoreRuntime, open_runtime
from stacksaga_store.saga import Saga, Step, StepContext
from stacksaga_store.states import ExecutionType, RunningStatus, TryoutStatus
from stacksaga_store.windows import WindowMath
from stacksaga_store.writer import RecoveryWriter

__all__ = [
    "Clock",
    "CommitModeName",
    "ConfigError",
    "ConsistencyMode",
    "DeliveryOutcome",
    "ExecutionType",
    "ManualClock",
    "NoRecoveryHandoff",
    "NonRetryableStepError",
    "Orchestrator",
    "RecordingRecoveryHandoff",
    "RecoveryEngine",
    "RecoveryHandoff",
    "RecoveryWriter",
    "RetryNode",
    "RetryableStepError",
    "RunningStatus",
    "Saga",
    "SagaDefinitionError",
    "SagaDispatcher",
    "SagaOutcome",
    "StackSagaError",
    "StackSagaSettings",
    "StaticLeaseSource",
    "Step",
    "StepContext",
    "StepEvent",
    "StoreRuntime",
    "SystemClock",
    "TryoutStatus",
    "WindowMath",
    "load_settings",
    "open_runtime",
]
