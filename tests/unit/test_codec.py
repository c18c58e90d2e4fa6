"""The msgpack codec: exact round trips, and nothing but CodecError on malformed input."""

from __future__ import annotations

from typing import Any, get_args

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    MESSAGE_STRATEGIES,
    envelopes,
    identical,
    journal_records,
    messages,
    values,
)

from accord.api import Durable, HlcFloor
from accord.codec import (
    ENVELOPE_TAG,
    MAX_EXPR_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_VALUE_DEPTH,
    MESSAGE_TAGS,
    RECORD_TAGS,
    CodecError,
    decode_message,
    decode_record,
    encode_message,
    encode_record,
    readdress,
)
from accord.invariants import AccordError
from accord.local.command import CommandSnapshot
from accord.messages import (
    AcceptOk,
    Apply,
    CommitOk,
    Envelope,
    Message,
    Nack,
    PreAccept,
    PreAcceptOk,
    ReadOk,
    ReadRedundant,
)
from accord.primitives import (
    BinOp,
    Bound,
    Const,
    CountOf,
    Deps,
    Expr,
    Item,
    Key,
    MakeTuple,
    Predicate,
    Put,
    ReadOf,
    Route,
    RowOf,
    Slice,
    SliceOf,
    StaticOf,
    Status,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
)

TS = Timestamp(1, 1_000_000, 1, 3)
KEY = Key(42, "k")
ROUTE = Route(KEY, (KEY,))
TXN = Txn((KEY,), Update((Put(KEY, BinOp("+", ReadOf(KEY, 0), Const(1))),)))
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pack(wire: object) -> bytes:
    return msgpack.packb(wire, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def roundtrip(message: object) -> object:
    return decode_message(encode_message(message))  # type: ignore[arg-type]


def read_ok(value: object) -> ReadOk:
    return ReadOk(7, TS, ((KEY, value),))


# ---------------------------------------------------------------------------- tables


def test_every_message_class_has_a_tag_and_a_strategy() -> None:
    classes = set(get_args(Message))
    assert set(MESSAGE_TAGS) == classes
    assert set(MESSAGE_STRATEGIES) == classes
    assert set(RECORD_TAGS) == {CommandSnapshot, HlcFloor, Durable}


def test_tags_are_frozen_because_journals_outlive_releases() -> None:
    # Changing any number here makes old journals and mixed-version clusters unreadable.
    assert ENVELOPE_TAG == 1
    assert {cls.__name__: tag for cls, tag in MESSAGE_TAGS.items()} == {
        "PreAccept": 10,
        "Accept": 11,
        "AcceptInvalidate": 12,
        "Commit": 13,
        "Apply": 14,
        "CommitInvalidate": 15,
        "InformDurable": 16,
        "BeginRecovery": 17,
        "BeginInvalidation": 18,
        "OutcomeDurable": 19,
        "CheckStatus": 20,
        "PreAcceptOk": 30,
        "Nack": 31,
        "AcceptOk": 32,
        "AcceptInvalidateOk": 33,
        "CommitOk": 34,
        "Insufficient": 35,
        "ReadOk": 36,
        "ReadRedundant": 37,
        "ApplyOk": 38,
        "RecoverOk": 39,
        "InvalidateOk": 40,
        "CheckStatusOk": 41,
    }
    assert {cls.__name__: tag for cls, tag in RECORD_TAGS.items()} == {
        "CommandSnapshot": 100,
        "HlcFloor": 101,
        "Durable": 102,
    }


def test_golden_bytes_pin_the_format() -> None:
    message = PreAcceptOk(5, TS, TS, Deps({KEY: [TS]}), rejected=True)
    assert encode_message(Envelope(1, 2, message)).hex() == (
        # [envelope, src, dest, [PreAcceptOk, cid, txn_id, witnessed_at, deps, rejected]]
        "94010102961e059401ce000f424001039401ce000f424001039192922aa16b919401ce000f42400103c3"
    )
    assert encode_record(HlcFloor(7)).hex() == "926507"


def test_codec_error_is_an_accord_error() -> None:
    assert issubclass(CodecError, AccordError)
    assert not CodecError.retryable


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", sorted(MESSAGE_STRATEGIES, key=lambda c: c.__name__))
@given(data=st.data())
@SLOW
def test_every_message_round_trips_exactly(cls: type[Any], data: st.DataObject) -> None:
    message = data.draw(MESSAGE_STRATEGIES[cls])
    encoded = encode_message(message)
    decoded = decode_message(encoded)
    assert identical(decoded, message)
    # Encoding is a function of the value: equal messages give equal bytes.
    assert encode_message(decoded) == encoded


@given(envelopes)
@SLOW
def test_envelopes_round_trip_exactly(envelope: Envelope) -> None:
    assert identical(roundtrip(envelope), envelope)


@given(envelopes, st.integers(min_value=0, max_value=2**63 - 1))
@SLOW
def test_readdressed_envelopes_are_the_bytes_encoding_gives(
    envelope: Envelope, new_dest: int
) -> None:
    # The transport encodes a message sent to several replicas once and readdresses it:
    # the bytes must be exactly those of encoding the envelope to the other destination.
    encoded = encode_message(envelope)
    moved = readdress(encoded, envelope.src, envelope.dest, new_dest)
    assert moved == encode_message(Envelope(envelope.src, new_dest, envelope.body))
    assert identical(decode_message(moved), Envelope(envelope.src, new_dest, envelope.body))


def test_readdress_refuses_bytes_of_another_envelope() -> None:
    envelope = Envelope(1, 2, CommitOk(0, Timestamp(1, 5, 0, 1)))
    encoded = encode_message(envelope)
    with pytest.raises(CodecError, match="not the bytes of an envelope from 1 to 3"):
        readdress(encoded, 1, 3, 4)
    with pytest.raises(CodecError, match="not the bytes of an envelope from 2 to 2"):
        readdress(encoded, 2, 2, 4)
    with pytest.raises(CodecError, match="64-bit"):
        readdress(encoded, 1, 2, 2**64)


@given(journal_records)
@SLOW
def test_journal_records_round_trip_exactly(record: CommandSnapshot | HlcFloor | Durable) -> None:
    encoded = encode_record(record)
    assert identical(decode_record(encoded), record)
    assert encode_record(decode_record(encoded)) == encoded


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        1,
        -1,
        2**63 - 1,
        -(2**63),
        "",
        "é\x00",
        b"",
        b"\x00\xff",
        (),
        ((),),
        (None,),
        (True, 1, "1", b"1", (1,)),
        (1.0, -0.0, float("inf"), 1e-310, (0.1, (2.5,))),
        ("a", b"a", ("a", (b"a",))),
    ],
    ids=repr,
)
def test_values_keep_their_exact_types(value: object) -> None:
    assert identical(roundtrip(read_ok(value)), read_ok(value))


def test_confusable_values_encode_differently() -> None:
    confusable = [True, 1, 1.0, "1", b"1", (1,), (True,), (1.0,), ("1",), (b"1",), None, ()]
    encodings = {encode_message(read_ok(v)) for v in confusable}
    assert len(encodings) == len(confusable)


@given(values())
def test_any_value_round_trips_exactly(value: object) -> None:
    op = WriteOp(KEY, value)
    message = ReadRedundant(1, TS, (op,), TxnResult(((KEY, value),), True))
    assert identical(roundtrip(message), message)


def test_every_expression_kind_round_trips() -> None:
    part = Slice(KEY, (1,), Bound(2), Bound("z", inclusive=False), reverse=True, limit=3)
    row = MakeTuple(
        (
            Item(ReadOf(KEY, (1, 2)), -1),
            BinOp("concat", Const((1,)), Const(None)),
            RowOf(KEY, (1, b"c"), 5),
            SliceOf(part),
            CountOf(Slice(KEY)),
            StaticOf(KEY),
        )
    )
    txn = Txn((KEY,), Update((Put(KEY, row),), (Predicate("not_null", Item(row, 0)),)))

    def kinds(expr: Expr) -> set[type]:
        if isinstance(expr, BinOp):
            return {BinOp} | kinds(expr.left) | kinds(expr.right)
        if isinstance(expr, Item):
            return {Item} | kinds(expr.value)
        if isinstance(expr, MakeTuple):
            return {MakeTuple}.union(*(kinds(item) for item in expr.items))
        return {type(expr)}

    assert kinds(row) == set(get_args(Expr))
    message = PreAccept(1, TS, txn, ROUTE)
    assert identical(roundtrip(message), message)


def test_bytearray_and_memoryview_input_decode() -> None:
    encoded = encode_message(read_ok(1))
    assert decode_message(bytearray(encoded)) == read_ok(1)
    assert decode_message(memoryview(encoded)) == read_ok(1)


# ---------------------------------------------------------------------------- limits


def nested(depth: int) -> object:
    value: object = ()
    for _ in range(depth - 1):
        value = (value,)
    return value


def chain(depth: int) -> BinOp | Const:
    expr: BinOp | Const = Const(1)
    for _ in range(depth - 1):
        expr = BinOp("+", expr, Const(1))
    return expr


def test_value_depth_limit_is_inclusive_both_ways() -> None:
    assert roundtrip(read_ok(nested(MAX_VALUE_DEPTH))) == read_ok(nested(MAX_VALUE_DEPTH))
    with pytest.raises(CodecError, match="MAX_VALUE_DEPTH"):
        encode_message(read_ok(nested(MAX_VALUE_DEPTH + 1)))
    wire = unpack(encode_message(read_ok(0)))
    wire[3][0][1] = nested(MAX_VALUE_DEPTH + 1)
    with pytest.raises(CodecError, match=r"MAX_VALUE_DEPTH.*ReadOk\.values\[0\]"):
        decode_message(pack(wire))


def test_tuple_building_counts_towards_the_expression_depth() -> None:
    expr: Expr = Const(1)
    for _ in range(MAX_EXPR_DEPTH):
        expr = MakeTuple((Item(expr, 0),)) if isinstance(expr, Const) else MakeTuple((expr,))
    with pytest.raises(CodecError, match="MAX_EXPR_DEPTH"):
        encode_message(PreAccept(1, TS, Txn((), Update((Put(KEY, expr),))), ROUTE))


def test_expression_depth_limit_is_inclusive_both_ways() -> None:
    def txn(expr: BinOp | Const) -> PreAccept:
        return PreAccept(1, TS, Txn((), Update((Put(KEY, expr),))), ROUTE)

    assert roundtrip(txn(chain(MAX_EXPR_DEPTH))) == txn(chain(MAX_EXPR_DEPTH))
    with pytest.raises(CodecError, match="MAX_EXPR_DEPTH"):
        encode_message(txn(chain(MAX_EXPR_DEPTH + 1)))
    wire = unpack(encode_message(txn(Const(1))))
    deep: list[object] = [0, 1]
    for _ in range(MAX_EXPR_DEPTH):
        deep = [2, 0, deep, [0, 1]]
    wire[3][1][0][0][2] = deep  # PreAccept.txn.update.writes[0].value
    with pytest.raises(CodecError, match="MAX_EXPR_DEPTH"):
        decode_message(pack(wire))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64, 10**30], ids=str)
def test_integers_beyond_64_bits_are_refused(value: int) -> None:
    with pytest.raises(CodecError, match="signed 64-bit"):
        encode_message(read_ok(value))
    with pytest.raises(CodecError, match="signed 64-bit"):
        encode_message(ReadOk(value, TS, ()))
    # Inside a tuple of scalars too (checked in one pass, not item by item).
    with pytest.raises(CodecError, match="signed 64-bit"):
        encode_message(read_ok(("k", 1, None, value)))
    with pytest.raises(CodecError, match="signed 64-bit"):
        encode_message(read_ok(("k", (1, value))))


@pytest.mark.parametrize("item", [[1], {"a": 1}, object(), 1j], ids=repr)
def test_a_tuple_holding_a_non_value_is_refused(item: object) -> None:
    with pytest.raises(CodecError, match="is not a value"):
        encode_message(read_ok(("k", 1, b"x", item)))
    flat = ("k", 2**63 - 1, -(2**63), b"x", None, True, 1.5)
    assert roundtrip(read_ok(flat)) == read_ok(flat)


def test_unsigned_64_bit_integers_on_the_wire_are_refused() -> None:
    wire = unpack(encode_message(read_ok(0)))
    wire[3][0][1] = 2**64 - 1
    with pytest.raises(CodecError, match="signed 64-bit"):
        decode_message(pack(wire))


def test_oversize_input_is_refused_unread() -> None:
    with pytest.raises(CodecError, match="MAX_MESSAGE_BYTES"):
        decode_message(b"\xc0" * (MAX_MESSAGE_BYTES + 1))
    with pytest.raises(CodecError, match="MAX_MESSAGE_BYTES"):
        decode_record(b"\xc0" * (MAX_MESSAGE_BYTES + 1))


def test_oversize_output_is_refused() -> None:
    with pytest.raises(CodecError, match="MAX_MESSAGE_BYTES"):
        encode_message(read_ok(b"x" * MAX_MESSAGE_BYTES))


# ---------------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([1], "list is not a value"),
        (1.5j, "complex is not a value"),
        ({"a": 1}, "dict is not a value"),
        (frozenset(), "frozenset is not a value"),
        (bytearray(b"x"), "bytearray is not a value"),
        (Key(1, "a"), "Key is not a value"),
        (Status.APPLIED, "Status is not a value"),
        ((1, [2]), r"list is not a value"),
    ],
    ids=repr,
)
def test_values_without_a_wire_form_are_refused(value: object, problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        encode_message(read_ok(value))


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (HlcFloor(1), "HlcFloor is not a message"),
        (object(), "object is not a message"),
        (Envelope(1, 2, Envelope(1, 2, CommitOk(1, TS))), "Envelope is not a message"),  # type: ignore[arg-type]
        (Nack(1, TS, TS, 40), "expected Status, got int"),  # type: ignore[arg-type]
        (CommitOk(True, TS), "expected int, got bool"),
        (CommitOk(1, (1, 2, 3, 4)), "expected Timestamp, got tuple"),  # type: ignore[arg-type]
        (AcceptOk(1, TS, {}), "expected Deps, got dict"),  # type: ignore[arg-type]
        (ReadOk(1, TS, [(KEY, 1)]), "expected tuple, got list"),  # type: ignore[arg-type]
        (ReadOk(1, TS, ((KEY, 1, 2),)), "pair"),  # type: ignore[arg-type]
        (ReadOk(1, TS, (((42, "k"), 1),)), "expected Key, got tuple"),  # type: ignore[arg-type]
    ],
    ids=lambda o: type(o).__name__ if not isinstance(o, str) else o,
)
def test_objects_without_a_wire_form_are_refused(obj: object, problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        encode_message(obj)  # type: ignore[arg-type]


def test_messages_are_not_records_and_records_are_not_messages() -> None:
    with pytest.raises(CodecError, match="is not a journal record"):
        encode_record(CommitOk(1, TS))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="belongs to CommitOk, which is not a journal record"):
        decode_record(encode_message(CommitOk(1, TS)))
    with pytest.raises(CodecError, match="belongs to HlcFloor, which is not a message"):
        decode_message(encode_record(HlcFloor(1)))


def test_encode_errors_name_the_path() -> None:
    txn = Txn((KEY,), Update((Put(KEY, BinOp("+", ReadOf(KEY), Const(1.5j))),)))
    with pytest.raises(CodecError, match=r"complex .*at PreAccept\.txn\.update\.writes\[0\]"):
        encode_message(PreAccept(1, TS, txn, ROUTE))


# ---------------------------------------------------------------------------- malformed input


def valid_wire() -> list[Any]:
    return unpack(
        encode_message(
            Envelope(1, 2, Apply(9, TS, TXN, ROUTE, TS, Deps(), (), TxnResult((), True)))
        )
    )


def at(path: tuple[int, ...], replacement: object) -> bytes:
    wire = valid_wire()
    target = wire
    for index in path[:-1]:
        target = target[index]
    target[path[-1]] = replacement
    return pack(wire)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty input"),
        (b"\xc1", "malformed msgpack"),
        (b"\x92\x01", "incomplete"),
        (pack(None), "expected a message .an array., got NoneType"),
        (pack({"a": 1}), "got dict"),
        (pack({1: 1}), "malformed msgpack"),  # strict_map_key
        (pack([]), "integer tag, got nothing"),
        (pack(["PreAccept"]), "integer tag, got str"),
        (pack([True]), "integer tag, got bool"),
        (pack([10.0]), "integer tag, got float"),
        (pack([99]), "unknown message tag 99"),
        (pack([-1]), "unknown message tag -1"),
        (pack([100]), "belongs to CommandSnapshot"),
        (pack([34, 1]), "CommitOk of 2 elements, got 1"),
        (pack([34, 1, [1, 2, 3, 4], 5]), "CommitOk of 2 elements, got 3"),
        (pack([34, 1, [1, 2, 3]]), r"Timestamp of 4 elements, got 3 \(at CommitOk.txn_id\)"),
        (pack([34, "1", [1, 2, 3, 4]]), r"expected int, got str \(at CommitOk.cid\)"),
        (pack([34, 1, [1, 2, 3, None]]), "expected int, got NoneType"),
        (pack([31, 1, [1, 2, 3, 4], [1, 2, 3, 4], 41]), "unknown status 41"),
        (pack([31, 1, [1, 2, 3, 4], [1, 2, 3, 4], True]), "expected int, got bool"),
        (b"\x93\x22\x01\xa1\xff", "malformed msgpack"),  # invalid UTF-8
        (pack([36, 1, [1, 2, 3, 4], [[[1, "k"], 2**64 - 1]]]), "does not fit in a signed 64-bit"),
        (pack([36, 1, [1, 2, 3, 4], [[[1, "k"], msgpack.ExtType(5, b"")]]]), "ExtType"),
        (pack([36, 1, [1, 2, 3, 4], [[[1, "k"], {"a": 1}]]]), "dict is not a value"),
        (pack([32, 1, [1, 2, 3, 4], [[[1, "k"], []], [[1, "k"], []]]]), "appears twice"),
        (
            pack([ENVELOPE_TAG, 1, 2, [ENVELOPE_TAG, 1, 2, [34, 1, [1, 2, 3, 4]]]]),
            "belongs to Envelope",
        ),
        (pack([ENVELOPE_TAG, 1, 2]), "Envelope of 3 elements"),
        (pack([34, 1, [1, 2, 3, 4]]) + b"\x00", "trailing bytes"),
    ],
    ids=lambda o: o if isinstance(o, str) else None,
)
def test_malformed_input_is_a_codec_error_naming_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(CodecError, match=problem):
        decode_message(data)


@pytest.mark.parametrize(
    ("path", "replacement", "problem"),
    [
        # The wire is [1, src, dest, [14, cid, txn_id, txn, route, execute_at, deps, writes,
        # result]]; a txn is [reads, [writes, condition]] and a Put is [0, key, expr].
        ((3, 4, 1), [[1, "k"], 5], r"expected Key \(an array\), got int .*Apply.route.keys\[1\]"),
        ((3, 4, 0), [2, "other"], r"invalid Route: home key other is not a participant"),
        ((3, 4, 1), [], r"invalid Route: a route needs at least one key"),
        (
            (3, 4),
            None,
            r"expected Route \(an array\), got NoneType \(at Envelope.body.Apply.route\)",
        ),
        ((3, 3), [[], None], r"invalid Txn: a transaction must read or write"),
        ((3, 3, 1, 0, 0, 2, 1), 9, r"unknown operator code 9"),
        ((3, 3, 1, 0, 0, 2), [99, 1], r"unknown expression kind 99"),
        ((3, 3, 1, 0, 0, 2), [], r"integer tag, got nothing"),
        ((3, 3, 1, 0, 0), [99, [1, "k"]], r"unknown write kind 99"),
        ((3, 3, 1, 0, 0, 2), [3, [0, 1], "0"], r"expected int, got str .*value.index\)"),
        ((3, 3, 1, 0, 0, 2), [3, [0, 1]], r"expected Item of 3 elements"),
        ((3, 3, 1, 0, 0, 2), [4, None], r"expected items \(an array\), got NoneType"),
        ((3, 3, 1, 0, 0, 2), [4, [[9]]], r"unknown expression kind 9 .*value.items\[0\]\)"),
        ((3, 3, 1, 1), [[6, [0, 1], [0, 1]]], r"invalid Predicate: comparison 'is_null'"),
        ((3, 3, 1, 1), [[0, [0, 1], None]], r"invalid Predicate: comparison '='"),
        ((3, 3, 1, 1), [[8, [0, 1], None]], r"unknown comparison code 8"),
        ((3, 8, 2), b"no", r"expected str, got bytes \(at Envelope.body.Apply.result.error\)"),
        ((3, 8, 1), 1, r"expected bool, got int \(at Envelope.body.Apply.result.applied\)"),
        ((3, 6), [[[1, "k"], [[1, 2, 3]]]], r"Timestamp of 4 elements.*Apply.deps\[0\]\[0\]"),
    ],
)
def test_malformed_fields_are_codec_errors_naming_the_field(
    path: tuple[int, ...], replacement: object, problem: str
) -> None:
    with pytest.raises(CodecError, match=problem):
        decode_message(at(path, replacement))


def test_non_bytes_input_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="expected bytes, got str"):
        decode_message("\x91\x01")  # type: ignore[arg-type]


@given(st.one_of(messages, envelopes))
@SLOW
def test_every_truncation_is_a_codec_error(message: object) -> None:
    data = encode_message(message)  # type: ignore[arg-type]
    for end in range(len(data)):
        with pytest.raises(CodecError):
            decode_message(data[:end])


@given(journal_records)
@SLOW
def test_every_truncated_record_is_a_codec_error(
    record: CommandSnapshot | HlcFloor | Durable,
) -> None:
    data = encode_record(record)
    for end in range(len(data)):
        with pytest.raises(CodecError):
            decode_record(data[:end])


def decodes_or_codec_error(data: bytes) -> None:
    """Malformed input may only raise CodecError; anything accepted must re-encode."""
    for decode, encode in ((decode_message, encode_message), (decode_record, encode_record)):
        try:
            decoded = decode(data)
        except CodecError:
            continue
        assert identical(decode(encode(decoded)), decoded)  # type: ignore[operator]


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_codec_error(data: bytes) -> None:
    decodes_or_codec_error(data)


@given(st.one_of(messages, envelopes), st.data())
@SLOW
def test_corrupted_bytes_decode_or_raise_codec_error(message: object, data: st.DataObject) -> None:
    encoded = bytearray(encode_message(message))  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    decodes_or_codec_error(bytes(encoded))


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.lists(st.integers(-1, 50), max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(-(2**63), 2**64 - 1), max_size=2),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
)


def array_paths(wire: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths to every array (including the root) inside an unpacked wire value."""
    if not isinstance(wire, list):
        return []
    found = [prefix]
    for index, item in enumerate(wire):
        found.extend(array_paths(item, (*prefix, index)))
    return found


@given(st.one_of(messages, envelopes, journal_records), st.data())
@SLOW
def test_structurally_mutated_input_decodes_or_raises_codec_error(
    obj: object, data: st.DataObject
) -> None:
    """Wrong types, wrong field counts and wrong tags anywhere in a valid message."""
    is_record = isinstance(obj, CommandSnapshot | HlcFloor | Durable)
    wire = unpack(encode_record(obj) if is_record else encode_message(obj))  # type: ignore[arg-type]
    array = wire
    for index in data.draw(st.sampled_from(array_paths(wire))):
        array = array[index]
    mutation = data.draw(st.sampled_from(["replace", "delete", "append"]))
    if mutation == "append" or not array:
        array.append(data.draw(junk))
    elif mutation == "delete":
        del array[data.draw(st.integers(0, len(array) - 1))]
    else:
        array[data.draw(st.integers(0, len(array) - 1))] = data.draw(junk)
    decodes_or_codec_error(pack(wire))
