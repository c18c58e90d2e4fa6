"""What the CQL endpoint tells drivers of the cluster (accord_cassandra.native.peers), without
Cassandra: system.local / system.peers_v2 answers rewritten to name the sidecars, rows of
nodes no sidecar fronts dropped, the peers file re-read, warnings added to a RESULT."""

from __future__ import annotations

import ipaddress
import json
import os
import struct
import uuid
from pathlib import Path

import pytest

from accord_cassandra.native import frame as f
from accord_cassandra.native.peers import (
    Directory,
    Endpoint,
    is_peer_event,
    read_rows,
    result_kind,
    rewrite_rows,
    system_table,
    with_warning,
)

INET, INT, UUID, TEXT, SET = 0x0010, 0x0009, 0x000C, 0x000D, 0x0022


def rows_body(
    columns: list[tuple[str, int]], rows: list[list[bytes | None]], flags: int = 0
) -> bytes:
    w = f.Writer().int32(f.ROWS).int32(flags | 0x0001).int32(len(columns))
    w.string("system").string("peers_v2")
    for name, kind in columns:
        w.string(name).short(kind)
        if kind == SET:
            w.short(TEXT)
    w.int32(len(rows))
    for row in rows:
        for cell in row:
            w.blob(cell)
    return w.build()


def inet(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


def port(n: int) -> bytes:
    return struct.pack(">i", n)


PEER_COLUMNS = [
    ("peer", INET),
    ("peer_port", INT),
    ("host_id", UUID),
    ("native_address", INET),
    ("native_port", INT),
    ("schema_version", UUID),
    ("tokens", SET),
]


def peer_row(cassandra: str, host_id: uuid.UUID, schema: uuid.UUID) -> list[bytes | None]:
    tokens = f.Writer().int32(1).blob(b"42").build()
    return [
        inet(cassandra),
        port(7000),
        host_id.bytes,
        inet(cassandra),
        port(9042),
        schema.bytes,
        tokens,
    ]


def directory(tmp_path: Path | None = None) -> Directory:
    return Directory(
        1,
        {1: "127.0.0.1:19001", 2: "127.0.0.1:19002", 3: "127.0.0.1:19003"},
        {1: "127.0.51.1", 2: "127.0.51.2", 3: "127.0.51.3:9042"},
        tmp_path,
    )


def test_peers_name_the_sidecars_and_keep_the_nodes_identity() -> None:
    ids = [uuid.uuid4() for _ in range(4)]
    schema = uuid.uuid4()
    # Cassandra node 1's peers: nodes 2 and 3 (fronted by sidecars 2, 3) and node 4 (none).
    body = rows_body(
        PEER_COLUMNS,
        [peer_row(f"127.0.51.{i}", ids[i - 1], schema) for i in (2, 3, 4)],
    )
    rows = read_rows(0, body)
    assert rows is not None
    out = read_rows(0, rewrite_rows("peers_v2", rows, directory()).encode())
    assert out is not None
    at = {n: i for i, n in enumerate(out.names)}
    seen = [
        (
            str(ipaddress.ip_address(r[at["native_address"]] or b"")),
            struct.unpack(">i", r[at["native_port"]] or b"")[0],
            uuid.UUID(bytes=r[at["host_id"]] or b""),
            str(ipaddress.ip_address(r[at["peer"]] or b"")),
        )
        for r in out.rows
    ]
    assert seen == [
        ("127.0.0.1", 19002, ids[1], "127.0.51.2"),
        ("127.0.0.1", 19003, ids[2], "127.0.51.3"),
    ]
    # Tokens and schema version: the node's, byte for byte.
    assert [r[at["tokens"]] for r in out.rows] == [r[6] for r in rows.rows[:2]]
    assert all(r[at["schema_version"]] == schema.bytes for r in out.rows)


def test_rows_without_address_columns_pass_and_unknown_nodes_are_dropped() -> None:
    directory_ = directory()
    only_ids = rows_body([("host_id", UUID), ("schema_version", UUID)], [[uuid.uuid4().bytes] * 2])
    rows = read_rows(0, only_ids)
    assert rows is not None
    assert len(rewrite_rows("peers", rows, directory_).rows) == 1
    stranger = rows_body([("peer", INET), ("rpc_address", INET)], [[inet("10.9.9.9")] * 2])
    rows = read_rows(0, stranger)
    assert rows is not None
    assert rewrite_rows("peers", rows, directory_).rows == []


def test_local_row_names_this_sidecar() -> None:
    body = rows_body(
        [("key", TEXT), ("rpc_address", INET), ("rpc_port", INT), ("host_id", UUID)],
        [[b"local", inet("127.0.51.1"), port(9042), uuid.uuid4().bytes]],
    )
    rows = read_rows(0, body)
    assert rows is not None
    (row,) = rewrite_rows("local", rows, directory()).rows
    assert row[1] == inet("127.0.0.1") and row[2] == port(19001)
    assert row[3] == rows.rows[0][3]


def test_a_sidecar_without_cassandra_host_is_not_advertised() -> None:
    d = Directory(1, {2: "127.0.0.1:19002", 3: "127.0.0.1:19003"}, {2: "127.0.51.2"})
    assert d.advertised() == {
        ipaddress.ip_address("127.0.51.2"): Endpoint(ipaddress.ip_address("127.0.0.1"), 19002)
    }


def test_the_peers_file_overrides_and_is_reread(tmp_path: Path) -> None:
    path = tmp_path / "cql_peers.json"
    d = directory(path)
    assert d.advertised()[ipaddress.ip_address("127.0.51.2")].port == 19002
    path.write_text(json.dumps({"2": "127.0.0.2:29002"}))
    moved = d.advertised()[ipaddress.ip_address("127.0.51.2")]
    assert (str(moved.address), moved.port) == ("127.0.0.2", 29002)
    path.write_text("{not json")
    os.utime(path, ns=(1, 1))
    kept = d.advertised()[ipaddress.ip_address("127.0.51.2")]
    assert kept == moved  # a broken file keeps what was known


def test_a_result_without_metadata_of_an_unknown_statement_is_malformed() -> None:
    body = f.Writer().int32(f.ROWS).int32(0x0004).int32(1).int32(0).build()
    with pytest.raises(f.Malformed, match="without metadata"):
        read_rows(0, body)
    assert read_rows(0, body, ["peer"]) is not None


def test_system_tables_are_recognised_conservatively() -> None:
    assert system_table("SELECT * FROM system.peers_v2") == "peers_v2"
    assert system_table("select schema_version from system.local where key='local';") == "local"
    assert system_table('SELECT * FROM "system"."peers"') == "peers"
    assert system_table("SELECT * FROM system.peers; SELECT 1") is None
    assert system_table("SELECT * FROM ks.peers") is None
    assert system_table("INSERT INTO system.peers (peer) VALUES ('1.2.3.4')") is None


def test_events_and_warnings() -> None:
    assert is_peer_event(f.Writer().string("TOPOLOGY_CHANGE").build())
    assert is_peer_event(f.Writer().string("STATUS_CHANGE").build())
    assert not is_peer_event(f.Writer().string("SCHEMA_CHANGE").build())
    schema_change = f.Writer().int32(f.SCHEMA_CHANGE).string("CREATED").build()
    flags, body = with_warning(0, schema_change, "late")
    assert flags & f.WARNING
    reader = f.Reader(body)
    assert reader.string_list() == ["late"]
    assert result_kind(flags, body) == f.SCHEMA_CHANGE
    flags2, body2 = with_warning(flags, body, "later")
    assert f.Reader(body2).string_list() == ["late", "later"]
    assert flags2 == flags
