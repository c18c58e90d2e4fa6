"""Fixtures for the saga store tests, on the real Cassandra node of tests/conftest.py.

One keyspace per test session (schema applied once, dropped at the end) keeps the suite fast;
each test gets its own ``service_name`` so its partitions never meet another test's (the
region/cluster/service prefix of every partition key is the seed's own isolation mechanism).
Tests that change the schema itself create a keyspace of their own (``fresh_keyspace``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.config.driver import DriverConfig, parse_driver_config
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.schema import apply_schema

T = TypeVar("T")
SIMPLE_SCHEMA = {"replication-strategy": "SimpleStrategy", "replication-factor": 1}


def driver_text(node: CassandraHandle, keyspace: str) -> str:
    """A DataStax-format driver file for the test node (exercises the HOCON path)."""
    points = ", ".join(f'"{ip}:{node.native_port}"' for ip in node.contact_points)
    # A loaded 2-core machine running a JVM can take more than the default 2 s for a Paxos
    # round under contention; the tests care about outcomes, not latency.
    return f"""
datastax-java-driver {{
  basic {{
    contact-points = [{points}]
    load-balancing-policy.local-datacenter = datacenter1
    session-keyspace = {keyspace}
    request.timeout = 20 seconds
  }}
}}
"""


def settings_overrides(
    service: str,
    *,
    default_mode: str = "RELAXED_WITH_DEDUP",
    strict_lease: str = "2s",
    **cassandra: Any,
) -> dict[str, Any]:
    """Overrides for load_settings, picklable so worker processes can rebuild the settings."""
    protection = {
        "default-mode": default_mode,
        "default-lease-duration": "2s",
        "domains": {
            "payment-saga": {"mode": "STRICT", "lease-duration": strict_lease},
            "notification-saga": {"mode": "RELAXED_WITH_DEDUP"},
        },
    }
    return {
        "cassandra": {"schema": SIMPLE_SCHEMA, "write-protection": protection, **cassandra},
        "instance": {"region": "test-region", "cluster": "test-cluster", "service-name": service},
    }


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one async test body (the project does not use pytest-asyncio)."""
    return asyncio.run(coroutine)


@pytest.fixture(scope="session")
def saga_keyspace(cassandra_node: CassandraHandle) -> Iterator[str]:
    keyspace = f"stacksaga_test_{uuid.uuid4().hex[:8]}"
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    config = parse_driver_config(driver_text(cassandra_node, keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, keyspace, settings.cassandra.schema_)
        yield keyspace
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    finally:
        cluster.shutdown()


@pytest.fixture
def fresh_keyspace(cassandra_node: CassandraHandle) -> Iterator[str]:
    """A keyspace name nobody uses yet; dropped after the test."""
    keyspace = f"stacksaga_fresh_{uuid.uuid4().hex[:8]}"
    yield keyspace
    settings = load_settings()
    config = parse_driver_config(driver_text(cassandra_node, keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    finally:
        cluster.shutdown()


@pytest.fixture
def service_name() -> str:
    return f"svc-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def node_driver_text(cassandra_node: CassandraHandle, saga_keyspace: str) -> str:
    return driver_text(cassandra_node, saga_keyspace)


@pytest.fixture
def driver_config(node_driver_text: str) -> DriverConfig:
    return parse_driver_config(node_driver_text, "<test>")


@pytest.fixture
def make_settings(service_name: str) -> Callable[..., StackSagaSettings]:
    def build(**kwargs: Any) -> StackSagaSettings:
        return load_settings(**settings_overrides(service_name, **kwargs))

    return build


@pytest.fixture
def open_store(
    driver_config: DriverConfig, make_settings: Callable[..., StackSagaSettings]
) -> Callable[..., Coroutine[Any, Any, StoreRuntime]]:
    """``runtime = await open_store(**settings_kwargs)``; close it in the test."""

    async def opener(**kwargs: Any) -> StoreRuntime:
        return await open_runtime(make_settings(**kwargs), driver_config=driver_config)

    return opener
