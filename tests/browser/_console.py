"""The console under test as a real subprocess (``python -m stacksaga_store console``) bound to
port 0, over a real Cassandra keyspace that this process seeded with sagas in every state
(``stacksaga_store.console.sample.seed``): the bound port is read from its
``console serving on http://...`` line."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.config.driver import DriverConfig, parse_driver_config
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.console.sample import SampleWorld, sample_saga, seed, traffic_order
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.saga.runtime import open_runtime
from tests.browser.servers import Server, server_process
from tests.console._server import make_keyspace
from tests.stacksaga.conftest import SIMPLE_SCHEMA, driver_text

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "browser-test-admin-token-0123456789"
SERVING = r"console serving on http://127\.0\.0\.1:(\d+)"
FROZEN = 3  # one to restore, one for the wrong token, one spare


def overrides(service: str) -> dict[str, Any]:
    return {
        "cassandra": {
            "schema": SIMPLE_SCHEMA,
            "write-protection": {"default-mode": "RELAXED_WITH_DEDUP"},
            "recovery": {"window-interval-minutes": 1, "restore": {"delay-windows": 5}},
        },
        "instance": {
            "region": "browser-region",
            "cluster": "browser-cluster",
            "service-name": service,
        },
    }


@dataclass
class ConsoleUnderTest:
    server: Server
    ids: dict[str, uuid.UUID]
    token: str
    service: str
    settings: StackSagaSettings
    driver: DriverConfig

    @property
    def url(self) -> str:
        return self.server.base_url

    def start_sagas(self, count: int) -> list[uuid.UUID]:
        """Start ``count`` plain orders from this (test) process, as another Standard-Node."""

        async def run() -> list[uuid.UUID]:
            runtime = await open_runtime(self.settings, driver_config=self.driver)
            try:
                engine = await RecoveryEngine.open(runtime)
                try:
                    writer = engine.orchestrator(sagas=[sample_saga(SampleWorld())])
                    return [
                        (await writer.start("order", traffic_order(0))).transaction_id
                        for _ in range(count)
                    ]
                finally:
                    await engine.close()
            finally:
                await runtime.close()

        return asyncio.run(run())


async def _seed(settings: StackSagaSettings, driver: DriverConfig) -> dict[str, uuid.UUID]:
    runtime = await open_runtime(settings, driver_config=driver)
    try:
        engine = await RecoveryEngine.open(runtime)
        try:
            # Refunds broken here, so sagas freeze; the console's own definition has them fixed.
            return await seed(
                engine.orchestrator(sagas=[sample_saga(SampleWorld())]), frozen=FROZEN
            )
        finally:
            await engine.close()
    finally:
        await runtime.close()


@contextmanager
def console_subprocess(node: CassandraHandle, directory: Path) -> Iterator[ConsoleUnderTest]:
    keyspace = make_keyspace(node)
    service = f"svc-{uuid.uuid4().hex[:8]}"
    text = driver_text(node, keyspace)
    settings = load_settings(**overrides(service))
    driver = parse_driver_config(text, "<browser test>")
    ids = asyncio.run(_seed(settings, driver))

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stacksaga-cassandra.conf").write_text(text, encoding="utf-8")
    config = directory / "stacksaga.yaml"
    config.write_text(yaml.safe_dump({"stacksaga": overrides(service)}), encoding="utf-8")
    token_file = directory / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    args = [
        sys.executable,
        "-m",
        "stacksaga_store",
        "--config",
        str(config),
        "console",
        "--listen",
        "127.0.0.1:0",
        "--sagas",
        "tests.browser._sagas:sagas",
        "--admin-token-file",
        str(token_file),
        "--live-interval",
        "0.5",
    ]
    with server_process(args, SERVING, directory / "console.log", cwd=REPO) as server:
        yield ConsoleUnderTest(server, ids, ADMIN_TOKEN, service, settings, driver)
