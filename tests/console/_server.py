"""A real console (uvicorn on port 0) on its own thread and event loop, over a real
Cassandra keyspace seeded with sagas in every state (``stacksaga_store.console.sample``).

Reused by the browser tests: ``with running_console(node, keyspace) as console:`` gives
``console.url``, ``console.ids`` (state label -> transaction id), ``console.token`` and
``console.call(coro_fn)`` to run more work (start a saga, say) on the console's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.console.app import ConsoleConfig, build_app
from stacksaga_store.console.backend import ConsoleBackend
from stacksaga_store.console.sample import SampleWorld, sample_saga, seed
from stacksaga_store.console.server import ConsoleServer, open_console
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.extension_schema import apply_coordination_schema
from stacksaga_store.store.schema import apply_schema
from tests.stacksaga.conftest import SIMPLE_SCHEMA, driver_text

ADMIN_TOKEN = "console-test-admin-token-0123456789"
START_TIMEOUT = 180.0
T = TypeVar("T")


def console_settings(service: str) -> StackSagaSettings:
    return load_settings(
        cassandra={
            "schema": SIMPLE_SCHEMA,
            "write-protection": {"default-mode": "RELAXED_WITH_DEDUP"},
            "recovery": {"window-interval-minutes": 1, "restore": {"delay-windows": 5}},
        },
        instance={
            "region": "console-region",
            "cluster": "console-cluster",
            "service-name": service,
        },
    )


def make_keyspace(node: CassandraHandle) -> str:
    keyspace = f"console_test_{uuid.uuid4().hex[:8]}"
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    cluster, session = connect_sync(settings, parse_driver_config(driver_text(node, keyspace)))
    try:
        apply_schema(session, keyspace, settings.cassandra.schema_)
        apply_coordination_schema(session, keyspace, settings.cassandra.schema_)
    finally:
        cluster.shutdown()
    return keyspace


@dataclass
class RunningConsole:
    url: str
    ids: dict[str, uuid.UUID]
    token: str
    service: str
    world: SampleWorld
    orchestrator: Orchestrator  # a second Standard-Node on the same keyspace (for new sagas)
    loop: asyncio.AbstractEventLoop
    backend: ConsoleBackend
    extra: dict[str, Any] = field(default_factory=dict)

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 120.0) -> T:
        """Run ``fn()`` on the console's event loop and wait for its result."""

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)


@contextmanager
def running_console(
    node: CassandraHandle,
    keyspace: str,
    *,
    admin_token: str | None = ADMIN_TOKEN,
    frozen: int = 3,
    live_interval: float = 0.5,
) -> Iterator[RunningConsole]:
    service = f"svc-{uuid.uuid4().hex[:8]}"
    settings = console_settings(service)
    driver = parse_driver_config(driver_text(node, keyspace), "<console test>")
    ready: concurrent.futures.Future[RunningConsole] = concurrent.futures.Future()
    stop: dict[str, asyncio.Event] = {}

    async def main() -> None:
        stop["event"] = asyncio.Event()
        runtime = await open_runtime(settings, driver_config=driver)
        try:
            engine = await RecoveryEngine.open(runtime)
            world = SampleWorld()
            saga = sample_saga(world)
            writer = engine.orchestrator(sagas=[saga])
            ids = await seed(writer, frozen=frozen)
            world.refunds_fixed = True  # so an admin restore can finish the compensation
            console = await open_console(settings, sagas=[saga], runtime=runtime, engine=engine)
            app = build_app(
                console.backend, ConsoleConfig(admin_token=admin_token, live_interval=live_interval)
            )
            server = ConsoleServer(app, "127.0.0.1:0")
            bound = await server.start()
            ready.set_result(
                RunningConsole(
                    f"http://{bound}",
                    ids,
                    admin_token or "",
                    service,
                    world,
                    writer,
                    asyncio.get_running_loop(),
                    console.backend,
                )
            )
            await stop["event"].wait()
            await server.stop()
            await engine.close()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            await runtime.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="console", daemon=True)
    thread.start()
    console = ready.result(START_TIMEOUT)
    try:
        yield console
    finally:
        console.loop.call_soon_threadsafe(stop["event"].set)
        thread.join(60)
