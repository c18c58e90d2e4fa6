"""A framed peer that vanishes without a word (accord_cassandra/frames.py, "Dead peers").

The peer runs in a network namespace of the test's own, joined to this one by a veth pair;
cutting the pair's far end drops every packet both ways, as a power cut or a network
partition does, so neither a FIN nor a RST ever arrives. A killed process would not do:
its kernel closes the connection for it. Without keepalive and ``TCP_USER_TIMEOUT`` the
listener keeps such a connection (and its slot) for good, and the sender keeps taking
batches into a socket TCP retransmits for a quarter of an hour; on gRPC, without
keepalive pings (transport.keepalive_options), the sender likewise. Every test fails.
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.frames import FrameConnection, FrameListener
from accord_cassandra.native.endpoint import CqlEndpoint
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.server import RECONNECT_OPTIONS
from accord_cassandra.transport import PeerSender, PeerServicer, keepalive_options
from accord_cassandra.transport import TransportMetrics as Metrics

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="a network namespace of the test's own needs root and iproute2",
)

KEY = PeerKey("test", b"k" * 32)
STREAM_KEY = PeerKey("k", b"s" * 32)  # tests/sidecar/test_transport_stream.py's Receiver's
DEAD_PEER_SECONDS = 2.0
# Noticed within the dead-peer time plus a keepalive probe or a retransmission's spacing;
# the slack is for a loaded machine. Without the options nothing is noticed for minutes.
NOTICED_WITHIN_SECONDS = 15.0
ROOT = Path(__file__).resolve().parents[2]


def _message(i: int) -> Envelope:
    return Envelope(1, 2, InformDurable(i, Timestamp(1, 1_800_000_000_000_000 + i, 0, 1)))


def _listener(delivered: list[Envelope]) -> FrameListener:
    authenticator = PeerAuthenticator(2, [1, 2], "hmac", keys=[KEY])
    metrics = Metrics()
    servicer = PeerServicer(2, delivered.append, metrics, authenticator.check)
    return FrameListener(servicer, metrics, dead_peer_seconds=DEAD_PEER_SECONDS)


def _sender(host: str, port: int, reached: Callable[[int, bool], None] | None = None) -> PeerSender:
    # The gRPC channel is never used (the peer has a frame address); it connects lazily.
    channel = grpc.aio.insecure_channel("127.0.0.1:9")

    async def connect() -> FrameConnection:
        return await FrameConnection.open(host, port, None, 2.0, DEAD_PEER_SECONDS)

    return PeerSender(
        1, 2, channel, Metrics(), BatchStamper(KEY), connect, 1 << 20, on_reachability=reached
    )


def serve_in_namespace(host: str) -> None:
    """The peer's end, run inside the namespace: a frame listener; prints its port."""

    async def run() -> None:
        listener = _listener([])
        print(await listener.bind(host, 0), flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def send_in_namespace(host: str, port: int) -> None:
    """The peer's end, run inside the namespace: a sender that delivers one batch, then
    says so and stays."""

    async def run() -> None:
        sender = _sender(host, port)
        sender.start()
        sender.send(_message(1))
        while sender.metrics.batches_sent == 0:
            await asyncio.sleep(0.01)
        print("sent", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


@dataclass
class Namespace:
    name: str
    inside: str  # the far end's address (in the namespace)
    outside: str  # this end's address
    far_link: str
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def python(self, call: str) -> subprocess.Popen[str]:
        """``call`` (an expression on this module) run by a Python inside the namespace."""
        code = f"import tests.sidecar.test_vanished_peers as m; m.{call}"
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        return process

    def cut(self) -> None:
        """Drop every packet between the namespace and this end, both ways, silently."""
        _ip("netns", "exec", self.name, "ip", "link", "set", self.far_link, "down")

    def heal(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.far_link, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    pid = os.getpid()
    name, near, far = f"accord-dead-{pid}", f"acd{pid % 100_000}a", f"acd{pid % 100_000}b"
    subnet = f"10.231.{pid % 250}"
    ns = Namespace(name, f"{subnet}.2", f"{subnet}.1", far)
    _ip("netns", "add", name)
    try:
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("link", "set", far, "netns", name)
        _ip("addr", "add", f"{ns.outside}/30", "dev", near)
        _ip("link", "set", near, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{ns.inside}/30", "dev", far)
        _ip("netns", "exec", name, "ip", "link", "set", far, "up")
        yield ns
    finally:
        for process in ns.processes:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        subprocess.run(["ip", "link", "del", near], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _line(process: subprocess.Popen[str], seconds: float = 30.0) -> str:
    """The next line ``process`` prints, within ``seconds``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    assert ready, f"the namespace's process printed nothing within {seconds} s"
    line = process.stdout.readline().strip()
    assert line, f"the namespace's process ended (exit {process.poll()})"
    return line


async def _until(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Seconds until ``condition`` held; fails after ``seconds``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"{what}: not within {seconds} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def _sending(sender: PeerSender, condition: Callable[[], bool], what: str) -> None:
    """A message to the peer every quarter second until ``condition`` holds."""
    started = time.monotonic()
    sent = 0
    while not condition():
        assert time.monotonic() - started < NOTICED_WITHIN_SECONDS, (
            f"{what}: not within {NOTICED_WITHIN_SECONDS} s "
            f"({sender.metrics.batches_sent} batches 'sent' meanwhile)"
        )
        sent += 1
        sender.send(_message(100 + sent))
        await asyncio.sleep(0.25)


async def _cut_and_heal(namespace: Namespace, sender: PeerSender, reports: list[bool]) -> None:
    """Cut the link: the sender, sending on as the protocol does to a silent peer, finds
    the peer unreachable; heal it: reachable again, and batches go through."""
    namespace.cut()
    await _sending(sender, lambda: bool(reports), "the vanished peer found unreachable")
    assert reports == [False]
    assert not sender.reachable
    namespace.heal()
    before = sender.metrics.batches_sent
    await _sending(sender, lambda: len(reports) == 2, "the peer reachable again")
    assert reports == [False, True]
    assert sender.metrics.batches_sent > before


def test_the_listener_frees_the_slot_of_a_peer_that_vanished(namespace: Namespace) -> None:
    async def run() -> None:
        delivered: list[Envelope] = []
        listener = _listener(delivered)
        port = await listener.bind(namespace.outside, 0)
        try:
            peer = namespace.python(f"send_in_namespace({namespace.outside!r}, {port})")
            assert await asyncio.to_thread(_line, peer) == "sent"
            await _until(lambda: len(delivered) == 1, 10, "the batch delivered")
            assert listener.open_connections == 1
            namespace.cut()
            took = await _until(
                lambda: listener.open_connections == 0,
                NOTICED_WITHIN_SECONDS,
                "the vanished peer's connection closed",
            )
            assert took >= DEAD_PEER_SECONDS / 2, took  # by keepalive, not at once
        finally:
            await listener.close()

    asyncio.run(run())


def test_a_sender_whose_peer_vanished_finds_it_unreachable_then_back(
    namespace: Namespace,
) -> None:
    async def run() -> None:
        peer = namespace.python(f"serve_in_namespace({namespace.inside!r})")
        port = int(await asyncio.to_thread(_line, peer))
        reports: list[bool] = []
        sender = _sender(namespace.inside, port, lambda _, reachable: reports.append(reachable))
        sender.start()
        try:
            sender.send(_message(1))
            await _until(lambda: sender.metrics.batches_sent == 1, 10, "the first batch")
            await _cut_and_heal(namespace, sender, reports)
        finally:
            await sender.close()

    asyncio.run(run())


def grpc_serve_in_namespace(host: str) -> None:
    """The peer's end on gRPC, run inside the namespace: ``Peer.Stream`` served as the
    sidecar serves it, with its keepalive options; prints its port."""
    from tests.sidecar.test_transport_stream import Receiver

    async def run() -> None:
        receiver = Receiver(stream=True)
        receiver.server = grpc.aio.server(options=keepalive_options(DEAD_PEER_SECONDS))
        await receiver.start(f"{host}:0")
        print(receiver.address.rpartition(":")[2], flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def _grpc_sender(address: str, reached: Callable[[int, bool], None]) -> PeerSender:
    options = (*RECONNECT_OPTIONS, *keepalive_options(DEAD_PEER_SECONDS))
    channel = grpc.aio.insecure_channel(address, options=options)
    stamper = BatchStamper(STREAM_KEY)
    return PeerSender(1, 2, channel, Metrics(), stamper, None, on_reachability=reached)


def test_on_grpc_a_vanished_peer_is_found_unreachable_then_back(namespace: Namespace) -> None:
    async def run() -> None:
        peer = namespace.python(f"grpc_serve_in_namespace({namespace.inside!r})")
        port = int(await asyncio.to_thread(_line, peer))
        reports: list[bool] = []
        sender = _grpc_sender(f"{namespace.inside}:{port}", lambda _, r: reports.append(r))
        sender.start()
        try:
            sender.send(_message(1))
            await _until(lambda: sender.metrics.batches_sent == 1, 10, "the first batch")
            # Idle for several ping periods: a live peer answers the pings and stays
            # reachable (keepalive must not take a quiet peer for a dead one).
            await asyncio.sleep(3 * DEAD_PEER_SECONDS)
            sender.send(_message(2))
            await _until(lambda: sender.metrics.batches_sent == 2, 10, "a batch after idling")
            assert reports == []
            await _cut_and_heal(namespace, sender, reports)
        finally:
            await sender.close()

    asyncio.run(run())


def cql_client_in_namespace(host: str, port: int) -> None:
    """A CQL client inside the namespace: STARTUP, says it was answered, and stays."""
    import socket

    from accord_cassandra.native import frame as f

    with socket.create_connection((host, port), timeout=30) as client:
        body = f.Writer().string_map({"CQL_VERSION": "3.0.0"}).build()
        client.sendall(f.encode_frame(4, 0, 1, f.STARTUP, body))
        assert len(client.recv(65536)) >= f.HEADER_BYTES
        print("answered", flush=True)
        time.sleep(600)


def test_the_cql_endpoint_drops_a_client_that_vanished(namespace: Namespace) -> None:
    from tests.unit.test_native_endpoint import CATALOG, fake_cassandra

    async def runner(request: object) -> object:
        raise AssertionError("no transaction is sent")

    async def run() -> None:
        upstream = await asyncio.start_server(fake_cassandra, "127.0.0.1", 0)
        cassandra = upstream.sockets[0].getsockname()[1]
        endpoint = CqlEndpoint(
            f"{namespace.outside}:0",
            f"127.0.0.1:{cassandra}",
            dead_client_seconds=DEAD_PEER_SECONDS,
        )
        port = int((await endpoint.bind()).rpartition(":")[2])
        await endpoint.start(CATALOG, runner)  # type: ignore[arg-type]
        try:
            client = namespace.python(f"cql_client_in_namespace({namespace.outside!r}, {port})")
            assert await asyncio.to_thread(_line, client) == "answered"
            assert len(endpoint.connections) == 1
            namespace.cut()
            took = await _until(
                lambda: not endpoint.connections,
                NOTICED_WITHIN_SECONDS,
                "the vanished client's connection closed",
            )
            assert took >= DEAD_PEER_SECONDS / 2, took
        finally:
            await endpoint.stop()
            upstream.close()
            await upstream.wait_closed()

    asyncio.run(run())
