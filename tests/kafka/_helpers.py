"""Waiting and reading for the Kafka tests: sagas reaching a final status, a consumer group
catching up with a topic, the records of a topic, the effects table."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stacksaga_store.config.kafka import KafkaProperties
from stacksaga_store.kafka.worker import stop_consumer
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.store.states import FINAL_STATUSES, RunningStatus

DEADLINE_SECONDS = 180.0


async def wait_final(
    orchestrator: Orchestrator, txns: Iterable[uuid.UUID], deadline: float = DEADLINE_SECONDS
) -> dict[uuid.UUID, RunningStatus]:
    """Every transaction's status once all are final; fails naming those still running."""
    pending = set(txns)
    statuses: dict[uuid.UUID, RunningStatus] = {}
    end = time.monotonic() + deadline
    while pending:
        for txn in list(pending):
            status = (await orchestrator.read(txn)).status
            statuses[txn] = status
            if status in FINAL_STATUSES:
                pending.discard(txn)
        if pending and time.monotonic() > end:
            stuck = {str(t): statuses[t].value for t in pending}
            raise AssertionError(f"sagas not final after {deadline:.0f} s: {stuck}")
        if pending:
            await asyncio.sleep(0.3)
    return statuses


async def topic_partitions(kafka: KafkaProperties, topic: str) -> list[TopicPartition]:
    """The partitions of a topic the workers created (``stacksaga.kafka.partitions`` of them)."""
    return [TopicPartition(topic, p) for p in range(kafka.partitions)]


async def wait_caught_up(
    kafka: KafkaProperties, group: str, topic: str, deadline: float = DEADLINE_SECONDS
) -> None:
    """Until ``group`` has committed the end offset of every partition of ``topic``."""
    tps = await topic_partitions(kafka, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await consumer.start()
    await admin.start()
    try:
        end = time.monotonic() + deadline
        while True:
            ends = await consumer.end_offsets(tps)
            committed = await admin.list_consumer_group_offsets(group)
            behind = {
                str(tp): (committed[tp].offset if tp in committed else None, ends[tp])
                for tp in tps
                if ends[tp] > 0 and (tp not in committed or committed[tp].offset < ends[tp])
            }
            if not behind:
                return
            if time.monotonic() > end:
                raise AssertionError(f"group {group} behind on {topic}: {behind}")
            await asyncio.sleep(0.3)
    finally:
        await admin.close()
        await stop_consumer(consumer)


async def read_topic(kafka: KafkaProperties, topic: str) -> list[Any]:
    """Every record now in ``topic``, from offset 0 (no group, nothing committed)."""
    tps = await topic_partitions(kafka, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        # An explicit position: seek_to_beginning() resolves later, and a position() read
        # before it could come back as the end (this read then returned nothing).
        for tp in tps:
            consumer.seek(tp, 0)
        records: list[Any] = []
        while True:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500)
            for part in batch.values():
                records.extend(part)
        return records
    finally:
        await stop_consumer(consumer)


def effects(session: Any, keyspace: str, txn: uuid.UUID) -> list[tuple[str, str, int]]:
    """(step, worker pid, write time in microseconds) of every run of a step's logic."""
    rows = session.execute(
        f"SELECT step, worker, WRITETIME(worker) AS written FROM {keyspace}.kafka_effects "
        "WHERE transaction_id = %s",
        [txn],
    )
    return [(row["step"], row["worker"], row["written"]) for row in rows]
