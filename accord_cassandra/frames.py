"""The framed peer link: peer batches as length-prefixed frames on a plain TCP (or TLS)
connection per peer, beside gRPC's ``Peer.Stream`` (accord_cassandra/transport.py).

Why: gRPC's Python stack cost a saturated sidecar ~300 us of CPU per batch of a few small
messages, both ends together (``python -m bench.peer_transport``); the frame link carries the
same bytes (a serialized, authenticated ``PeerBatch``) for a fraction of that.

Wire format: the client opens with ``MAGIC`` (8 bytes: protocol name and version), then
sends frames, each a 4-byte big-endian length and that many bytes of ``PeerBatch``. Nothing
flows back but, when the listener refuses the connection, one line saying why before it
closes. A length above the listener's ``max_frame_bytes`` (or zero) is refused before any of
the body is read. A batch refused whole (malformed, unauthenticated, another codec version)
closes the connection, as gRPC's abort ends a stream; its sender reconnects for the next
batch. Each batch is authenticated (accord_cassandra/peerauth.py) before anything in it is
decoded, by the same code as on gRPC (:meth:`PeerServicer.handle`); with TLS, the client
certificate's names are what gRPC's auth context gives mtls.

Limits: at most ``max_connections`` connections are open at once (TLS handshakes included);
one more is closed as soon as it is accepted. A connection that has not, within
``auth_timeout_seconds`` of being accepted, finished its TLS handshake, said ``MAGIC`` and
sent a whole first frame is closed. Only a connection whose first batch authenticated may
then stay idle, so what anyone able to reach the port can hold is at most
``max_connections`` sockets, each for that long, each with at most one frame's buffer.

Dead peers: a peer that vanishes without a word (powered off, or cut off by the network: no
FIN, no RST) would otherwise hold its connection at both ends for good: the listener's slot
(a peer that comes back opens a new one beside it), and the sender's socket, which takes
batches into its buffer for TCP to retransmit for a quarter of an hour. Both ends therefore
set TCP keepalive and ``TCP_USER_TIMEOUT`` (:func:`keep_alive`) so that the kernel ends such a
connection within about ``dead_peer_seconds``; the sender then reconnects, and until the
peer answers again it counts as unreachable (accord_cassandra/transport.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from accord.invariants import fail
from accord_cassandra.ports import check_dead_seconds, keep_alive
from accord_cassandra.transport import (
    MAX_FRAME_BYTES,
    BatchRefused,
    PeerServicer,
    TransportMetrics,
)

logger = logging.getLogger(__name__)

MAGIC = b"ACPF\x00\x00\x00\x01"
LENGTH = struct.Struct(">I")
# The defaults of config peer_frame_max_connections and peer_frame_auth_timeout_seconds.
# Honest peers hold one connection each (a second one only while a reconnect overlaps its
# predecessor's close), so 128 is room for a large cluster; with the default frame limit
# it bounds what unauthenticated clients can make the listener buffer to 1 GiB.
MAX_CONNECTIONS = 128
AUTH_TIMEOUT_SECONDS = 10.0
# The default of config peer_dead_seconds: how long a connection whose peer
# acknowledges nothing (neither data nor keepalive probes) lasts. Probes are tiny, and an
# honest peer's reconnect costs a handshake: no reason to wait for TCP's own 15 minutes.
DEAD_PEER_SECONDS = 30.0
# Connections the kernel queues while the listener is not accepting (asyncio's own).
LISTEN_BACKLOG = 100
# After accept() fails (no file descriptor left): the retry's pause, as asyncio's server's.
ACCEPT_PAUSE_SECONDS = 1.0
# Connection refusals are logged at most this often (the rest are counted).
LOG_SECONDS = 10.0


def auth_context_of(peercert: Mapping[str, Any] | None) -> dict[str, list[bytes]]:
    """The names of a TLS client certificate (``ssl.SSLObject.getpeercert()``) as gRPC's
    auth context gives them, for :class:`accord_cassandra.peerauth.PeerAuthenticator`."""
    if not peercert:
        return {}
    common = [
        str(value).encode()
        for rdn in peercert.get("subject", ())
        for name, value in rdn
        if name == "commonName"
    ]
    alternative = [str(value).encode() for _, value in peercert.get("subjectAltName", ())]
    return {"x509_common_name": common, "x509_subject_alternative_name": alternative}


class FrameListener:
    """Accepts framed peer connections and hands each batch to a :class:`PeerServicer`.

    It accepts on its own socket rather than through ``asyncio.start_server``: asyncio's
    server-side TLS runs the handshake before the server hears of the connection, so
    handshakes would escape the connection limit. Here a connection is counted from the
    moment it is accepted, and refused before a byte of it is read."""

    def __init__(
        self,
        servicer: PeerServicer | None = None,
        metrics: TransportMetrics | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        auth_timeout_seconds: float = AUTH_TIMEOUT_SECONDS,
        dead_peer_seconds: float = DEAD_PEER_SECONDS,
    ) -> None:
        check_dead_seconds(dead_peer_seconds)
        if not 0 < max_frame_bytes <= 0xFFFFFFFF:
            raise ValueError(f"max_frame_bytes must be 1..{0xFFFFFFFF}, not {max_frame_bytes}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        if not auth_timeout_seconds > 0:
            raise ValueError(f"auth_timeout_seconds must be positive, not {auth_timeout_seconds}")
        self.servicer = servicer
        self.metrics = metrics or TransportMetrics()
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.auth_timeout_seconds = auth_timeout_seconds
        self.dead_peer_seconds = dead_peer_seconds
        self.socket: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # One task per admitted connection, from its accept to its close; its writer once
        # the (TLS) stream exists.
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter | None] = {}
        self._logged_at = float("-inf")
        self._unlogged = 0

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet closed (those in the TLS handshake included)."""
        return len(self._connections)

    async def bind(self, host: str, port: int, *, serve: bool = True) -> int:
        """Listen on ``host:port`` (0: any free port); returns the port bound. Connections
        are served from here on, or with ``serve=False`` from :meth:`start` (a sidecar
        binds its ports before its node exists)."""
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        if not found:
            fail(f"getaddrinfo found no address for {host!r}")
        family, _, _, _, address = found[0]
        listening = socket.create_server(address[:2], family=family, backlog=LISTEN_BACKLOG)
        listening.setblocking(False)
        self.socket = listening
        if serve:
            await self.start()
        return int(listening.getsockname()[1])

    async def start(
        self, servicer: PeerServicer | None = None, metrics: TransportMetrics | None = None
    ) -> None:
        if servicer is not None:
            self.servicer = servicer
        if metrics is not None:
            self.metrics = metrics
        if self.socket is None or self.servicer is None or self._accepting is not None:
            fail("a frame listener starts serving once, bound, with a servicer")
        self._accepting = asyncio.create_task(self._accept(self.socket))

    async def close(self) -> None:
        # Closing each connection's socket ends its reader with EOF; a connection still in
        # its handshake (no stream yet) is cancelled.
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self.socket is not None:
            self.socket.close()
        for task, writer in list(self._connections.items()):
            if writer is None:
                task.cancel()
            else:
                writer.close()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(listening)
            except OSError as error:
                # Out of file descriptors, say: the kernel keeps the backlog meanwhile.
                logger.warning("frame listener cannot accept: %r", error)
                await asyncio.sleep(ACCEPT_PAUSE_SECONDS)
                continue
            client.setblocking(False)
            if len(self._connections) >= self.max_connections:
                self._refuse_at_once(client)
                continue
            # As asyncio's own servers do: the listener's rare writes (a refusal line, TLS)
            # need not wait for an acknowledgement.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(client, self.dead_peer_seconds)
            task = asyncio.create_task(self._serve(client))
            self._connections[task] = None
            task.add_done_callback(self._ended)
            if len(self._connections) > self.max_connections:
                fail(f"{len(self._connections)} frame connections open, over the limit")

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._connections.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a framed peer connection failed", exc_info=task.exception())

    def _refuse_at_once(self, client: socket.socket) -> None:
        """Close a connection past the limit before a byte of it is read or a handshake
        begins: a refusal must cost less than what it protects."""
        why = f"{self.max_connections} connections are open, the limit"
        self.metrics.frame_connections_over_limit += 1
        self._counted(_peer_of(client), why)
        if self.ssl_context is None:  # a TLS client could not read the line
            with contextlib.suppress(OSError):
                client.send(f"refused: {why}\n".encode())
        client.close()

    async def _streams(
        self, client: socket.socket
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The accepted socket as a stream pair, after its TLS handshake if any (what
        ``asyncio.start_server`` hands its callback). The socket is the transport's from
        here on, closed with it, also when this raises."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            client,
            ssl=self.ssl_context,
            # The auth timeout around this ends a handshake first; asyncio's own (60 s by
            # default) must not end it sooner, uncounted.
            ssl_handshake_timeout=self.auth_timeout_seconds + 1.0 if self.ssl_context else None,
        )
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def _counted(self, peer: object, why: str) -> None:
        """Count a connection this listener closed; log at most every LOG_SECONDS."""
        self.metrics.refused_connections += 1
        self._unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= LOG_SECONDS:
            logger.warning(
                "closed %d framed peer connection(s) (last from %s: %s)", self._unlogged, peer, why
            )
            self._logged_at = now
            self._unlogged = 0

    def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        self._counted(writer.get_extra_info("peername"), why)
        with contextlib.suppress(Exception):
            writer.write(f"refused: {why}\n"[:1000].encode())

    async def _serve(self, client: socket.socket) -> None:
        task = asyncio.current_task()
        if task is None or task not in self._connections:
            fail("a frame connection is served by the task it was admitted as")
        peer = _peer_of(client)
        writer: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(self.auth_timeout_seconds):
                    reader, writer = await self._streams(client)
                    self._connections[task] = writer
                    first = await self._first_frame(reader, writer)
            except TimeoutError:
                self.metrics.frame_connections_timed_out += 1
                why = f"no whole frame within {self.auth_timeout_seconds:g} s of connecting"
                if writer is None:  # still in its TLS handshake: it could not read a line
                    self._counted(peer, why)
                else:
                    self._refuse(writer, why)
                return
            if first is not None:
                await self._frames(reader, writer, first)
        except (asyncio.IncompleteReadError, OSError):
            # The peer went away (or never spoke; a TLS error is an OSError too), or it
            # vanished and the kernel gave up on it (TimeoutError): its sender reconnects.
            pass
        finally:
            # Without a writer the transport, if any, closed the socket when its handshake
            # failed; closing it again does nothing.
            if writer is None:
                client.close()
            else:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes
    ) -> None:
        """Hand the first frame and every later one to the servicer, until one is refused."""
        if self.servicer is None:
            fail("a frame listener serves only with a servicer")
        auth_context = auth_context_of(writer.get_extra_info("peercert"))
        handle = self.servicer.handle
        unpack = LENGTH.unpack
        limit = self.max_frame_bytes
        readexactly = reader.readexactly
        frame = first
        while True:
            try:
                await handle(frame, auth_context)
            except BatchRefused as refused:
                self._refuse(writer, f"{refused.code.name}: {refused.details}")
                return
            (length,) = unpack(await readexactly(4))
            if length == 0 or length > limit:
                self._oversize(writer, length)
                return
            frame = await readexactly(length)

    async def _first_frame(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | None:
        """``MAGIC`` and the first frame's body; None when the connection was refused."""
        hello = await reader.readexactly(len(MAGIC))
        if hello != MAGIC:
            self._refuse(writer, f"not a framed peer link (opened with {hello!r})")
            return None
        (length,) = LENGTH.unpack(await reader.readexactly(4))
        if length == 0 or length > self.max_frame_bytes:
            self._oversize(writer, length)
            return None
        return await reader.readexactly(length)

    def _oversize(self, writer: asyncio.StreamWriter, length: int) -> None:
        self.metrics.oversize_frames += 1
        self._refuse(writer, f"frame of {length} bytes, the limit is 1..{self.max_frame_bytes}")


def _peer_of(client: socket.socket) -> object:
    try:
        return client.getpeername()
    except OSError:  # it went away already
        return "?"


class FrameConnection:
    """One sender's connection to a peer's frame listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.closed = False
        self.why: str | None = None
        self._reader = asyncio.create_task(self._read(reader))

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
        dead_peer_seconds: float = DEAD_PEER_SECONDS,
    ) -> FrameConnection:
        check_dead_seconds(dead_peer_seconds)
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
            )
        keep_alive(writer.get_extra_info("socket"), dead_peer_seconds)
        writer.write(MAGIC)
        return cls(reader, writer)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        # The listener only ever writes a refusal before it closes: EOF (or that line) ends
        # this connection at once, so the next batch goes on a new one rather than into a
        # socket nobody reads.
        try:
            line = await reader.readline()
        except (OSError, ValueError) as error:  # ValueError: a line over the reader's limit
            line = repr(error).encode()
        self.why = line.decode(errors="replace").strip() or "closed by the peer"
        self.close()

    def write(self, frame: bytes) -> None:
        self.writer.write(frame)

    def buffered(self) -> int:
        return int(self.writer.transport.get_write_buffer_size())

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()
            if self._reader is not asyncio.current_task():
                self._reader.cancel()


def client_ssl_context(
    ca: bytes | None, certificate: str | None = None, private_key: str | None = None
) -> ssl.SSLContext:
    """A TLS client context for a peer's frame listener (the peer_tls CA, or the system's
    roots without one; the node's own certificate for mtls)."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cadata=ca.decode() if ca is not None else None
    )
    if certificate is not None:
        context.load_cert_chain(certificate, private_key)
    return context


def server_ssl_context(
    ca: bytes | None, certificate: str, private_key: str, *, require_client_certificate: bool
) -> ssl.SSLContext:
    """The frame listener's TLS, as ``peer_tls`` (or ``tls``) makes the gRPC peer port's."""
    context = ssl.create_default_context(
        ssl.Purpose.CLIENT_AUTH, cadata=ca.decode() if ca is not None else None
    )
    context.load_cert_chain(certificate, private_key)
    context.verify_mode = ssl.CERT_REQUIRED if require_client_certificate else ssl.CERT_NONE
    return context


__all__: Sequence[str] = [
    "AUTH_TIMEOUT_SECONDS",
    "DEAD_PEER_SECONDS",
    "MAGIC",
    "MAX_CONNECTIONS",
    "MAX_FRAME_BYTES",
    "FrameConnection",
    "FrameListener",
    "auth_context_of",
    "client_ssl_context",
    "server_ssl_context",
]
