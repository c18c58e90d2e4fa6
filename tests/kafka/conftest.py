"""A real Kafka broker (KRaft, one JVM) shared by the Kafka tests, beside the real Cassandra
node of tests/conftest.py.

The broker runs on 127.0.73.1 (``STACKSAGA_KAFKA_FIRST_IP`` moves it);
``STACKSAGA_KAFKA_TEST_BOOTSTRAP=host:port`` points the tests at a broker already running
instead. A broker that does not start is an error in every test that needs it, never a skip.
Each test gets its own topic prefix and consumer group, so tests never see each other's events.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import load_settings
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka
from stacksaga_store.store.connect import connect_sync
from tests.kafka._sagas import EFFECTS_DDL
from tests.stacksaga.conftest import (  # noqa: F401 - fixtures used by the Kafka tests
    driver_config,
    driver_text,
    make_settings,
    node_driver_text,
    saga_keyspace,
    service_name,
    settings_overrides,
)

EXTERNAL_ENV = "STACKSAGA_KAFKA_TEST_BOOTSTRAP"


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        yield external
        return
    kafka = LocalKafka(BrokerSpec(brokers=1), tmp_path_factory.mktemp("kafka"))
    kafka.start()
    try:
        yield kafka.spec.bootstrap_servers
    finally:
        kafka.stop(clean=True)


@pytest.fixture(scope="session")
def effects_table(cassandra_node: CassandraHandle, saga_keyspace: str) -> str:  # noqa: F811
    config = parse_driver_config(driver_text(cassandra_node, saga_keyspace))
    cluster, session = connect_sync(load_settings(), config)
    try:
        session.execute(EFFECTS_DDL.format(keyspace=saga_keyspace))
    finally:
        cluster.shutdown()
    return saga_keyspace


@pytest.fixture
def kafka_overrides(
    kafka_bootstrap: str,
    service_name: str,  # noqa: F811
    effects_table: str,
) -> Callable[..., dict[str, Any]]:
    """load_settings overrides: the test node, a STRICT and a RELAXED domain, this test's
    own topics and group."""
    prefix = f"t{uuid.uuid4().hex[:10]}"

    def build(**kafka: Any) -> dict[str, Any]:
        # The lease outlives any step on a loaded machine: a lease that expires while its
        # holder still runs lets a duplicate run the step too (seen with 3 s here).
        overrides = settings_overrides(service_name, strict_lease="60s")
        overrides["kafka"] = {
            "bootstrap-servers": kafka_bootstrap,
            "topic-prefix": prefix,
            "group-id": f"{prefix}-workers",
            "partitions": 3,
            "session-timeout-ms": 6000,
            "retry-backoff-ms": 100,
            "revoke-grace-ms": 3000,
            **kafka,
        }
        return overrides

    return build
