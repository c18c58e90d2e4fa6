"""Kafka step workers: consume step commands, run each under its domain's write protection,
publish what comes next, and only then commit the offset.

Theory of operation (docs/kafka.md)
-----------------------------------
One steps topic per saga domain; every event of a saga is keyed by its transaction id, so a
saga's events stay in one partition, in order. Workers of one consumer group share the
partitions. For each record a worker:

1. decodes it (undecodable bytes go to the dead-letter topic, with the reason in headers);
2. calls :meth:`Orchestrator.deliver` - the step runs only if it is the transaction's next
   action, under its execution marker (STRICT: an LWT lease; RELAXED_WITH_DEDUP: read, run,
   batch). Unknown transactions or sagas go to the dead-letter topic; retryable store errors
   (``retry-attempts`` times) and busy leases (until the longest domain lease could have
   expired) are retried with capped exponential backoff, then dead-lettered;
3. reads the transaction back, publishes an outcome event and, if the saga waits on a step,
   that step's command (same key; ``acks=all``, awaited); a COMPLETE/REVERT_COMPLETE left by a
   crash is finished by :meth:`Orchestrator.resume`, which runs no step;
4. marks the offset done. Offsets are committed manually, per partition, up to the first
   record not yet done, so a crash at any instant before step 4 redelivers the record; the
   marker turns the redelivery away (STRICT: exactly once; RELAXED: never after the commit)
   and step 3 runs again, so a lost "next" event is published again. Duplicates of a command
   are harmless for the same reason.

A partition has at most ``max-in-flight-per-partition`` records running; past twice that many
fetched, the partition is paused until it drains. On revoke (rebalance, shutdown) in-flight
records get ``revoke-grace-ms`` to finish and their offsets are committed; what is still
running then is cancelled and left uncommitted (a STRICT lease expires on its own), so the new
owner redelivers it. A retryable step failure parks the saga for the recovery engine
(FAILED_WITH_RETRYABLE_ERROR); the worker does not publish a retry itself: the Retry-Node
re-enters it through this topic (:mod:`stacksaga_store.kafka.reentry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
)

from stacksaga_store.config.kafka import KafkaProperties, SecurityProtocol
from stacksaga_store.errors import (
    SagaDefinitionError,
    StackSagaError,
    TransactionNotFoundError,
)
from stacksaga_store.kafka.errors import KafkaAuthError
from stacksaga_store.kafka.messages import (
    Outcome,
    UndecodableEvent,
    decode_step,
    encode_outcome,
    encode_step,
)
from stacksaga_store.saga.definition import Saga, SagaPayload, SagaPayloadError
from stacksaga_store.saga.orchestrator import DeliveryOutcome, Orchestrator, StepEvent
from stacksaga_store.store.states import (
    ExecutionType,
    NextKind,
    RunningStatus,
    next_action,
    progress,
)

__all__ = [
    "AfterStep",
    "StepPublisher",
    "StepWorker",
    "client_options",
    "ensure_topics",
    "stop_consumer",
]

logger = logging.getLogger(__name__)

AfterStep = Callable[[StepEvent, DeliveryOutcome], Awaitable[None]]
_RETRY_PENDING = (
    RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
    RunningStatus.REVERT_FAILED_WITH_RETRYABLE_ERROR,
)
_UNKNOWN = (TransactionNotFoundError, SagaDefinitionError, SagaPayloadError)
_MARKER_SKIPS = (DeliveryOutcome.ALREADY_COMMITTED, DeliveryOutcome.ALREADY_FAILED)


def client_options(kafka: KafkaProperties) -> dict[str, Any]:
    """aiokafka connection options from ``stacksaga.kafka``."""
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "security_protocol": kafka.security_protocol.value,
    }
    if kafka.security_protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL):
        import ssl

        options["ssl_context"] = ssl.create_default_context()
    if kafka.sasl_mechanism is not None:
        options["sasl_mechanism"] = kafka.sasl_mechanism.value
        options["sasl_plain_username"] = kafka.sasl_username
        options["sasl_plain_password"] = (
            kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
        )
    return options


async def start_client(client: Any, kafka: KafkaProperties) -> None:
    """``client.start()``; a bootstrap failure under SASL is probed once per server so that
    refused credentials come out as :class:`KafkaAuthError` naming the user and the
    broker's reason (aiokafka itself only says it could not bootstrap)."""
    try:
        await client.start()
    except KafkaConnectionError:
        if kafka.sasl_mechanism is not None:
            await _probe_sasl(kafka)
        raise


async def _probe_sasl(kafka: KafkaProperties) -> None:
    options = client_options(kafka)
    del options["bootstrap_servers"]
    for server in kafka.bootstrap_servers.split(","):
        host, _, port = server.rpartition(":")
        try:
            conn = await create_conn(host.strip("[]"), int(port), **options)
        except SaslAuthenticationFailed as exc:
            raise KafkaAuthError(
                f"Kafka at {server} refused the {kafka.sasl_mechanism} credentials of user "
                f"{kafka.sasl_username!r} (stacksaga.kafka.sasl-username / sasl-password): {exc}"
            ) from exc
        except (KafkaError, OSError):
            continue  # that server is down or unreachable: not an answer about credentials
        conn.close()


def topics_for(kafka: KafkaProperties, sagas: Iterable[Saga]) -> list[str]:
    return sorted({kafka.steps_topic(saga.domain) for saga in sagas})


async def ensure_topics(kafka: KafkaProperties, topics: Sequence[str]) -> None:
    """Create missing topics (``partitions``, ``replication-factor``); existing ones are kept."""

    admin = AIOKafkaAdminClient(**client_options(kafka))
    try:
        await start_client(admin, kafka)
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        if not missing:
            return
        new = [NewTopic(t, kafka.partitions, kafka.replication_factor) for t in missing]
        with contextlib.suppress(TopicAlreadyExistsError):
            response = await admin.create_topics(new)
            for name, code, message in getattr(response, "topic_errors", []):
                # 36: TOPIC_ALREADY_EXISTS (another worker won the race).
                if code not in (0, 36):
                    raise StackSagaError(f"cannot create Kafka topic {name}: {code} {message}")
        await _wait_for_topics(admin, missing)
    finally:
        await admin.close()


async def _wait_for_topics(admin: Any, topics: Sequence[str]) -> None:
    for _ in range(100):
        if set(topics) <= set(await admin.list_topics()):
            return
        await asyncio.sleep(0.1)
    raise StackSagaError(f"Kafka topics {list(topics)} not visible after creation")


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``, carried through when a broker just died.

    aiokafka 0.14's ``Fetcher.close`` cancels each pending fetch and awaits it. A fetch that
    failed against a dead broker sleeps out its retry backoff, and the cancellation of that
    sleep comes out of ``close`` as a ``CancelledError`` (aiokafka issue 647): the stop
    raised, the other fetches and the client's connections stayed open, and they leaked
    until garbage collection (a CI run's SIGKILLed-broker test failed so, and the next test
    failed on the 30 warnings their collection raised). A cancellation of the caller's own
    task is passed on as ever.
    """
    try:
        await consumer.stop()
        return
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    logger.info("a Kafka fetch cancelled in its retry backoff broke off the stop; finishing it")
    fetcher = getattr(consumer, "_fetcher", None)
    pending = [t for t in getattr(fetcher, "_pending_tasks", ()) if not t.done()]
    for fetch in pending:
        fetch.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    client = getattr(consumer, "_client", None)
    if client is not None:
        await client.close()


async def _stop_quietly(client: Any) -> None:
    """Stop a client whose start failed; the start's error is the one the caller needs, so a
    second one from stopping is only logged."""
    try:
        await client.stop()
    except Exception:
        logger.warning("stopping a Kafka client after its failed start failed too", exc_info=True)


class StepPublisher:
    """Publishes step commands: the first step of a new saga, or any step event."""

    def __init__(self, orchestrator: Orchestrator, kafka: KafkaProperties) -> None:
        self.orchestrator = orchestrator
        self.kafka = kafka
        self._producer: Any = None

    async def start(self) -> None:
        await ensure_topics(self.kafka, [*topics_for(self.kafka, self.orchestrator.sagas)])
        producer = AIOKafkaProducer(**client_options(self.kafka), acks="all")
        try:
            await start_client(producer, self.kafka)
        except BaseException:
            await _stop_quietly(producer)
            raise
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def start_saga(
        self,
        saga: Saga,
        aggregate: dict[str, Any],
        *,
        transaction_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Create the transaction (STARTED, nothing run) and publish its first step command."""
        txn = await self.orchestrator.create(saga, aggregate, transaction_id=transaction_id)
        await self.publish(saga, StepEvent(txn, saga.step_names[0], ExecutionType.EXECUTE))
        return txn

    async def publish(self, saga: Saga, event: StepEvent) -> None:
        if self._producer is None:
            raise StackSagaError("StepPublisher.start() was not awaited")
        topic = self.kafka.steps_topic(saga.domain)
        await self._producer.send_and_wait(
            topic, encode_step(event), key=str(event.transaction_id).encode()
        )


@dataclass
class _Partition:
    """One assigned partition: records fetched, running and done, by offset."""

    tp: Any
    queue: deque[Any] = field(default_factory=deque)
    running: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    # Every fetched offset not yet committed, in offset order, True once handled.
    window: dict[int, bool] = field(default_factory=dict)
    paused: bool = False
    # Set while a revoke drains it: the drain commits, the records' own tasks must not race it.
    revoking: bool = False
    commit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class StepWorker:
    """One consumer-group member running the steps of ``orchestrator``'s sagas."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        kafka: KafkaProperties,
        *,
        name: str | None = None,
        after_step: AfterStep | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.kafka = kafka
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.after_step = after_step
        self.topics = topics_for(kafka, orchestrator.sagas)
        self._sagas = {saga.name: saga for saga in orchestrator.sagas}
        protection = orchestrator.settings.cassandra.write_protection
        self._lease_wait_seconds = max(
            (protection.policy_for(saga.domain).lease_seconds for saga in orchestrator.sagas),
            default=0,
        )
        self._consumer: Any = None
        self._producer: Any = None
        self._parts: dict[Any, _Partition] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await ensure_topics(
            self.kafka, [*self.topics, self.kafka.outcomes_topic, self.kafka.dead_letter_topic]
        )
        try:
            await self._start_clients()
        except BaseException:
            # A half-started worker keeps nothing open: the caller sees only the error.
            for client in (self._consumer, self._producer):
                if client is not None:
                    await _stop_quietly(client)
            self._consumer = self._producer = None
            raise
        self._loop_task = asyncio.create_task(self._fetch_loop(), name=f"kafka-worker-{self.name}")
        logger.info(
            "kafka worker %s consuming %s as group %s", self.name, self.topics, self.kafka.group_id
        )

    async def _start_clients(self) -> None:
        options = client_options(self.kafka)
        self._producer = AIOKafkaProducer(**options, acks="all", client_id=f"{self.name}-p")
        await start_client(self._producer, self.kafka)
        self._consumer = AIOKafkaConsumer(
            **options,
            group_id=self.kafka.group_id,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.kafka.session_timeout_ms,
            heartbeat_interval_ms=max(300, self.kafka.session_timeout_ms // 4),
            max_poll_records=max(8, 2 * self.kafka.max_in_flight_per_partition),
        )
        self._consumer.subscribe(self.topics, listener=_Rebalance(self))
        await start_client(self._consumer, self.kafka)

    async def stop(self) -> None:
        """Leave the group: in-flight steps finish (within the grace) and are committed."""
        self._stopping.set()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._consumer is not None:
            await self._drain(list(self._parts))
            await stop_consumer(self._consumer)
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    @property
    def assigned(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this worker holds now."""
        return sorted((tp.topic, tp.partition) for tp in self._parts)

    # -- fetching ---------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                batch = await self._consumer.getmany(timeout_ms=200)
            except KafkaError as exc:
                logger.warning("kafka worker %s: fetch failed (%s); retrying", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            for tp, records in batch.items():
                part = self._parts.get(tp)
                if part is None:
                    continue  # revoked meanwhile: the new owner fetches these again
                for record in records:
                    part.queue.append(record)
                    part.window[record.offset] = False
                self._dispatch(part)

    def _dispatch(self, part: _Partition) -> None:
        limit = self.kafka.max_in_flight_per_partition
        while part.queue and len(part.running) < limit:
            record = part.queue.popleft()
            task = asyncio.create_task(self._handle(part, record))
            part.running[record.offset] = task
        backlog = len(part.queue) + len(part.running)
        if self._consumer is None:
            return
        if not part.paused and backlog >= 2 * limit:
            self._consumer.pause(part.tp)
            part.paused = True
        elif part.paused and backlog < limit:
            self._consumer.resume(part.tp)
            part.paused = False

    async def _handle(self, part: _Partition, record: Any) -> None:
        try:
            await self._process(record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug or an unexpected client error: keep the record (dead letter), keep flowing.
            logger.exception("kafka worker %s: record %s failed", self.name, _where(record))
            await self._dead_letter(record, f"worker error: {type(exc).__name__}: {exc}")
        finally:
            part.running.pop(record.offset, None)
        part.window[record.offset] = True
        if not part.revoking:
            await self._commit(part)
        if self._parts.get(part.tp) is part and not part.revoking:
            self._dispatch(part)

    async def _commit(self, part: _Partition) -> None:
        async with part.commit_lock:
            done = None
            for offset, finished in list(part.window.items()):
                if not finished:
                    break
                done = offset
            if done is None or self._consumer is None:
                return
            try:
                await self._consumer.commit({part.tp: done + 1})
            except KafkaError as exc:
                # Rebalanced away: the new owner redelivers; the markers turn it away.
                logger.warning(
                    "kafka worker %s: commit of %s@%d failed: %s", self.name, part.tp, done + 1, exc
                )
                return
            for offset in [o for o in part.window if o <= done]:
                del part.window[offset]

    # -- one record -------------------------------------------------------------------------

    async def _process(self, record: Any) -> None:
        try:
            event = decode_step(record.value)
        except UndecodableEvent as exc:
            await self._dead_letter(record, f"undecodable: {exc}")
            return
        outcome = await self._deliver_with_retries(record, event)
        if outcome is None:
            return
        self._count(outcome.value)
        if self.after_step is not None:
            await self.after_step(event, outcome)
        await self._publish_next(event, outcome)

    async def _deliver_with_retries(self, record: Any, event: StepEvent) -> DeliveryOutcome | None:
        """Deliver; retry store errors ``retry-attempts`` times and a busy lease until the
        longest lease of this worker's domains could have expired (a holder that died, or
        was cancelled on a revoke, keeps its lease that long), then dead-letter."""
        delay = self.kafka.retry_backoff_ms / 1000
        cap = self.kafka.retry_backoff_max_ms / 1000
        busy_until = time.monotonic() + self._lease_wait_seconds + 2 * cap
        attempts = 0
        last = ""
        while True:
            try:
                outcome = await self.orchestrator.deliver(event)
            except _UNKNOWN as exc:
                await self._dead_letter(record, f"unknown saga or transaction: {exc}")
                return None
            except StackSagaError as exc:
                if not exc.retryable:
                    await self._dead_letter(record, f"{type(exc).__name__}: {exc}")
                    return None
                attempts += 1
                last = f"{type(exc).__name__}: {exc}"
                if attempts >= self.kafka.retry_attempts:
                    break
            else:
                if outcome is not DeliveryOutcome.LEASE_BUSY:
                    return outcome
                last = "lease busy"
                if time.monotonic() > busy_until:
                    break
            logger.info("kafka worker %s: %s retry: %s", self.name, _where(record), last)
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)
        await self._dead_letter(record, f"retries exhausted: {last}")
        return None

    async def _publish_next(self, event: StepEvent, outcome: DeliveryOutcome) -> None:
        txn = event.transaction_id
        view = await self.orchestrator.read(txn)
        saga = self._sagas[SagaPayload.decode(view.record.payload).saga]
        action = next_action(
            view.status, saga.step_names, saga.compensable, progress(saga.step_names, view.tryouts)
        )
        status = view.status
        nxt: StepEvent | None = None
        if status in _RETRY_PENDING:
            pass  # the recovery engine owns the retry
        elif action.kind in (NextKind.EXECUTE, NextKind.COMPENSATE) and action.step_name:
            nxt = StepEvent(txn, action.step_name, ExecutionType(action.kind.value))
            same = (nxt.step_name, nxt.execution_type) == (event.step_name, event.execution_type)
            if same and outcome in _MARKER_SKIPS:
                # The marker is final but the tryout row not yet written: its holder writes
                # it and publishes what follows (or, had it crashed, the recovery engine
                # resumes the saga). Publishing this step again would loop on the marker.
                nxt = None
        elif action.kind in (NextKind.COMPLETE, NextKind.REVERT_COMPLETE):
            status = (await self.orchestrator.resume(txn)).status
        key = str(txn).encode()
        report = Outcome(
            transaction_id=txn,
            step=event.step_name,
            execution_type=event.execution_type,
            outcome=outcome.value,
            status=status.value,
            worker=self.name,
            next_step=nxt.step_name if nxt else None,
            next_type=nxt.execution_type if nxt else None,
        )
        # The outcome first: whoever sees the saga's next step happen has seen this one's.
        await self._producer.send_and_wait(
            self.kafka.outcomes_topic, encode_outcome(report), key=key
        )
        if nxt is not None:
            await self._producer.send_and_wait(
                self.kafka.steps_topic(saga.domain), encode_step(nxt), key=key
            )

    async def _dead_letter(self, record: Any, reason: str) -> None:
        logger.error(
            "kafka worker %s: %s -> dead-letter topic: %s", self.name, _where(record), reason
        )
        headers = [
            ("stacksaga.reason", reason[:1000].encode()),
            ("stacksaga.source", _where(record).encode()),
            ("stacksaga.worker", self.name.encode()),
        ]
        await self._producer.send_and_wait(
            self.kafka.dead_letter_topic, record.value, key=record.key, headers=headers
        )
        self._count("DEAD_LETTER")

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    # -- rebalance --------------------------------------------------------------------------

    def _assigned(self, tps: Iterable[Any]) -> None:
        for tp in tps:
            self._parts.setdefault(tp, _Partition(tp))
        logger.info("kafka worker %s assigned %s", self.name, sorted(str(tp) for tp in tps))

    async def _drain(self, tps: Sequence[Any]) -> None:
        """Let the running records of ``tps`` finish (grace), commit them, drop the rest."""
        parts = [self._parts[tp] for tp in tps if tp in self._parts]
        for part in parts:
            part.revoking = True
            part.queue.clear()  # fetched, not started: the next owner gets them
        running = [task for part in parts for task in part.running.values()]
        if running:
            _, late = await asyncio.wait(running, timeout=self.kafka.revoke_grace_ms / 1000)
            for task in late:
                task.cancel()
            if late:
                logger.warning(
                    "kafka worker %s abandoned %d in-flight steps on revoke", self.name, len(late)
                )
                await asyncio.gather(*late, return_exceptions=True)
        for part in parts:
            await self._commit(part)
            self._parts.pop(part.tp, None)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka's ConsumerRebalanceListener interface, bound to one worker."""

    def __init__(self, worker: StepWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.worker._drain(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.worker._assigned(list(assigned))


def _where(record: Any) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"
