"""The framed peer link (accord_cassandra/frames.py) in one process, the sidecar's real
sender and listener: its limits and its reconnection. Forged batches against running
sidecars on it are in tests/sidecar/test_peer_auth.py."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
import uvloop

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.frames import (
    AUTH_TIMEOUT_SECONDS,
    LENGTH,
    MAGIC,
    MAX_CONNECTIONS,
    FrameConnection,
    FrameListener,
    client_ssl_context,
    server_ssl_context,
)
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.transport import BACKOFF_SECONDS_MAX, PeerSender, PeerServicer
from accord_cassandra.transport import TransportMetrics as Metrics
from tests.certs import make_ca, make_cert

KEY = PeerKey("test", b"k" * 32)


def _message(i: int) -> Envelope:
    return Envelope(1, 2, InformDurable(i, Timestamp(1, 1_800_000_000_000_000 + i, 0, 1)))


def _listener(
    delivered: list[Envelope],
    metrics: Metrics,
    max_frame_bytes: int = 1 << 20,
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int = MAX_CONNECTIONS,
    auth_timeout_seconds: float = AUTH_TIMEOUT_SECONDS,
) -> FrameListener:
    authenticator = PeerAuthenticator(2, [1, 2], "hmac", keys=[KEY])
    servicer = PeerServicer(2, delivered.append, metrics, authenticator.check)
    return FrameListener(
        servicer,
        metrics,
        ssl_context=ssl_context,
        max_frame_bytes=max_frame_bytes,
        max_connections=max_connections,
        auth_timeout_seconds=auth_timeout_seconds,
    )


def _sender(
    metrics: Metrics,
    stamper: BatchStamper,
    port: int,
    max_frame_bytes: int,
    context: ssl.SSLContext | None = None,
) -> PeerSender:
    # The gRPC channel is never used (the peer has a frame address); it connects lazily.
    channel = grpc.aio.insecure_channel("127.0.0.1:9")
    return PeerSender(1, 2, channel, metrics, stamper, _connector(port, context), max_frame_bytes)


def _connector(
    port: int, context: ssl.SSLContext | None = None
) -> Callable[[], Awaitable[FrameConnection]]:
    async def connect() -> FrameConnection:
        return await FrameConnection.open("127.0.0.1", port, context, 2.0)

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


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A listener's TLS context and one its clients trust (no client certificates)."""
    directory: Path = tmp_path_factory.mktemp("frame-tls")
    ca = make_ca(directory, "frames-ca")
    key, cert = make_cert(directory, ca, "frames")
    authority = ca[1].read_bytes()
    server = server_ssl_context(authority, str(cert), str(key), require_client_certificate=False)
    return server, client_ssl_context(authority)


async def _closed_with(reader: asyncio.StreamReader) -> bytes:
    """What the listener said before it closed this connection (b"": nothing)."""
    async with asyncio.timeout(30):  # a bound on a hang, not a measurement
        return await reader.read()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_connections_past_the_limit_are_refused_and_silent_ones_time_out(
    loop: str, secure: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    """Three connections at most: an honest sender's and two that never send a whole
    frame. Two more are closed on arrival, unread (over TLS: before any handshake, so
    without a word); the honest link keeps delivering; the two silent ones are closed once
    the auth timeout passes (over TLS one is still in its handshake), the honest one not:
    it opened first, so its timeout had passed too, but it authenticated."""
    server_context, client_context = tls if secure else (None, None)

    async def run() -> None:
        delivered: list[Envelope] = []
        metrics = Metrics()
        listener = _listener(
            delivered,
            metrics,
            ssl_context=server_context,
            max_connections=3,
            auth_timeout_seconds=2.0,
        )
        port = await listener.bind("127.0.0.1", 0)
        sender = _sender(Metrics(), BatchStamper(KEY), port, 1 << 20, client_context)
        streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            sender.start()
            sender.send(_message(1))
            await _until(lambda: len(delivered) == 1, 10)
            assert listener.open_connections == 1
            # Silent: one says nothing at all (over TLS: not even its handshake), the other
            # its opening and half a frame (over TLS: after its handshake).
            streams.append(await asyncio.open_connection("127.0.0.1", port))
            streams.append(
                await asyncio.open_connection(
                    "127.0.0.1",
                    port,
                    ssl=client_context,
                    server_hostname="127.0.0.1" if secure else None,
                )
            )
            streams[1][1].write(MAGIC + LENGTH.pack(100) + b"x" * 10)
            await _until(lambda: listener.open_connections == 3, 10)
            for _ in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                said = await _closed_with(reader)
                writer.close()
                assert said == (b"" if secure else b"refused: 3 connections are open, the limit\n")
            assert metrics.frame_connections_over_limit == 2
            assert listener.open_connections == 3
            sender.send(_message(2))
            await _until(lambda: len(delivered) == 2, 10)
            silent = [await _closed_with(reader) for reader, _ in streams]
            late = b"refused: no whole frame within 2 s of connecting\n"
            assert silent == ([b"", late] if secure else [late, late])
            assert metrics.frame_connections_timed_out == 2
            await _until(lambda: listener.open_connections == 1, 10)
            # Closed by the listener: the four above and nothing else.
            assert metrics.refused_connections == 4
            sender.send(_message(3))
            await _until(lambda: len(delivered) == 3, 10)
        finally:
            for _, writer in streams:
                writer.close()
            await sender.close()
            await listener.close()

    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())
