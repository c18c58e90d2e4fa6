"""``stacksaga-store console --demo``: the console over a live store with traffic.

Starts a Cassandra node (or uses ``--contact-point``), applies the schema to the
``stacksaga_demo`` keyspace, seeds one saga per state (``sample.seed``), then starts an
order every ``interval`` seconds (``sample.traffic_order``: some retried, compensated or
frozen) on an orchestrator whose Retry-Node (the default runtime's) carries out the retries
at the next window; the console serves it all, with the sample saga registered so frozen
sagas can be restored from the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Callable
from datetime import timedelta

from accord_cassandra.ports import split_address
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.console.app import ConsoleConfig, build_app
from stacksaga_store.console.sample import SampleWorld, sample_saga, seed, traffic_order
from stacksaga_store.console.server import ConsoleServer, is_loopback, open_console
from stacksaga_store.demo import DEMO_KEYSPACE, demo_settings
from stacksaga_store.recovery.service import RecoveryService, open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.extension_schema import apply_coordination_schema
from stacksaga_store.store.schema import apply_schema

__all__ = ["run_console_demo"]

logger = logging.getLogger(__name__)


def _apply(contact_points: list[tuple[str, int]]) -> DriverConfig:
    settings = demo_settings("console-demo")
    config = DriverConfig(
        contact_points=tuple(contact_points),
        local_datacenter="datacenter1",
        session_keyspace=DEMO_KEYSPACE,
        request_timeout=timedelta(seconds=10),
        origin="<console demo>",
    )
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, DEMO_KEYSPACE, settings.cassandra.schema_)
        apply_coordination_schema(session, DEMO_KEYSPACE, settings.cassandra.schema_)
    finally:
        cluster.shutdown()
    return config


async def run_console_demo(
    contact_points: list[tuple[str, int]],
    *,
    listen: str,
    admin_token: str | None,
    interval: float,
    out: Callable[[str], None],
    stop: asyncio.Event | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    driver = await loop.run_in_executor(None, _apply, contact_points)
    settings = demo_settings("console-demo")
    token = admin_token or secrets.token_urlsafe(24)
    if admin_token is None:
        out(f"admin token for this demo (type it into the restore form): {token}")
    runtime = await open_runtime(settings, driver_config=driver)
    world = SampleWorld()
    saga = sample_saga(world)
    writer = runtime.orchestrator(sagas=[saga])  # the runtime's Retry-Node serves it
    service = runtime.recovery
    if not isinstance(service, RecoveryService):
        raise RuntimeError("the demo needs the recovery engine")
    try:
        ids = await seed(writer)
        out("seeded: " + ", ".join(f"{label}={tid}" for label, tid in ids.items()))
        world.refunds_fixed = True
        console = await open_console(settings, sagas=[saga], runtime=runtime, engine=service.engine)
        host, _ = split_address(listen)
        app = build_app(
            console.backend,
            ConsoleConfig(admin_token=token, loopback_hosts_only=is_loopback(host)),
        )
        server = ConsoleServer(app, listen)
        bound = await server.start()
        out(f"console serving on http://{bound}  (Ctrl-C stops)")

        async def traffic() -> None:
            n = 0
            while True:
                try:
                    await writer.start("order", traffic_order(n))
                except Exception:
                    logger.exception("demo traffic: order %d failed", n)
                n += 1
                await asyncio.sleep(interval)

        task = loop.create_task(traffic(), name="console demo traffic")
        done = stop or asyncio.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(number, done.set)
        waiter = loop.create_task(done.wait())
        serving = loop.create_task(server.wait())
        await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()
    finally:
        await runtime.close()
    return 0
