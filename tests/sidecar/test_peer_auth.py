"""Peer authentication (docs/sidecars.md "Security"): forged replica messages against three
sidecars on the embedded store with the shared-secret MAC, then the same with mutual TLS on
a peer port of their own, then the refusal to start unauthenticated beyond loopback.

Each forgery is what an attacker on the network would send: an ``Apply`` that sets a
balance, or a ``PreAccept`` + ``Commit`` that creates a row (recovery would finish it on
every replica). Every one must be refused with UNAUTHENTICATED or PERMISSION_DENIED, change
no data anywhere, and leave the cluster serving.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from accord.codec import encode_message
from accord.messages import Apply, Commit, Envelope, InformDurable, PreAccept
from accord.primitives import Deps, Kind, Route, Timestamp, execute
from accord_cassandra.client import Client, Transaction
from accord_cassandra.cluster import LocalSidecars, metrics_of
from accord_cassandra.config import ConfigError, load
from accord_cassandra.frames import LENGTH, MAGIC
from accord_cassandra.peerauth import BatchStamper, PeerKey
from accord_cassandra.schema import Catalog
from accord_cassandra.translate import to_txn
from accord_cassandra.transport import CODEC_VERSION
from accord_cassandra.v1 import peer_pb2, peer_pb2_grpc
from tests.certs import make_ca, make_cert
from tests.sidecar.conftest import EMBEDDED_TABLES, TOKEN, _stop

CATALOG = Catalog.from_mapping(EMBEDDED_TABLES)
FORGED_BALANCE = 1_000_000


def client(address: str) -> Client:
    return Client(address, token=TOKEN, timeout=20)


def balance_everywhere(cluster: LocalSidecars, account: str) -> list[object]:
    """The account's balance read by a transaction coordinated by each sidecar in turn (each
    read waits for every conflicting transaction a replica knows of, forged ones too)."""
    balances = []
    for address in cluster.addresses():
        t = Transaction()
        t.let("a", "bank", "accounts", account)
        with client(address) as c:
            row = c.transact(t).rows["a"]
        balances.append(None if row is None else row["balance"])
    return balances


def write_balance(cluster: LocalSidecars, account: str, balance: int) -> Timestamp:
    t = Transaction().update("bank", "accounts", account, balance=balance, tag=0)
    with client(cluster.addresses()[0]) as c:
        result = c.transact(t)
    assert result.applied
    return Timestamp.parse(result.txn_id)


def forged_txn_id(seen: Timestamp, node: int) -> Timestamp:
    # What an attacker learns from any transaction id: the epoch, and the clock's range.
    return Timestamp(seen.epoch, seen.hlc + 1_000_000, int(Kind.WRITE), node)


def forged_apply(seen: Timestamp, account: str, src: int, dest: int) -> bytes:
    translation = to_txn(
        Transaction().update("bank", "accounts", account, balance=FORGED_BALANCE, tag=0).request,
        CATALOG,
    )
    txn = translation.txn
    writes, result = execute(txn, {})
    txn_id = forged_txn_id(seen, src)
    route = Route(txn.keys[0], txn.keys)
    body = Apply(7, txn_id, txn, route, txn_id, Deps(), writes, result)
    return encode_message(Envelope(src, dest, body))


def forged_preaccept_commit(seen: Timestamp, account: str, src: int, dest: int) -> list[bytes]:
    translation = to_txn(
        Transaction().update("bank", "accounts", account, balance=FORGED_BALANCE, tag=0).request,
        CATALOG,
    )
    txn = translation.txn
    txn_id = forged_txn_id(seen, src)
    route = Route(txn.keys[0], txn.keys)
    return [
        encode_message(Envelope(src, dest, PreAccept(8, txn_id, txn, route))),
        encode_message(
            Envelope(src, dest, Commit(9, txn_id, txn_id, Deps(), True, False, txn, route))
        ),
    ]


def batch(source: int, payloads: list[bytes]) -> peer_pb2.PeerBatch:
    return peer_pb2.PeerBatch(codec_version=CODEC_VERSION, source=source, payloads=payloads)


def signed(
    secret: str, source: int, destination: int, payloads: list[bytes], key_id: str = "local"
) -> peer_pb2.PeerBatch:
    request = batch(source, payloads)
    BatchStamper(PeerKey(key_id, secret.encode())).stamp(request, destination)
    return request


def deliver_code(address: str, request: peer_pb2.PeerBatch) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            peer_pb2_grpc.PeerStub(channel).Deliver(request, timeout=10)
        except grpc.RpcError as error:
            return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def deliver_frame(
    address: str, request: peer_pb2.PeerBatch, context: ssl.SSLContext | None = None
) -> str:
    """Send ``request`` as one frame on the framed peer link (accord_cassandra/frames.py):
    the status the listener refused it with ("UNAUTHENTICATED", ...), or "OK" when the
    connection stayed open without a word."""
    return frame_reply(
        address, LENGTH.pack(request.ByteSize()) + request.SerializeToString(), context
    )


def frame_reply(address: str, data: bytes, context: ssl.SSLContext | None = None) -> str:
    host, _, port = address.rpartition(":")
    with contextlib.ExitStack() as stack:
        connection = stack.enter_context(socket.create_connection((host, int(port)), timeout=10))
        if context is not None:
            connection = stack.enter_context(context.wrap_socket(connection, server_hostname=host))
        connection.sendall(MAGIC + data)
        connection.settimeout(2.0)
        reader = stack.enter_context(connection.makefile("rb"))
        try:
            line = reader.readline()
        except TimeoutError:
            return "OK"  # the listener refuses at once; a batch it takes gets no answer
        except (ssl.SSLError, ConnectionError):
            return "CLOSED"
    if not line:
        return "CLOSED"  # e.g. TLS 1.3: the client's handshake ends before the server's
    reply = line.decode().strip()
    if not reply.startswith("refused: "):
        raise AssertionError(f"not a refusal: {reply!r}")
    return reply.removeprefix("refused: ").split(":")[0]


def frames_address(cluster: LocalSidecars, node_id: int) -> str:
    address = cluster.sidecars[node_id].frames_address
    assert address, "LocalSidecars give every sidecar a frame listener by default"
    return address


def refused_batches(cluster: LocalSidecars, node_id: int) -> float:
    figures = metrics_of(cluster.sidecars[node_id].metrics_address)
    return figures["accord_peer_batches_unauthenticated_total"]


REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own ACCORD_SIDECAR_* variables must not leak into these configs.
    for name in list(os.environ):
        if name.startswith("ACCORD_SIDECAR_"):
            monkeypatch.delenv(name)


# ---------------------------------------------------------------------------- shared secret


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSidecars]:
    cluster = LocalSidecars(
        tmp_path_factory.mktemp("peer-auth"),
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"drain_seconds": 2},
    )
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        _stop(cluster)


def forgeries(cluster: LocalSidecars, seen: Timestamp, account: str) -> dict[str, Any]:
    """Each wrongly authenticated batch, as (batch, the code it must get), sent to node 1."""
    apply = [forged_apply(seen, account, 2, 1)]
    good = cluster.peer_secret
    tampered = signed(good, 2, 1, apply)
    tampered.source = 3  # signed as node 2, then claims to be node 3
    stale = batch(2, apply)
    BatchStamper(PeerKey("local", good.encode()), clock=lambda: time.time() - 120).stamp(stale, 1)
    return {
        "unsigned": (batch(2, apply), grpc.StatusCode.UNAUTHENTICATED),
        "wrong-key": (signed("x" * 64, 2, 1, apply), grpc.StatusCode.UNAUTHENTICATED),
        "unknown-key-id": (signed(good, 2, 1, apply, "old"), grpc.StatusCode.UNAUTHENTICATED),
        "other-node-id": (tampered, grpc.StatusCode.UNAUTHENTICATED),
        "other-destination": (signed(good, 2, 3, apply), grpc.StatusCode.PERMISSION_DENIED),
        "no-such-peer": (
            signed(good, 9, 1, [forged_apply(seen, account, 9, 1)]),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        "stale": (stale, grpc.StatusCode.UNAUTHENTICATED),
        "preaccept-commit-unsigned": (
            batch(2, forged_preaccept_commit(seen, account, 2, 1)),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        "preaccept-commit-wrong-key": (
            signed("y" * 64, 2, 1, forged_preaccept_commit(seen, account, 2, 1)),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    }


@pytest.mark.parametrize("link", ["grpc", "frames"])
@pytest.mark.parametrize(
    "kind",
    [
        "unsigned",
        "wrong-key",
        "unknown-key-id",
        "other-node-id",
        "other-destination",
        "no-such-peer",
        "stale",
        "preaccept-commit-unsigned",
        "preaccept-commit-wrong-key",
    ],
)
def test_a_forged_batch_is_refused_and_changes_nothing(
    secured: LocalSidecars, kind: str, link: str
) -> None:
    """On gRPC's Peer.Deliver and on the framed link alike (the sidecars' own traffic takes
    the latter: the balances read afterwards travelled on it)."""
    account = f"victim-{kind}-{link}"
    seen = write_balance(secured, account, 100)
    request, code = forgeries(secured, seen, account)[kind]
    before = refused_batches(secured, 1)
    if link == "grpc":
        assert deliver_code(secured.sidecars[1].address, request) == code
    else:
        assert deliver_frame(frames_address(secured, 1), request) == code.name
    assert refused_batches(secured, 1) == before + 1
    assert balance_everywhere(secured, account) == [100, 100, 100]


def frame_figures(cluster: LocalSidecars, node_id: int) -> tuple[float, float]:
    figures = metrics_of(cluster.sidecars[node_id].metrics_address)
    return (
        figures["accord_peer_frames_oversize_total"],
        figures["accord_peer_frame_connections_refused_total"],
    )


def test_an_oversize_frame_is_refused_before_its_body(secured: LocalSidecars) -> None:
    """A length over peer_frame_max_bytes (8 MiB by default) and no body at all: the
    listener answers at once (it did not wait for 4 GiB that never come), closes, counts it;
    the cluster keeps serving."""
    before = frame_figures(secured, 1)
    started = time.monotonic()
    assert (
        frame_reply(frames_address(secured, 1), LENGTH.pack(0xFFFFFFFF))
        == "frame of 4294967295 bytes, the limit is 1..8388608"
    )
    assert time.monotonic() - started < 2.0
    assert frame_reply(frames_address(secured, 1), LENGTH.pack(8 * 1024 * 1024 + 1)).startswith(
        "frame of"
    )
    oversize, refused = frame_figures(secured, 1)
    assert (oversize, refused) == (before[0] + 2, before[1] + 2)
    seen = write_balance(secured, "after-oversize", 7)
    assert seen is not None
    assert balance_everywhere(secured, "after-oversize") == [7, 7, 7]


def test_a_frame_link_opened_wrongly_is_refused(secured: LocalSidecars) -> None:
    """Not the framed link's opening (a gRPC client, say): refused, counted, nothing read
    as a frame."""
    before = frame_figures(secured, 1)
    host, _, port = frames_address(secured, 1).rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        line = connection.makefile("rb").readline()
    assert line.startswith(b"refused: not a framed peer link")
    assert frame_figures(secured, 1) == (before[0], before[1] + 1)


def test_a_forged_new_row_never_appears(secured: LocalSidecars) -> None:
    """The PreAccept + Commit of a row nobody wrote, unsigned: had node 1 taken it, its
    recovery would have created the row on every replica."""
    seen = write_balance(secured, "someone-else", 1)
    request = batch(2, forged_preaccept_commit(seen, "created-from-nothing", 2, 1))
    assert deliver_code(secured.sidecars[1].address, request) == grpc.StatusCode.UNAUTHENTICATED
    # Longer than a recovery takes to start (recover_delay_ms 1 s, 3 s for others' txns).
    time.sleep(4)
    assert balance_everywhere(secured, "created-from-nothing") == [None, None, None]


def test_a_replayed_batch_is_refused(secured: LocalSidecars) -> None:
    seen = write_balance(secured, "replayed", 5)
    body = InformDurable(1, Timestamp(seen.epoch, seen.hlc, 1, 2))
    request = signed(secured.peer_secret, 2, 1, [encode_message(Envelope(2, 1, body))])
    address = secured.sidecars[1].address
    assert deliver_code(address, request) == grpc.StatusCode.OK
    assert deliver_code(address, request) == grpc.StatusCode.UNAUTHENTICATED
    # One replay window for both links: the batch gRPC took is a replay on frames too.
    assert deliver_frame(frames_address(secured, 1), request) == "UNAUTHENTICATED"
    fresh = signed(secured.peer_secret, 2, 1, [encode_message(Envelope(2, 1, body))])
    assert deliver_frame(frames_address(secured, 1), fresh) == "OK"
    assert deliver_frame(frames_address(secured, 1), fresh) == "UNAUTHENTICATED"
    assert balance_everywhere(secured, "replayed") == [5, 5, 5]


# Small enough to fill from a test, above the two connections node 1's peers hold.
FRAME_CONNECTIONS = 6
FRAME_AUTH_TIMEOUT_SECONDS = 2


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSidecars]:
    cluster = LocalSidecars(
        tmp_path_factory.mktemp("frame-limits"),
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={
            "drain_seconds": 2,
            "peer_frame_max_connections": FRAME_CONNECTIONS,
            "peer_frame_auth_timeout_seconds": FRAME_AUTH_TIMEOUT_SECONDS,
        },
    )
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        _stop(cluster)


def frame_connections(cluster: LocalSidecars, node_id: int) -> dict[str, float]:
    """Node ``node_id``'s framed-link connection figures: open now, and closed by it."""
    figures = metrics_of(cluster.sidecars[node_id].metrics_address)
    name = "accord_peer_frame_connections"
    return {
        "open": figures[name],
        "over_limit": figures[f"{name}_over_limit_total"],
        "timed_out": figures[f"{name}_timed_out_total"],
        "refused": figures[f"{name}_refused_total"],
    }


def eventually(condition: Callable[[], bool], seconds: float = 30) -> None:
    """Wait for ``condition`` (a bound on a hang: nothing here is a measurement)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.05)


def open_frame_connection(cluster: LocalSidecars, node_id: int) -> socket.socket:
    host, _, port = frames_address(cluster, node_id).rpartition(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.settimeout(30)  # reads below end with the listener's close, or fail here
    return connection


def said_before_closing(connection: socket.socket) -> bytes:
    with connection, connection.makefile("rb") as reader:
        return reader.read()


def test_frame_connections_past_the_limit_are_refused_while_peers_keep_working(
    limited: LocalSidecars,
) -> None:
    """Node 1's listener holds its two peers' connections, then as many authenticated ones
    as fit under peer_frame_max_connections: three more are closed on arrival, unread, and
    counted; transactions through every sidecar still commit on the peers' connections."""
    assert write_balance(limited, "limit-before", 1) is not None
    eventually(lambda: frame_connections(limited, 1)["open"] == 2)  # from nodes 2 and 3
    stamper = BatchStamper(PeerKey("local", limited.peer_secret.encode()))
    fillers = []
    try:
        for _ in range(FRAME_CONNECTIONS - 2):
            request = batch(2, [])
            stamper.stamp(request, 1)
            filler = open_frame_connection(limited, 1)
            fillers.append(filler)
            filler.sendall(MAGIC + LENGTH.pack(request.ByteSize()) + request.SerializeToString())
        eventually(lambda: frame_connections(limited, 1)["open"] == FRAME_CONNECTIONS)
        before = frame_connections(limited, 1)
        refusal = f"refused: {FRAME_CONNECTIONS} connections are open, the limit\n".encode()
        for _ in range(3):
            assert said_before_closing(open_frame_connection(limited, 1)) == refusal
        after = frame_connections(limited, 1)
        assert after["over_limit"] == before["over_limit"] + 3
        assert after["refused"] == before["refused"] + 3
        assert after["open"] == FRAME_CONNECTIONS
        assert write_balance(limited, "limit-during", 2) is not None
        assert balance_everywhere(limited, "limit-during") == [2, 2, 2]
    finally:
        for filler in fillers:
            filler.close()
    eventually(lambda: frame_connections(limited, 1)["open"] == 2)


def test_a_silent_frame_connection_is_closed_after_the_auth_timeout(
    limited: LocalSidecars,
) -> None:
    """One connection that says nothing, one that says the opening and no frame: each is
    closed, with why, once peer_frame_auth_timeout_seconds pass; the peers' connections,
    older but authenticated, stay."""
    assert write_balance(limited, "timeout-before", 1) is not None
    eventually(lambda: frame_connections(limited, 1)["open"] == 2)
    before = frame_connections(limited, 1)
    silent = open_frame_connection(limited, 1)
    opened = open_frame_connection(limited, 1)
    opened.sendall(MAGIC)
    late = f"refused: no whole frame within {FRAME_AUTH_TIMEOUT_SECONDS} s of connecting\n"
    assert [said_before_closing(silent), said_before_closing(opened)] == [late.encode()] * 2
    after = frame_connections(limited, 1)
    assert after["timed_out"] == before["timed_out"] + 2
    assert after["refused"] == before["refused"] + 2  # nothing else was closed
    assert after["open"] == 2
    assert write_balance(limited, "timeout-after", 3) is not None


def test_the_previous_key_is_accepted_during_rotation(tmp_path: Path) -> None:
    """Rolling rotation: node 1 signs with the new key and still accepts the old one; nodes 2
    and 3 sign with the old one and accept the new one. The cluster serves throughout."""
    old = {"id": "k1", "secret": "a" * 64}
    new = {"id": "k2", "secret": "b" * 64}
    cluster = LocalSidecars(tmp_path, tables=EMBEDDED_TABLES, client_token=TOKEN)
    cluster.write_configs()
    for node_id, sidecar in cluster.sidecars.items():
        config = yaml.safe_load(sidecar.config_path.read_text())
        first, second = (new, old) if node_id == 1 else (old, new)
        keys = {"current": first, "previous": second}
        config["peer_keys"] = keys
        sidecar.config_path.write_text(yaml.safe_dump(config))
    try:
        cluster.start(timeout=60)
        for index, address in enumerate(cluster.addresses()):
            t = Transaction().update("bank", "accounts", f"rotated-{index}", balance=index, tag=0)
            with client(address) as c:
                assert c.transact(t).applied
        assert balance_everywhere(cluster, "rotated-2") == [2, 2, 2]
        assert all(refused_batches(cluster, n) == 0 for n in cluster.sidecars)
        # A third key, known to nobody, is still refused.
        seen = write_balance(cluster, "rotated-0", 0)
        request = signed("c" * 64, 2, 1, [forged_apply(seen, "rotated-0", 2, 1)], "k3")
        assert deliver_code(cluster.sidecars[1].address, request) in REFUSED
        assert balance_everywhere(cluster, "rotated-0") == [0, 0, 0]
    finally:
        _stop(cluster)


# ---------------------------------------------------------------------------- mutual TLS


def peer_port_cluster(base: Path, peer_auth: str) -> tuple[LocalSidecars, Path]:
    """Three sidecars (not started): clients on their plain port, peers on a TLS port each,
    every certificate (generated here, never committed) naming accord-node-<id>."""
    certs = base / "certs"
    certs.mkdir()
    ca = make_ca(certs, "test-ca")
    for node_id in (1, 2, 3):
        make_cert(certs, ca, f"accord-node-{node_id}")
    rogue_ca = make_ca(certs, "rogue-ca")
    make_cert(certs, rogue_ca, "accord-node-2-rogue", "accord-node-2")
    cluster = LocalSidecars(
        base / "cluster",
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"drain_seconds": 2, "peer_auth": peer_auth},
    )
    cluster.write_configs()
    for node_id, sidecar in cluster.sidecars.items():
        config = yaml.safe_load(sidecar.config_path.read_text())
        if peer_auth != "hmac":
            del config["peer_keys"]
        # Port 0: each binds its own peer port and reports it; LocalSidecars hands the
        # bound peer ports out as the peers' addresses.
        config["peer_listen"] = "127.0.0.1:0"
        config["peer_tls"] = {
            "certificate": str(certs / f"accord-node-{node_id}.crt"),
            "private_key": str(certs / f"accord-node-{node_id}.key"),
            "ca": str(ca[1]),
        }
        sidecar.config_path.write_text(yaml.safe_dump(config))
    return cluster, certs


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSidecars, Path]]:
    cluster, certs = peer_port_cluster(tmp_path_factory.mktemp("mtls"), "mtls")
    try:
        cluster.start(timeout=60)
        yield cluster, certs
    finally:
        _stop(cluster)


def _peer_address(cluster: LocalSidecars, node_id: int) -> str:
    config = yaml.safe_load(cluster.sidecars[node_id].config_path.read_text())
    return str(config["peer_listen"])


def deliver_tls(
    address: str, certs: Path, name: str | None, request: peer_pb2.PeerBatch
) -> grpc.StatusCode:
    # The caller trusts the sidecars' CA; what it presents is the test's variable.
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "test-ca.crt").read_bytes(),
        private_key=(certs / f"{name}.key").read_bytes() if name else None,
        certificate_chain=(certs / f"{name}.crt").read_bytes() if name else None,
    )
    with grpc.secure_channel(address, credentials) as channel:
        try:
            peer_pb2_grpc.PeerStub(channel).Deliver(request, timeout=10)
        except grpc.RpcError as error:
            return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_mtls_peers_serve_and_clients_need_no_certificate(
    mtls: tuple[LocalSidecars, Path],
) -> None:
    cluster, _ = mtls
    for index, address in enumerate(cluster.addresses()):
        write_balance_via = Transaction().update("bank", "accounts", f"tls-{index}", balance=index)
        with client(address) as c:  # a plain channel: no client certificate
            assert c.transact(write_balance_via).applied
    assert balance_everywhere(cluster, "tls-1") == [1, 1, 1]
    # The client port no longer offers the peer service at all.
    seen = write_balance(cluster, "tls-victim", 100)
    forged = batch(2, [forged_apply(seen, "tls-victim", 2, 1)])
    assert deliver_code(cluster.sidecars[1].address, forged) == grpc.StatusCode.UNIMPLEMENTED
    assert balance_everywhere(cluster, "tls-victim") == [100, 100, 100]


@pytest.mark.parametrize(
    ("name", "source", "code"),
    [
        # No client certificate: the handshake fails before any request is read.
        (None, 2, grpc.StatusCode.UNAVAILABLE),
        # A certificate from another CA naming the right node.
        ("accord-node-2-rogue", 2, grpc.StatusCode.UNAVAILABLE),
        # Node 3's genuine certificate, claiming to be node 2.
        ("accord-node-3", 2, grpc.StatusCode.PERMISSION_DENIED),
    ],
    ids=["no-certificate", "other-ca", "other-node-id"],
)
def test_mtls_refuses_forged_peers(
    mtls: tuple[LocalSidecars, Path], name: str | None, source: int, code: object
) -> None:
    cluster, certs = mtls
    account = f"tls-victim-{name}"
    seen = write_balance(cluster, account, 100)
    payloads = [forged_apply(seen, account, source, 1)]
    request = batch(source, payloads)
    BatchStamper(None).stamp(request, 1)
    before = refused_batches(cluster, 1)
    assert deliver_tls(_peer_address(cluster, 1), certs, name, request) == code
    if code == grpc.StatusCode.PERMISSION_DENIED:
        assert refused_batches(cluster, 1) == before + 1
    assert balance_everywhere(cluster, account) == [100, 100, 100]


def _frame_tls(certs: Path, name: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "test-ca.crt"))
    if name is not None:
        context.load_cert_chain(str(certs / f"{name}.crt"), str(certs / f"{name}.key"))
    return context


def test_mtls_on_the_framed_link(mtls: tuple[LocalSidecars, Path]) -> None:
    """The frame listener has the peer port's TLS and rules: no client certificate fails
    the handshake (nothing read, nothing counted), another node's certificate is
    PERMISSION_DENIED, the genuine node's is taken once."""
    cluster, certs = mtls
    seen = write_balance(cluster, "tls-frames", 100)
    forged = batch(2, [forged_apply(seen, "tls-frames", 2, 1)])
    BatchStamper(None).stamp(forged, 1)
    address = frames_address(cluster, 1)
    # Refused in the handshake itself, or (TLS 1.3) right after the client's side of it.
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        assert deliver_frame(address, forged, _frame_tls(certs, None)) == "CLOSED"
    before = refused_batches(cluster, 1)
    assert deliver_frame(address, forged, _frame_tls(certs, "accord-node-3")) == "PERMISSION_DENIED"
    assert refused_batches(cluster, 1) == before + 1
    body = InformDurable(1, Timestamp(seen.epoch, seen.hlc, 1, 2))
    genuine = batch(2, [encode_message(Envelope(2, 1, body))])
    BatchStamper(None).stamp(genuine, 1)
    assert deliver_frame(address, genuine, _frame_tls(certs, "accord-node-2")) == "OK"
    assert deliver_frame(address, genuine, _frame_tls(certs, "accord-node-2")) == "UNAUTHENTICATED"
    assert balance_everywhere(cluster, "tls-frames") == [100, 100, 100]


def test_mtls_accepts_the_genuine_node_once(mtls: tuple[LocalSidecars, Path]) -> None:
    """The check that the refusals above are not a broken port: node 2's own certificate
    delivers a harmless message, and the very same batch again is a replay."""
    cluster, certs = mtls
    seen = write_balance(cluster, "tls-genuine", 1)
    body = InformDurable(1, Timestamp(seen.epoch, seen.hlc, 1, 2))
    request = batch(2, [encode_message(Envelope(2, 1, body))])
    BatchStamper(None).stamp(request, 1)
    address = _peer_address(cluster, 1)
    assert deliver_tls(address, certs, "accord-node-2", request) == grpc.StatusCode.OK
    assert deliver_tls(address, certs, "accord-node-2", request) == grpc.StatusCode.UNAUTHENTICATED


def test_a_tls_peer_port_with_the_shared_secret_needs_no_client_certificate(
    tmp_path: Path,
) -> None:
    """peer_tls with peer_auth: hmac encrypts the peer port; the MAC authenticates."""
    cluster, certs = peer_port_cluster(tmp_path, "hmac")
    try:
        cluster.start(timeout=60)
        for index, address in enumerate(cluster.addresses()):
            t = Transaction().update("bank", "accounts", f"tls-hmac-{index}", balance=index)
            with client(address) as c:
                assert c.transact(t).applied
        assert balance_everywhere(cluster, "tls-hmac-2") == [2, 2, 2]
        seen = write_balance(cluster, "tls-hmac-victim", 100)
        forged = batch(2, [forged_apply(seen, "tls-hmac-victim", 2, 1)])
        peer_port = _peer_address(cluster, 1)
        # Through the TLS handshake without a certificate, then refused for want of a MAC.
        assert deliver_tls(peer_port, certs, None, forged) == grpc.StatusCode.UNAUTHENTICATED
        # The peer port speaks TLS only.
        assert deliver_code(peer_port, forged) == grpc.StatusCode.UNAVAILABLE
        assert balance_everywhere(cluster, "tls-hmac-victim") == [100, 100, 100]
    finally:
        _stop(cluster)


# ---------------------------------------------------------------------------- configuration

BASE: dict[str, Any] = {
    "node_id": 1,
    "peers": {1: "10.1.0.1:50051", 2: "10.1.0.2:50051", 3: "10.1.0.3:50051"},
    "journal_dir": "/tmp/accord-test-journal",
    "tables": {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["b", "bigint"]]}},
}


@pytest.fixture
def sidecar_names_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    # A listen host must resolve (the config refuses one that does not): "sidecar-N" stands
    # for a deployment's DNS name, resolved here to the address BASE gives node N.
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.startswith("sidecar-"):
            host = f"10.1.0.{host.removeprefix('sidecar-')}"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "10.1.0.1:50051", "sidecar-1:50051"])
@pytest.mark.usefixtures("sidecar_names_resolve")
def test_no_peer_auth_beyond_loopback_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(**BASE, listen=listen)
    assert "peer_auth: none" in str(caught.value) and listen in str(caught.value)
    # Said explicitly, it starts; and loopback needs no saying.
    assert load(**BASE, listen=listen, allow_insecure_peers=True).peer_auth == "none"
    assert load(**BASE, listen="127.0.0.1:50051").peer_auth == "none"
    assert load(**BASE, listen="[::1]:50051").peer_auth == "none"


def test_peer_listen_is_what_must_be_authenticated() -> None:
    peer_addresses = {1: "10.1.0.1:7000", 2: "10.1.0.2:7000", 3: "10.1.0.3:7000"}
    with pytest.raises(ConfigError, match="peer_auth: none while the peer service listens on"):
        load(
            **BASE,
            listen="127.0.0.1:50051",
            peer_listen="0.0.0.0:7000",
            peer_addresses=peer_addresses,
        )
    keys = {"current": {"id": "k1", "secret": "s" * 32}}
    config = load(**BASE, listen="0.0.0.0:50051", peer_auth="hmac", peer_keys=keys)
    assert config.peer_keys is not None and config.peer_keys.current.id == "k1"
    assert "s" * 32 not in repr(config)  # the secret never reaches a log line


def test_the_secret_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCORD_SIDECAR_PEER_KEYS__CURRENT__SECRET", "e" * 40)
    keys = {"current": {"id": "k1"}}
    config = load(**BASE, listen="0.0.0.0:50051", peer_auth="hmac", peer_keys=keys)
    assert config.peer_keys is not None
    assert config.peer_keys.current.secret.get_secret_value() == "e" * 40


# Files that exist (their content is only read when the sidecar starts).
PEM_FILES = {"certificate": __file__, "private_key": __file__, "ca": __file__}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"peer_auth": "hmac"}, ["peer_auth: hmac needs peer_keys"]),
        (
            {"peer_auth": "hmac", "peer_keys": {"current": {"id": "k", "secret": "short"}}},
            ["peer_keys.current.secret", "32"],
        ),
        (
            {
                "peer_auth": "hmac",
                "peer_keys": {
                    "current": {"id": "k", "secret": "s" * 32},
                    "previous": {"id": "k", "secret": "t" * 32},
                },
            },
            ["previous.id must differ"],
        ),
        ({"peer_auth": "mtls"}, ["peer_auth: mtls needs peer_tls"]),
        (
            {"peer_auth": "mtls", "peer_tls": PEM_FILES},
            ["peer_auth: mtls needs peer_listen"],
        ),
        (
            {
                "peer_auth": "mtls",
                "peer_tls": {**PEM_FILES, "identity": "node"},
            },
            ["identity", "{node_id}"],
        ),
        (
            {"peer_tls": PEM_FILES},
            ["peer_tls is the TLS of the peer port: it needs peer_listen"],
        ),
        (
            {"peer_auth": "mtls", "peer_tls": {**PEM_FILES, "ca": "/nonexistent/ca.pem"}},
            ["peer_tls.ca", "cannot read /nonexistent/ca.pem", "No such file"],
        ),
        ({"peer_listen": "127.0.0.1:7000"}, ["peer_addresses must give the peer port"]),
        ({"peer_listen": "127.0.0.1:50051"}, ["peer_listen must differ from listen"]),
        ({"peer_addresses": {9: "127.0.0.1:1"}}, ["peer_addresses names nodes [9]"]),
    ],
)
def test_peer_auth_config_errors_name_the_field(changes: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load(**{**BASE, "listen": "127.0.0.1:50051", **changes})
    for word in words:
        assert word in str(caught.value)


def test_a_sidecar_refuses_to_start_beyond_loopback_without_peer_auth(tmp_path: Path) -> None:
    # Refused while the configuration is read: nothing is bound, so any port will do.
    config = {**BASE, "listen": "0.0.0.0:50051", "journal_dir": str(tmp_path / "journal")}
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "accord_cassandra", "sidecar", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "peer_auth: none" in done.stderr and "allow_insecure_peers" in done.stderr
    assert not (tmp_path / "journal").exists()  # refused before it touched anything


# What batch_mac gave for one batch before its HMAC was computed from precomputed pads
# (then hmac.digest): a peer on either version must accept the other's batches.
GOLDEN_MACS = {
    b"s" * 32: "b05a391cd8412f0a58e3dfa0a0ab3dcc0187e27ce91c07113b9616926d523747",
    b"": "a7bdfab118bbf09c3f3a7183682520ce3d8798642aea5c3cc8b8ac73b03be3e4",
    b"L" * 100: "93ae00ea4f054a40d1e7e3a4c1385684d066db7a6232844ac72a42df07dfe464",
}


def test_the_batch_mac_is_standard_hmac_sha256_and_unchanged() -> None:
    import hmac

    from accord_cassandra.peerauth import _hmac_sha256, batch_mac

    for size in (0, 1, 32, 63, 64, 65, 200):  # around SHA-256's 64-byte block
        secret = bytes(range(size % 256))[:size] if size < 256 else os.urandom(size)
        for message in (b"", b"m", os.urandom(64), os.urandom(3000)):
            assert _hmac_sha256(secret, message) == hmac.digest(secret, message, "sha256")
    batch = peer_pb2.PeerBatch(
        codec_version=3,
        source=2,
        destination=1,
        incarnation=77,
        sequence=5,
        sent_at_micros=1_800_000_000_000_000,
        key_id="k1",
        payloads=[b"one", b"", b"x" * 300],
    )
    for secret, mac in GOLDEN_MACS.items():
        assert batch_mac(secret, batch).hex() == mac
        assert batch_mac(secret, batch, list(batch.payloads)).hex() == mac
