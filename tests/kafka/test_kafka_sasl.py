"""A broker with SASL_PLAINTEXT + PLAIN (accounts from the launcher's spec, written into the
client listener's JAAS config): workers with the right credentials run a saga through it;
a wrong password is a clear error naming the user and the broker's reason, not a hang.

The broker gets its own address (``STACKSAGA_KAFKA_FIRST_IP`` + 20), beside the session's
plain broker, and is started for this module alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from typing import Any

import pytest

from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka, default_first_ip
from stacksaga_store.kafka.errors import KafkaAuthError
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.states import RunningStatus
from tests.kafka._helpers import wait_final
from tests.kafka._sagas import order_saga
from tests.stacksaga.conftest import run

USERS = {"broker": "broker-secret", "alice": "alice-secret"}
# Only a guard against a hang: the refusal itself comes back in well under a second.
HANG_GUARD_SECONDS = 90.0


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    first = IPv4Address(default_first_ip()) + 20
    spec = BrokerSpec(brokers=1, first_ip=str(first), sasl_users=USERS)
    kafka = LocalKafka(spec, tmp_path_factory.mktemp("kafka-sasl"))
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop(clean=True)


def _sasl(broker: LocalKafka, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap-servers": broker.spec.bootstrap_servers,
        "security-protocol": "SASL_PLAINTEXT",
        "sasl-mechanism": "PLAIN",
        "sasl-username": user,
        "sasl-password": password,
    }


def test_sasl_listener_config_is_written_from_the_spec(sasl_broker: LocalKafka) -> None:
    props = (sasl_broker.broker_dir(1) / "conf" / "server.properties").read_text()
    assert f"listeners=SASL_PLAINTEXT://{sasl_broker.spec.ip(1)}:9092," in props
    assert 'user_alice="alice-secret"' in props and 'username="broker"' in props


def test_workers_with_the_right_credentials_run_a_saga(
    sasl_broker: LocalKafka,
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    async def body() -> None:
        settings = load_settings(**kafka_overrides(**_sasl(sasl_broker, "alice", "alice-secret")))
        runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
        saga = await order_saga(
            runtime.cql, runtime.driver_config.keyspace, name="sasl", domain="notification-saga"
        )
        orchestrator = runtime.orchestrator(sagas=[saga])
        publisher = StepPublisher(orchestrator, settings.kafka)
        worker = StepWorker(orchestrator, settings.kafka, name="sasl-w")
        try:
            await publisher.start()
            await worker.start()
            txn = await publisher.start_saga(saga, {"order": 1}, transaction_id=uuid.uuid4())
            statuses = await wait_final(orchestrator, [txn])
            assert statuses[txn] is RunningStatus.PROCESS_COMPLETED
            assert worker.counts.get("EXECUTED") == 3, worker.counts
        finally:
            await worker.stop()
            await publisher.stop()
            await runtime.close()

    run(body())


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "alice-secret")])
def test_wrong_credentials_are_a_clear_error_naming_the_user(
    user: str,
    password: str,
    sasl_broker: LocalKafka,
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    async def body() -> None:
        settings = load_settings(**kafka_overrides(**_sasl(sasl_broker, user, password)))
        runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
        saga = await order_saga(
            runtime.cql, runtime.driver_config.keyspace, name="sasl", domain="notification-saga"
        )
        worker = StepWorker(runtime.orchestrator(sagas=[saga]), settings.kafka, name="bad")
        try:
            with pytest.raises(KafkaAuthError) as caught:
                await asyncio.wait_for(worker.start(), HANG_GUARD_SECONDS)
            text = str(caught.value)
            assert f"user {user!r}" in text and "sasl-password" in text, text
            assert "Invalid username or password" in text, text
            assert password not in text, "the error must not echo the password"
        finally:
            await worker.stop()
            await runtime.close()

    run(body())
