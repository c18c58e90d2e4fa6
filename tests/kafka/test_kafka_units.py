"""The Kafka package's parts that need no broker: settings, the wire format, the launcher's
refusals."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from stacksaga_store.config.kafka import KafkaProperties
from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import ConfigError
from stacksaga_store.kafka import worker
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka, new_cluster_id
from stacksaga_store.kafka.errors import KafkaLauncherError, PortBusyError
from stacksaga_store.kafka.jars import check_version
from stacksaga_store.kafka.messages import UndecodableEvent, decode_step, encode_step
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.orchestrator import Orchestrator, StepEvent
from stacksaga_store.store.states import ExecutionType


def test_kafka_settings_from_overrides_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKSAGA_KAFKA__GROUP_ID", "from-env")
    kafka = load_settings(kafka={"bootstrap-servers": "127.0.73.1:9092, 127.0.73.2:9092"}).kafka
    assert kafka.group_id == "from-env"
    assert kafka.bootstrap_servers == "127.0.73.1:9092,127.0.73.2:9092"
    assert kafka.steps_topic("payment-saga") == "stacksaga.steps.payment-saga"
    assert kafka.steps_topic(None) == "stacksaga.steps.default"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"bootstrap-servers": "no-port"}, "stacksaga.kafka.bootstrap-servers"),
        ({"partitions": 0}, "stacksaga.kafka.partitions"),
        ({"max-in-flight-per-partition": 0}, "stacksaga.kafka.max-in-flight-per-partition"),
        ({"topic-prefix": "bad prefix"}, "stacksaga.kafka.topic-prefix"),
        ({"security-protocol": "SASL_SSL"}, "stacksaga.kafka"),
        ({"grup-id": "typo"}, "stacksaga.kafka.grup-id"),
    ],
)
def test_bad_kafka_settings_name_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(kafka=override)
    assert [name for name, _ in caught.value.problems] == [field]


def test_sasl_needs_credentials_and_takes_them() -> None:
    kafka = load_settings(
        kafka={
            "security-protocol": "sasl_plaintext",
            "sasl-mechanism": "SCRAM-SHA-512",
            "sasl-username": "u",
            "sasl-password": "s3cret-value",
        }
    ).kafka
    assert (
        kafka.sasl_password is not None and kafka.sasl_password.get_secret_value() == "s3cret-value"
    )
    assert "s3cret-value" not in repr(kafka)


def test_step_events_round_trip_and_anything_else_is_undecodable() -> None:
    event = StepEvent(uuid.uuid4(), "charge", ExecutionType.COMPENSATE)
    assert decode_step(encode_step(event)) == event
    assert b"heal" not in encode_step(event)  # plain commands keep their bytes
    healing = StepEvent(event.transaction_id, "charge", ExecutionType.COMPENSATE, heal=True)
    assert decode_step(encode_step(healing)) == healing
    bad = [
        None,
        b"\xff",
        b"[]",
        b'{"format": 2, "kind": "step"}',
        b'{"format": 1, "kind": "step", "transaction_id": "x", "step": "a", '
        b'"execution_type": "EXECUTE"}',
        encode_step(event).replace(b"COMPENSATE", b"QUARANTINE"),
        encode_step(healing).replace(b"true", b'"yes"'),
    ]
    for value in bad:
        with pytest.raises(UndecodableEvent):
            decode_step(value)


def test_launcher_refuses_bad_specs() -> None:
    with pytest.raises(KafkaLauncherError, match="1 or 3"):
        BrokerSpec(brokers=2)
    with pytest.raises(KafkaLauncherError, match=re.escape("127.0.0.0/8")):
        BrokerSpec(first_ip="10.0.0.1")
    with pytest.raises(KafkaLauncherError, match=re.escape("is not 4.x.y")):
        check_version("3.9.1")


def test_a_busy_port_is_an_error_naming_it(tmp_path: Path) -> None:
    ip = "127.0.73.250"
    with socket.socket() as holder:
        holder.bind((ip, 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = BrokerSpec(first_ip=ip, client_port=port, controller_port=port + 1)
        with pytest.raises(PortBusyError, match=re.escape(f"{ip}:{port}")):
            LocalKafka(spec, tmp_path).start()


def test_cluster_ids_never_look_like_an_option() -> None:
    # One in 64 URL-safe base64 ids starts with '-'; the storage tool then fails to format.
    ids = [new_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


@pytest.fixture
def no_broker() -> Iterator[str]:
    """host:port on loopback that refuses connections: a bound socket that never listens (and,
    held, keeps the port from anyone else)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.72.250", 0))
        host, port = sock.getsockname()
        yield f"{host}:{port}"


def _publisher(kafka: KafkaProperties) -> StepPublisher:
    return StepPublisher(cast("Orchestrator", SimpleNamespace(sagas=[])), kafka)


def _worker(kafka: KafkaProperties) -> StepWorker:
    stand_in = SimpleNamespace(sagas=[], settings=load_settings())
    return StepWorker(cast("Orchestrator", stand_in), kafka, name="unit")


@pytest.mark.parametrize("make", [_publisher, _worker], ids=["publisher", "worker"])
def test_a_failed_start_stops_the_producer_it_made(
    make: Callable[[KafkaProperties], StepPublisher | StepWorker],
    no_broker: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topics are taken as there, so start() gets as far as its producer, whose bootstrap
    is refused: start() raises and leaves no producer open, no task and no thread."""
    made: list[AIOKafkaProducer] = []

    class Recorded(AIOKafkaProducer):  # type: ignore[misc]
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            made.append(self)

    async def topics_are_there(kafka: KafkaProperties, topics: Sequence[str]) -> None:
        return None

    monkeypatch.setattr(worker, "AIOKafkaProducer", Recorded)
    monkeypatch.setattr(worker, "ensure_topics", topics_are_there)
    kafka = load_settings(kafka={"bootstrap-servers": no_broker}).kafka
    threads = set(threading.enumerate())
    reported: list[str] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        client = make(kafka)
        with pytest.raises(KafkaConnectionError):
            await client.start()
        assert len(made) == 1
        assert made[0]._closed, "the producer of a failed start was left open"
        assert client._producer is None
        await client.stop()  # stopping after a failed start is harmless
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        del client
        made.clear()
        gc.collect()  # an unclosed aiokafka producer reports itself when collected

    asyncio.run(scenario())
    assert "Unclosed AIOKafkaProducer" not in reported
    assert set(threading.enumerate()) <= threads


class _FetchBrokenOffConsumer:
    """Stands in for an AIOKafkaConsumer whose stop() meets a fetch sleeping out its retry
    backoff: aiokafka 0.14's Fetcher.close cancels each pending fetch and awaits it, so that
    cancellation comes out of stop(), and the later fetches and the client stay open."""

    def __init__(self) -> None:
        self._fetcher = SimpleNamespace(_pending_tasks=set())
        self.closed_client = False
        self._client = SimpleNamespace(close=self._close_client)

    async def _close_client(self) -> None:
        self.closed_client = True

    async def stop(self) -> None:
        for fetch in list(self._fetcher._pending_tasks):
            fetch.cancel()
            await fetch
        await self._client.close()


def test_a_consumer_stop_broken_off_by_a_fetch_in_backoff_is_finished() -> None:
    async def scenario() -> None:
        bare = _FetchBrokenOffConsumer()
        bare._fetcher._pending_tasks.add(asyncio.create_task(asyncio.sleep(30)))
        await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await bare.stop()  # what the worker called before
        assert not bare.closed_client

        consumer = _FetchBrokenOffConsumer()
        fetches = [asyncio.create_task(asyncio.sleep(30)) for _ in range(3)]
        consumer._fetcher._pending_tasks.update(fetches)
        await asyncio.sleep(0)
        await worker.stop_consumer(cast("Any", consumer))  # returns: finished, not broken off
        assert all(f.cancelled() for f in fetches)
        assert consumer.closed_client, "the consumer's client was left open"

    asyncio.run(scenario())


def test_stopping_a_consumer_passes_on_the_callers_own_cancellation() -> None:
    async def scenario() -> None:
        consumer = _FetchBrokenOffConsumer()
        in_stop = asyncio.Event()

        async def stop() -> None:
            in_stop.set()
            await asyncio.sleep(30)  # a fetch that takes its time to finish

        consumer.stop = stop  # type: ignore[method-assign]
        stopping = asyncio.create_task(worker.stop_consumer(cast("Any", consumer)))
        await in_stop.wait()
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        assert not consumer.closed_client, "a cancelled stop went on as if a fetch broke it off"

    asyncio.run(scenario())
