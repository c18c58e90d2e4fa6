"""Recovery on by default: :func:`open_runtime` is the documented way to connect, and it runs
the recovery engine unless told not to.

::

    runtime = await open_runtime(settings)                 # engine opened with the runtime
    orchestrator = runtime.orchestrator(sagas=[order])     # writer wired, Retry-Node started
    ...
    await runtime.close()                                  # Retry-Node stopped gracefully

What "runs the engine" means here: every orchestrator the runtime builds without an explicit
``recovery=`` handoff writes the restore watchdog and the retry pointers
(:class:`~stacksaga_store.recovery.writer.RecoveryWriter`), and the first one also gets a
background :class:`~stacksaga_store.recovery.retry_node.RetryNode` that re-invokes what the
directory holds; the node that holds the ring's first range (Node-0) compacts Tiers 1-2 after
each pass. The Retry-Node's lease comes from the ring coordinator when
``recovery.coordinator.addresses`` is set, else it holds the whole ring
(:class:`~stacksaga_store.ring.leases.StaticLeaseSource`): right for one process per service;
several processes of one service without a coordinator would walk the same rows (the markers
keep a committed step from running again, but RELAXED_WITH_DEDUP can run a simultaneous
duplicate), so that case is logged as a warning.

``open_runtime(settings, metrics_listen="127.0.0.1:0")`` also serves the engine's metrics
(Prometheus text, ``GET /metrics``) on the port it reports as
``runtime.recovery.metrics_address``.

``open_runtime(settings, recovery=False)`` opts out: orchestrators get
:class:`~stacksaga_store.saga.handoff.NoRecoveryHandoff` and a warning is logged at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from accord_cassandra.metrics_http import MetricsServer
from stacksaga_store.clock import Clock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.metrics import RecoveryMetrics, serve_metrics
from stacksaga_store.recovery.retry_node import RetryNode
from stacksaga_store.ring.leases import LeaseSource, StaticLeaseSource
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.handoff import RecoveryHandoff
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.saga.runtime import open_runtime as open_store_runtime

__all__ = ["RecoveryService", "lease_source_for", "open_runtime", "serve_retry_node"]

logger = logging.getLogger(__name__)

# Between two Retry-Node passes over an empty directory: a pass costs one Tier-1 read.
IDLE_SECONDS = 1.0


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def lease_source_for(
    settings: StackSagaSettings, node_id: str, metrics: RecoveryMetrics
) -> LeaseSource:
    """The coordinator's lease client when one is configured, else the whole ring."""
    coordinator = settings.cassandra.recovery.coordinator
    service = settings.instance.service_name
    if not coordinator.addresses:
        return StaticLeaseSource(service)
    from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient

    client = CoordinatorLeaseClient.from_settings(settings, node_id=node_id, metrics=metrics)
    client.start()
    return client


@dataclass
class RecoveryService:
    """The engine behind a runtime (a :class:`~stacksaga_store.saga.runtime.RecoveryPlug`)."""

    engine: RecoveryEngine
    leases: LeaseSource
    node_id: str
    metrics: RecoveryMetrics = field(default_factory=RecoveryMetrics)
    idle_seconds: float = IDLE_SECONDS
    node: RetryNode | None = None
    _primary: Orchestrator | None = None
    metrics_server: MetricsServer | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` where ``GET /metrics`` is served (the bound port), if it is."""
        return self.metrics_server.bound if self.metrics_server is not None else None

    @property
    def handoff(self) -> RecoveryHandoff:
        return self.engine.writer

    @property
    def clock(self) -> Clock:
        return self.engine.clock

    def attach(self, orchestrator: Orchestrator) -> None:
        """The first orchestrator drives the Retry-Node; a later one's sagas join it."""
        if self._primary is not None:
            for saga in orchestrator.sagas:
                self._primary.register(saga)
            return
        self._primary = orchestrator
        self.node = self.engine.retry_node(
            orchestrator, self.leases, node_id=self.node_id, metrics=self.metrics
        )
        self._task = asyncio.get_running_loop().create_task(
            self.node.run(stop=self._stop, idle_seconds=self.idle_seconds),
            name=f"retry-node {self.node_id}",
        )
        logger.info("recovery engine running: retry-node=%s", self.node_id)

    async def close(self) -> None:
        """Graceful: running dispatches finish, no bucket is dropped after the request."""
        self._stop.set()
        if self.node is not None:
            self.node.request_shutdown()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("retry-node %s ended with an error", self.node_id)
        stop = getattr(self.leases, "stop", None)
        if stop is not None:
            with contextlib.suppress(Exception):
                await stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.engine.close()


async def open_runtime(
    settings: StackSagaSettings,
    *,
    recovery: bool = True,
    driver_config: DriverConfig | None = None,
    lease_waits_max: int = 3,
    clock: Clock | None = None,
    node_id: str | None = None,
    idle_seconds: float = IDLE_SECONDS,
    metrics_listen: str | None = None,
) -> StoreRuntime:
    """Connect and prepare (as :func:`stacksaga_store.saga.runtime.open_runtime`), then open
    the recovery engine unless ``recovery=False`` (module docstring).

    ``metrics_listen`` (``host:port``, port 0 for any free one) serves the engine's
    :class:`RecoveryMetrics` at ``GET /metrics`` in Prometheus format; the bound address is
    logged and is ``runtime.recovery.metrics_address``."""
    runtime = await open_store_runtime(
        settings, driver_config=driver_config, lease_waits_max=lease_waits_max
    )
    if not recovery:
        logger.warning(
            "recovery engine disabled (open_runtime(recovery=False)): no restore watchdog is "
            "written and failed steps wait for a manual resume"
        )
        return runtime
    used_id = node_id or default_node_id()
    metrics = RecoveryMetrics()
    try:
        engine = await RecoveryEngine.open(runtime, clock=clock)
        try:
            leases = lease_source_for(settings, used_id, metrics)
        except BaseException:
            await engine.close()
            raise
    except BaseException:
        await runtime.close()
        raise
    if not settings.cassandra.recovery.coordinator.addresses:
        logger.info(
            "no recovery.coordinator: this process's Retry-Node walks the whole ring; run one "
            "such process per service (or configure the coordinator)"
        )
    service = RecoveryService(engine, leases, used_id, metrics=metrics, idle_seconds=idle_seconds)
    if metrics_listen is not None:
        try:
            service.metrics_server = await serve_metrics(metrics, metrics_listen)
        except BaseException:
            await service.close()
            await runtime.close()
            raise
        logger.info("recovery metrics on http://%s/metrics", service.metrics_address)
    runtime.recovery = service
    return runtime


async def serve_retry_node(
    settings: StackSagaSettings,
    sagas: Iterable[Saga],
    *,
    node_id: str | None = None,
    metrics_listen: str | None = None,
    idle_seconds: float = IDLE_SECONDS,
    out: Callable[[str], None] = print,
) -> int:
    """A Retry-Node process (``stacksaga-store retry-node``) until SIGTERM or SIGINT.

    A signal stops new dispatches; those in flight finish; no bucket is dropped from then on
    (a bucket is dropped only when 100% dispatched, and one being walked is handed back whole,
    to be re-dispatched idempotently by the range's next holder); the coordinator lease is
    released; exit 0. ``metrics_listen`` serves :class:`RecoveryMetrics` at ``GET /metrics``.
    The signals are caught from before the connection is opened, so one that comes while the
    process is still connecting also ends it cleanly, with exit 0.
    """
    used_id = node_id or default_node_id()
    stop = asyncio.Event()
    nodes: list[RetryNode] = []
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        logger.info("retry-node %s: %s, shutting down gracefully", used_id, name)
        for node in nodes:
            node.request_shutdown()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum.name)
    try:
        out(f"retry-node {used_id} connecting")
        runtime = await open_store_runtime(settings)
        try:
            engine = await RecoveryEngine.open(runtime)
            try:
                return await _serve(
                    engine, sagas, used_id, metrics_listen, idle_seconds, out, stop, nodes
                )
            finally:
                await engine.close()
        finally:
            await runtime.close()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _serve(
    engine: RecoveryEngine,
    sagas: Iterable[Saga],
    used_id: str,
    metrics_listen: str | None,
    idle_seconds: float,
    out: Callable[[str], None],
    stop: asyncio.Event,
    nodes: list[RetryNode],
) -> int:
    if stop.is_set():
        out(f"retry-node {used_id} stopped before it started")
        return 0
    metrics = RecoveryMetrics()
    leases = lease_source_for(engine.runtime.settings, used_id, metrics)
    orchestrator = engine.orchestrator(sagas=sagas)
    node = engine.retry_node(orchestrator, leases, node_id=used_id, metrics=metrics)
    nodes.append(node)
    server = None
    try:
        server = await serve_metrics(metrics, metrics_listen) if metrics_listen else None
        served = f"; metrics on {server.bound}" if server is not None else ""
        out(f"retry-node {used_id} running{served}")
        await node.run(stop=stop, idle_seconds=idle_seconds)
        out(f"retry-node {used_id} stopped; {node.in_flight} dispatches in flight")
    finally:
        stop_leases = getattr(leases, "stop", None)
        if stop_leases is not None:
            await stop_leases()
        if server is not None:
            await server.stop()
    return 0
