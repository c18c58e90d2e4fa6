"""Wiring: settings + driver file -> connected session -> event store, protection, orchestrator.

:func:`open_runtime` here is the store alone, the recovery engine's building block: an
orchestrator it builds without a ``recovery=`` handoff has no recovery (and logs a warning
saying so). An application calls
``stacksaga_store.open_runtime`` (:mod:`stacksaga_store.recovery.service`), the same plus the
recovery engine, in the same way::

    settings = load_settings("stacksaga.yaml")
    runtime = await open_runtime(settings)
    orchestrator = runtime.orchestrator(sagas=[order_saga])
    outcome = await orchestrator.start(order_saga, {"order_id": 42})
    await runtime.close()

Connecting and preparing block in the driver, so they run in a worker thread; everything after
that is non-blocking (:mod:`stacksaga_store.store.cql`). The schema must exist (``python -m
stacksaga_store schema apply``); preparing the statements fails fast if a table is missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from stacksaga_store.clock import Clock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.handoff import RecoveryHandoff
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.store.connect import open_cql
from stacksaga_store.store.cql import CqlSession
from stacksaga_store.store.events import CassandraEventStore
from stacksaga_store.store.protection import WriteProtection

__all__ = ["RecoveryPlug", "StoreRuntime", "open_runtime"]

logger = logging.getLogger(__name__)


class RecoveryPlug(Protocol):
    """The recovery engine as a runtime sees it (implemented one layer up, in
    :mod:`stacksaga_store.recovery.service`): the handoff and clock an orchestrator gets by
    default, and the Retry-Node it starts for the sagas of the orchestrators it serves."""

    @property
    def handoff(self) -> RecoveryHandoff: ...

    @property
    def clock(self) -> Clock: ...

    def attach(self, orchestrator: Orchestrator) -> None: ...

    async def close(self) -> None: ...


@dataclass
class StoreRuntime:
    """A connected store. Close it to shut the driver's threads down.

    With a ``recovery`` plug (what ``stacksaga_store.open_runtime`` gives), an orchestrator
    built without an explicit ``recovery`` handoff is wired to the recovery engine; without
    one (this module's :func:`open_runtime`, the engine's own building block) it gets
    :class:`~stacksaga_store.saga.handoff.NoRecoveryHandoff`.
    """

    settings: StackSagaSettings
    driver_config: DriverConfig
    cluster: Any
    cql: CqlSession
    events: CassandraEventStore
    protection: WriteProtection
    recovery: RecoveryPlug | None = None

    def orchestrator(
        self,
        *,
        recovery: RecoveryHandoff | None = None,
        clock: Clock | None = None,
        sagas: Iterable[Saga] = (),
    ) -> Orchestrator:
        plug = self.recovery if recovery is None else None
        orchestrator = Orchestrator(
            store=self.events,
            protection=self.protection,
            settings=self.settings,
            recovery=plug.handoff if plug is not None else recovery,
            clock=clock or (plug.clock if plug is not None else None),
            sagas=sagas,
        )
        if plug is not None:
            plug.attach(orchestrator)
        return orchestrator

    async def close(self) -> None:
        if self.recovery is not None:
            await self.recovery.close()
        await asyncio.get_running_loop().run_in_executor(None, self.cluster.shutdown)


async def open_runtime(
    settings: StackSagaSettings,
    *,
    driver_config: DriverConfig | None = None,
    lease_waits_max: int = 3,
) -> StoreRuntime:
    """Connect, prepare every statement, and return the pieces ready to use."""
    connection = await open_cql(settings, driver_config=driver_config)
    config, cluster, cql = connection.driver_config, connection.cluster, connection.cql
    try:
        events = CassandraEventStore(cql, config.keyspace)
        protection = WriteProtection(cql, config.keyspace, lease_waits_max=lease_waits_max)
        await events.prepare()
        await protection.prepare()
    except BaseException:
        await connection.close()
        raise
    logger.info(
        "saga store ready: keyspace=%s contact_points=%s", config.keyspace, config.contact_points
    )
    return StoreRuntime(settings, config, cluster, cql, events, protection)
