"""Three brokers (KRaft quorum of 3, replication factor 3, min.insync.replicas 2): one broker is
SIGKILLed while STRICT sagas flow; every saga completes and no step's logic runs twice.

The cluster gets its own addresses (``STACKSAGA_KAFKA_FIRST_IP`` + 10 .. + 12), beside the
session's single broker, and is started for this test alone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.kafka.broker import BrokerSpec, LocalKafka, default_first_ip
from stacksaga_store.kafka.worker import StepPublisher, StepWorker
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.states import RunningStatus
from tests.kafka._helpers import effects, wait_caught_up, wait_final
from tests.kafka._sagas import STEPS, order_saga
from tests.stacksaga.conftest import run

SAGAS = 20
DEADLINE = 300.0


@pytest.fixture
def three_brokers(tmp_path: Path) -> Iterator[LocalKafka]:
    first = IPv4Address(default_first_ip()) + 10
    kafka = LocalKafka(BrokerSpec(brokers=3, first_ip=str(first)), tmp_path / "kafka3")
    kafka.start()
    try:
        yield kafka
    finally:
        # Killed, not stopped: the data is thrown away, and the last broker of a quorum that
        # lost its majority ignores SIGTERM.
        kafka.stop(clean=True, kill=True)


async def _effects(runtime: StoreRuntime, txn: uuid.UUID) -> list[tuple[str, str, int]]:
    loop = asyncio.get_running_loop()
    keyspace = runtime.driver_config.keyspace
    return await loop.run_in_executor(None, effects, runtime.cql.session, keyspace, txn)


def test_sigkill_one_of_three_brokers_under_load_every_saga_completes_once(
    three_brokers: LocalKafka,
    kafka_overrides: Callable[..., dict[str, Any]],
    driver_config: DriverConfig,
) -> None:
    async def body() -> None:
        overrides = kafka_overrides(
            **{
                "bootstrap-servers": three_brokers.spec.bootstrap_servers,
                "replication-factor": 3,
            }
        )
        settings = load_settings(**overrides)
        runtime = await open_runtime(settings, driver_config=driver_config, lease_waits_max=0)
        keyspace = runtime.driver_config.keyspace
        saga = await order_saga(runtime.cql, keyspace, name="cluster-strict", domain="payment-saga")
        orchestrator = runtime.orchestrator(sagas=[saga])
        kafka = settings.kafka
        publisher = StepPublisher(orchestrator, kafka)
        await publisher.start()
        workers = [StepWorker(orchestrator, kafka, name=f"w{i}") for i in range(2)]
        try:
            for worker in workers:
                await worker.start()
            txns = [
                await publisher.start_saga(saga, {"order": i, "hold": 0.2}) for i in range(SAGAS)
            ]
            # Under load: some steps done, most sagas still running.
            loop = asyncio.get_running_loop()
            end = loop.time() + DEADLINE
            while sum(w.counts.get("EXECUTED", 0) for w in workers) < 5:
                assert loop.time() < end, "no step ran before the kill"
                await asyncio.sleep(0.2)
            in_flight = SAGAS * len(STEPS) - sum(w.counts.get("EXECUTED", 0) for w in workers)
            victim = 2
            pid = three_brokers.pid(victim)
            assert pid is not None and three_brokers.is_running(victim)
            os.kill(pid, signal.SIGKILL)
            assert in_flight > 0, "every step ran before the kill"

            statuses = await wait_final(orchestrator, txns, DEADLINE)
            assert set(statuses.values()) == {RunningStatus.PROCESS_COMPLETED}, statuses
            assert not three_brokers.is_running(victim)
            await wait_caught_up(kafka, kafka.group_id, kafka.steps_topic(saga.domain), DEADLINE)
            for txn in txns:
                runs = Counter(step for step, _, _ in await _effects(runtime, txn))
                assert runs == Counter(STEPS), (txn, runs)
            assert sum(w.counts.get("DEAD_LETTER", 0) for w in workers) == 0
        finally:
            for worker in workers:
                await worker.stop()
            await publisher.stop()
            await runtime.close()

    run(body())
