"""The sidecars' CQL native-protocol endpoint with the DataStax Python driver (protocol v4) and
raw sockets: transactions through Accord, plain CQL forwarded to Cassandra, refusals and
malformed frames answered with the right ERROR codes while the endpoint keeps serving."""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, ProtocolVersion
from cassandra.cluster import Cluster, NoHostAvailable, Session
from cassandra.query import SimpleStatement

from accord_cassandra.launcher import CassandraHandle
from accord_cassandra.native import frame as f
from tests.sidecar.conftest import (
    TRANSFER,
    CassandraSidecars,
    CqlSidecars,
    bank_sidecars_on_cassandra,
)

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


@pytest.fixture(scope="module")
def cql_sidecars(
    cassandra_cluster: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CqlSidecars, CassandraSidecars]]:
    directory = tmp_path_factory.mktemp("cql-native")
    with bank_sidecars_on_cassandra(cassandra_cluster, directory, "cqlnat", CqlSidecars) as pair:
        yield pair


def connect(address: str) -> tuple[Cluster, Session]:
    host, _, port = address.rpartition(":")
    cluster = Cluster(
        [host],
        port=int(port),
        protocol_version=ProtocolVersion.V4,
        connect_timeout=30,
        control_connection_timeout=30,
    )
    return cluster, cluster.connect()


def test_transfers_through_the_endpoint_conserve_the_total(
    cql_sidecars: tuple[CqlSidecars, CassandraSidecars],
) -> None:
    sidecars, bank = cql_sidecars
    ks = bank.keyspace
    ids = [f"nat-{i}" for i in range(4)]
    clusters = [connect(s.cql_address) for s in sidecars.sidecars.values()]
    try:
        session = clusters[0][1]
        for account in ids:
            rows = session.execute(
                f"BEGIN TRANSACTION INSERT INTO {ks}.accounts (id, balance, tag) "
                f"VALUES ('{account}', 100, 0); COMMIT TRANSACTION",
                timeout=120,
            )
            assert rows.one()[0] is True  # [applied]
        prepared = [s.prepare(TRANSFER.format(ks=ks)) for _, s in clusters]
        names = [c.name for c in prepared[0].column_metadata]
        assert names == ["id", "id", "balance", "balance", "id", "balance", "id"]
        rng = random.Random(19)
        plan = []
        for n in range(24):
            src, dst = rng.sample(ids, 2)
            amount = rng.randint(1, 60)
            plan.append((n % 3, [src, dst, amount, amount, src, amount, dst]))

        def one(item: tuple[int, list[object]]) -> tuple[bool, int | None, int | None]:
            index, params = item
            row = clusters[index][1].execute(prepared[index], params, timeout=120).one()
            return row[0], row[1], row[2]

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(one, plan))
        applied = [o for o in outcomes if o[0]]
        assert applied, outcomes
        # The transaction's SELECT is typed: bigint balances came back as ints.
        assert all(isinstance(o[1], int) for o in outcomes)
        # A read through Accord, named markers bound by name.
        statement = session.prepare(
            f"BEGIN TRANSACTION LET a = (SELECT balance FROM {ks}.accounts WHERE id = :a); "
            f"LET b = (SELECT balance FROM {ks}.accounts WHERE id = :b); "
            f"LET c = (SELECT balance FROM {ks}.accounts WHERE id = :c); "
            f"LET d = (SELECT balance FROM {ks}.accounts WHERE id = :d); "
            "SELECT a.balance, b.balance, c.balance, d.balance; COMMIT TRANSACTION"
        )
        row = session.execute(
            statement, {"a": ids[0], "b": ids[1], "c": ids[2], "d": ids[3]}, timeout=120
        ).one()
        assert row[0] is True
        assert sum(row[1:]) == 400, row
        assert list(row[1:]) != [100, 100, 100, 100]  # some transfer applied
    finally:
        for cluster, _ in clusters:
            cluster.shutdown()


def test_plain_cql_passes_through_and_plain_writes_to_accord_tables_are_refused(
    cql_sidecars: tuple[CqlSidecars, CassandraSidecars],
) -> None:
    sidecars, bank = cql_sidecars
    ks = bank.keyspace
    cluster, session = connect(sidecars.sidecars[1].cql_address)
    try:
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {ks}.notes (id int PRIMARY KEY, body text)", timeout=120
        )
        # QUORUM both ways: the endpoint passes the client's consistency level on, and at the
        # driver's default (LOCAL_ONE) a read may reach a replica the write has not yet.
        quorum = ConsistencyLevel.QUORUM
        plain = f"INSERT INTO {ks}.notes (id, body) VALUES (1, 'plain')"
        session.execute(SimpleStatement(plain, consistency_level=quorum), timeout=60)
        insert = session.prepare(f"INSERT INTO {ks}.notes (id, body) VALUES (?, ?)")
        insert.consistency_level = quorum
        session.execute(insert, [2, "prepared"], timeout=60)
        select = SimpleStatement(f"SELECT id, body FROM {ks}.notes", consistency_level=quorum)
        rows = session.execute(select, timeout=60)
        assert sorted((r.id, r.body) for r in rows) == [(1, "plain"), (2, "prepared")]
        # Seen by Cassandra itself, not only by the endpoint.
        read = f"SELECT body FROM {ks}.notes WHERE id = 2"
        direct = bank.session.execute(SimpleStatement(read, consistency_level=quorum)).one()
        assert direct.body == "prepared"
        session.execute(f"USE {ks}")
        with pytest.raises(InvalidRequest, match="managed by Accord"):
            session.execute("INSERT INTO accounts (id, balance) VALUES ('x', 1)")
        with pytest.raises(InvalidRequest, match="managed by Accord"):
            session.prepare(f"UPDATE {ks}.accounts SET balance = 1 WHERE id = 'x'")
        with pytest.raises(InvalidRequest, match="managed by Accord"):
            session.execute(
                f"BEGIN BATCH INSERT INTO {ks}.notes (id, body) VALUES (3, 'b') "
                f"DELETE FROM {ks}.accounts WHERE id = 'x' APPLY BATCH"
            )
        # Nothing of the refused batch landed; the connection still serves.
        assert session.execute("SELECT body FROM notes WHERE id = 3").one() is None
        assert session.execute(f"SELECT id FROM {ks}.accounts WHERE id = 'x'").one() is None
    finally:
        cluster.shutdown()


def raw_connection(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=60)


def read_frame(sock: socket.socket) -> f.Frame:
    header = recv_exactly(sock, f.HEADER_BYTES)
    version, flags, stream, opcode, length = f.HEADER.unpack(header)
    return f.Frame(version, flags, stream, opcode, recv_exactly(sock, length))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def request(stream: int, opcode: int, body: bytes, version: int = 4, flags: int = 0) -> bytes:
    return f.encode_frame(version, flags, stream, opcode, body)


def startup_body(**options: str) -> bytes:
    return f.Writer().string_map({"CQL_VERSION": "3.0.0", **options}).build()


def query_body(text: str) -> bytes:
    return f.Writer().long_string(text).short(1).byte(0).build()


def error_of(frame: f.Frame) -> tuple[int, str]:
    assert frame.opcode == f.ERROR, frame
    return f.read_error(frame.body)


def ready_connection(address: str) -> socket.socket:
    sock = raw_connection(address)
    sock.sendall(request(1, f.STARTUP, startup_body()))
    assert read_frame(sock).opcode == f.READY
    return sock


def test_malformed_frames_get_the_right_errors_and_the_endpoint_serves_on(
    cql_sidecars: tuple[CqlSidecars, CassandraSidecars],
) -> None:
    sidecars, bank = cql_sidecars
    address = sidecars.sidecars[2].cql_address
    ks = bank.keyspace

    # Protocol v5 (and v3): refused at negotiation with the wording drivers fall back on.
    for version in (5, 3):
        with raw_connection(address) as sock:
            sock.sendall(request(7, f.OPTIONS, b"", version=version))
            reply = read_frame(sock)
            code, message = error_of(reply)
            assert (reply.version, reply.stream, code) == (0x84, 7, f.PROTOCOL_ERROR)
            assert "Invalid or unsupported protocol version" in message
            assert sock.recv(1) == b""  # then closed

    with ready_connection(address) as sock:
        # An unknown opcode, a compressed frame, a truncated QUERY: each answered, in order.
        sock.sendall(request(2, 0x42, b""))
        assert error_of(read_frame(sock))[0] == f.PROTOCOL_ERROR
        sock.sendall(request(3, f.QUERY, query_body("SELECT now() FROM system.local"), flags=1))
        assert error_of(read_frame(sock))[0] == f.PROTOCOL_ERROR
        sock.sendall(request(4, f.QUERY, query_body("SELECT 1")[:-3]))
        code, message = error_of(read_frame(sock))
        assert code == f.PROTOCOL_ERROR and "truncated" in message
        # An oversize frame: refused, its body skipped, the connection goes on.
        big = 16 * 1024 * 1024 + 1
        sock.sendall(f.HEADER.pack(4, 0, 5, f.QUERY, big))
        code, message = error_of(read_frame(sock))
        assert code == f.PROTOCOL_ERROR and "exceeds the limit" in message
        chunk = b"\0" * 65536
        for _ in range(big // len(chunk)):
            sock.sendall(chunk)
        sock.sendall(b"\0" * (big % len(chunk)))
        # Transactions: a syntax error, an unknown table, an unknown prepared id.
        sock.sendall(
            request(6, f.QUERY, query_body("BEGIN TRANSACTION SELEKT; COMMIT TRANSACTION"))
        )
        reply = read_frame(sock)
        assert reply.stream == 6 and error_of(reply)[0] == f.SYNTAX_ERROR
        text = f"BEGIN TRANSACTION SELECT * FROM {ks}.nowhere WHERE id = 'a'; COMMIT TRANSACTION"
        sock.sendall(request(8, f.QUERY, query_body(text)))
        assert error_of(read_frame(sock))[0] == f.INVALID
        unknown = b"ACRD" + bytes(16)
        sock.sendall(
            request(9, f.EXECUTE, f.Writer().short_bytes(unknown).short(1).byte(0).build())
        )
        code, _ = error_of(reply := read_frame(sock))
        assert code == f.UNPREPARED and reply.body.endswith(f.Writer().short_bytes(unknown).build())
        # A transaction text over the limit.
        huge = "BEGIN TRANSACTION " + "-- pad\n" * 20_000 + "COMMIT TRANSACTION"
        sock.sendall(request(10, f.QUERY, query_body(huge)))
        code, message = error_of(read_frame(sock))
        assert code == f.INVALID and "exceeds the limit" in message
        # Still serving, on this connection: a plain query through Cassandra.
        sock.sendall(request(11, f.QUERY, query_body("SELECT release_version FROM system.local")))
        reply = read_frame(sock)
        assert (reply.stream, reply.opcode) == (11, f.RESULT)

    # Compression at STARTUP is refused; a transaction before STARTUP too.
    with raw_connection(address) as sock:
        sock.sendall(request(1, f.STARTUP, startup_body(COMPRESSION="lz4")))
        code, message = error_of(read_frame(sock))
        assert code == f.PROTOCOL_ERROR and "compression" in message
        sock.sendall(request(2, f.QUERY, query_body("BEGIN TRANSACTION COMMIT TRANSACTION")))
        assert error_of(read_frame(sock))[0] == f.PROTOCOL_ERROR
        # A frame cut short by the end of the connection: an ERROR, then closed.
        sock.sendall(struct.pack(">BBhBI", 4, 0, 3, f.QUERY, 100) + b"x" * 10)
        sock.shutdown(socket.SHUT_WR)
        code, message = error_of(read_frame(sock))
        assert code == f.PROTOCOL_ERROR and "ended inside a frame" in message

    # And a driver still connects and runs a transaction.
    cluster, session = connect(address)
    try:
        row = session.execute(
            f"BEGIN TRANSACTION SELECT id, balance FROM {ks}.accounts WHERE id = 'none'; "
            "COMMIT TRANSACTION",
            timeout=120,
        ).one()
        assert row[0] is True and row[1] is None
    finally:
        cluster.shutdown()


def test_a_driver_asking_for_compression_or_v5_falls_back(
    cql_sidecars: tuple[CqlSidecars, CassandraSidecars],
) -> None:
    sidecars, _ = cql_sidecars
    host, _, port = sidecars.sidecars[3].cql_address.rpartition(":")
    # No protocol_version: the driver starts at its highest (v5) and must fall back to v4.
    cluster = Cluster(
        [host],
        port=int(port),
        compression=True,
        connect_timeout=30,
    )
    try:
        session = cluster.connect()
        assert cluster.protocol_version == 4
        assert session.execute("SELECT release_version FROM system.local").one() is not None
    except NoHostAvailable as error:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"no fallback: {error}")
    finally:
        cluster.shutdown()
