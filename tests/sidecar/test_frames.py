"""The framed peer link (accord_cassandra/frames.py) in one process, the sidecar's real
sender and listener: its limits and its reconnection. Forged batches against running
sidecars on it are in tests/sidecar/test_peer_auth.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
import pytest

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.frames import LENGTH, MAGIC, FrameConnection, FrameListener
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.transport import BACKOFF_SECONDS_MAX, PeerSender, PeerServicer
from accord_cassandra.transport import TransportMetrics as Metrics

KEY = PeerKey("test", b"k" * 32)


def _message(i: int) -> Envelope:
    return Envelope(1, 2, InformDurable(i, Timestamp(1, 1_800_000_000_000_000 + i, 0, 1)))


def _listener(
    delivered: list[Envelope], metrics: Metrics, max_frame_bytes: int = 1 << 20
) -> FrameListener:
    authenticator = PeerAuthenticator(2, [1, 2], "hmac", keys=[KEY])
    servicer = PeerServicer(2, delivered.append, metrics, authenticator.check)
    return FrameListener(servicer, metrics, max_frame_bytes=max_frame_bytes)


def _sender(metrics: Metrics, stamper: BatchStamper, port: int, max_frame_bytes: int) -> PeerSender:
    # The gRPC channel is never used (the peer has a frame address); it connects lazily.
    channel = grpc.aio.insecure_channel("127.0.0.1:9")
    return PeerSender(1, 2, channel, metrics, stamper, _connector(port), max_frame_bytes)


def _connector(port: int) -> Callable[[], Awaitable[FrameConnection]]:
    async def connect() -> FrameConnection:
        return await FrameConnection.open("127.0.0.1", port, None, 2.0)

    return connect


async def _until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s")
        await asyncio.sleep(0.01)


def test_an_oversize_length_is_refused_without_reading_the_body() -> None:
    """The length alone, over the limit, and a body that never comes: the refusal arrives
    at once and the connection closes (a listener waiting for the body would time out)."""

    async def run() -> None:
        delivered: list[Envelope] = []
        metrics = Metrics()
        listener = _listener(delivered, metrics, max_frame_bytes=1024)
        port = await listener.bind("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(MAGIC + LENGTH.pack(1025) + b"x" * 100)
            async with asyncio.timeout(5):
                line = await reader.readline()
                rest = await reader.read()
            assert line == b"refused: frame of 1025 bytes, the limit is 1..1024\n"
            assert rest == b""  # closed
            writer.close()
            assert (metrics.oversize_frames, metrics.refused_connections) == (1, 1)
            # The listener still serves: a good batch on a new connection is delivered.
            sender = _sender(Metrics(), BatchStamper(KEY), port, 1024)
            sender.start()
            sender.send(_message(1))
            await _until(lambda: len(delivered) == 1, 5)
            await sender.close()
        finally:
            await listener.close()

    asyncio.run(run())


def test_a_forged_frame_is_refused_whole_and_the_link_reopens() -> None:
    """A batch with a wrong MAC: nothing in it decoded or delivered, the connection closed
    and counted; the sender's next batch goes on a new connection and is delivered."""

    async def run() -> None:
        delivered: list[Envelope] = []
        metrics = Metrics()
        listener = _listener(delivered, metrics)
        port = await listener.bind("127.0.0.1", 0)
        forger = _sender(Metrics(), BatchStamper(PeerKey("test", b"f" * 32)), port, 1 << 20)
        honest = _sender(Metrics(), BatchStamper(KEY), port, 1 << 20)
        try:
            forger.start()
            forger.send(_message(1))
            await _until(lambda: metrics.unauthenticated_batches == 1, 5)
            await _until(lambda: metrics.refused_connections == 1, 5)
            assert delivered == [] and metrics.received == 0
            honest.start()
            honest.send(_message(2))
            await _until(lambda: len(delivered) == 1, 5)
            assert delivered[0] == _message(2)
        finally:
            await forger.close()
            await honest.close()
            await listener.close()

    asyncio.run(run())


@pytest.mark.parametrize("down_seconds", [0.2, 2.5])
def test_a_restarted_listener_is_reconnected_within_the_retry_budget(
    down_seconds: float,
) -> None:
    """The listener goes away and comes back on its port (a sidecar restart): the sender,
    sending all along, delivers again within its backoff's ceiling (a second) of the
    listener's return, however long it was down."""

    async def run() -> None:
        delivered: list[Envelope] = []
        metrics = Metrics()
        listener = _listener(delivered, metrics)
        port = await listener.bind("127.0.0.1", 0)
        sender_metrics = Metrics()
        sender = _sender(sender_metrics, BatchStamper(KEY), port, 1 << 20)
        sender.start()
        sent = 0

        async def keep_sending() -> None:
            nonlocal sent
            while True:
                sent += 1
                sender.send(_message(sent))
                await asyncio.sleep(0.02)

        pump = asyncio.create_task(keep_sending())
        try:
            await _until(lambda: len(delivered) > 0, 5)
            await listener.close()
            await asyncio.sleep(down_seconds)
            assert sender_metrics.failed_batches > 0  # it did notice
            before = len(delivered)
            restarted = _listener(delivered, Metrics())
            await restarted.bind("127.0.0.1", port)
            back = time.monotonic()
            try:
                await _until(lambda: len(delivered) > before, 5)
                assert time.monotonic() - back < BACKOFF_SECONDS_MAX + 0.5
            finally:
                await restarted.close()
        finally:
            pump.cancel()
            await sender.close()

    asyncio.run(run())


def test_a_frame_larger_than_the_read_buffer_is_read_whole() -> None:
    """A frame of several MiB (far over the stream reader's 64 KiB buffer limit) arrives
    whole: here a genuine batch whose one payload is not an accord message is refused on its
    own (as on gRPC), and the connection stays open for the next batch."""

    async def run() -> None:
        delivered: list[Envelope] = []
        metrics = Metrics()
        listener = _listener(delivered, metrics, max_frame_bytes=8 << 20)
        port = await listener.bind("127.0.0.1", 0)
        sender = _sender(Metrics(), BatchStamper(KEY), port, 8 << 20)
        try:
            sender.start()
            sender.send_encoded(b"\x00" * (5 << 20))
            await _until(lambda: metrics.refused == 1, 10)
            sender.send(_message(3))
            await _until(lambda: len(delivered) == 1, 5)
            assert (metrics.refused_connections, metrics.unauthenticated_batches) == (0, 0)
        finally:
            await sender.close()
            await listener.close()

    asyncio.run(run())
