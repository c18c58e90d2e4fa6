"""Wiring of the recovery engine onto a connected
:class:`~stacksaga_store.saga.runtime.StoreRuntime`.

::

    runtime = await open_runtime(settings)
    engine = await RecoveryEngine.open(runtime)            # commit mode from the settings
    orchestrator = engine.orchestrator(sagas=[order])      # a Standard-Node
    node = engine.retry_node(orchestrator, leases)         # a Retry-Node (same process or not)
    await node.run(stop=stop_event)
    await engine.close(); await runtime.close()

The commit mode is ``stacksaga.cassandra.recovery.commit-mode``; ``accord`` needs the
sidecars (``recovery.accord.sidecars``) serving the store's own keyspace, and replaces the
runtime's event store and write protection with their Accord forms
(:mod:`stacksaga_store.store.accord_store`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stacksaga_store.clock import Clock, SystemClock
from stacksaga_store.config.settings import CommitModeName
from stacksaga_store.recovery.commit_modes import (
    AccordCommit,
    AccordDirectory,
    AccordGateway,
    CommitMode,
    CrashPoints,
    OrderedCommit,
)
from stacksaga_store.recovery.directory import Directory, DirectoryScope
from stacksaga_store.recovery.metrics import RecoveryMetrics
from stacksaga_store.recovery.retry_node import Dispatcher, Reentry, RetryNode, SagaDispatcher
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.recovery.writer import RecoveryWriter
from stacksaga_store.ring.leases import LeaseSource
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.store.accord_store import AccordEventStore, AccordProtection

__all__ = ["RecoveryEngine"]


@dataclass
class RecoveryEngine:
    """Directory, commit mode and writer of one process (one instance_id)."""

    runtime: StoreRuntime
    directory: Directory
    commit: CommitMode
    writer: RecoveryWriter
    clock: Clock
    gateway: AccordGateway | None = None

    @classmethod
    async def open(
        cls,
        runtime: StoreRuntime,
        *,
        clock: Clock | None = None,
        instance_id: str | None = None,
        crash: CrashPoints | None = None,
        commit_mode: CommitModeName | None = None,
    ) -> RecoveryEngine:
        settings = runtime.settings
        recovery = settings.cassandra.recovery
        windows = WindowMath(recovery.window_interval_minutes)
        directory = Directory(runtime.cql, runtime.driver_config.keyspace, windows)
        await directory.prepare()
        mode = commit_mode or recovery.commit_mode
        gateway: AccordGateway | None = None
        commit: CommitMode
        if mode is CommitModeName.ACCORD:
            gateway = AccordGateway(
                recovery.accord.sidecars,
                token=recovery.accord.token,
                timeout=recovery.accord.timeout.total_seconds(),
            )
            keyspace = runtime.driver_config.keyspace
            events = AccordEventStore(
                runtime.cql, keyspace, gateway=gateway, crashes=(crash or CrashPoints()).commits
            )
            await events.prepare()
            protection = AccordProtection(
                runtime.cql,
                keyspace,
                events=events,
                lease_waits_max=runtime.protection.lease_waits_max,
            )
            await protection.prepare()
            # Every writer of the store in this process goes through Accord from now on
            # (a plain write after an Accord write of the same cells would be lost).
            runtime.events, runtime.protection = events, protection
            directory = AccordDirectory(runtime.cql, keyspace, windows, events.runner)
            await directory.prepare()
            commit = AccordCommit(directory, DirectoryScope.of(settings.instance))
        else:
            commit = OrderedCommit(directory, DirectoryScope.of(settings.instance))
        used_clock = clock or SystemClock()
        writer = RecoveryWriter(
            directory=directory,
            events=runtime.events,
            settings=settings,
            commit=commit,
            clock=used_clock,
            instance_id=instance_id,
            crash=crash,
            lanes=recovery.accord.write_lanes if mode is CommitModeName.ACCORD else 1,
        )
        return cls(runtime, directory, commit, writer, used_clock, gateway)

    def orchestrator(self, *, sagas: Iterable[Saga] = ()) -> Orchestrator:
        """A Standard-Node orchestrator whose recovery handoff is this engine's writer."""
        return self.runtime.orchestrator(recovery=self.writer, clock=self.clock, sagas=sagas)

    def retry_node(
        self,
        orchestrator: Orchestrator,
        leases: LeaseSource,
        *,
        node_id: str = "retry-node",
        metrics: RecoveryMetrics | None = None,
        dispatcher: Dispatcher | None = None,
        page_rows: int = 500,
        reenter: Reentry | None = None,
    ) -> RetryNode:
        """``reenter``: how the default dispatcher re-invokes a saga (``Orchestrator.resume``
        unless given; Kafka-driven services pass ``KafkaReentry.resume``)."""
        return RetryNode(
            directory=self.directory,
            dispatcher=dispatcher
            or SagaDispatcher(
                orchestrator=orchestrator, writer=self.writer, commit=self.commit, reenter=reenter
            ),
            commit=self.commit,
            leases=leases,
            settings=self.runtime.settings,
            clock=self.clock,
            metrics=metrics,
            node_id=node_id,
            page_rows=page_rows,
        )

    async def close(self) -> None:
        if self.gateway is not None:
            await self.gateway.close()
