"""The Retry-Node's side of the ring coordinator: a
:class:`~stacksaga_store.ring.leases.LeaseSource`.

Theory of operation
-------------------
:class:`CoordinatorLeaseClient` keeps one ``Session`` stream open to the master, trying the
configured coordinator addresses in turn (standbys refuse with FAILED_PRECONDITION). Every
message it sends carries a sequence number, and it remembers the monotonic time each was
sent. A Grant echoes the latest sequence the coordinator had received, and the lease is
valid until *that send time* plus the granted duration, shortened by the drift allowance
(:mod:`stacksaga_store.ring.leases`): never longer than the coordinator believes.

It renews every third of the lease duration. When the stream breaks it reconnects, presenting
the lease it still holds (``Hello.held``) so a new master can adopt it; meanwhile the lease
stays usable until it expires, so recovery work goes on while no master is reachable.

Each session authenticates with the node key (``key``, :mod:`stacksaga_store.ring.auth`)
and, with ``channel_credentials``, over TLS with a client certificate;
:meth:`CoordinatorLeaseClient.from_settings` takes both from
``stacksaga.cassandra.recovery.coordinator``.

A Revoke makes :meth:`current` return None at once (the Retry-Node's next check stops it),
and so does :meth:`drop`, the Retry-Node's report that the store refused a write on the
lease's epoch (the range moved while this node was paused, say);
``Released`` is sent only when the Retry-Node reports no dispatch in flight
(:meth:`note_in_flight`), so the next holder never overlaps a running dispatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import ClassVar

import grpc

from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import check_state
from stacksaga_store.recovery.metrics import RecoveryMetrics
from stacksaga_store.ring.auth import auth_metadata, client_security
from stacksaga_store.ring.leases import DRIFT_ALLOWANCE, Lease, TokenRange
from stacksaga_store.v1 import ring_pb2 as pb
from stacksaga_store.v1 import ring_pb2_grpc

__all__ = ["CoordinatorLeaseClient"]

logger = logging.getLogger(__name__)

SENT_REMEMBERED_MAX = 256
RECONNECT_SECONDS = (0.1, 2.0)
OUTBOX_MAX = 64


class CoordinatorLeaseClient:
    """Lease source backed by the ring coordinator. :meth:`start`, then :meth:`stop`."""

    # The coordinator persists each epoch (es_ring_state) before it grants its leases.
    persists_epochs: ClassVar[bool] = True

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        node_id: str,
        service_name: str,
        renew_fallback_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: RecoveryMetrics | None = None,
        key: bytes | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        check_state(bool(addresses), "no coordinator address")
        self.addresses = list(addresses)
        self.key = key
        self.channel_credentials = channel_credentials
        self.node_id = node_id
        self.service_name = service_name
        self._monotonic = monotonic
        self.metrics = metrics or RecoveryMetrics()
        self._renew_fallback = renew_fallback_seconds
        self._lease: Lease | None = None
        self._duration = renew_fallback_seconds * 3
        self._revoked_epoch: int | None = None
        self._released_epoch: int | None = None
        self._in_flight = 0
        self._sequence = 0
        self._sent: OrderedDict[int, float] = OrderedDict()
        self._outbox: asyncio.Queue[pb.NodeMessage | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.leases_seen: list[Lease] = []
        self.connected_to: str | None = None

    @classmethod
    def from_settings(
        cls, settings: StackSagaSettings, *, node_id: str, metrics: RecoveryMetrics | None = None
    ) -> CoordinatorLeaseClient:
        """A client of the configured coordinators, authenticated as ``node_id``."""
        coordinator = settings.cassandra.recovery.coordinator
        key, credentials = client_security(coordinator, node_id)
        return cls(
            coordinator.addresses,
            node_id=node_id,
            service_name=settings.instance.service_name,
            key=key,
            channel_credentials=credentials,
            metrics=metrics,
        )

    # -- LeaseSource -----------------------------------------------------------------------------

    def current(self) -> Lease | None:
        lease = self._lease
        if lease is None or not lease.valid(self._monotonic()):
            return None
        return lease

    def monotonic(self) -> float:
        return self._monotonic()

    def note_in_flight(self, count: int) -> None:
        self._in_flight = count
        self._maybe_release()

    def drop(self, epoch: int) -> None:
        """The store refused a write on lease ``epoch``: the coordinator moved the range on
        (it persists an epoch before granting it), whatever our clock says. Drop the lease as
        if revoked (renewals and grants of it are ignored; ``Released`` once nothing is in
        flight) and start a fresh session, so the coordinator hears a Hello and can give this
        node a range in the current epoch."""
        lease = self._lease
        if lease is not None and lease.epoch > epoch:
            return  # already on a later epoch
        logger.info("node=%s lease epoch %d refused by the store; dropped", self.node_id, epoch)
        self._lease = None
        self._revoked_epoch = max(epoch, self._revoked_epoch or epoch)
        self._maybe_release()
        if self._outbox is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._outbox.put_nowait(None)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self, *, release: bool = True) -> None:
        """Stop; with ``release``, hand the lease back first (a graceful leave)."""
        lease = self._lease
        if release and lease is not None and self._outbox is not None and self._in_flight == 0:
            self._send(pb.NodeMessage(released=pb.Released(epoch=lease.epoch)))
            await asyncio.sleep(0.05)  # let the stream carry it before it closes
        self._stopping = True
        self._lease = None
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_for_lease(self, timeout: float) -> Lease:
        deadline = self._monotonic() + timeout
        while self._monotonic() < deadline:
            lease = self.current()
            if lease is not None:
                return lease
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{self.node_id}: no lease within {timeout} s")

    # -- the session ----------------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            address = self.addresses[attempt % len(self.addresses)]
            attempt += 1
            try:
                await self._session(address)
                attempt = 0  # a session that ran: start over at the first address
            except grpc.aio.AioRpcError as exc:
                logger.debug("coordinator %s: %s", address, exc.code().name)
            self.connected_to = None
            if self._stopping:
                return
            pause = RECONNECT_SECONDS[0] if attempt < len(self.addresses) else RECONNECT_SECONDS[1]
            await asyncio.sleep(min(pause, self._duration / 10))

    async def _session(self, address: str) -> None:
        self._outbox = asyncio.Queue(OUTBOX_MAX)
        outbox = self._outbox
        hello = pb.Hello(node_id=self.node_id, service_name=self.service_name)
        held = self.current()
        if held is not None:
            hello.held.CopyFrom(_lease_proto(held, self._duration))
        self._send(pb.NodeMessage(hello=hello))
        channel = (
            grpc.aio.insecure_channel(address)
            if self.channel_credentials is None
            else grpc.aio.secure_channel(address, self.channel_credentials)
        )
        # A fresh credential per session: the coordinator accepts each one once.
        metadata = auth_metadata(self.key, self.node_id) if self.key is not None else ()
        async with channel:
            stub = ring_pb2_grpc.RingCoordinatorStub(channel)
            call = stub.Session(_drain(outbox), metadata=metadata)
            renewer = asyncio.create_task(self._renew_loop())
            try:
                async for message in call:
                    self.connected_to = address
                    self._on_message(message)
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer
                # Ends the request stream, so gRPC's task that consumes it finishes too.
                with contextlib.suppress(asyncio.QueueFull):
                    outbox.put_nowait(None)
                call.cancel()

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self._duration / 3))
            lease = self._lease
            if lease is not None and self._revoked_epoch is None:
                self._send(pb.NodeMessage(renew=pb.Renew(epoch=lease.epoch)))
            if self._lease is not None and not self._lease.valid(self._monotonic()):
                # Not renewed in time (evicted as stale, or a master that lost us): start a
                # fresh session so the coordinator hears a Hello again.
                self._lease = None
                if self._outbox is not None:
                    self._outbox.put_nowait(None)
                return

    def _send(self, message: pb.NodeMessage) -> None:
        if self._outbox is None:
            return
        self._sequence += 1
        message.sequence = self._sequence
        self._sent[self._sequence] = self._monotonic()
        while len(self._sent) > SENT_REMEMBERED_MAX:
            self._sent.popitem(last=False)
        with contextlib.suppress(asyncio.QueueFull):
            self._outbox.put_nowait(message)

    def _on_message(self, message: pb.CoordinatorMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "grant":
            self._on_grant(message.sequence, message.grant.lease)
        elif kind == "revoke":
            epoch = int(message.revoke.epoch)
            lease = self._lease
            if lease is not None and lease.epoch == epoch:
                logger.info(
                    "node=%s lease epoch %d revoked: %s", self.node_id, epoch, message.revoke.reason
                )
                self._lease = None
            self._revoked_epoch = epoch
            self._maybe_release()

    def _on_grant(self, sequence: int, lease: pb.Lease) -> None:
        sent = self._sent.get(sequence)
        if sent is None:
            return  # answers a message too old to trust its timing: wait for the next one
        if self._revoked_epoch is not None:
            if lease.epoch <= self._revoked_epoch:
                return  # a renewal that crossed the Revoke
            self._revoked_epoch = None
            self._released_epoch = None
        self._duration = lease.duration_ms / 1000
        token_range = TokenRange(lease.range.start, lease.range.end)
        granted = Lease(
            service_name=lease.service_name,
            range=token_range,
            epoch=int(lease.epoch),
            ordinal=int(lease.ordinal),
            members=int(lease.members),
            valid_until=sent + self._duration * (1 - DRIFT_ALLOWANCE),
        )
        previous = self._lease
        if previous is None or (previous.range, previous.epoch) != (granted.range, granted.epoch):
            self.metrics.lease_changes += 1
            self.leases_seen.append(granted)
            logger.info(
                "node=%s lease epoch=%d ordinal=%d/%d %s",
                self.node_id,
                granted.epoch,
                granted.ordinal,
                granted.members,
                token_range,
            )
        elif previous.valid_until > granted.valid_until:
            return  # an older renewal arriving late never shortens a newer one
        self._lease = granted

    def _maybe_release(self) -> None:
        epoch = self._revoked_epoch
        if epoch is None or self._in_flight > 0 or self._lease is not None:
            return
        if self._released_epoch == epoch:
            return
        self._released_epoch = epoch
        self._send(pb.NodeMessage(released=pb.Released(epoch=epoch)))


async def _drain(outbox: asyncio.Queue[pb.NodeMessage | None]) -> AsyncIterator[pb.NodeMessage]:
    while True:
        message = await outbox.get()
        if message is None:
            return
        yield message


def _lease_proto(lease: Lease, duration_seconds: float) -> pb.Lease:
    return pb.Lease(
        service_name=lease.service_name,
        range=pb.TokenRange(start=lease.range.start, end=lease.range.end),
        epoch=lease.epoch,
        duration_ms=int(duration_seconds * 1000),
        ordinal=lease.ordinal,
        members=lease.members,
    )
