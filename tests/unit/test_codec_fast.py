"""The msgspec fast path of accord.codec agrees with the walk it replaced, byte for byte.

``accord.codec.walk`` is the codec as it was before msgspec: it still names every problem,
and it is the reference here. Whatever the fast path accepts, the walk accepts as the
identical value; whatever either refuses is the walk's CodecError, word for word.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, cast

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import envelopes, identical, journal_records, messages

from accord import codec
from accord.api import Durable, HlcFloor
from accord.codec import ENVELOPE_TAG, CodecError, walk
from accord.local.command import CommandSnapshot
from accord.messages import Apply, Commit, Envelope, PreAccept, PreAcceptOk
from accord.primitives import (
    BinOp,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Deps,
    Item,
    Key,
    MakeTuple,
    Predicate,
    Put,
    PutRow,
    PutStatic,
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
    WriteScope,
)

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
TS = Timestamp(1, 1_000_000, 1, 3)
KEY = Key(42, "k")
ROUTE = Route(KEY, (KEY,))


def txn(n: int) -> Txn:
    return Txn((KEY,), Update((Put(KEY, BinOp("+", ReadOf(KEY, 0), Const(n))),)))


def outcome(decode: Any, data: bytes) -> tuple[str, object]:
    try:
        return "value", decode(data)
    except CodecError as error:
        return "error", str(error)


def same_outcome(data: bytes) -> None:
    for fast, reference in (
        (codec.decode_message, walk.decode_message),
        (codec.decode_record, walk.decode_record),
    ):
        got, expected = outcome(fast, data), outcome(reference, data)
        assert got[0] == expected[0], (got, expected)
        if got[0] == "value":
            assert identical(got[1], expected[1])
        else:
            assert got == expected


@given(st.one_of(messages, envelopes))
@SLOW
def test_messages_encode_to_the_walks_bytes_and_decode_to_its_values(message: Any) -> None:
    data = walk.encode_message(message)
    assert codec.encode_message(message) == data
    assert identical(codec.decode_message(data), walk.decode_message(data))


@given(journal_records)
@SLOW
def test_records_encode_to_the_walks_bytes_and_decode_to_its_values(record: Any) -> None:
    data = walk.encode_record(record)
    assert codec.encode_record(record) == data
    assert identical(codec.decode_record(data), walk.decode_record(data))


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # what msgpack can pack at all
    st.floats(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.lists(st.integers(-1, 50), max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)


def array_paths(wire: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    if not isinstance(wire, list):
        return []
    found = [prefix]
    for index, item in enumerate(wire):
        found.extend(array_paths(item, (*prefix, index)))
    return found


@given(st.one_of(messages, envelopes, journal_records), st.data())
@SLOW
def test_mutated_input_has_the_walks_outcome(obj: Any, data: st.DataObject) -> None:
    is_record = isinstance(obj, CommandSnapshot | HlcFloor | Durable)
    encoded = codec.encode_record(obj) if is_record else codec.encode_message(obj)
    wire = msgpack.unpackb(encoded, raw=False, strict_map_key=False)
    array = wire
    for index in data.draw(st.sampled_from(array_paths(wire))):
        array = array[index]
    mutation = data.draw(st.sampled_from(["replace", "delete", "append", "swap"]))
    if mutation == "append" or not array:
        array.append(data.draw(junk))
    elif mutation == "delete":
        del array[data.draw(st.integers(0, len(array) - 1))]
    elif mutation == "swap":
        array.reverse()
    else:
        array[data.draw(st.integers(0, len(array) - 1))] = data.draw(junk)
    same_outcome(msgpack.packb(wire, use_bin_type=True))


@given(st.one_of(messages, envelopes), st.data())
@SLOW
def test_corrupted_bytes_have_the_walks_outcome(message: Any, data: st.DataObject) -> None:
    encoded = bytearray(codec.encode_message(message))
    for _ in range(data.draw(st.integers(1, 3))):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    same_outcome(bytes(encoded))


def test_valid_input_never_reaches_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path decides valid input alone (a fast path that always fell back would be
    correct and slow; this is what catches it)."""

    def refuse(*_: object) -> None:
        raise AssertionError("the walk was used")

    result = TxnResult(((KEY, 5),), True)
    samples = [
        Envelope(1, 2, PreAccept(1, TS, txn(1), ROUTE)),
        Envelope(1, 2, Commit(1, TS, TS, Deps({KEY: [TS]}), stable=True, txn=txn(1))),
        Envelope(2, 1, PreAcceptOk(1, TS, TS, Deps({KEY: [TS]}))),
        Envelope(1, 2, Apply(1, TS, txn(1), ROUTE, TS, Deps(), (WriteOp(KEY, 6),), result)),
    ]
    data = [codec.encode_message(m) for m in samples]
    records = [HlcFloor(9), Durable((TS,))]
    record_data = [codec.encode_record(r) for r in records]
    for name in ("encode_message", "decode_message", "encode_record", "decode_record"):
        monkeypatch.setattr(walk, name, refuse)
    assert [codec.encode_message(m) for m in samples] == data
    assert [codec.decode_message(d) for d in data] == samples
    assert [codec.decode_record(d) for d in record_data] == records


def test_caches_never_confuse_two_transactions() -> None:
    # Distinct transactions built and dropped in turn may share an id(); each must still
    # encode as itself, and equal bytes decode to equal transactions.
    for n in range(50):
        message = PreAccept(1, TS, txn(n), ROUTE)
        data = codec.encode_message(message)
        assert data == walk.encode_message(message)
        assert codec.decode_message(data) == message
        assert codec.decode_message(data).txn is codec.decode_message(data).txn  # type: ignore[union-attr]


def test_deps_of_keeps_normal_deps_and_normalises_the_rest() -> None:
    a, b = Timestamp(1, 1, 0, 1), Timestamp(1, 2, 0, 1)
    k1, k2 = Key(1, "a"), Key(2, "b")
    normal = {k1: (a, b), k2: (b,)}
    assert Deps.of(normal) == Deps(normal)
    for odd in ({k2: (b,), k1: (a, b)}, {k1: (b, a)}, {k1: (a, a, b)}, {k1: (), k2: (a,)}):
        assert identical(Deps.of(odd), Deps(odd))


def test_unsorted_deps_on_the_wire_decode_as_the_walk_did() -> None:
    unsorted = [32, 1, list(TS), [[[2, "b"], [list(TS)]], [[1, "a"], [list(TS), list(TS)]]]]
    same_outcome(msgpack.packb(unsorted, use_bin_type=True))
    decoded = codec.decode_message(msgpack.packb(unsorted, use_bin_type=True))
    assert decoded.deps.keys() == (Key(1, "a"), Key(2, "b"))  # type: ignore[union-attr]


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_hostile_nesting_is_a_codec_error_not_a_recursion_error(depth: int) -> None:
    deep = b"\x91" * depth + b"\x01"
    for data in (deep, bytes.fromhex("9422") + b"\x01" + deep):
        with pytest.raises(CodecError):
            codec.decode_message(data)
        with pytest.raises(CodecError):
            codec.decode_record(data)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, True])
def test_timestamp_and_key_fields_outside_signed_64_bits_are_refused(value: object) -> None:
    # msgpack carries unsigned 64-bit integers; only Int64's bounds keep them out of a
    # Timestamp (or a Key's token) on the fast path.
    for wire in (
        [34, 1, [1, value, 3, 4]],
        [ENVELOPE_TAG, 1, 2, [32, 1, [1, 2, 3, 4], [[[value, "k"], [[1, 2, 3, 4]]]]]],
    ):
        data = msgpack.packb(wire, use_bin_type=True)
        with pytest.raises(CodecError, match=r"signed 64-bit|expected int, got bool"):
            codec.decode_message(data)
        same_outcome(data)


def test_an_encode_error_inside_a_part_names_the_whole_path() -> None:
    bad = Txn((KEY,), Update((Put(KEY, Const([1])),)))
    for obj, encode, reference in (
        (Envelope(1, 2, PreAccept(1, TS, bad, ROUTE)), codec.encode_message, walk.encode_message),
        (
            CommandSnapshot(
                TS, Status.PRE_ACCEPTED, bad, ROUTE, TS, TS, None, Deps(), None, None, True, None
            ),
            codec.encode_record,
            walk.encode_record,
        ),
    ):
        with pytest.raises(CodecError) as expected:
            reference(obj)  # type: ignore[operator]
        assert "txn.update.writes[0]" in str(expected.value)
        with pytest.raises(CodecError, match=re.escape(str(expected.value))):
            encode(obj)  # type: ignore[operator]


# A transaction with every kind of expression and write, and values of every kind (floats,
# bytes, tuples nested in clustering keys and bounds), which the walk decodes from lists.
EVERY_KIND = Txn(
    (KEY,),
    Update(
        (
            Put(KEY, MakeTuple((Item(ReadOf(KEY, (1, (2.5, b"x"))), -1), Const(("s", None))))),
            PutRow(KEY, (1, ("a", 2.0)), BinOp("concat", RowOf(KEY, (3,), (1,)), Const((4,))), 60),
            PutStatic(KEY, StaticOf(KEY)),
            DeleteRow(KEY, (b"r", -0.5)),
            DeleteRange(KEY, ((1,),), Bound((2, 3), False), Bound(9.5)),
            DeletePartition(KEY),
            Delete(KEY),
        ),
        (
            Predicate(">", CountOf(Slice(KEY, ("p",), Bound(1), None, True, 10)), Const(0)),
            Predicate("is_null", SliceOf(Slice(KEY, (), None, Bound((b"z",))))),
        ),
    ),
    (BinOp("-", Const(1.5), Const(float("inf"))), Const(True)),
)


def txn_part() -> Any:
    """The codec's part that decodes (and caches) the Txn fields of messages."""
    return codec._FIELDS[Txn][3].__self__


def test_every_kind_of_transaction_decodes_without_the_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    part = txn_part()
    data = walk.encode_message(Envelope(1, 2, PreAccept(1, TS, EVERY_KIND, ROUTE)))
    expected = walk.decode_message(data)
    part.decoded.clear()

    def refuse(*_: object) -> None:
        raise AssertionError("the walk was used")

    monkeypatch.setattr(part, "codec", walk._Codec(refuse, refuse))
    decoded = codec.decode_message(data)
    # identical(): every decoded array is a tuple again, every operator its member.
    assert identical(decoded, expected)
    assert identical(decoded.body.txn, EVERY_KIND)  # type: ignore[union-attr]
    # What arrived is sent and journaled as the bytes it arrived as, with no encoding.
    assert codec.encode_message(decoded) == data


def _pre_accept_wire(txn: Txn) -> list[Any]:
    wire = msgpack.unpackb(
        walk.encode_message(PreAccept(1, TS, txn, ROUTE)), raw=False, strict_map_key=False
    )
    assert isinstance(wire, list)
    return wire


def _first_write_value(wire: list[Any]) -> list[Any]:
    value = wire[3][1][0][0][2]  # PreAccept.txn.update.writes[0].value
    assert isinstance(value, list)
    return value


def _packed(wire: object) -> bytes:
    return msgpack.packb(wire, use_bin_type=True)


def _mutated(edit: Any, txn: Txn | None = None) -> bytes:
    wire = _pre_accept_wire(txn or EVERY_KIND)
    edit(wire)
    return _packed(wire)


NAN_ROW = Txn((KEY,), Update((DeleteRow(KEY, ((1.0,),)),)))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # A trailing field left off, which the struct's default would fill in.
        (_mutated(lambda w: _first_write_value(w)[1][0][1].pop()), "expected ReadOf of 3"),
        (_mutated(lambda w: w[3][1].pop()), "expected Update of 2"),
        # An operator spelled as its symbol rather than its code.
        (
            _mutated(lambda w: w[3][1][0][1][3].__setitem__(1, "+")),
            "unknown operator code '+'",
        ),
        # Values the walk refuses, in a struct field msgspec cannot type.
        (_mutated(lambda w: w[3][1][0][0][2][1][1].__setitem__(1, 2**64 - 1)), "signed 64-bit"),
        (_mutated(lambda w: w[3][1][0][0][2][1][1].__setitem__(1, {"a": 1})), "dict is not"),
        (
            _mutated(lambda w: w[3][1][0][0][2][1][1].__setitem__(1, [[]] * 1)),
            None,  # a list of values is a tuple: accepted by both
        ),
        (
            _mutated(
                lambda w: w[3][1][0][0][2][1][1].__setitem__(
                    1, functools.reduce(lambda inner, _: [inner], range(33), cast("list[Any]", []))
                )
            ),
            "MAX_VALUE_DEPTH",
        ),
        # NaN inside a tuple of a clustering key: seen only once the lists are tuples (a
        # row deleted, unlike a row read, is never checked again as a selection).
        (_mutated(lambda w: w[3][1][0][0][2][0].__setitem__(0, math.nan), NAN_ROW), "NaN"),
    ],
)
def test_transactions_the_fast_path_cannot_vouch_for_have_the_walks_outcome(
    data: bytes, problem: str | None
) -> None:
    same_outcome(data)
    if problem is None:
        codec.decode_message(data)
    else:
        with pytest.raises(CodecError, match=re.escape(problem)):
            codec.decode_message(data)


def test_an_integer_in_a_wider_form_decodes_as_the_walk_decodes_it() -> None:
    txn = Txn((KEY,), Update((Put(KEY, Const(1)),)))
    data = walk.encode_message(PreAccept(1, TS, txn, ROUTE))
    narrow = b"\x92\x00\x01"  # Const(1)
    assert data.count(narrow) == 1
    wide = data.replace(narrow, b"\x92\x00\xd3" + (1).to_bytes(8, "big"))
    same_outcome(wide)
    decoded = codec.decode_message(wide)
    assert identical(decoded, PreAccept(1, TS, txn, ROUTE))
    # Not its encoding, so not what the codec sends for it.
    assert codec.encode_message(decoded) == data


EVERY_WRITE = (
    WriteOp(KEY, (1, (2.5, b"x"), "s", None, True)),
    WriteOp(KEY, None, delete=True),
    WriteOp(KEY, (3,), clustering=(1, ("a", -2.0)), ttl=60),
    WriteOp(KEY, ("static",), scope=WriteScope.STATIC),
    WriteOp(KEY, None, True, WriteScope.RANGE, ((1,),), Bound((2, 3), False), Bound(9.5)),
    WriteOp(KEY, None, delete=True, scope=WriteScope.PARTITION),
)
EVERY_RESULT = TxnResult(((KEY, (1, ("a", b"b"))), (Key(7, "z"), None)), True, None, (2.5, ()))


def _parts() -> list[Any]:
    return [codec._FIELDS[cls][3].__self__ for cls in (Txn, tuple[WriteOp, ...], TxnResult)]


def test_writes_and_results_decode_without_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the walk was used")

    for result in (EVERY_RESULT, TxnResult(((KEY, 1),), False, "no")):
        apply = Apply(1, TS, EVERY_KIND, ROUTE, TS, Deps({KEY: [TS]}), EVERY_WRITE, result)
        data = walk.encode_message(apply)
        expected = walk.decode_message(data)
        with monkeypatch.context() as patch:
            for part in _parts():
                part.decoded.clear()
                patch.setattr(part, "codec", walk._Codec(refuse, refuse))
            decoded = codec.decode_message(data)
            assert identical(decoded, expected)
            assert identical(decoded, apply)
            assert codec.encode_message(decoded) == data


def _apply_wire() -> list[Any]:
    apply = Apply(1, TS, EVERY_KIND, ROUTE, TS, Deps(), EVERY_WRITE, EVERY_RESULT)
    wire = msgpack.unpackb(walk.encode_message(apply), raw=False, strict_map_key=False)
    assert isinstance(wire, list)
    return wire


def _apply_mutated(edit: Any) -> bytes:
    wire = _apply_wire()
    edit(wire)
    return _packed(wire)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # A version-3 field left at its default where the walk would have left it off.
        (_apply_mutated(lambda w: w[7][0].append(0)), None),
        (_apply_mutated(lambda w: w[8].__setitem__(3, [])), None),
        # Fields the version-2 form never leaves off.
        (_apply_mutated(lambda w: w[7][1].pop()), "expected WriteOp of 3 to 8 elements"),
        (_apply_mutated(lambda w: w[8].__delitem__(slice(2, None))), "of 3 to 5 elements"),
        # Values the walk refuses.
        (_apply_mutated(lambda w: w[7][0].__setitem__(1, 2**64 - 1)), "signed 64-bit"),
        (_apply_mutated(lambda w: w[8][0][0].__setitem__(1, {"a": 1})), "dict is not"),
        (_apply_mutated(lambda w: w[8][3].__setitem__(0, [2**63])), "signed 64-bit"),
        # A write's own invariant, on values that were lists when msgspec built them.
        (_apply_mutated(lambda w: w[7][2][4].__setitem__(0, [math.nan])), "NaN"),
        (_apply_mutated(lambda w: w[7][0].append(int(WriteScope.RANGE))), "must be a delete"),
    ],
)
def test_writes_and_results_the_fast_path_cannot_vouch_for_have_the_walks_outcome(
    data: bytes, problem: str | None
) -> None:
    same_outcome(data)
    if problem is None:
        decoded = codec.decode_message(data)
        assert identical(decoded, walk.decode_message(data))
        # Bytes not in the walk's form are never remembered as the decoded value's form.
        assert codec.encode_message(decoded) == walk.encode_message(decoded) != data
    else:
        with pytest.raises(CodecError, match=re.escape(problem)):
            codec.decode_message(data)
