"""Open the store for the console and serve it with uvicorn.

:func:`open_console` connects (settings + driver file, as every other command), opens the
recovery engine (its directory, commit mode and writer; no Retry-Node: the console never
dispatches), and builds the backend; :class:`ConsoleServer` binds the listen address itself
(port 0 allowed) so the port it reports is the one it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn

from accord_cassandra.ports import split_address
from stacksaga_store.clock import Clock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.console.app import ConsoleConfig, build_app
from stacksaga_store.console.backend import ConsoleBackend
from stacksaga_store.console.census import ROWS_MAX_DEFAULT, SagaCensus
from stacksaga_store.errors import ConfigError
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime

__all__ = ["DEFAULT_LISTEN", "ConsoleServer", "is_loopback", "open_console", "serve_console"]

logger = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:4545"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class OpenConsole:
    runtime: StoreRuntime
    engine: RecoveryEngine
    backend: ConsoleBackend

    async def close(self) -> None:
        await self.engine.close()
        await self.runtime.close()


async def open_console(
    settings: StackSagaSettings,
    *,
    sagas: Sequence[Saga] = (),
    driver_config: DriverConfig | None = None,
    sidecars: Sequence[str] = (),
    recovery_metrics: Sequence[str] = (),
    clock: Clock | None = None,
    rows_max: int = ROWS_MAX_DEFAULT,
    runtime: StoreRuntime | None = None,
    engine: RecoveryEngine | None = None,
) -> OpenConsole:
    """Connected and prepared; pass ``runtime``/``engine`` to share an existing one."""
    runtime = runtime or await open_runtime(settings, driver_config=driver_config)
    engine = engine or await RecoveryEngine.open(runtime, clock=clock)
    orchestrator = engine.orchestrator(sagas=sagas) if sagas else None
    census = SagaCensus(
        runtime.cql,
        runtime.driver_config.keyspace,
        settings.instance.region,
        settings.instance.cluster,
        rows_max=rows_max,
    )
    backend = ConsoleBackend(
        engine=engine,
        orchestrator=orchestrator,
        census=census,
        sidecars=tuple(sidecars),
        recovery_metrics=tuple(recovery_metrics),
        clock=engine.clock,
    )
    await backend.prepare()
    return OpenConsole(runtime, engine, backend)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: :func:`serve_console` stops it on SIGTERM or
    SIGINT and exits 0 (uvicorn's handler re-raises the signal once it has stopped)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ConsoleServer:
    """uvicorn on a socket bound here; ``bound`` is ``host:port`` once :meth:`start` returned."""

    def __init__(self, app: Any, listen: str) -> None:
        host, port = split_address(listen)
        self.host, self.port = host, port
        self.app = app
        self.bound = listen
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError.single(
                "--listen", f"cannot bind {self.host}:{self.port}: {exc}"
            ) from exc
        sock.listen(128)
        host, port = sock.getsockname()[:2]
        self.bound = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="console http"
        )
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the console's HTTP server stopped while starting")
            await asyncio.sleep(0.02)
        return self.bound

    async def wait(self) -> None:
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def serve_console(
    settings: StackSagaSettings,
    *,
    listen: str,
    admin_token: str | None,
    sagas: Sequence[Saga] = (),
    sidecars: Sequence[str] = (),
    recovery_metrics: Sequence[str] = (),
    live_interval: float = 2.0,
    out: Callable[[str], None] = print,
    stop: asyncio.Event | None = None,
    driver_config: DriverConfig | None = None,
    clock: Clock | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM (or ``stop``); prints ``console serving on http://host:port``."""
    host, _ = split_address(listen)
    if not is_loopback(host):
        logger.warning(
            "console listening beyond loopback (%s): anyone who reaches it reads every saga", host
        )
    console = await open_console(
        settings,
        sagas=sagas,
        sidecars=sidecars,
        recovery_metrics=recovery_metrics,
        driver_config=driver_config,
        clock=clock,
    )
    try:
        app = build_app(
            console.backend,
            ConsoleConfig(
                admin_token=admin_token,
                live_interval=live_interval,
                loopback_hosts_only=is_loopback(host),
            ),
        )
        server = ConsoleServer(app, listen)
        bound = await server.start()
        out(f"console serving on http://{bound}")
        done = stop or asyncio.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(number, done.set)
        waiter = asyncio.get_running_loop().create_task(done.wait())
        serving = asyncio.get_running_loop().create_task(server.wait())
        await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        await server.stop()
    finally:
        await console.close()
    return 0
