"""The CQL endpoint's frame codec, values and statement check, without sockets."""

from __future__ import annotations

import io

import pytest
from cassandra import cqltypes
from cassandra.protocol import ProtocolHandler, QueryMessage, ResultMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from accord_cassandra.native import frame as f
from accord_cassandra.native.endpoint import (
    Column,
    describe,
    prepared_body,
    rows_body,
    statement_id,
)
from accord_cassandra.native.statements import is_transaction, written_tables
from accord_cassandra.native.values import decode, encode
from accord_cassandra.schema import Catalog

frames = st.builds(
    f.Frame,
    st.just(4),
    st.integers(0, 0x1F),
    st.integers(-(2**15), 2**15 - 1),
    st.sampled_from(sorted(f.REQUEST_OPCODES)),
    st.binary(max_size=300),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(frames, max_size=6), st.data())
def test_frames_survive_any_split_of_the_stream(items: list[f.Frame], data: st.DataObject) -> None:
    stream = b"".join(i.encode() for i in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = f.FrameDecoder()
    out: list[f.Frame | f.BadFrame] = []
    last = 0
    for cut in [*cuts, len(stream)]:
        out.extend(decoder.feed(stream[last:cut]))
        last = cut
    assert out == items
    assert decoder.eof() is None


def test_an_oversize_frame_is_refused_and_skipped_and_the_next_one_read() -> None:
    decoder = f.FrameDecoder(max_frame_bytes=10)
    good = f.Frame(4, 0, 9, f.OPTIONS, b"")
    data = f.HEADER.pack(4, 0, 3, f.QUERY, 11) + b"x" * 11 + good.encode()
    out = (
        list(decoder.feed(data[:5]))
        + list(decoder.feed(data[5:14]))
        + list(decoder.feed(data[14:]))
    )
    assert out[0] == f.BadFrame(3, f.PROTOCOL_ERROR, out[0].message, False)  # type: ignore[union-attr]
    assert out[1:] == [good]


@pytest.mark.parametrize("version", [1, 2, 3, 5, 6, 0x7F])
def test_another_version_is_refused_fatally_in_words_drivers_know(version: int) -> None:
    decoder = f.FrameDecoder()
    (bad,) = decoder.feed(f.HEADER.pack(version, 0, 1, f.OPTIONS, 0))
    assert isinstance(bad, f.BadFrame) and bad.fatal and bad.code == f.PROTOCOL_ERROR
    assert f"Invalid or unsupported protocol version ({version})" in bad.message
    assert list(decoder.feed(f.Frame(4, 0, 1, f.OPTIONS, b"").encode())) == []


def test_a_response_sent_as_a_request_and_a_cut_frame_are_fatal() -> None:
    (bad,) = f.FrameDecoder().feed(f.HEADER.pack(0x84, 0, 1, f.READY, 0))
    assert isinstance(bad, f.BadFrame) and bad.fatal
    decoder = f.FrameDecoder()
    assert list(decoder.feed(f.HEADER.pack(4, 0, 12, f.QUERY, 50) + b"abc")) == []
    cut = decoder.eof()
    assert cut is not None and cut.stream == 12 and cut.fatal


def test_query_parameters_as_the_driver_writes_them() -> None:
    message = QueryMessage(
        "SELECT 1", consistency_level=4, serial_consistency_level=8, fetch_size=50, timestamp=7
    )
    body = ProtocolHandler.encode_message(message, 1, 4, None, False)[f.HEADER_BYTES :]
    text, params = f.read_query(body)
    assert text == "SELECT 1"
    assert (params.consistency, params.page_size, params.serial_consistency) == (4, 50, 8)
    assert params.timestamp == 7
    with pytest.raises(f.Malformed, match="truncated"):
        f.read_query(body[:-1])


VALUES = [
    ("int", -5),
    ("bigint", 2**40),
    ("smallint", -300),
    ("tinyint", 7),
    ("varint", -(2**62)),
    ("text", "héllo"),
    ("ascii", "abc"),
    ("blob", b"\x00\xff"),
    ("boolean", True),
    ("double", 1.5),
    ("float", 0.25),
    ("timestamp", 1_700_000_000_123),
    ("date", -3),
    ("time", 86_399_000_000_000),
    ("uuid", "3b241101-e2bb-4255-8caf-4136c566a962"),
    ("inet", "10.0.0.1"),
    ("inet", "::1"),
    ("decimal", "-12.340"),
    ("duration", (1, -0, 5)),
    ("frozen<list<int>>", [1, 2]),
    ("frozen<map<text, int>>", [("a", 1), ("b", 2)]),
    ("tuple<int, text>", (1, None)),
]


@pytest.mark.parametrize(("cql_type", "value"), VALUES)
def test_values_round_trip(cql_type: str, value: object) -> None:
    data = encode(cql_type, value)
    assert data is not None
    assert decode(cql_type, data) == value


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
def test_durations_and_varints_round_trip(big: int, small: int) -> None:
    assert decode("duration", encode("duration", (small, small, big))) == (small, small, big)
    assert decode("varint", encode("varint", big)) == big
    assert decode("bigint", encode("bigint", big)) == big


def test_wrong_sized_values_are_malformed() -> None:
    with pytest.raises(f.Malformed):
        decode("int", b"\x00\x01")
    with pytest.raises(f.Malformed):
        decode("frozen<list<int>>", b"\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x01")


def test_the_driver_reads_our_rows_and_prepared_results() -> None:
    columns = [
        Column("ks", "t", "[applied]", "boolean"),
        Column("ks", "t", "src.balance", "bigint"),
        Column("ks", "t", "tags", "frozen<set<text>>"),
    ]
    body = rows_body(columns, [(True, 5, ("a", "b")), (False, None, None)])
    decoded = ResultMessage.recv_body(io.BytesIO(body), 4, {}, None, None)
    assert decoded.column_names == ["[applied]", "src.balance", "tags"]
    assert decoded.column_types[1] is cqltypes.LongType
    assert decoded.parsed_rows == [(True, 5, {"a", "b"}), (False, None, None)]
    catalog = Catalog.from_mapping(
        {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}}
    )
    statement = describe(
        "BEGIN TRANSACTION LET a = (SELECT balance FROM bank.accounts WHERE id = :who); "
        "SELECT a.balance; IF a.balance > ? THEN "
        "UPDATE bank.accounts SET balance = 0 WHERE id = :who; END IF COMMIT TRANSACTION",
        catalog,
    )
    assert statement.id == statement_id(statement.prepared.text) and len(statement.id) == 20
    prepared = ResultMessage.recv_body(io.BytesIO(prepared_body(statement)), 4, {}, None, None)
    assert prepared.query_id == statement.id
    assert [(c.name, c.type) for c in prepared.bind_metadata] == [
        ("who", cqltypes.VarcharType),
        ("balance", cqltypes.LongType),
        ("who", cqltypes.VarcharType),
    ]
    assert [c[2] for c in prepared.column_metadata] == ["[applied]", "a.balance"]


def test_transactions_and_plain_writes_are_told_apart() -> None:
    assert is_transaction("  -- note\n/* x */ begin   Transaction SELECT 1; COMMIT TRANSACTION")
    assert not is_transaction("BEGIN BATCH INSERT INTO t (a) VALUES (1) APPLY BATCH")
    assert written_tables("INSERT INTO ks.t (a) VALUES (1)", None) == ["ks.t"]
    assert written_tables('update "Ks"."T" SET a = 1 WHERE k = 1', None) == ["Ks.T"]
    assert written_tables("DELETE a FROM t WHERE k = 1", "ks") == ["ks.t"]
    assert written_tables("TRUNCATE TABLE ks.t", None) == ["ks.t"]
    assert written_tables("SELECT update FROM ks.t WHERE k = 'INSERT INTO ks.u'", None) == []
    assert written_tables(
        "BEGIN UNLOGGED BATCH USING TIMESTAMP 5 INSERT INTO a.b (k) VALUES (1) "
        "UPDATE a.c SET v = 1 WHERE k = 1 DELETE FROM a.d WHERE k = 1 APPLY BATCH",
        None,
    ) == ["a.b", "a.c", "a.d"]
    assert (
        written_tables("INSERT INTO t (a) VALUES (1)", None) == []
    )  # no keyspace: Cassandra refuses
