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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from accord.invariants import fail
from accord_cassandra.transport import (
    MAX_FRAME_BYTES,
    BatchRefused,
    PeerServicer,
    TransportMetrics,
)

logger = logging.getLogger(__name__)

MAGIC = b"ACPF\x00\x00\x00\x01"
LENGTH = struct.Struct(">I")
# A client that connects and does not say MAGIC within this long is dropped.
HELLO_SECONDS = 10.0
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
    """Accepts framed peer connections and hands each batch to a :class:`PeerServicer`."""

    def __init__(
        self,
        servicer: PeerServicer | None = None,
        metrics: TransportMetrics | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if not 0 < max_frame_bytes <= 0xFFFFFFFF:
            raise ValueError(f"max_frame_bytes must be 1..{0xFFFFFFFF}, not {max_frame_bytes}")
        self.servicer = servicer
        self.metrics = metrics or TransportMetrics()
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self.server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._logged_at = float("-inf")
        self._unlogged = 0

    async def bind(self, host: str, port: int, *, serve: bool = True) -> int:
        """Listen on ``host:port`` (0: any free port); returns the port bound. Connections
        are served from here on, or with ``serve=False`` from :meth:`start` (a sidecar
        binds its ports before its node exists)."""
        self.server = await asyncio.start_server(
            self._serve, host, port, ssl=self.ssl_context, limit=2**16, start_serving=False
        )
        sockets = self.server.sockets
        if not sockets:
            fail("a bound frame listener has no socket")
        if serve:
            await self.start()
        return int(sockets[0].getsockname()[1])

    async def start(
        self, servicer: PeerServicer | None = None, metrics: TransportMetrics | None = None
    ) -> None:
        if servicer is not None:
            self.servicer = servicer
        if metrics is not None:
            self.metrics = metrics
        if self.server is None or self.servicer is None:
            fail("a frame listener starts serving once bound, with a servicer")
        await self.server.start_serving()

    async def close(self) -> None:
        # Closing each connection's socket ends its reader with EOF (cancelling the tasks
        # would make asyncio log each as an error).
        if self.server is not None:
            self.server.close()
        for writer in list(self._connections):
            writer.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)

    def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        self.metrics.refused_connections += 1
        self._unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= LOG_SECONDS:
            peer = writer.get_extra_info("peername")
            logger.warning(
                "closed %d framed peer connection(s) (last from %s: %s)", self._unlogged, peer, why
            )
            self._logged_at = now
            self._unlogged = 0
        with contextlib.suppress(Exception):
            writer.write(f"refused: {why}\n"[:1000].encode())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            await self._frames(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError):
            pass  # the peer went away (or never spoke): its sender reconnects
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(HELLO_SECONDS):
            hello = await reader.readexactly(len(MAGIC))
        if hello != MAGIC:
            self._refuse(writer, f"not a framed peer link (opened with {hello!r})")
            return
        auth_context = auth_context_of(writer.get_extra_info("peercert"))
        if self.servicer is None:
            fail("a frame listener serves only with a servicer")
        handle = self.servicer.handle
        unpack = LENGTH.unpack
        limit = self.max_frame_bytes
        readexactly = reader.readexactly
        while True:
            (length,) = unpack(await readexactly(4))
            if length == 0 or length > limit:
                self.metrics.oversize_frames += 1
                self._refuse(writer, f"frame of {length} bytes, the limit is 1..{limit}")
                return
            try:
                await handle(await readexactly(length), auth_context)
            except BatchRefused as refused:
                self._refuse(writer, f"{refused.code.name}: {refused.details}")
                return


class FrameConnection:
    """One sender's connection to a peer's frame listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.closed = False
        self.why: str | None = None
        self._reader = asyncio.create_task(self._read(reader))

    @classmethod
    async def open(
        cls, host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
    ) -> FrameConnection:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
            )
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
    "MAGIC",
    "MAX_FRAME_BYTES",
    "FrameConnection",
    "FrameListener",
    "auth_context_of",
    "client_ssl_context",
    "server_ssl_context",
]
