"""``python -m bench.peer_transport``: CPU per peer batch, the framed link
(accord_cassandra/frames.py) against gRPC's ``Peer.Stream`` and unary ``Peer.Deliver``, each
plain and with mutual TLS, with the sidecar's real sender and receiver in one process on
loopback.

Not a suite: a check of the transport's own cost, free of Cassandra and of the machine's
load (it counts this process's CPU time, both ends together, codec included), printed per
batch of ``--per-batch`` messages. uvloop runs the loop when installed, as in the sidecar.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.frames import (
    MAX_FRAME_BYTES,
    FrameConnection,
    FrameListener,
    client_ssl_context,
    server_ssl_context,
)
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.server import PEER_SERVICE_NAME, _add_raw_stream_unary, _add_raw_unary
from accord_cassandra.transport import PeerSender, PeerServicer, TransportMetrics
from accord_cassandra.v1 import peer_pb2

KEY = PeerKey("bench", b"b" * 32)
SENDER, RECEIVER = 1, 2
WAIT_SECONDS = 60.0


def _message(i: int) -> Envelope:
    txn_id = Timestamp(1, 1_800_000_000_000_000 + i, 0, SENDER)
    return Envelope(SENDER, RECEIVER, InformDurable(i, txn_id))


class _Inbox:
    """What the receiver's node would get; wakes a waiter (no polling: a polling loop's own
    CPU would grow with the latency it waits out and bias the comparison)."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.reached = asyncio.Event()

    def deliver(self, envelope: Envelope) -> None:
        self.count += 1
        if self.count >= self.target:
            self.reached.set()

    async def wait_for(self, target: int) -> None:
        self.target = target
        if self.count < target:
            self.reached.clear()
            await asyncio.wait_for(self.reached.wait(), WAIT_SECONDS)


class Certificates:
    """A CA and one certificate per node (the identities mtls expects), made with the
    openssl CLI in a temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = self._make("ca", None)
        self.nodes = {n: self._make(f"accord-node-{n}", self.ca) for n in (SENDER, RECEIVER)}

    def _make(self, name: str, ca: tuple[Path, Path] | None) -> tuple[Path, Path]:
        key, cert = self.directory / f"{name}.key", self.directory / f"{name}.crt"
        subject = ["-subj", f"/CN={name}", "-nodes", "-keyout", str(key)]
        if ca is None:
            run = ["req", "-x509", "-newkey", "rsa:2048", *subject, "-out", str(cert)]
            subprocess.run(["openssl", *run, "-days", "1"], check=True, capture_output=True)
            return key, cert
        csr, ext = self.directory / f"{name}.csr", self.directory / f"{name}.ext"
        ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:{name}\n")
        run = ["req", "-newkey", "rsa:2048", *subject, "-out", str(csr)]
        subprocess.run(["openssl", *run], check=True, capture_output=True)
        sign = ["x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0])]
        sign += ["-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext)]
        subprocess.run(["openssl", *sign], check=True, capture_output=True)
        return key, cert


def _grpc_ends(
    servicer: PeerServicer, certificates: Certificates | None
) -> tuple[grpc.aio.Server, Any]:
    server = grpc.aio.server()
    serialize = peer_pb2.PeerAck.SerializeToString

    async def stream(requests: AsyncIterator[bytes], context: Any) -> peer_pb2.PeerAck:
        return await servicer.Stream(requests, context)

    _add_raw_unary(server, PEER_SERVICE_NAME, "Deliver", servicer.Deliver, serialize)
    _add_raw_stream_unary(server, PEER_SERVICE_NAME, "Stream", stream, serialize)
    if certificates is None:
        port = server.add_insecure_port("127.0.0.1:0")
        return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    ca = certificates.ca[1].read_bytes()
    key, cert = (p.read_bytes() for p in certificates.nodes[RECEIVER])
    port = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True),
    )
    key, cert = (p.read_bytes() for p in certificates.nodes[SENDER])
    credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return server, grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials)


class _Direct:
    """A frame link without a socket: each frame is handed to the receiver as it is
    written. What it costs is what every link shares (queue, stamp, MAC, serialize, parse,
    decode, the loop's wake-ups): the floor under the links' own costs."""

    def __init__(self, servicer: PeerServicer, auth_context: dict[str, list[bytes]]) -> None:
        self.servicer = servicer
        self.auth_context = auth_context
        self.closed = False
        self.why = None
        self.writer = self
        self.tasks: set[asyncio.Task[int]] = set()

    def is_closing(self) -> bool:
        return False

    def write(self, frame: bytes) -> None:
        task = asyncio.create_task(self.servicer.handle(frame[4:], self.auth_context))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def buffered(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


async def cpu_per_batch(
    *, link: str, batches: int, per_batch: int, certificates: Certificates | None = None
) -> float:
    """Microseconds of CPU per batch delivered (sent, received, decoded, handed over) on
    ``link``: "frames", "stream", "deliver" or "direct" (see :class:`_Direct`); with
    mutual TLS when given ``certificates`` (then authenticated by certificate, as peer_auth
    mtls, else by HMAC)."""
    inbox = _Inbox()
    if certificates is None:
        authenticator = PeerAuthenticator(RECEIVER, [SENDER, RECEIVER], "hmac", keys=[KEY])
        stamper = BatchStamper(KEY)
    else:
        authenticator = PeerAuthenticator(RECEIVER, [SENDER, RECEIVER], "mtls")
        stamper = BatchStamper(None)
    metrics = TransportMetrics()
    servicer = PeerServicer(RECEIVER, inbox.deliver, metrics, authenticator.check)
    server, channel = _grpc_ends(servicer, certificates)
    await server.start()
    listener: FrameListener | None = None
    frames: Callable[[], Awaitable[FrameConnection]] | None = None
    if link == "frames":
        server_context: ssl.SSLContext | None = None
        client_context: ssl.SSLContext | None = None
        if certificates is not None:
            ca = certificates.ca[1].read_bytes()
            key, cert = (str(p) for p in certificates.nodes[RECEIVER])
            server_context = server_ssl_context(ca, cert, key, require_client_certificate=True)
            key, cert = (str(p) for p in certificates.nodes[SENDER])
            client_context = client_ssl_context(ca, cert, key)
        listener = FrameListener(servicer, metrics, ssl_context=server_context)
        port = await listener.bind("127.0.0.1", 0)

        async def frames() -> FrameConnection:
            return await FrameConnection.open("127.0.0.1", port, client_context, 5.0)

    if link == "direct":
        # What the listener's TLS would hand over for the sender's certificate.
        names = {"x509_common_name": [f"accord-node-{SENDER}".encode()]}
        direct = _Direct(servicer, names if certificates is not None else {})

        async def frames() -> FrameConnection:
            return direct  # type: ignore[return-value]

    sender = PeerSender(
        SENDER, RECEIVER, channel, TransportMetrics(), stamper, frames, MAX_FRAME_BYTES
    )
    if link == "deliver":
        sender._unary = sender._probed = True  # as towards an older sidecar
    sender.start()
    try:
        for i in range(per_batch):  # warm: connection, probe, first stream
            sender.send(_message(i))
        await inbox.wait_for(per_batch)
        started = time.process_time()
        for b in range(batches):
            for i in range(per_batch):
                sender.send(_message(b * per_batch + i))
            await inbox.wait_for((b + 2) * per_batch)
        return 1e6 * (time.process_time() - started) / batches
    finally:
        await sender.close()
        if listener is not None:
            await listener.close()
        await server.stop(grace=None)


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="peer-transport-") as directory:
        certificates = Certificates(Path(directory)) if args.tls else None
        for _ in range(args.rounds):
            for tls in (False, True) if certificates is not None else (False,):
                for link in ("direct", "deliver", "stream", "frames"):
                    micros = await cpu_per_batch(
                        link=link,
                        batches=args.batches,
                        per_batch=args.per_batch,
                        certificates=certificates if tls else None,
                    )
                    name = f"{link}{' (mTLS)' if tls else ' (HMAC)'}"
                    print(f"{name:16s} {micros:7.0f} us CPU per batch of {args.per_batch}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_transport", description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--per-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-tls", dest="tls", action="store_false", help="skip the mutual-TLS runs"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
