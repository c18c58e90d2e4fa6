"""One sidecar process: the Accord node, its journal, its data store, and its gRPC services.

Services: ``accord_cassandra.v1.Transactions`` (clients; a bearer token when
``client_token`` is set) and ``grpc.health.v1.Health`` on ``listen`` (TLS with ``tls``), and
``accord_cassandra.v1.Peer`` (replicas) on the same port or, with ``peer_listen``, on a port
of its own (mutual TLS with ``peer_tls``). Every peer batch is authenticated before it is
decoded (``peer_auth``, accord_cassandra/peerauth.py).

Shutdown (SIGTERM/SIGINT): health turns NOT_SERVING, new transactions are refused, those in
flight get ``drain_seconds`` to finish, then the server and the node stop. Nothing durable
depends on a clean shutdown: a SIGKILL at any instant loses nothing acknowledged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from accord import Const, Key, MakeTuple, NodeConfig, Put, Topology, ring_topology
from accord.invariants import check_not_none, fail
from accord.messages import Envelope
from accord.messages.validate import InvalidMessage, MessageLimits
from accord.testing import Bugs
from accord_cassandra.client import NEVER_CONNECTED
from accord_cassandra.config import BATCH_MAX_KEYS_LIMIT, ConfigError, SidecarConfig
from accord_cassandra.datastore import (
    MAX_NODE_ID,
    AsyncDataStore,
    CassandraDataStore,
    tables_from_cluster,
)
from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.frames import (
    FrameConnection,
    FrameListener,
    client_ssl_context,
    server_ssl_context,
)
from accord_cassandra.host import MAX_PENDING_CLIENTS, Admission, Overloaded, SidecarHost
from accord_cassandra.journal import FileJournal, JournalCorrupt
from accord_cassandra.memory_store import MemoryDataStore
from accord_cassandra.metrics import MetricsServer, registry_of
from accord_cassandra.native.agreement import schema_agreement
from accord_cassandra.native.endpoint import CqlEndpoint, Failure
from accord_cassandra.native.peers import Directory
from accord_cassandra.peerauth import BatchStamper, PeerAuthenticator, PeerKey
from accord_cassandra.ports import (
    bind_retrying,
    split_address,
    wait_for_json,
    write_json_atomically,
)
from accord_cassandra.schema import (
    Catalog,
    SchemaError,
    TableSchema,
    check_key,
    check_txn_write,
    check_type,
    check_write,
)
from accord_cassandra.translate import (
    MAX_LETS,
    MAX_MUTATIONS,
    RequestError,
    to_response,
    to_txn,
)
from accord_cassandra.transport import Peers, PeerServicer, keepalive_options
from accord_cassandra.v1 import client_pb2, client_pb2_grpc, peer_pb2

logger = logging.getLogger(__name__)

SERVICE_NAME = "accord_cassandra.v1.Transactions"
PEER_SERVICE_NAME = "accord_cassandra.v1.Peer"
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# A frame listener that has not accepted within this long is down: the batch is dropped and
# the sender retries after its backoff (at most a second), as a gRPC channel reconnects.
FRAME_CONNECT_SECONDS = 2.0
# gRPC backs off reconnecting to an unreachable peer exponentially, up to 120 s by default,
# and a channel in backoff fails every call at once. A peer down for a few seconds then
# stayed unreachable long after it restarted: it could not catch up for 15-25 s
# (tests/sidecar/test_cassandra.py). Peers are few and close; retry every second at most.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


# Error details travel in a gRPC header (percent-encoded, so up to 3x longer): an error
# echoing a 64 KiB value overflowed the client's metadata limit and arrived as
# RESOURCE_EXHAUSTED instead of the real error.
MAX_DETAILS_CHARS = 1024
# A transaction is given the client's remaining deadline less this (or less a tenth of it,
# if that is shorter), so the sidecar answers with its own status first. Without it, at
# 10,500 concurrent transfers a request that waited for a busy key past the client's
# deadline had its stream reset by the server's deadline timer before the client's fired:
# the client saw CANCELLED, an outcome no client can interpret, instead of the definite
# RESOURCE_EXHAUSTED of an admission timeout.
DEADLINE_MARGIN_SECONDS = 0.5


# Requests the gRPC core has received but the event loop has not yet picked up. Past
# grpc.server.max_pending_requests (default 1,000) the core refuses new ones at random,
# always past the hard limit (default 3,000), and this gRPC reports them as CANCELLED: at
# 10,500 concurrent transfers on 3 sidecars that was 1,000-1,200 answers the client cannot
# interpret, though none had reached the sidecar (tests/sidecar/test_pending.py). Above
# MAX_PENDING_CLIENTS a sidecar refuses transactions itself, definitely, once it reads them;
# until the loop reaches a request, its deadline bounds how long it waits (then
# DEADLINE_EXCEEDED). The bound below is four times what a sidecar ever admits, so the
# core refuses (CANCELLED) only a flood of 40,000 unread requests, and it keeps memory
# bounded (a pending request is its bytes and a call record: 10,500 at once peaked at
# 109-126 MiB per sidecar). Soft limit = hard limit: no random refusals below it.
MAX_PENDING_REQUESTS = 4 * MAX_PENDING_CLIENTS
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", MAX_PENDING_REQUESTS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_REQUESTS),
)


def fit_details(details: str) -> str:
    """``details`` cut to fit gRPC metadata, saying it was cut."""
    if len(details) <= MAX_DETAILS_CHARS:
        return details
    return f"{details[: MAX_DETAILS_CHARS - 40]}... ({len(details)} characters, truncated)"


class StartupError(AccordCassandraError, RuntimeError):
    """The sidecar cannot start; the message names the setting and the problem."""


def _why(error: BaseException) -> str:
    # An OSError's own words, without its "[Errno n]" prefix.
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


class TransactionsServicer(client_pb2_grpc.TransactionsServicer):
    def __init__(
        self,
        host: SidecarHost,
        catalog: Catalog,
        *,
        token: str | None,
        timeout: float,
        delegate: tuple[int, Any] | None = None,
    ) -> None:
        self.host = host
        self.catalog = catalog
        self.token = token
        self.expected_authorization = f"Bearer {token}".encode()
        self.timeout = timeout
        # (node id, Transactions stub) of the sidecar that coordinates for this one.
        self.delegate = delegate

    async def Transact(
        self,
        request: client_pb2.TransactRequest | bytes,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> client_pb2.TransactResponse:
        if self.token is not None:
            headers = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
            if len(headers) > 1:
                # Which one would count differs between proxies and servers: refuse both.
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "more than one authorization header"
                )
            supplied = headers[0] if headers else ""
            # Constant-time, so response timing says nothing about how much of it matched.
            if not hmac.compare_digest(str(supplied).encode(), self.expected_authorization):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token"
                )
        if isinstance(request, bytes):
            try:
                request = client_pb2.TransactRequest.FromString(request)
            except DecodeError as error:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    fit_details(f"malformed TransactRequest: {error}"),
                )
        if not isinstance(request, client_pb2.TransactRequest):
            fail("abort() returned after a malformed TransactRequest")
        try:
            translation = to_txn(request, self.catalog)
        except RequestError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, fit_details(str(error)))
        timeout = self.timeout
        remaining = context.time_remaining()
        if remaining is not None:
            margin = min(DEADLINE_MARGIN_SECONDS, remaining / 10)
            timeout = min(timeout, remaining - margin)
            if timeout <= 0:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request reached the sidecar {remaining:.3f} s before its deadline, "
                    "too late to run it; nothing was submitted",
                )
        try:
            return await self.run(request, translation, timeout)
        except Refused as refused:
            await context.abort(refused.code, fit_details(refused.message))
        return fail("abort() returned after a refused transaction")  # pragma: no cover

    async def run(
        self, request: client_pb2.TransactRequest, translation: Any, timeout: float
    ) -> client_pb2.TransactResponse:
        """Run a request translated (``to_txn``) and checked: its response, or
        :class:`Refused` with the status the client API gives it (docs/sidecars.md, "Client
        errors"). The gRPC service and the CQL endpoint both answer through this."""
        if self.delegate is not None:
            relayed = await self._delegated(self.delegate, request, timeout)
            if relayed is not None:
                return relayed
        try:
            reply = await self.host.submit(translation.txn, timeout=timeout)
        except Overloaded as error:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)) from None
        except TimeoutError:
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no outcome within the timeout; the transaction may still commit",
            ) from None
        if reply.outcome == "invalidated":
            raise Refused(
                grpc.StatusCode.ABORTED,
                "the transaction was invalidated: it did not and will not apply",
            )
        if reply.outcome != "ok" or reply.result is None:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE, "outcome unknown: the transaction may still commit"
            )
        result = check_not_none(reply.result, "ok reply for %s without a result", reply.txn_id)
        return to_response(
            str(reply.txn_id),
            result,
            translation.lets,
            self.catalog,
            range_checked=translation.range_checked,
            views=translation.views,
        )

    async def _delegated(
        self,
        delegate: tuple[int, Any],
        request: client_pb2.TransactRequest,
        timeout: float,
    ) -> client_pb2.TransactResponse | None:
        """Run a request (already validated here) at the delegate and relay its answer; None
        when the delegate could not be reached at all (nothing left this sidecar), and then
        the caller coordinates it here.

        The delegate's codes mean what they mean at any sidecar, so the client's rules hold.
        Its UNAVAILABLE goes on without the delegate's own wording, which the client would
        read as *its* connection failing before sending (NotSent, definite).
        """
        node, stub = delegate
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token is not None else ()
        try:
            response: client_pb2.TransactResponse = await stub.Transact(
                request, timeout=timeout, metadata=metadata
            )
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details() or ""
            if code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in NEVER_CONNECTED):
                return None
            if code not in DELEGATE_RELAYED or code == grpc.StatusCode.UNAVAILABLE:
                raise Refused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"outcome unknown: sidecar {node}, which coordinates for this one, answered "
                    f"{code.name}; the transaction may still commit",
                ) from None
            raise Refused(code, f"from sidecar {node}: {details}") from None
        return response


class Refused(AccordCassandraError, RuntimeError):
    """A transaction that got no result: ``code`` as the client API reports it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Codes a delegate's answer keeps (docs/sidecars.md, "Client errors"); any other (its
# UNAVAILABLE, UNAUTHENTICATED for a token it does not share, UNKNOWN, ...) is relayed as
# outcome unknown.
DELEGATE_RELAYED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


# How the CQL endpoint reports each refusal (accord_cassandra/native/endpoint.py, Failure).
CQL_FAILURES = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.FAILED_PRECONDITION: "invalid",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "overloaded",
    grpc.StatusCode.ABORTED: "invalidated",
}


def cql_runner(transactions: TransactionsServicer) -> Callable[[Any], Any]:
    """The CQL endpoint's way into Accord: the gRPC service's own checks and path, without
    gRPC; a refusal becomes a :class:`~accord_cassandra.native.endpoint.Failure`."""
    timeout = transactions.timeout

    async def run(request: client_pb2.TransactRequest) -> client_pb2.TransactResponse:
        try:
            translation = to_txn(request, transactions.catalog)
        except RequestError as error:
            raise Failure("invalid", str(error)) from None
        try:
            return await transactions.run(request, translation, timeout)
        except Refused as refused:
            raise Failure(CQL_FAILURES.get(refused.code, "unknown"), refused.message) from None

    return run


def _add_raw_unary(
    server: grpc.aio.Server,
    service: str,
    method: str,
    behaviour: Any,
    serialize: Any,
) -> None:
    """Register a unary method that receives the request's raw bytes.

    The generated registration deserializes before the servicer runs, and a request that
    does not parse then fails as UNKNOWN ("Unexpected DecodeError"); parsing in the servicer
    lets it answer INVALID_ARGUMENT with what was wrong.
    """
    handler = grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=serialize
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )


def _add_raw_stream_unary(
    server: grpc.aio.Server,
    service: str,
    method: str,
    behaviour: Any,
    serialize: Any,
) -> None:
    """Register a client-streaming method whose requests arrive as raw bytes (as
    :func:`_add_raw_unary`, for each message of the stream)."""
    handler = grpc.stream_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=serialize
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )


def _channel_factory(config: SidecarConfig) -> Any:
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        *RECONNECT_OPTIONS,
        *keepalive_options(config.peer_dead_seconds),
    ]
    if config.peer_listen is not None:
        # Peers dial each other's peer port: TLS there is peer_tls (mutual with mtls).
        if config.peer_tls is None:
            return lambda address: grpc.aio.insecure_channel(address, options=options)
        peer = config.peer_tls
        peer_credentials = grpc.ssl_channel_credentials(
            root_certificates=peer.ca.read_bytes(),
            private_key=peer.private_key.read_bytes(),
            certificate_chain=peer.certificate.read_bytes(),
        )
        return lambda address: grpc.aio.secure_channel(address, peer_credentials, options=options)
    if config.tls is None:
        return lambda address: grpc.aio.insecure_channel(address, options=options)
    tls = config.tls
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        private_key=tls.private_key.read_bytes(),
        certificate_chain=tls.certificate.read_bytes(),
    )
    return lambda address: grpc.aio.secure_channel(address, credentials, options=options)


def _server_credentials(config: SidecarConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if tls is None:
        return None
    return grpc.ssl_server_credentials(
        [(tls.private_key.read_bytes(), tls.certificate.read_bytes())],
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        require_client_auth=tls.require_client_certificate,
    )


def _peer_server_credentials(config: SidecarConfig) -> grpc.ServerCredentials | None:
    peer = config.peer_tls
    if peer is None:
        return None
    return grpc.ssl_server_credentials(
        [(peer.private_key.read_bytes(), peer.certificate.read_bytes())],
        root_certificates=peer.ca.read_bytes(),
        require_client_auth=config.peer_auth == "mtls",
    )


def _peer_keys(config: SidecarConfig) -> tuple[PeerKey | None, list[PeerKey]]:
    """The key that signs outgoing batches and the keys accepted on incoming ones."""
    if config.peer_auth != "hmac" or config.peer_keys is None:
        return None, []
    keys = config.peer_keys
    current = PeerKey(keys.current.id, keys.current.secret.get_secret_value().encode())
    accepted = [current]
    if keys.previous is not None:
        previous = keys.previous
        accepted.append(PeerKey(previous.id, previous.secret.get_secret_value().encode()))
    return current, accepted


async def _bind(server: grpc.aio.Server, config: SidecarConfig) -> str:
    """Bind the gRPC port (port 0: any free one); returns the address bound."""
    credentials = _server_credentials(config)

    async def bind() -> int:
        if credentials is None:
            port = int(server.add_insecure_port(config.listen))
        else:
            port = int(server.add_secure_port(config.listen, credentials))
        if port == 0:  # some grpc versions return 0 instead of raising
            raise RuntimeError(f"Failed to bind to address {config.listen}")
        return port

    host, _ = split_address(config.listen)
    retry = config.bind_retry_seconds
    return f"{host}:{await bind_retrying(bind, config.listen, retry_seconds=retry)}"


async def _bind_peer(server: grpc.aio.Server, config: SidecarConfig, listen: str) -> str:
    """Bind the separate peer port (port 0: any free one); returns the address bound."""
    credentials = _peer_server_credentials(config)

    async def bind() -> int:
        if credentials is None:
            port = int(server.add_insecure_port(listen))
        else:
            port = int(server.add_secure_port(listen, credentials))
        if port == 0:  # some grpc versions return 0 instead of raising
            raise RuntimeError(f"Failed to bind to address {listen}")
        return port

    host, _ = split_address(listen)
    retry = config.bind_retry_seconds
    return f"{host}:{await bind_retrying(bind, listen, retry_seconds=retry)}"


def _frame_contexts(
    config: SidecarConfig,
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The frame link's TLS (listener's, connecting side's): the gRPC peer port's, that is
    peer_tls (a client certificate required with mtls), else tls, else none."""
    peer = config.peer_tls
    if peer is not None:
        peer_ca = peer.ca.read_bytes()
        key, cert = str(peer.private_key), str(peer.certificate)
        return (
            server_ssl_context(
                peer_ca, cert, key, require_client_certificate=config.peer_auth == "mtls"
            ),
            client_ssl_context(peer_ca, cert, key),
        )
    tls = config.tls
    if tls is None:
        return None, None
    ca = tls.ca.read_bytes() if tls.ca else None
    key, cert = str(tls.private_key), str(tls.certificate)
    return (
        server_ssl_context(
            ca, cert, key, require_client_certificate=tls.require_client_certificate
        ),
        client_ssl_context(ca, cert, key),
    )


def _frame_connector(
    config: SidecarConfig, context: ssl.SSLContext | None
) -> Callable[[str], Callable[[], Any]]:
    def connector(address: str) -> Callable[[], Any]:
        host, port = split_address(address)

        async def connect() -> FrameConnection:
            return await FrameConnection.open(
                host.strip("[]"),
                port,
                context,
                FRAME_CONNECT_SECONDS,
                config.peer_dead_seconds,
            )

        return connect

    return connector


async def _bind_frames(listener: FrameListener, listen: str, retry_seconds: float) -> str:
    """Bind the frame listener (port 0: any free one); returns the address bound."""
    host, port = split_address(listen)

    async def bind() -> int:
        return await listener.bind(host.strip("[]"), port, serve=False)

    return f"{host}:{await bind_retrying(bind, listen, retry_seconds=retry_seconds)}"


async def _peer_addresses(config: SidecarConfig) -> tuple[dict[int, str], dict[int, str]]:
    """``peers`` and ``peer_frame_addresses``, or with ``peers_file`` the addresses in it
    once it appears: ``{node: host:port}``, or ``{"peers": {...}, "peer_frames": {...}}``
    when peers have frame listeners."""
    if config.peers_file is None:
        return dict(config.peers), dict(config.peer_frame_addresses)
    found = await wait_for_json(config.peers_file, config.peers_wait_seconds)
    try:
        found = dict(found)
        frames: dict[int, str] = dict(config.peer_frame_addresses)
        if "peers" in found:
            frames = {
                int(node): str(address)
                for node, address in dict(found.get("peer_frames") or {}).items()
            }
            found = dict(found["peers"])
        peers = {int(node): str(address) for node, address in found.items()}
        for address in [*peers.values(), *frames.values()]:
            if split_address(address)[1] == 0:
                raise ValueError(f"{address!r} has no port")
        unknown = sorted(set(frames) - set(peers))
        if unknown:
            raise ValueError(f"peer_frames names nodes {unknown} that are not peers")
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"peers_file {config.peers_file}: not a mapping of node id to host:port ({error})"
        ) from None
    if set(peers) != set(config.peers):
        raise ConfigError(
            f"peers_file {config.peers_file} names nodes {sorted(peers)}, "
            f"the config's peers are {sorted(config.peers)}"
        )
    return peers, frames


def _connect_cassandra(config: SidecarConfig) -> Any:
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    settings = config.cassandra
    auth = (
        PlainTextAuthProvider(settings.username, settings.password or "")
        if settings.username is not None
        else None
    )
    cluster = Cluster(
        settings.contact_points,
        port=settings.port,
        auth_provider=auth,
        protocol_version=5,
        connect_timeout=settings.connect_timeout_seconds,
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=settings.local_datacenter)
        ),
    )
    session = cluster.connect()
    # Rows as plain tuples: the store reads columns by position, and the driver's default
    # (named tuples) builds a namedtuple class for every result it decodes, which showed in
    # a saturated sidecar's profile.
    session.row_factory = tuple_factory
    return cluster, session


def node_config(config: SidecarConfig) -> NodeConfig:
    timing = config.timing
    return NodeConfig(
        retry_micros=timing.retry_ms * 1000,
        recover_delay_micros=timing.recover_delay_ms * 1000,
        recover_delay_other_micros=3 * timing.recover_delay_ms * 1000,
        recover_delay_adaptive=timing.recover_delay == "adaptive",
        recover_delay_max_micros=timing.recover_delay_max_ms * 1000,
        recover_delay_latency_factor=timing.recover_delay_latency_factor,
        recover_delay_percentile=timing.recover_delay_percentile,
        recover_delay_window=timing.recover_delay_window,
        # The backoff caps every delay: never below the learned one's cap.
        recover_backoff_max_micros=max(
            NodeConfig().recover_backoff_max_micros, timing.recover_delay_max_ms * 1000
        ),
        preaccept_timeout_micros=timing.preaccept_timeout_ms * 1000,
        client_timeout_micros=timing.client_timeout_ms * 1000,
        reorder_buffer_micros=timing.reorder_buffer_ms * 1000,
        max_progress_coordinators=config.max_progress_coordinators,
        shared_storage=config.shared_storage_enabled,
        batch_max_parts=config.batch_max_parts,
        batch_max_keys=config.batch_max_keys,
    )


def admission_control(config: SidecarConfig) -> Admission:
    settings = config.admission
    return Admission(
        per_key=settings.per_key,
        max_waiting=settings.max_waiting,
        max_waiting_per_key=settings.waiting_per_key,
    )


# Bound on the keys peer_data_check remembers as good (then it starts over).
KNOWN_KEYS_MAX = 65_536


def peer_data_check(
    catalog: Catalog, known_txn: Callable[[object], object | None] | None = None
) -> Callable[[Envelope], None]:
    """Refuse peer messages whose keys or written rows the store could never take.

    A write that cannot land must never be committed: every replica would retry it forever
    and every transaction on its key would wait behind it.

    ``known_txn(txn_id)``: the transaction this node already holds under that id (it was
    checked when it first arrived), or None.
    """

    # Keys already found good: a key's check (its table, its token recomputed from its
    # partition key) is pure, and every message of a transaction names the same keys again.
    known: set[Key] = set()

    def table_of(key: Key) -> TableSchema:
        if key in known:
            return catalog.for_key(key)
        table = check_key(catalog, key)
        if len(known) >= KNOWN_KEYS_MAX:
            known.clear()
        known.add(key)
        return table

    def check_txn(txn: Any) -> None:
        for key in txn.keys:
            table_of(key)
        for put in txn.update.writes if txn.update else ():
            check_txn_write(catalog, put)
            if isinstance(put, Put) and isinstance(put.value, MakeTuple):
                table = catalog.for_key(put.key)
                if len(put.value.items) != len(table.columns):
                    raise SchemaError(f"{table.qualified}: a row of the wrong width")
                for (name, cql_type), item in zip(table.columns, put.value.items, strict=True):
                    if isinstance(item, Const):
                        check_type(table.where(name), cql_type, item.value)

    def check(envelope: Envelope) -> None:
        body = envelope.body
        txn = getattr(body, "txn", None)
        route = getattr(body, "route", None)
        try:
            if txn is not None:
                # PreAccept, Commit and Apply of one transaction each carry it again: this
                # check was 6% of a saturated sidecar's main-thread CPU, most of it these
                # row checks (bench.saturate --cprofile, CPU clock). The node keeps what it
                # accepted, all of it checked on arrival: an equal txn needs no second
                # look. One that only shares the id (a forgery, or a slice) is checked in
                # full.
                txn_id = getattr(body, "txn_id", None)
                held = known_txn(txn_id) if known_txn is not None and txn_id is not None else None
                if held is not txn and held != txn:
                    check_txn(txn)
            for key in route.keys if route else ():
                table_of(key)
            for write in getattr(body, "writes", None) or ():
                check_write(table_of(write.key), write)
        except SchemaError as error:
            raise InvalidMessage(f"{type(body).__name__}: {error}") from None

    return check


def message_limits(config: SidecarConfig) -> MessageLimits:
    # Clients can name at most MAX_LETS + MAX_MUTATIONS keys, but group commit merges them
    # into batches of up to batch_max_keys, which another sidecar may set higher than this
    # one. A bound of MAX_LETS + MAX_MUTATIONS refused every larger batch's PreAccept and
    # BeginRecovery, so such a batch could neither commit nor be recovered: 48 disjoint
    # 16-key transactions stalled 10-20 s, and retried copies joined new oversized batches.
    return MessageLimits(
        max_future_skew_micros=int(config.max_clock_skew_seconds * 1_000_000),
        max_node_id=MAX_NODE_ID,
        max_keys=max(MAX_LETS + MAX_MUTATIONS, BATCH_MAX_KEYS_LIMIT),
    )


def static_topology(config: SidecarConfig) -> Topology:
    return ring_topology(
        sorted(config.peers),
        config.replication_factor,
        shards_per_node=config.shards_per_node,
        electorate_size=config.electorate_size,
        electorate_preference=config.electorate_preference,
    )


class Sidecar:
    """Everything one sidecar runs, started and stopped together."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.cluster: Any = None
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.peer_server: grpc.aio.Server | None = None
        self.peer_listen: str | None = None
        self.frames: FrameListener | None = None
        self.peer_frames_listen: str | None = None
        self.metrics: MetricsServer | None = None
        self.listen = config.listen
        self.delegate_channel: grpc.aio.Channel | None = None
        self.cql: CqlEndpoint | None = None
        self.cql_listen: str | None = None

    async def start(self) -> None:
        config = self.config
        started = time.perf_counter()
        # Ports first: with port 0 the kernel picks them, and whoever started this process
        # learns them from the address file (and may only then know every peer's address).
        # Peers' pings are answered on whichever server takes the peer port.
        keepalive = keepalive_options(config.peer_dead_seconds)
        server = grpc.aio.server(
            options=SERVER_OPTIONS + (keepalive if config.peer_listen is None else ())
        )
        self.server = server
        # A port that cannot be bound fails the start here, before anything runs, with one
        # line naming the setting.
        try:
            self.listen = await _bind(server, config)
        except (OSError, RuntimeError) as error:
            raise StartupError(f"listen: cannot bind {config.listen}: {_why(error)}") from None
        peer_server = server
        if config.peer_listen is not None:
            peer_server = grpc.aio.server(options=SERVER_OPTIONS + keepalive)
            self.peer_server = peer_server
            try:
                self.peer_listen = await _bind_peer(peer_server, config, config.peer_listen)
            except (OSError, RuntimeError) as error:
                raise StartupError(
                    f"peer_listen: cannot bind {config.peer_listen}: {_why(error)}"
                ) from None
        frame_server_context, frame_client_context = _frame_contexts(config)
        if config.peer_frames_listen is not None:
            self.frames = FrameListener(
                ssl_context=frame_server_context,
                max_frame_bytes=config.peer_frame_max_bytes,
                max_connections=config.peer_frame_max_connections,
                auth_timeout_seconds=config.peer_frame_auth_timeout_seconds,
                dead_peer_seconds=config.peer_dead_seconds,
            )
            try:
                self.peer_frames_listen = await _bind_frames(
                    self.frames, config.peer_frames_listen, config.bind_retry_seconds
                )
            except (OSError, RuntimeError) as error:
                raise StartupError(
                    f"peer_frames_listen: cannot bind {config.peer_frames_listen}: {_why(error)}"
                ) from None
        if config.metrics_listen is not None:
            self.metrics = MetricsServer(
                config.metrics_listen,
                registry_of(self),
                bind_retry_seconds=config.bind_retry_seconds,
            )
            try:
                await self.metrics.start()
            except OSError as error:
                raise StartupError(
                    f"metrics_listen: cannot bind {config.metrics_listen}: {_why(error)}"
                ) from None
        if config.cql_listen is not None:
            self.cql = CqlEndpoint(
                config.cql_listen,
                config.cql_upstream_address,
                plain_writes=config.cql_plain_writes,
                max_frame_bytes=config.cql_max_frame_bytes,
                prepared_capacity=config.cql_prepared_cache,
                directory=Directory(
                    config.node_id,
                    config.cql_peers,
                    config.cassandra_hosts,
                    config.cql_peers_file,
                ),
                schema_agreement_seconds=config.cql_schema_agreement_seconds,
                max_connections=config.cql_max_connections,
                dead_client_seconds=config.cql_dead_client_seconds,
            )
            try:
                self.cql_listen = await self.cql.bind()
            except OSError as error:
                raise StartupError(
                    f"cql_listen: cannot bind {config.cql_listen}: {_why(error)}"
                ) from None
        if config.address_file is not None:
            write_json_atomically(
                config.address_file,
                {
                    "listen": self.listen,
                    "metrics_listen": self.metrics.bound if self.metrics is not None else None,
                    "peer_listen": self.peer_listen,
                    "peer_frames_listen": self.peer_frames_listen,
                    "cql_listen": self.cql_listen,
                },
            )
        try:
            peers, frame_addresses = await _peer_addresses(config)
        except TimeoutError as error:
            raise StartupError(f"peers_file: {error}") from None
        store: AsyncDataStore
        if config.store == "cassandra":
            self.cluster, session = await asyncio.to_thread(_connect_cassandra, config)
            if self.cql is not None:
                self.cql.agreement = schema_agreement(session, config.cql_upstream_address)
            unusable: dict[str, str] = {}
            tables = tables_from_cluster(
                self.cluster.metadata, config.cassandra.keyspaces, unusable
            )
            for name, why in sorted(unusable.items()):
                logger.warning("table %s is not served: %s", name, why)
            catalog = Catalog(tables, unusable)
            cassandra = CassandraDataStore(
                session, catalog, consistency=config.cassandra.consistency
            )
            for problem in await cassandra.check_clocks(config.max_clock_skew_seconds):
                logger.warning("clock check for USING TTL: %s", problem)
            catalog.ttl_check = cassandra.ttl_problem
            store = cassandra
        else:
            catalog = Catalog.from_mapping(config.tables)
            store = MemoryDataStore(catalog)
        self.catalog = catalog
        try:
            journal = FileJournal(Path(config.journal_dir), fsync=config.journal_fsync)
        except (JournalCorrupt, OSError) as error:
            raise StartupError(f"journal_dir: {error}") from None
        signing, accepted = _peer_keys(config)
        self.peers = Peers(
            config.node_id,
            {node: config.peer_addresses.get(node, a) for node, a in peers.items()},
            _channel_factory(config),
            BatchStamper(signing),
            frame_addresses,
            _frame_connector(config, frame_client_context),
            config.peer_frame_max_bytes,
        )
        self.peer_auth = PeerAuthenticator(
            config.node_id,
            sorted(config.peers),
            config.peer_auth,
            keys=accepted,
            identity=config.peer_tls.identity if config.peer_tls else "accord-node-{node_id}",
            window_seconds=config.peer_replay_window_seconds,
        )
        if config.topology == "cassandra":
            from accord_cassandra.topology import topology_from_cassandra

            sidecar_of_host = {address: node for node, address in config.cassandra_hosts.items()}
            topology = topology_from_cassandra(
                self.cluster.metadata,
                config.cassandra.keyspaces[0],
                sidecar_of_host,
                electorate_size=config.electorate_size,
                electorate_preference=config.electorate_preference,
            )
        else:
            topology = static_topology(config)
        if isinstance(store, MemoryDataStore):
            restored = store.restore(
                journal.replay(), lambda key: topology.owns(config.node_id, key)
            )
            logger.info("memory store rebuilt from %d applied transactions", restored)
        if config.planted_bugs:
            logger.warning("planted bugs active (tests only): %s", ", ".join(config.planted_bugs))
        self.host = SidecarHost(
            config.node_id,
            topology,
            journal,
            store,
            self.peers.send,
            config=node_config(config),
            limits=message_limits(config),
            check_data=peer_data_check(catalog, self._known_txn),
            admission=admission_control(config),
            bugs=Bugs(**dict.fromkeys(config.planted_bugs, True)),
        )
        self.peers.on_reachability = self.host.peer_reachable
        peer_servicer = PeerServicer(
            config.node_id, self.host.deliver, self.peers.metrics, self.peer_auth.check
        )
        _add_raw_unary(
            peer_server,
            PEER_SERVICE_NAME,
            "Deliver",
            peer_servicer.Deliver,
            peer_pb2.PeerAck.SerializeToString,
        )
        _add_raw_stream_unary(
            peer_server,
            PEER_SERVICE_NAME,
            "Stream",
            peer_servicer.Stream,
            peer_pb2.PeerAck.SerializeToString,
        )
        transactions = TransactionsServicer(
            self.host,
            catalog,
            token=config.client_token,
            timeout=config.timing.client_timeout_ms / 1000,
            delegate=self._delegate(peers),
        )
        _add_raw_unary(
            server,
            SERVICE_NAME,
            "Transact",
            transactions.Transact,
            client_pb2.TransactResponse.SerializeToString,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.host.start()
        self.peers.start()
        await server.start()
        if self.peer_server is not None:
            await self.peer_server.start()
        if self.frames is not None:
            await self.frames.start(peer_servicer, self.peers.metrics)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        if self.cql is not None:
            await self.cql.start(catalog, cql_runner(transactions))
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        logger.info(
            "sidecar started node=%d listen=%s peer_listen=%s peer_frames_listen=%s "
            "framed_peers=%s cql_listen=%s peer_auth=%s store=%s replayed=%d seconds=%.2f",
            config.node_id,
            self.listen,
            self.peer_listen or self.listen,
            self.peer_frames_listen,
            sorted(frame_addresses),
            self.cql_listen,
            config.peer_auth,
            config.store,
            self.host.replayed,
            time.perf_counter() - started,
        )

    def _known_txn(self, txn_id: object) -> object | None:
        command = self.host.node.store.commands.get(txn_id)  # type: ignore[call-overload]
        return command.txn if command is not None else None

    def _delegate(self, peers: dict[int, str]) -> tuple[int, Any] | None:
        """The stub of the sidecar that coordinates for this one (``coordinate_via``)."""
        node = self.config.coordinate_via
        if node is None:
            return None
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *RECONNECT_OPTIONS]
        tls = self.config.tls
        address = peers[node]
        if tls is None:
            channel = grpc.aio.insecure_channel(address, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca.read_bytes() if tls.ca else None,
                private_key=tls.private_key.read_bytes(),
                certificate_chain=tls.certificate.read_bytes(),
            )
            channel = grpc.aio.secure_channel(address, credentials, options=options)
        self.delegate_channel = channel
        return node, client_pb2_grpc.TransactionsStub(channel)

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.host.drain(self.config.drain_seconds)
        if self.cql is not None:
            await self.cql.stop()
        if self.server is not None:
            await self.server.stop(grace=1.0)
        if self.peer_server is not None:
            await self.peer_server.stop(grace=1.0)
        if self.frames is not None:
            await self.frames.close()
        if self.metrics is not None:
            await self.metrics.stop()
        await self.host.stop()
        await self.peers.close()
        if self.delegate_channel is not None:
            await self.delegate_channel.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.shutdown)
        logger.info("sidecar stopped node=%d", self.config.node_id)


async def serve(config: SidecarConfig) -> None:
    """Run a sidecar until SIGTERM or SIGINT."""
    sidecar = Sidecar(config)
    await sidecar.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stopped = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(sidecar.host.failed.wait())
    await asyncio.wait((stopped, failed), return_when=asyncio.FIRST_COMPLETED)
    if sidecar.host.failed.is_set():
        # Nothing in flight can finish: no drain, just stop answering and exit non-zero.
        sidecar.config = sidecar.config.model_copy(update={"drain_seconds": 0})
        await sidecar.stop()
        raise SystemExit(f"sidecar failed: {sidecar.host.failure!r}")
    failed.cancel()
    await sidecar.stop()
