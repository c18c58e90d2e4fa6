"""Fixtures for the recovery engine tests, on the real Cassandra node of tests/conftest.py.

One keyspace per session holds the seed's 9 tables plus ``es_ring_state``; the accord commit
mode's sidecars serve that same keyspace. Each test gets its own
``service_name``, so its directory partitions never meet another test's (the seed's own
isolation: region, cluster and service lead every partition key).

Time is a :class:`~stacksaga_store.clock.ManualClock` starting at :data:`T0`: tests move it by
windows and days instead of waiting. Lease validity is on the real monotonic clock and kept
short (seconds) where a test needs leases to expire.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig, parse_driver_config
from stacksaga_store.config.settings import CommitModeName, StackSagaSettings, load_settings
from stacksaga_store.recovery.commit_modes import CrashPoints
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.extension_schema import (
    apply_coordination_schema,
)
from stacksaga_store.store.schema import apply_schema
from tests.stacksaga.conftest import SIMPLE_SCHEMA, driver_text

# A Wednesday noon, far from any real date so nothing collides with wall-clock data.
T0 = datetime(2031, 3, 12, 12, 0, 30, tzinfo=UTC)


def recovery_overrides(
    service: str, *, lifetime: str = "24h", cluster: str = "test-cluster", **recovery: Any
) -> dict[str, Any]:
    """Settings for a test: small buckets and delays unless the test says otherwise."""
    base: dict[str, Any] = {
        "window-interval-minutes": 1,
        "bucket-size": 50,
        "concurrency": 16,
        "retry": {"lookback-days": 2},
        "restore": {"delay-windows": 5},
    }
    base.update(recovery)
    return {
        "cassandra": {
            "schema": SIMPLE_SCHEMA,
            "write-protection": {"default-mode": "RELAXED_WITH_DEDUP"},
            "transaction": {"lifetime": lifetime},
            "recovery": base,
        },
        "instance": {"region": "test-region", "cluster": cluster, "service-name": service},
    }


DROP_TIMEOUT_SECONDS = 120.0


@pytest.fixture(scope="session")
def recovery_keyspace(cassandra_node: CassandraHandle) -> Iterator[str]:
    keyspace = f"recovery_test_{uuid.uuid4().hex[:8]}"
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    config = parse_driver_config(driver_text(cassandra_node, keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, keyspace, settings.cassandra.schema_)
        apply_coordination_schema(session, keyspace, settings.cassandra.schema_)
        yield keyspace
        # A schema change on a loaded machine can take longer than the driver's 10 s default.
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=DROP_TIMEOUT_SECONDS)
    finally:
        cluster.shutdown()


@pytest.fixture
def service_name() -> str:
    return f"svc-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def recovery_driver_text(cassandra_node: CassandraHandle, recovery_keyspace: str) -> str:
    return driver_text(cassandra_node, recovery_keyspace)


@pytest.fixture
def recovery_driver(recovery_driver_text: str) -> DriverConfig:
    return parse_driver_config(recovery_driver_text, "<recovery test>")


@dataclass
class Stack:
    """A connected store plus a recovery engine on a manual clock."""

    runtime: StoreRuntime
    engine: RecoveryEngine
    clock: ManualClock
    crash: CrashPoints


StackFactory = Callable[..., Any]


@pytest.fixture
def make_settings(service_name: str) -> Callable[..., StackSagaSettings]:
    def build(**recovery: Any) -> StackSagaSettings:
        return load_settings(**recovery_overrides(service_name, **recovery))

    return build


@pytest.fixture
def open_stack(
    recovery_driver: DriverConfig, make_settings: Callable[..., StackSagaSettings]
) -> StackFactory:
    """``async with open_stack(clock=..., **recovery_settings) as stack: ...``"""

    @asynccontextmanager
    async def opener(
        *,
        clock: ManualClock | None = None,
        crash: CrashPoints | None = None,
        commit_mode: CommitModeName | None = None,
        **recovery: Any,
    ) -> AsyncIterator[Stack]:
        runtime = await open_runtime(make_settings(**recovery), driver_config=recovery_driver)
        used_clock = clock or ManualClock(T0)
        used_crash = crash or CrashPoints()
        try:
            engine = await RecoveryEngine.open(
                runtime, clock=used_clock, crash=used_crash, commit_mode=commit_mode
            )
            try:
                yield Stack(runtime, engine, used_clock, used_crash)
            finally:
                await engine.close()
        finally:
            await runtime.close()

    return opener


@pytest.fixture(scope="session")
def accord_sidecars(
    cassandra_node: CassandraHandle,
    recovery_keyspace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[str]]:
    """Three Accord sidecars serving the store keyspace on the test node; their addresses.

    Started once per session (each is a separate process) after the keyspace exists: a
    sidecar reads its keyspaces' tables at start-up.
    """
    from accord_cassandra.cluster import LocalSidecars

    sidecars = LocalSidecars(
        directory=tmp_path_factory.mktemp("accord-sidecars"),
        nodes=3,
        replication_factor=3,
        store="cassandra",
        cassandra={
            "contact_points": list(cassandra_node.contact_points),
            "port": cassandra_node.native_port,
            "keyspaces": [recovery_keyspace],
        },
    )
    sidecars.start(timeout=90)
    try:
        yield sidecars.addresses()
    finally:
        sidecars.stop()


def accord_recovery(addresses: list[str]) -> dict[str, Any]:
    """Recovery settings selecting the accord commit mode with these sidecars."""
    return {"commit-mode": "accord", "accord": {"sidecars": addresses, "timeout": "20s"}}


def one_lane(mode: dict[str, Any]) -> dict[str, Any]:
    """``mode`` with the accord writer on one instance id (``write-lanes: 1``), for tests of
    what happens to one bucket: with lanes, consecutive sagas use different instances."""
    if "accord" not in mode:
        return mode
    return {**mode, "accord": {**mode["accord"], "write-lanes": 1}}


@pytest.fixture(params=["ordered", "accord"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Recovery settings of each commit mode in turn (``accord`` starts the sidecars)."""
    if request.param == "accord":
        return accord_recovery(request.getfixturevalue("accord_sidecars"))
    return {}
