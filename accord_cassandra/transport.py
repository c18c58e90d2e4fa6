"""Replica-to-replica messaging over gRPC (``accord_cassandra.v1.Peer``).

Outgoing: one channel and one sender task per peer. Messages wait in a bounded queue;
the sender writes everything queued as one batch on a long-lived ``Stream`` call to the
peer (or, to an older peer without it, as one ``Deliver`` call with a deadline). A batch
that fails is dropped, not retried here: the protocol re-sends what matters on its own
timers, and retrying stale messages would only delay fresh ones. When a queue is full the
oldest message is dropped for the same reason.

Incoming: a batch is authenticated first (accord_cassandra/peerauth.py: a shared-secret MAC
or the client certificate, destination, replay window); one that is not is refused whole,
UNAUTHENTICATED or PERMISSION_DENIED, before anything is decoded. Then each payload is
decoded with the accord codec and must name this node as its destination and the batch's
sender as its source, then checked (accord/messages/validate.py and the host's own limits);
a payload that fails is refused on its own and counted, the rest of its batch still
delivered, and refusals are logged at most once per ``REFUSAL_LOG_SECONDS`` per sender.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from accord.codec import CODEC_VERSION, CodecError, decode_message, encode_message, readdress
from accord.invariants import fail
from accord.messages import Envelope
from accord.messages.validate import InvalidMessage
from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.peerauth import BatchStamper, Refused
from accord_cassandra.v1 import peer_pb2, peer_pb2_grpc

if TYPE_CHECKING:
    from accord_cassandra.frames import FrameConnection

logger = logging.getLogger(__name__)
_FRAME_LENGTH = struct.Struct(">I")

# Peer batches carry accord.codec's CODEC_VERSION: a peer on another version is refused.
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
# Refused peer messages are logged at most this often per sender (the rest are counted):
# 200k garbage payloads in one batch once wrote 26 MB of warnings and stalled the loop.
REFUSAL_LOG_SECONDS = 10.0

# A message queued longer than this is dropped unsent. While a peer is down its queue
# fills; delivering thousands of stale PreAccepts and Applies when it came back made it
# record and then recover transactions long decided elsewhere (tests/sidecar/storm.py:
# recoveries climbing for minutes after a restart). The protocol re-sends what still
# matters on its own timers, with fresh state.
MAX_AGE_SECONDS = 2.0
# The largest frame on the framed link (accord_cassandra/frames.py) by default: a gRPC peer
# message's bound (server.MAX_MESSAGE_BYTES).
MAX_FRAME_BYTES = 8 * 1024 * 1024


class BatchRefused(AccordCassandraError):
    """A peer batch refused whole; ``code`` is the gRPC status a gRPC link answers with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass
class TransportMetrics:
    sent: int = 0
    batches_sent: int = 0
    dropped: int = 0
    expired: int = 0
    failed_batches: int = 0
    received: int = 0
    refused: int = 0
    unauthenticated_batches: int = 0
    # Refused because the message was well-formed but no honest peer sends it.
    invalid: int = 0
    # Framed link (accord_cassandra/frames.py): connections closed for a frame length over
    # the limit (its body unread), for arriving with the listener's connections all taken,
    # for no whole first frame within the auth timeout, and connections refused for any
    # reason (those three included).
    oversize_frames: int = 0
    frame_connections_over_limit: int = 0
    frame_connections_timed_out: int = 0
    refused_connections: int = 0


def keepalive_options(dead_seconds: float) -> tuple[tuple[str, int], ...]:
    """gRPC channel and server options under which either end of a peer connection pings
    the other every ``dead_seconds / 2`` and ends the connection when a ping goes
    unanswered for as long again: a peer gone without a word (no FIN, no RST) then turns
    the sender's calls UNAVAILABLE (the peer unreachable) instead of having TCP retransmit
    into the void for a quarter of an hour (frames.py, "Dead peers", does the same with TCP
    options). Both ends are sidecars, so each also accepts the other's pings that often,
    with or without calls or data in flight (by gRPC's defaults a server answers pings
    without data more often than every five minutes with GOAWAY)."""
    half = max(1000, int(dead_seconds * 500))
    return (
        ("grpc.keepalive_time_ms", half),
        ("grpc.keepalive_timeout_ms", half),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Twice as often as an honest peer pings: only a flood earns strikes (gRPC's
        # default two, then GOAWAY), as before.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", half // 2),
    )


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(
        self,
        node_id: int,
        deliver: Callable[[Envelope], None],
        metrics: TransportMetrics,
        authenticate: Callable[[peer_pb2.PeerBatch, Mapping[str, Any], list[bytes]], None],
    ) -> None:
        self.node_id = node_id
        self.deliver = deliver
        self.metrics = metrics
        self.authenticate = authenticate
        self._logged_at: dict[int, float] = {}
        self._unlogged: dict[int, int] = {}

    def _refused(self, source: int, problem: str) -> None:
        """Count a refused message; log it unless this sender was logged about lately."""
        self.metrics.refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at.get(source, -REFUSAL_LOG_SECONDS) < REFUSAL_LOG_SECONDS:
            self._unlogged[source] = self._unlogged.get(source, 0) + 1
            return
        if len(self._logged_at) > 1024:  # sources are untrusted numbers: keep this bounded
            self._logged_at.clear()
            self._unlogged.clear()
        self._logged_at[source] = now
        more = self._unlogged.pop(source, 0)
        logger.warning(
            "refused a peer message from node=%d: %s%s",
            source,
            problem[:500].encode("unicode_escape").decode(),  # one line, whatever it quotes
            f" ({more} more refused since the last such line)" if more else "",
        )

    async def Deliver(
        self, request: peer_pb2.PeerBatch | bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peer_pb2.PeerAck:
        return peer_pb2.PeerAck(accepted=await self._batch(request, context))

    async def Stream(
        self,
        requests: AsyncIterator[peer_pb2.PeerBatch | bytes],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> peer_pb2.PeerAck:
        """Batches on one stream, each handled as :meth:`Deliver` handles its batch: a
        stream costs a gRPC call once, not once per batch (a unary call per batch was about
        a fifth of a saturated sidecar's Python time, both ends together)."""
        accepted = 0
        async for request in requests:
            accepted += await self._batch(request, context)
        return peer_pb2.PeerAck(accepted=accepted)

    async def _batch(
        self, request: peer_pb2.PeerBatch | bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> int:
        """Authenticate one batch and hand its payloads to the node; how many it accepted.
        A batch refused whole aborts the call (a stream with it)."""
        try:
            return await self.handle(request, context.auth_context())
        except BatchRefused as refused:
            await context.abort(refused.code, refused.details)
            fail("abort() returned after a refused batch")

    async def handle(
        self, request: peer_pb2.PeerBatch | bytes, auth_context: Mapping[str, Any]
    ) -> int:
        """:meth:`_batch` for any link: raises :class:`BatchRefused` for a batch refused
        whole (malformed, unauthenticated, another codec version), with nothing decoded."""
        if isinstance(request, bytes):  # registered raw by the server, see _add_raw_unary
            try:
                request = peer_pb2.PeerBatch.FromString(request)
            except DecodeError as error:
                self.metrics.refused += 1
                raise BatchRefused(
                    grpc.StatusCode.INVALID_ARGUMENT, f"malformed PeerBatch: {error}"
                ) from None
        # Read out of the protobuf once: the MAC and the decoding below both walk them.
        payloads = list(request.payloads)
        try:
            self.authenticate(request, auth_context, payloads)
        except Refused as refused:
            self.metrics.unauthenticated_batches += 1
            raise BatchRefused(refused.code, f"peer batch refused: {refused.reason}") from None
        if request.codec_version != CODEC_VERSION:
            raise BatchRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"codec version {request.codec_version} is not {CODEC_VERSION}: "
                "upgrade every sidecar",
            )
        accepted = 0
        source = request.source
        for index, payload in enumerate(payloads):
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            try:
                envelope = decode_message(payload)
            except CodecError as error:
                self._refused(source, str(error))
                continue
            if (
                not isinstance(envelope, Envelope)
                or envelope.dest != self.node_id
                or envelope.src != source
            ):
                self._refused(source, "misaddressed")
                continue
            try:
                self.deliver(envelope)
            except InvalidMessage as error:
                self.metrics.invalid += 1
                self._refused(source, str(error))
                continue
            self.metrics.received += 1
            accepted += 1
        return accepted


class PeerSender:
    """Queues and ships this node's messages to one peer."""

    def __init__(
        self,
        node_id: int,
        peer_id: int,
        channel: grpc.aio.Channel,
        metrics: TransportMetrics,
        stamper: BatchStamper,
        frames: Callable[[], Awaitable[FrameConnection]] | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        on_reachability: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        # Told when the peer turns unreachable (a connection refused or reset, gRPC's
        # UNAVAILABLE) and when a batch reaches it again: transitions only.
        self.on_reachability = on_reachability
        self.reachable = True
        self.stamper = stamper
        self.channel = channel
        self.stub = peer_pb2_grpc.PeerStub(channel)
        self.metrics = metrics
        # A deque and a future to wake the sender, not an asyncio.Queue: every message
        # passes through here, and the Queue's own bookkeeping (unfinished-task counting,
        # its event, the getters' deque) showed in a saturated sidecar's profile.
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self._backoff = 0.05
        self._backoff_until = 0.0
        self._call: grpc.aio.StreamUnaryCall[peer_pb2.PeerBatch, peer_pb2.PeerAck] | None = None
        # Set once the peer answered UNIMPLEMENTED to Stream (an older sidecar).
        self._unary = False
        self._probed = False
        # With a frame address for the peer, batches go as frames (accord_cassandra/frames.py)
        # on a connection this opens, not on gRPC.
        self.frames = frames
        self.max_frame_bytes = max_frame_bytes
        self._connection: FrameConnection | None = None

    def send(self, envelope: Envelope) -> None:
        self.send_encoded(encode_message(envelope))

    def send_encoded(self, payload: bytes) -> None:
        """Queue the codec's bytes of an envelope to this peer."""
        if len(self.queue) >= QUEUE_LIMIT:
            self.queue.popleft()
            self.metrics.dropped += 1
        self.queue.append((time.monotonic(), payload))
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _first(self) -> tuple[float, bytes]:
        """The oldest queued message, once there is one."""
        while not self.queue:
            wakeup = self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await wakeup
            finally:
                self._wakeup = None
        return self.queue.popleft()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        # Batches go on one stream per peer (Stream): writes are pipelined, so nothing waits
        # for an acknowledgement. A peer that answers UNIMPLEMENTED gets unary Deliver calls,
        # up to IN_FLIGHT_LIMIT at once: waiting for each acknowledgement before sending the
        # next made every message queue behind a whole round trip on a WAN (bench: loaded
        # p50 1.5-2x higher, fast path 0.62-0.70 instead of 0.86-0.99). Batches may then
        # arrive out of order, which the protocol tolerates anyway.
        slots = asyncio.Semaphore(IN_FLIGHT_LIMIT)
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                first = await self._first()
                await slots.acquire()
                if self._backoff_until > asyncio.get_running_loop().time():
                    await asyncio.sleep(self._backoff_until - asyncio.get_running_loop().time())
                # Taken after the waits above, so a batch never carries what went stale there.
                oldest = time.monotonic() - MAX_AGE_SECONDS
                batch = [first[1]] if first[0] >= oldest else []
                queue = self.queue
                while len(batch) < BATCH_LIMIT and queue:
                    queued_at, payload = queue.popleft()
                    if queued_at >= oldest:
                        batch.append(payload)
                    else:
                        self.metrics.expired += 1
                if first[0] < oldest:
                    self.metrics.expired += 1
                if not batch:
                    slots.release()
                    continue
                if self._unary:
                    task = asyncio.create_task(self._deliver(batch, slots))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    continue
                try:
                    if self.frames is not None:
                        await self._frame(batch, self.frames)
                    else:
                        await self._stream(batch)
                except Exception as error:  # noqa: BLE001
                    # grpc can raise its own internal errors (ExecuteBatchError) when the
                    # peer goes away mid-call, probing or writing; the sender must outlive
                    # them, or this peer would never hear from this node again. The probe
                    # is retried with the next batch (_probed is still False).
                    self._end_stream()
                    self._end_frames()
                    self._failed(batch, type(error).__name__)
                finally:
                    slots.release()
        finally:
            self._end_stream()
            self._end_frames()

    async def _frame(
        self, batch: list[bytes], connect: Callable[[], Awaitable[FrameConnection]]
    ) -> None:
        """Write one batch as a frame on the peer's connection, opening one if there is
        none or the last one closed (the peer restarted, or refused a batch whole). Writes
        are pipelined as on a stream; a write that waits longer than a unary call's deadline
        for the socket to drain ends the connection and drops the batch."""
        connection = self._connection
        if connection is not None and (connection.closed or connection.writer.is_closing()):
            logger.debug("frame link to node=%d ended: %s", self.peer_id, connection.why)
            connection.close()
            connection = self._connection = None
        if connection is None:
            try:
                connection = self._connection = await connect()
            except (OSError, TimeoutError) as error:
                self._failed(batch, f"cannot connect: {error!r}", unreachable=True)
                return
        data = self._request(batch).SerializeToString()
        if len(data) > self.max_frame_bytes:
            logger.error(
                "a batch of %d bytes to node=%d is over the %d-byte frame limit: dropped",
                len(data),
                self.peer_id,
                self.max_frame_bytes,
            )
            self._failed(batch, "frame too large")
            return
        connection.write(_FRAME_LENGTH.pack(len(data)) + data)
        if connection.buffered():  # only then can drain wait (loopback: hardly ever)
            try:
                async with asyncio.timeout(DELIVER_DEADLINE_SECONDS):
                    await connection.drain()
            except (OSError, TimeoutError) as error:
                self._end_frames()
                self._failed(batch, type(error).__name__)
                return
        self._delivered(batch)

    def _end_frames(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _request(self, batch: list[bytes]) -> peer_pb2.PeerBatch:
        request = peer_pb2.PeerBatch(
            codec_version=CODEC_VERSION, source=self.node_id, payloads=batch
        )
        self.stamper.stamp(request, self.peer_id, batch)
        return request

    def _delivered(self, batch: list[bytes]) -> None:
        self.metrics.sent += len(batch)
        self.metrics.batches_sent += 1
        self._backoff = 0.05
        if not self.reachable:
            self._reach(True)

    def _reach(self, reachable: bool) -> None:
        self.reachable = reachable
        logger.info("node=%d is %s", self.peer_id, "reachable" if reachable else "unreachable")
        if self.on_reachability is not None:
            self.on_reachability(self.peer_id, reachable)

    def _failed(self, batch: list[bytes], code: object, *, unreachable: bool = False) -> None:
        """``unreachable``: the peer could not be reached at all (nothing listens, the
        connection was refused or reset), as opposed to a batch that failed on a live link
        (refused, timed out: the peer may only be slow)."""
        self.metrics.failed_batches += 1
        self.metrics.dropped += len(batch)
        logger.debug("delivery to node=%d failed: %s", self.peer_id, code)
        if (unreachable or code is grpc.StatusCode.UNAVAILABLE) and self.reachable:
            self._reach(False)
        # A peer that is down: space the next attempts out instead of spinning.
        self._backoff_until = asyncio.get_running_loop().time() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_SECONDS_MAX)

    async def _stream(self, batch: list[bytes]) -> None:
        """Write one batch on the peer's stream, opening one if there is none or the last
        one ended since the previous write (the peer restarted, or refused a batch whole).
        A write that fails on it, or waits longer than a unary call's deadline for flow
        control, ends the stream and drops the batch; the next batch opens a new one."""
        if not self._probed and not await self._probe(batch):
            return
        call = self._call
        if call is not None and call.done():
            code = await call.code()
            self._end_stream()
            if code is grpc.StatusCode.UNIMPLEMENTED:
                await self._fall_back(batch)
                return
            call = None
        if call is None:
            call = self._call = self.stub.Stream()
        try:
            async with asyncio.timeout(DELIVER_DEADLINE_SECONDS):
                await call.write(self._request(batch))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as error:
            code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
            if code is None and call.done():
                code = await call.code()
            self._end_stream()
            if code is grpc.StatusCode.UNIMPLEMENTED:
                await self._fall_back(batch)
                return
            self._failed(batch, code or type(error).__name__)
            return
        self._delivered(batch)

    async def _probe(self, batch: list[bytes]) -> bool:
        """Whether ``batch`` may go on a stream: the first time, an empty stream asks the
        peer whether it has Stream at all (a batch written to a peer that has not would be
        lost unseen). False when the batch went by Deliver instead, or failed."""
        try:
            probe = self.stub.Stream()
            async with asyncio.timeout(DELIVER_DEADLINE_SECONDS):
                await probe.done_writing()
                await probe
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                self._probed = True
                await self._fall_back(batch)
            else:
                self._failed(batch, error.code())
            return False
        except TimeoutError:
            self._failed(batch, "probe timed out")
            return False
        self._probed = True
        return True

    async def _fall_back(self, batch: list[bytes]) -> None:
        # An older sidecar without Stream: this batch and later ones go by Deliver.
        logger.info("node=%d has no Stream: falling back to Deliver", self.peer_id)
        self._unary = True
        await self._deliver_now(batch)

    def _end_stream(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _deliver_now(self, batch: list[bytes]) -> None:
        try:
            await self.stub.Deliver(self._request(batch), timeout=DELIVER_DEADLINE_SECONDS)
        except grpc.aio.AioRpcError as error:
            self._failed(batch, error.code())
        else:
            self._delivered(batch)

    async def _deliver(self, batch: list[bytes], slots: asyncio.Semaphore) -> None:
        try:
            await self._deliver_now(batch)
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
        stamper: BatchStamper,
        frame_addresses: Mapping[int, str] | None = None,
        connect_frames: Callable[[str], Callable[[], Awaitable[FrameConnection]]] | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        """``frame_addresses``: the peers with a frame listener (accord_cassandra/frames.py)
        and where; ``connect_frames`` makes, for one such address, what opens a connection to
        it. The other peers get gRPC's Peer.Stream."""
        self.metrics = TransportMetrics()
        # Set by the owner once it exists (the host is built after its transport): who is
        # told that a peer turned unreachable or reachable again.
        self.on_reachability: Callable[[int, bool], None] | None = None
        frame_addresses = frame_addresses or {}
        self.senders = {
            peer: PeerSender(
                node_id,
                peer,
                make_channel(address),
                self.metrics,
                stamper,
                connect_frames(frame_addresses[peer])
                if connect_frames is not None and peer in frame_addresses
                else None,
                max_frame_bytes,
                self._reachability,
            )
            for peer, address in sorted(addresses.items())
            if peer != node_id
        }
        # The last envelope encoded: (body, src, dest, bytes). A coordinator sends one body
        # to every replica in a row; the others get its bytes readdressed, not re-encoded.
        # Holding the body keeps its identity from being reused (bodies are frozen).
        self._last: tuple[object, int, int, bytes] | None = None

    def start(self) -> None:
        for sender in self.senders.values():
            sender.start()

    def _reachability(self, peer: int, reachable: bool) -> None:
        if self.on_reachability is not None:
            self.on_reachability(peer, reachable)

    def unreachable(self) -> list[int]:
        """The peers whose last delivery found nobody to talk to."""
        return [peer for peer, sender in self.senders.items() if not sender.reachable]

    def send(self, envelope: Envelope) -> None:
        sender = self.senders.get(envelope.dest)
        if sender is None:
            logger.error("no address for node=%d", envelope.dest)
            return
        body = envelope.body
        last = self._last
        if last is not None and last[0] is body and last[1] == envelope.src:
            payload = readdress(last[3], envelope.src, last[2], envelope.dest)
        else:
            payload = encode_message(envelope)
        self._last = (body, envelope.src, envelope.dest, payload)
        sender.send_encoded(payload)

    def queue_depths(self) -> dict[int, int]:
        return {peer: len(sender.queue) for peer, sender in self.senders.items()}

    async def close(self) -> None:
        for sender in self.senders.values():
            await sender.close()
