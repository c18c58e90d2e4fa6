"""``python -m bench.peer_transport``: CPU per peer batch, ``Peer.Stream`` against unary
``Peer.Deliver``, with the sidecar's real sender and receiver in one process on loopback.

Not a suite: a check of the transport's own cost, free of Cassandra and of the machine's
load (it counts this process's CPU time, both ends together, codec included), printed per
batch of ``--per-batch`` messages. uvloop runs the loop when installed, as in the sidecar.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
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


async def cpu_per_batch(*, unary: bool, batches: int, per_batch: int) -> float:
    """Microseconds of CPU per batch delivered (sent, received, decoded, handed over)."""
    inbox = _Inbox()
    authenticator = PeerAuthenticator(RECEIVER, [SENDER, RECEIVER], "hmac", keys=[KEY])
    servicer = PeerServicer(RECEIVER, inbox.deliver, TransportMetrics(), authenticator.check)
    server = grpc.aio.server()
    serialize = peer_pb2.PeerAck.SerializeToString

    async def stream(requests: AsyncIterator[bytes], context: Any) -> peer_pb2.PeerAck:
        return await servicer.Stream(requests, context)

    _add_raw_unary(server, PEER_SERVICE_NAME, "Deliver", servicer.Deliver, serialize)
    _add_raw_stream_unary(server, PEER_SERVICE_NAME, "Stream", stream, serialize)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    sender = PeerSender(SENDER, RECEIVER, channel, TransportMetrics(), BatchStamper(KEY))
    if unary:
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
        await server.stop(grace=None)


async def _main(args: argparse.Namespace) -> None:
    for _ in range(args.rounds):
        for unary in (True, False):
            micros = await cpu_per_batch(
                unary=unary, batches=args.batches, per_batch=args.per_batch
            )
            name = "Deliver (unary)" if unary else "Stream"
            print(f"{name:16s} {micros:7.0f} us CPU per batch of {args.per_batch}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_transport", description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--per-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
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
