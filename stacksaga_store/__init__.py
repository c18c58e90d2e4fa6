"""StackSaga Cassandra event store and saga API for Python (seed 000, Parts 1-3).

Theory of operation
-------------------
A *saga* (:class:`Saga`) is an ordered list of *steps* (:class:`Step`), each an async
``execute`` and an optional async ``compensate``. :class:`Orchestrator` runs a saga as a
*transaction* whose state lives in Cassandra, in the seed's tables:

* ``es_transaction``: one row per transaction: status, JSON payload (aggregate and revert
  hints), timestamps and the restore watchdog's path;
* ``es_transaction_tryout``: one row per attempt (*tryout*), append-only, index 0, 1, 2, ...;
  the saga's position is derived from it (:mod:`stacksaga_store.store.states`);
* ``es_execution_markers``: one row per step invocation, written by write protection
  (:mod:`stacksaga_store.store.protection`) so a step's business logic runs once per marker:
  STRICT (LWT lease with a TTL, then a permanent COMMITTED) or RELAXED_WITH_DEDUP (a read check,
  then result and marker in one logged batch), per saga domain;
* ``es_frozen_transaction``: transactions parked because a compensation failed (FROZEN) or they
  outlived ``transaction.lifetime`` (QUARANTINED); :meth:`Orchestrator.admin_restore` takes them
  back;
* the five recovery-directory tables of the recovery engine (seed Part 4), which plugs in
  through :class:`~stacksaga_store.saga.handoff.RecoveryHandoff`:
  :class:`~stacksaga_store.recovery.writer.RecoveryWriter` is the Standard-Node side,
  :class:`~stacksaga_store.recovery.retry_node.RetryNode` walks the directory on a token-range lease
  from the ring coordinator (:mod:`stacksaga_store.ring.server`), Node-0 compacts
  (:mod:`stacksaga_store.recovery.compaction`), and
  :class:`~stacksaga_store.recovery.engine.RecoveryEngine`
  wires them onto a runtime; see docs/recovery-engine.md.

Configuration (:func:`load_settings`) carries every property of the seed's Properties Reference;
the Cassandra connection comes from a DataStax-format HOCON file
(:mod:`stacksaga_store.config.driver`).

Glossary: *invocation* = one step's execute (or compensate) within one transaction, retried
under the same idempotency key; *delivery* = one attempt to run an invocation (a Kafka
redelivery is a second delivery of the same invocation); *parked* = FROZEN or QUARANTINED.

Module map, one subpackage a layer (each imports only those below it; pyproject's import-linter
contract holds them to it): ``recovery`` (the engine: windows, directory, directory_show, writer,
commit_modes, retry_node, lease_client, compaction, metrics, engine) over ``ring`` (leases,
auth, server: the ring coordinator) and ``saga`` (definition, orchestrator, handoff, runtime),
which import nothing of each other, over ``store`` (cql, connect, schema, extension_schema,
model, states, events, protection) over ``config`` (settings, durations, hocon, driver);
``clock`` and ``errors`` beneath all; ``demo`` and ``__main__`` (the CLI) on top; ``v1``
(generated gRPC code).
"""

from __future__ import annotations

from stacksaga_store.clock import Clock, ManualClock, SystemClock
from stacksaga_store.config.settings import (
    CommitModeName,
    ConsistencyMode,
    StackSagaSettings,
    load_settings,
)
from stacksaga_store.errors import (
    ConfigError,
    NonRetryableStepError,
    RetryableStepError,
    SagaDefinitionError,
    StackSagaError,
)
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.retry_node import RetryNode, SagaDispatcher
from stacksaga_store.recovery.service import open_runtime
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.recovery.writer import RecoveryWriter
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.handoff import (
    NoRecoveryHandoff,
    RecordingRecoveryHandoff,
    RecoveryHandoff,
)
from stacksaga_store.saga.orchestrator import DeliveryOutcome, Orchestrator, SagaOutcome, StepEvent
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.store.states import ExecutionType, RunningStatus, TryoutStatus

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
