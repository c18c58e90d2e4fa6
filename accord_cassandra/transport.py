"""Replica-to-replica messaging over gRPC (``accord_cassandra.v1.Peer``).

Outgoing: one channel and one sender task per peer. Messages wait in a bounded queue;
the sender ships everything queued as one ``Deliver`` batch with a deadline. A batch that
fails is dropped, not retried here: the protocol re-sends what matters on its own timers,
and retrying stale messages would only delay fresh ones. When a queue is full the oldest
message is dropped for the same reason.

Incoming: each payload is decoded with the accord codec and must name this node as its
destination and the batch's sender as its source; anything else is refused and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from accord.messages import Envelope
from accord.messages.codec import CodecError, decode_message, encode_message
from accord_cassandra.v1 import peer_pb2, peer_pb2_grpc

logger = logging.getLogger(__name__)

CODEC_VERSION = 1
QUEUE_LIMIT = 10_000
# A receiver steps its node through a whole batch before it answers. Under load (after a
# restart every replica re-persists what it applied: thousands of messages at once, see the
# test report) 512-message batches took longer than a 2 s deadline: the sender counted
# batches the receiver had handled as failed and backed off while its queue overflowed.
# Smaller batches and a longer deadline keep delivery and its accounting honest.
BATCH_LIMIT = 128
DELIVER_DEADLINE_SECONDS = 5.0
# The receiver lets the event loop run (the pump, other batches) this often.
YIELD_EVERY = 16
BACKOFF_SECONDS_MAX = 1.0
IN_FLIGHT_LIMIT = 16
# A message queued longer than this is dropped unsent. While a peer is down its queue
# fills; delivering thousands of stale PreAccepts and Applies when it came back made it
# record and then recover transactions long decided elsewhere (tests/sidecar/storm.py:
# recoveries climbing for minutes after a restart). The protocol re-sends what still
# matters on its own timers, with fresh state.
MAX_AGE_SECONDS = 2.0


@dataclass
class TransportMetrics:
    sent: int = 0
    dropped: int = 0
    expired: int = 0
    failed_batches: int = 0
    received: int = 0
    refused: int = 0


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(
        self, node_id: int, deliver: Callable[[Envelope], None], metrics: TransportMetrics
    ) -> None:
        self.node_id = node_id
        self.deliver = deliver
        self.metrics = metrics

    async def Deliver(
        self, request: peer_pb2.PeerBatch | bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peer_pb2.PeerAck:
        if isinstance(request, bytes):  # registered raw by the server, see _add_raw_unary
            try:
                request = peer_pb2.PeerBatch.FromString(request)
            except DecodeError as error:
                self.metrics.refused += 1
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"malformed PeerBatch: {error}"
                )
        assert isinstance(request, peer_pb2.PeerBatch)
        if request.codec_version != CODEC_VERSION:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"codec version {request.codec_version} is not {CODEC_VERSION}: "
                "upgrade every sidecar",
            )
        accepted = 0
        for payload in request.payloads:
            try:
                envelope = decode_message(payload)
            except CodecError as error:
                self.metrics.refused += 1
                logger.warning("refused a peer message from node=%d: %s", request.source, error)
                continue
            if (
                not isinstance(envelope, Envelope)
                or envelope.dest != self.node_id
                or envelope.src != request.source
            ):
                self.metrics.refused += 1
                logger.warning("refused a misaddressed peer message from node=%d", request.source)
                continue
            self.metrics.received += 1
            self.deliver(envelope)
            accepted += 1
            if accepted % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return peer_pb2.PeerAck(accepted=accepted)


class PeerSender:
    """Queues and ships this node's messages to one peer."""

    def __init__(
        self, node_id: int, peer_id: int, channel: grpc.aio.Channel, metrics: TransportMetrics
    ) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        self.channel = channel
        self.stub = peer_pb2_grpc.PeerStub(channel)
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self._backoff = 0.05
        self._backoff_until = 0.0

    def send(self, envelope: Envelope) -> None:
        if self.queue.qsize() >= QUEUE_LIMIT:
            self.queue.get_nowait()
            self.metrics.dropped += 1
        self.queue.put_nowait((time.monotonic(), encode_message(envelope)))

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        # Up to IN_FLIGHT_LIMIT batches travel at once: waiting for each acknowledgement
        # before sending the next made every message queue behind a whole round trip on a
        # WAN (bench: loaded p50 1.5-2x higher, fast path 0.62-0.70 instead of 0.86-0.99).
        # Batches may then arrive out of order, which the protocol tolerates anyway.
        slots = asyncio.Semaphore(IN_FLIGHT_LIMIT)
        pending: set[asyncio.Task[None]] = set()
        while True:
            first = await self.queue.get()
            await slots.acquire()
            if self._backoff_until > asyncio.get_running_loop().time():
                await asyncio.sleep(self._backoff_until - asyncio.get_running_loop().time())
            # Taken after the waits above, so a batch never carries what went stale there.
            oldest = time.monotonic() - MAX_AGE_SECONDS
            batch = [first[1]] if first[0] >= oldest else []
            while len(batch) < BATCH_LIMIT and not self.queue.empty():
                queued_at, payload = self.queue.get_nowait()
                if queued_at >= oldest:
                    batch.append(payload)
                else:
                    self.metrics.expired += 1
            if first[0] < oldest:
                self.metrics.expired += 1
            if not batch:
                slots.release()
                continue
            task = asyncio.create_task(self._deliver(batch, slots))
            pending.add(task)
            task.add_done_callback(pending.discard)

    async def _deliver(self, batch: list[bytes], slots: asyncio.Semaphore) -> None:
        request = peer_pb2.PeerBatch(
            codec_version=CODEC_VERSION, source=self.node_id, payloads=batch
        )
        try:
            await self.stub.Deliver(request, timeout=DELIVER_DEADLINE_SECONDS)
            self.metrics.sent += len(batch)
            self._backoff = 0.05
        except grpc.aio.AioRpcError as error:
            self.metrics.failed_batches += 1
            self.metrics.dropped += len(batch)
            logger.debug("delivery to node=%d failed: %s", self.peer_id, error.code())
            # A peer that is down: space the next attempts out instead of spinning.
            self._backoff_until = asyncio.get_running_loop().time() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_SECONDS_MAX)
        finally:
            slots.release()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close()


class Peers:
    """Routes a node's outgoing envelopes to per-peer senders."""

    def __init__(
        self,
        node_id: int,
        addresses: Mapping[int, str],
        make_channel: Callable[[str], grpc.aio.Channel],
    ) -> None:
        self.metrics = TransportMetrics()
        self.senders = {
            peer: PeerSender(node_id, peer, make_channel(address), self.metrics)
            for peer, address in sorted(addresses.items())
            if peer != node_id
        }

    def start(self) -> None:
        for sender in self.senders.values():
            sender.start()

    def send(self, envelope: Envelope) -> None:
        sender = self.senders.get(envelope.dest)
        if sender is None:
            logger.error("no address for node=%d", envelope.dest)
            return
        sender.send(envelope)

    def queue_depths(self) -> dict[int, int]:
        return {peer: sender.queue.qsize() for peer, sender in self.senders.items()}

    async def close(self) -> None:
        for sender in self.senders.values():
            await sender.close()
