"""The peer transport's stream (``Peer.Stream``): one gRPC call carries many batches, a
batch refused whole ends only its stream, and a peer without ``Stream`` (an older sidecar)
is reached through ``Deliver``.

A real :class:`PeerSender` talks over loopback to a real :class:`PeerServicer` registered the
way the sidecar registers it (raw bytes in, ``PeerAck`` out), with shared-secret MACs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.server import PEER_SERVICE_NAME, _add_raw_stream_unary, _add_raw_unary
from accord_cassandra.transport import PeerSender, PeerServicer, TransportMetrics
from accord_cassandra.v1 import peer_pb2

KEY = PeerKey("k", b"s" * 32)
SENDER, RECEIVER = 1, 2
# Generous: a shared, loaded machine; the test waits for progress, never for a time.
WAIT_SECONDS = 60.0


def message(i: int) -> Envelope:
    txn_id = Timestamp(1, 1_800_000_000_000_000 + i, 0, SENDER)
    return Envelope(SENDER, RECEIVER, InformDurable(i, txn_id))


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("no progress within the deadline")
        await asyncio.sleep(0.01)


class Receiver:
    """A peer server; ``stream=False`` registers Deliver alone, as an older sidecar did."""

    def __init__(self, *, stream: bool, authenticator: PeerAuthenticator | None = None) -> None:
        self.delivered: list[Envelope] = []
        self.calls: dict[str, int] = {"Deliver": 0, "Stream": 0}
        self.metrics = TransportMetrics()
        self.authenticator = authenticator or PeerAuthenticator(
            RECEIVER, [SENDER, RECEIVER], "hmac", keys=[KEY]
        )
        self.servicer = PeerServicer(
            RECEIVER, self.delivered.append, self.metrics, self.authenticator.check
        )
        self.stream = stream
        self.server = grpc.aio.server()
        self.address = ""

    async def start(self, address: str = "127.0.0.1:0") -> None:
        async def deliver(request: bytes, context: Any) -> peer_pb2.PeerAck:
            self.calls["Deliver"] += 1
            return await self.servicer.Deliver(request, context)

        async def stream(requests: AsyncIterator[bytes], context: Any) -> peer_pb2.PeerAck:
            self.calls["Stream"] += 1
            return await self.servicer.Stream(requests, context)

        serialize = peer_pb2.PeerAck.SerializeToString
        _add_raw_unary(self.server, PEER_SERVICE_NAME, "Deliver", deliver, serialize)
        if self.stream:
            _add_raw_stream_unary(self.server, PEER_SERVICE_NAME, "Stream", stream, serialize)
        port = self.server.add_insecure_port(address)
        self.address = f"127.0.0.1:{port}"
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(grace=None)


async def sender_to(receiver: Receiver, stamper: BatchStamper | None = None) -> PeerSender:
    channel = grpc.aio.insecure_channel(receiver.address)
    sender = PeerSender(SENDER, RECEIVER, channel, TransportMetrics(), stamper or BatchStamper(KEY))
    sender.start()
    return sender


async def _many_batches_one_stream() -> None:
    receiver = Receiver(stream=True)
    await receiver.start()
    sender = await sender_to(receiver)
    try:
        for round_index in range(20):
            for i in range(5):
                sender.send(message(round_index * 5 + i))
            await until(lambda r=round_index: len(receiver.delivered) == (r + 1) * 5)
        assert [e.body.cid for e in receiver.delivered] == list(range(100)), "order kept"
        assert sender.metrics.batches_sent >= 20
        # The empty probe that asks whether the peer has Stream, then the one stream.
        assert receiver.calls == {"Deliver": 0, "Stream": 2}, receiver.calls
        assert sender.metrics.sent == 100
    finally:
        await sender.close()
        await receiver.stop()


def test_batches_share_one_stream_in_order() -> None:
    asyncio.run(_many_batches_one_stream())


async def _refused_batch_ends_only_its_stream() -> None:
    receiver = Receiver(stream=True)
    await receiver.start()
    # Signed with a key the receiver does not hold: refused whole, the stream aborted.
    forger = await sender_to(receiver, BatchStamper(PeerKey("k", b"x" * 32)))
    honest = await sender_to(receiver)
    try:
        forger.send(message(0))
        await until(lambda: receiver.metrics.unauthenticated_batches == 1)
        await until(lambda: forger.metrics.failed_batches + forger.metrics.sent >= 1)
        honest.send(message(1))
        await until(lambda: len(receiver.delivered) == 1)
        assert receiver.delivered[0].body.cid == 1
        # The forger's sender opens a new stream for its next batch (refused again).
        forger.send(message(2))
        await until(lambda: receiver.metrics.unauthenticated_batches == 2)
        assert [e.body.cid for e in receiver.delivered] == [1]
        # Then the honest sender still gets through on its own stream.
        honest.send(message(3))
        await until(lambda: len(receiver.delivered) == 2)
    finally:
        await forger.close()
        await honest.close()
        await receiver.stop()


def test_a_refused_batch_ends_only_its_stream() -> None:
    asyncio.run(_refused_batch_ends_only_its_stream())


async def _falls_back_to_deliver() -> None:
    receiver = Receiver(stream=False)
    await receiver.start()
    sender = await sender_to(receiver)
    try:
        for i in range(10):
            sender.send(message(i))
            await until(lambda n=i: len(receiver.delivered) == n + 1)
        assert receiver.calls["Deliver"] == 10, receiver.calls
        assert sorted(e.body.cid for e in receiver.delivered) == list(range(10))
        assert sender.metrics.dropped == 0
    finally:
        await sender.close()
        await receiver.stop()


def test_a_peer_without_stream_is_reached_through_deliver() -> None:
    asyncio.run(_falls_back_to_deliver())


async def _receiver_restart() -> None:
    first = Receiver(stream=True)
    await first.start()
    sender = await sender_to(first)
    try:
        sender.send(message(0))
        await until(lambda: len(first.delivered) == 1)
        await first.stop()
        # A new server on the same address (as a restarted sidecar would be).
        second = Receiver(stream=True)
        await second.start(first.address)
        for i in range(1, 200):
            if second.delivered:
                break
            sender.send(message(i))
            await asyncio.sleep(0.05)
        await until(lambda: bool(second.delivered))
        await second.stop()
    finally:
        await sender.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_stream_is_reopened_after_the_receiver_restarts() -> None:
    asyncio.run(_receiver_restart())


class _GrpcInternalError(Exception):
    """What grpc raises from deep inside a call when the peer goes away mid-call
    (``ExecuteBatchError``): no ``AioRpcError``, nothing the sender names."""


class _FailingCall:
    """A real stream call whose first step (``write`` or ``done_writing``) raises."""

    def __init__(self, call: Any) -> None:
        self.call = call

    async def write(self, request: object) -> None:
        raise _GrpcInternalError("write")

    async def done_writing(self) -> None:
        raise _GrpcInternalError("done_writing")

    def done(self) -> bool:
        return bool(self.call.done())

    def cancel(self) -> bool:
        return bool(self.call.cancel())


class _FlakyStub:
    """The sender's stub, failing its next ``Stream`` calls as scripted: "open" raises at
    once, "midway" returns a call whose first step raises."""

    def __init__(self, real: Any, script: list[str]) -> None:
        self.real = real
        self.script = script
        self.Deliver = real.Deliver

    def Stream(self) -> Any:
        step = self.script.pop(0) if self.script else "ok"
        if step == "open":
            raise _GrpcInternalError("open")
        call = self.real.Stream()
        return _FailingCall(call) if step == "midway" else call


async def _survives_grpc_internal_errors() -> None:
    receiver = Receiver(stream=True)
    await receiver.start()
    sender = await sender_to(receiver)
    # Probe opened: raises; probe mid-call: raises; probe ok; first write on the stream:
    # raises; then every call is real.
    stub = _FlakyStub(sender.stub, ["open", "midway", "ok", "midway"])
    sender.stub = stub  # type: ignore[assignment]
    try:
        for i in range(200):
            if receiver.delivered:
                break
            sender.send(message(i))
            await asyncio.sleep(0.05)
        await until(lambda: bool(receiver.delivered))
        assert not stub.script, "every scripted failure was met"
        assert sender.task is not None and not sender.task.done(), "the sender lives on"
        assert sender.metrics.failed_batches >= 3
        # And it keeps delivering on the stream it opened after the failures.
        sent = sender.metrics.sent
        sender.send(message(1000))
        await until(lambda: sender.metrics.sent > sent)
        assert receiver.delivered[-1].body.cid == 1000
    finally:
        await sender.close()
        await receiver.stop()


def test_the_sender_survives_grpc_internal_errors_probing_and_writing() -> None:
    asyncio.run(_survives_grpc_internal_errors())


async def _one_body_to_several_peers() -> None:
    from accord.codec import decode_message, encode_message
    from accord_cassandra.transport import Peers

    addresses = {1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3", 4: "127.0.0.1:4"}
    peers = Peers(1, addresses, grpc.aio.insecure_channel, BatchStamper(KEY))
    try:
        shared = InformDurable(7, Timestamp(1, 1_800_000_000_000_000, 0, 1))
        other = InformDurable(8, Timestamp(1, 1_800_000_000_000_001, 0, 1))
        # A coordinator's broadcast (one body object, readdressed), then another body with
        # equal content but its own identity, then the first body again after it.
        sent = [
            Envelope(1, 2, shared),
            Envelope(1, 3, shared),
            Envelope(1, 4, shared),
            Envelope(1, 2, other),
            Envelope(1, 3, shared),
        ]
        for envelope in sent:
            peers.send(envelope)
        queued = {peer: [p for _, p in s.queue] for peer, s in peers.senders.items()}
        expected: dict[int, list[bytes]] = {2: [], 3: [], 4: []}
        for envelope in sent:
            expected[envelope.dest].append(encode_message(envelope))
        assert queued == expected
        for payloads in queued.values():
            for payload in payloads:
                assert isinstance(decode_message(payload), Envelope)
    finally:
        await peers.close()


def test_a_body_sent_to_several_peers_has_each_envelope_s_own_bytes() -> None:
    asyncio.run(_one_body_to_several_peers())
