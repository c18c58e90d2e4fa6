"""The ring coordinator: a gRPC service granting fenced token-range leases (seed Part 4).

Theory of operation
-------------------
One coordinator deployment per virtual cluster ``(region, cluster)``, as a master and any
number of standbys. Each process runs :class:`RingCoordinator`:

* **Leadership** (:class:`Leadership`): the master holds the row ``es_ring_state(region,
  cluster, 'leader')`` through LWTs with a TTL: take it with ``IF holder = null`` (free, or
  its TTL ran out), keep it with ``IF holder = me AND term = mine`` every TTL/3. A master that
  has not confirmed its leadership for TTL (minus a drift margin, counted from the *send* of
  its last successful LWT on its monotonic clock) stops serving by itself, before the row can
  expire on the server: two masters never serve at once. A standby retries every TTL/3.
* **Leases**: the master keeps one :class:`~stacksaga_store.ring.leases.ServiceRing` per service it
  has Retry-Nodes for; each node holds a ``Session`` stream (Hello, Renew, Released in; Grant,
  Revoke out). See :mod:`stacksaga_store.ring.leases` for the timing and epoch rules.
* **Epochs**: a ring's epoch lives in ``es_ring_state(region, cluster, 'ring:<service>')`` and
  moves only by a conditional batch that *also* requires this process's leadership term, so a
  deposed master cannot issue a new epoch. A new master first reads the epoch (SERIAL) and
  adopts the leases nodes present at that epoch for one lease duration
  (:class:`~stacksaga_store.ring.leases.Phase` ADOPTING): Retry-Nodes keep working through a
  failover, and keep working on their leases while no master is up at all, until the leases expire.

Standbys answer ``Session`` with FAILED_PRECONDITION; clients go through their address list.
``Status`` works everywhere and shows leadership, rings, epochs and leases.

Every call is authenticated first when a secret or mutual TLS is configured
(:mod:`stacksaga_store.ring.auth`), and a ``Hello`` may only name the node its credentials
prove. Requests are parsed here, not by gRPC, so bytes that are no message answer
INVALID_ARGUMENT; a message is at most ``MESSAGE_MAX_BYTES`` and a node id or service name
at most 256 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from accord_cassandra.ports import bind_retrying
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import (
    InvariantViolation,
    StackSagaError,
    check_not_none,
    check_state,
)
from stacksaga_store.ring.auth import (
    NODE_ID_MAX_BYTES,
    SERVICE_NAME_MAX_BYTES,
    RingAuthenticator,
    RingRefused,
    server_security,
)
from stacksaga_store.ring.leases import (
    DRIFT_ALLOWANCE,
    Grant,
    Outbound,
    PersistEpoch,
    Revoke,
    ServiceRing,
    TokenRange,
    margin_seconds,
    ring_row_name,
)
from stacksaga_store.store.connect import open_cql
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind, StoreUnavailableError
from stacksaga_store.v1 import ring_pb2 as pb
from stacksaga_store.v1 import ring_pb2_grpc

__all__ = ["Leadership", "RingCoordinator", "lease_to_proto", "serve_coordinator"]

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.05
SESSION_QUEUE_MAX = 256
SESSIONS_MAX = 4096
# Node messages are a few dozen bytes; anything near this is not one.
MESSAGE_MAX_BYTES = 64 * 1024
_SERVICE = "stacksaga_store.v1.RingCoordinator"


class Leadership:
    """The master's LWT row with a TTL (module docstring). All methods return applied?"""

    def __init__(
        self,
        cql: CqlSession,
        keyspace: str,
        *,
        region: str,
        cluster: str,
        holder: str,
        ttl_seconds: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        check_state(ttl_seconds >= 1, "leadership TTL must be >= 1 s")
        self.cql = cql
        self.keyspace = keyspace
        self.region = region
        self.cluster = cluster
        self.holder = holder
        self.ttl_seconds = ttl_seconds
        self.monotonic = monotonic
        self.term = random.SystemRandom().randrange(1, 2**62)
        self.valid_until = 0.0
        self._statements: dict[str, Prepared] = {}

    async def prepare(self) -> None:
        table = f"{self.keyspace}.es_ring_state"
        where = "region = ? AND cluster = ? AND name = ?"
        specs = {
            "acquire": (
                f"UPDATE {table} USING TTL ? SET holder = ?, term = ? WHERE {where} "
                "IF holder = null",
                StatementKind.LWT,
            ),
            "renew": (
                f"UPDATE {table} USING TTL ? SET holder = ?, term = ? WHERE {where} "
                "IF holder = ? AND term = ?",
                StatementKind.LWT,
            ),
            "resign": (
                f"DELETE holder, term FROM {table} WHERE {where} IF holder = ? AND term = ?",
                StatementKind.LWT,
            ),
            "epoch": (f"SELECT epoch FROM {table} WHERE {where}", StatementKind.SERIAL_READ),
            "bump": (
                f"UPDATE {table} SET epoch = ? WHERE {where} IF epoch = ?",
                StatementKind.LWT,
            ),
            "first": (
                f"UPDATE {table} SET epoch = ? WHERE {where} IF epoch = null",
                StatementKind.LWT,
            ),
            "leader": (f"SELECT holder, term FROM {table} WHERE {where}", StatementKind.READ),
        }
        for name, (text, kind) in specs.items():
            self._statements[name] = await self.cql.prepare(text, kind=kind, table="es_ring_state")

    def _key(self, name: str) -> list[object]:
        return [self.region, self.cluster, name]

    @property
    def margin(self) -> float:
        return margin_seconds(self.ttl_seconds)

    def leading(self) -> bool:
        return self.monotonic() < self.valid_until

    async def _lwt(self, name: str, params: list[object], sent: float) -> bool:
        rows = await self.cql.execute(self._statements[name], params, row_limit=None)
        applied = bool(rows and rows[0]["[applied]"])
        if applied and name in ("acquire", "renew"):
            self.valid_until = sent + self.ttl_seconds * (1 - DRIFT_ALLOWANCE) - self.margin
        return applied

    async def try_acquire(self) -> bool:
        sent = self.monotonic()
        params = [self.ttl_seconds, self.holder, self.term, *self._key("leader")]
        return await self._lwt("acquire", params, sent)

    async def renew(self) -> bool:
        sent = self.monotonic()
        params = [
            self.ttl_seconds,
            self.holder,
            self.term,
            *self._key("leader"),
            self.holder,
            self.term,
        ]
        applied = await self._lwt("renew", params, sent)
        if not applied:
            self.valid_until = 0.0
        return applied

    async def resign(self) -> None:
        self.valid_until = 0.0
        params = [*self._key("leader"), self.holder, self.term]
        await self.cql.execute(self._statements["resign"], params, row_limit=None)

    async def leader(self) -> str | None:
        rows = await self.cql.execute(self._statements["leader"], self._key("leader"), row_limit=1)
        return rows[0]["holder"] if rows and rows[0]["holder"] else None

    async def read_epoch(self, service_name: str) -> int:
        rows = await self.cql.execute(
            self._statements["epoch"], self._key(ring_row_name(service_name)), row_limit=1
        )
        return int(rows[0]["epoch"]) if rows and rows[0]["epoch"] is not None else 0

    async def bump_epoch(self, service_name: str, previous: int, epoch: int) -> bool:
        """``previous`` -> ``epoch``, only while this process still holds its term."""
        sent = self.monotonic()
        ring = self._key(ring_row_name(service_name))
        bump = (
            (self._statements["first"], [epoch, *ring])
            if previous == 0
            else (self._statements["bump"], [epoch, *ring, previous])
        )
        renew = (
            self._statements["renew"],
            [
                self.ttl_seconds,
                self.holder,
                self.term,
                *self._key("leader"),
                self.holder,
                self.term,
            ],
        )
        rows = await self.cql.execute_lwt_batch([bump, renew])
        applied = bool(rows and rows[0]["[applied]"])
        if applied:
            self.valid_until = sent + self.ttl_seconds * (1 - DRIFT_ALLOWANCE) - self.margin
        return applied


def lease_to_proto(
    service_name: str,
    token_range: TokenRange,
    epoch: int,
    duration_ms: int,
    ordinal: int,
    members: int,
) -> pb.Lease:
    return pb.Lease(
        service_name=service_name,
        range=pb.TokenRange(start=token_range.start, end=token_range.end),
        epoch=epoch,
        duration_ms=duration_ms,
        ordinal=ordinal,
        members=members,
    )


@dataclass
class _Session:
    node_id: str
    service_name: str
    queue: asyncio.Queue[pb.CoordinatorMessage | None] = field(
        default_factory=lambda: asyncio.Queue(SESSION_QUEUE_MAX)
    )
    # Why the node's stream was refused mid-session (a message that did not parse).
    refusal: str | None = None


def _parse_node_message(raw: pb.NodeMessage | bytes) -> pb.NodeMessage:
    return pb.NodeMessage.FromString(raw) if isinstance(raw, bytes) else raw


class RingCoordinator(ring_pb2_grpc.RingCoordinatorServicer):
    """One coordinator process (master or standby). :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        *,
        leadership: Leadership,
        coordinator_id: str,
        lease_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        auth: RingAuthenticator | None = None,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        check_state(lease_seconds > 0, "lease duration must be positive")
        self.leadership = leadership
        self.auth = auth or RingAuthenticator()
        self.credentials = credentials
        self.coordinator_id = coordinator_id
        self.lease_seconds = lease_seconds
        self.monotonic = monotonic
        self.rings: dict[str, ServiceRing] = {}
        self._sessions: dict[str, _Session] = {}
        self._ring_locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._leader = False
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, listen: str) -> int:
        await self.leadership.prepare()
        self._server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", MESSAGE_MAX_BYTES)]
        )
        # Raw requests (no deserializer): garbage is INVALID_ARGUMENT here, not UNKNOWN.
        handlers = {
            "Session": grpc.stream_stream_rpc_method_handler(
                self.Session, response_serializer=pb.CoordinatorMessage.SerializeToString
            ),
            "Status": grpc.unary_unary_rpc_method_handler(
                self.Status, response_serializer=pb.StatusReply.SerializeToString
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE, handlers),)
        )
        server = self._server
        credentials = self.credentials

        async def bind() -> int:
            if credentials is None:
                return int(server.add_insecure_port(listen))
            return int(server.add_secure_port(listen, credentials))

        # Port 0: any free port (reported by the caller); a fixed port is retried for a while,
        # since a coordinator restarting on its known address may find it still held.
        self.port = await bind_retrying(bind, listen)
        await self._server.start()
        self._tasks = [
            asyncio.create_task(self._leadership_loop()),
            asyncio.create_task(self._ticker()),
        ]
        logger.info("ring coordinator %s listening on port %d", self.coordinator_id, self.port)
        return self.port

    async def stop(self, *, resign: bool = True) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        was_leader = self._leader
        self._demote("coordinator stopping")
        if resign and was_leader:
            with contextlib.suppress(StoreUnavailableError):
                await self.leadership.resign()
        if self._server is not None:
            await self._server.stop(grace=0.5)

    @property
    def is_leader(self) -> bool:
        return self._leader and self.leadership.leading()

    # -- leadership ---------------------------------------------------------------------------

    async def _leadership_loop(self) -> None:
        period = self.leadership.ttl_seconds / 3
        while True:
            try:
                if self._leader:
                    if not await self.leadership.renew():
                        self._demote("leadership renewal refused")
                elif await self.leadership.try_acquire():
                    self._leader = True
                    self.rings.clear()
                    logger.info("coordinator %s is now the master", self.coordinator_id)
            except StoreUnavailableError as exc:
                logger.warning("leadership LWT failed: %s", exc)
            await asyncio.sleep(period)

    def _demote(self, reason: str) -> None:
        if self._leader:
            logger.warning("coordinator %s stops serving: %s", self.coordinator_id, reason)
        self._leader = False
        self.rings.clear()
        for session in list(self._sessions.values()):
            self._offer(session, None)
        self._sessions.clear()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            if self._leader and not self.leadership.leading():
                # Not confirmed for TTL: the row may expire any moment; stop before it does.
                self._demote("leadership not confirmed within its TTL")
                continue
            now = self.monotonic()
            for ring in list(self.rings.values()):
                self._route(ring, ring.tick(now))

    # -- sessions -----------------------------------------------------------------------------

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        try:
            return self.auth.authenticate(
                tuple(context.invocation_metadata() or ()), context.auth_context()
            )
        except RingRefused as refused:
            await context.abort(refused.code, refused.reason)
            raise  # abort raises; this keeps the type checker aware

    async def Session(
        self,
        request_iterator: AsyncIterator[pb.NodeMessage | bytes],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        proven = await self._authenticate(context)
        if not self.is_leader:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"{self.coordinator_id} is not the master"
            )
        raw = await anext(aiter(request_iterator), None)
        try:
            first = None if raw is None else _parse_node_message(raw)
        except DecodeError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed NodeMessage: {error}")
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a session starts with Hello")
        first = check_not_none(first, "a session starts with Hello")
        hello = first.hello
        if not hello.node_id or not hello.service_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Hello needs node and service")
        for what, value, limit in (
            ("node_id", hello.node_id, NODE_ID_MAX_BYTES),
            ("service_name", hello.service_name, SERVICE_NAME_MAX_BYTES),
        ):
            size = len(value.encode())
            if size > limit:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Hello.{what} of {size} bytes exceeds {limit}",
                )
        try:
            self.auth.check_node(hello.node_id, proven, context.auth_context())
        except RingRefused as refused:
            await context.abort(refused.code, refused.reason)
        if len(self._sessions) >= SESSIONS_MAX and hello.node_id not in self._sessions:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{SESSIONS_MAX} sessions already open"
            )
        session = _Session(hello.node_id, hello.service_name)
        previous = self._sessions.get(session.node_id)
        if previous is not None:
            self._offer(previous, None)  # the node reconnected: the old stream is dead
        self._sessions[session.node_id] = session
        reader = asyncio.create_task(self._read(session, first, request_iterator))
        try:
            while True:
                message = await session.queue.get()
                if message is None:
                    if session.refusal is not None:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.refusal)
                    return
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if self._sessions.get(session.node_id) is session:
                del self._sessions[session.node_id]
                ring = self.rings.get(session.service_name)
                if ring is not None:
                    self._route(ring, ring.disconnect(session.node_id, self.monotonic()))

    async def _read(
        self,
        session: _Session,
        first: pb.NodeMessage,
        request_iterator: AsyncIterator[pb.NodeMessage | bytes],
    ) -> None:
        try:
            await self._on_hello(session, first)
            async for raw in request_iterator:
                await self._on_message(session, _parse_node_message(raw))
        except DecodeError as error:
            session.refusal = f"malformed NodeMessage: {error}"
            logger.info("session of %s ended: %s", session.node_id, session.refusal)
        except (grpc.aio.AioRpcError, StoreUnavailableError, StackSagaError) as exc:
            logger.info("session of %s ended: %s", session.node_id, exc)
        finally:
            self._offer(session, None)

    async def _ring(self, service_name: str) -> ServiceRing | None:
        ring = self.rings.get(service_name)
        if ring is not None:
            return ring
        lock = self._ring_locks.setdefault(service_name, asyncio.Lock())
        async with lock:
            ring = self.rings.get(service_name)
            if ring is None and self.is_leader:
                epoch = await self.leadership.read_epoch(service_name)
                ring = ServiceRing(service_name, epoch, self.lease_seconds, self.monotonic())
                self.rings[service_name] = ring
                logger.info("ring %s loaded at epoch %d (%s)", service_name, epoch, ring.phase)
            return ring

    async def _on_hello(self, session: _Session, message: pb.NodeMessage) -> None:
        ring = await self._ring(session.service_name)
        if ring is None:
            return
        held = None
        if message.hello.HasField("held") and message.hello.held.service_name == ring.service_name:
            lease = message.hello.held
            held = (TokenRange(lease.range.start, lease.range.end), int(lease.epoch))
        self._route(ring, ring.hello(session.node_id, message.sequence, held, self.monotonic()))

    async def _on_message(self, session: _Session, message: pb.NodeMessage) -> None:
        ring = self.rings.get(session.service_name)
        if ring is None:
            return
        now = self.monotonic()
        kind = message.WhichOneof("kind")
        if kind == "renew":
            outs = ring.renew(session.node_id, message.sequence, message.renew.epoch, now)
        elif kind == "released":
            outs = ring.released(session.node_id, message.sequence, message.released.epoch, now)
        else:
            outs = []
        self._route(ring, outs)

    def _route(self, ring: ServiceRing, outs: list[Outbound]) -> None:
        duration_ms = int(self.lease_seconds * 1000)
        for out in outs:
            if isinstance(out, PersistEpoch):
                self._tasks.append(asyncio.create_task(self._persist(ring, out)))
                continue
            session = self._sessions.get(out.node_id)
            if session is None or session.service_name != ring.service_name:
                continue
            if isinstance(out, Grant):
                lease = lease_to_proto(
                    ring.service_name, out.range, out.epoch, duration_ms, out.ordinal, out.members
                )
                message = pb.CoordinatorMessage(sequence=out.sequence, grant=pb.Grant(lease=lease))
            else:
                if not isinstance(out, Revoke):
                    raise InvariantViolation(f"the ring sends no {type(out).__name__}")
                revoke = pb.Revoke(epoch=out.epoch, reason=out.reason)
                message = pb.CoordinatorMessage(sequence=out.sequence, revoke=revoke)
            self._offer(session, message)
        self._tasks = [task for task in self._tasks if not task.done()]

    def _offer(self, session: _Session, message: pb.CoordinatorMessage | None) -> None:
        try:
            session.queue.put_nowait(message)
        except asyncio.QueueFull:
            # A node that does not read its stream is as good as gone: end the session.
            logger.warning("session of %s is not reading; closing it", session.node_id)
            with contextlib.suppress(asyncio.QueueEmpty):
                session.queue.get_nowait()
            session.queue.put_nowait(None)

    async def _persist(self, ring: ServiceRing, intent: PersistEpoch) -> None:
        try:
            applied = await self.leadership.bump_epoch(
                intent.service_name, intent.previous, intent.epoch
            )
        except StoreUnavailableError as exc:
            logger.warning("epoch %d of %s not persisted: %s", intent.epoch, ring.service_name, exc)
            applied = False
        if self.rings.get(ring.service_name) is not ring:
            return  # demoted meanwhile
        now = self.monotonic()
        if not applied:
            logger.warning("epoch bump of %s refused; retrying", ring.service_name)
            self._route(ring, ring.persist_failed(now))
            return
        logger.info(
            "ring %s: epoch %d, members %s", ring.service_name, intent.epoch, list(ring.members)
        )
        self._route(ring, ring.persisted(intent.epoch, now))

    # -- status ---------------------------------------------------------------------------------

    async def Status(
        self, request: pb.StatusRequest | bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StatusReply:
        await self._authenticate(context)
        if isinstance(request, bytes):
            try:
                pb.StatusRequest.FromString(request)
            except DecodeError as error:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"malformed StatusRequest: {error}"
                )
        reply = pb.StatusReply(coordinator_id=self.coordinator_id, leader=self.is_leader)
        duration_ms = int(self.lease_seconds * 1000)
        for name, ring in sorted(self.rings.items()):
            status = pb.RingStatus(
                service_name=name,
                epoch=ring.epoch,
                phase=ring.phase.value,
                members=list(ring.members),
            )
            ordered = sorted(ring.holders.items(), key=lambda item: item[1].range)
            for ordinal, (node_id, holder) in enumerate(ordered):
                status.holders.append(node_id)
                status.leases.append(
                    lease_to_proto(
                        name, holder.range, ring.epoch, duration_ms, ordinal, len(ordered)
                    )
                )
            reply.rings.append(status)
        return reply


async def serve_coordinator(
    settings: StackSagaSettings,
    *,
    listen: str,
    coordinator_id: str | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run one coordinator process until SIGTERM/SIGINT (or ``stop``); resign on the way out.

    Prints ``ring coordinator <id> serving on <host>:<port>`` once the port is bound, for
    supervisors and tests that wait for it.
    """
    recovery = settings.cassandra.recovery.coordinator
    # Before anything connects: an unauthenticated coordinator beyond loopback is refused.
    auth, credentials = server_security(recovery, listen)
    connection = await open_cql(settings)
    stop_event = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal_number, stop_event.set)
    identity = coordinator_id or listen
    try:
        leadership = Leadership(
            connection.cql,
            connection.driver_config.keyspace,
            region=settings.instance.region,
            cluster=settings.instance.cluster,
            holder=identity,
            ttl_seconds=int(recovery.leadership_ttl.total_seconds()),
        )
        coordinator = RingCoordinator(
            leadership=leadership,
            coordinator_id=identity,
            lease_seconds=recovery.lease_duration.total_seconds(),
            auth=auth,
            credentials=credentials,
        )
        port = await coordinator.start(listen)
        host = listen.rpartition(":")[0]
        sys.stdout.write(f"ring coordinator {identity} serving on {host}:{port}\n")
        sys.stdout.flush()
        await stop_event.wait()
        await coordinator.stop(resign=True)
    finally:
        await connection.close()
    return 0
