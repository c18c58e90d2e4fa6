"""Floats in the core, and bool/int/float kept apart (rows.order_key, same_value, execute).

Floats are IEEE 754 binary64: ``+`` and ``-`` are correctly rounded, so every replica
computes the same bits; they order as Java's ``Double.compare`` (Cassandra's order of float
and double clustering values), and ``True``, ``1`` and ``1.0`` are three values.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.codec import decode_message, encode_message
from accord.invariants import InvalidTransaction
from accord.messages import ReadOk
from accord.primitives import (
    BinOp,
    Bound,
    Const,
    Key,
    MemoryPartitions,
    Predicate,
    Put,
    RowAt,
    Slice,
    Timestamp,
    Txn,
    TxnId,
    Update,
    WriteOp,
    execute,
)
from accord.primitives.rows import order_key, same_value

KEY = Key(7, "k")
TS = Timestamp(1, 1_000_000, 0, 1)


def java_double_compare_key(number: float) -> int:
    """Java's ``Double.compare`` as an integer key: ``doubleToLongBits`` (every NaN the
    canonical one) with the sign-magnitude bits flipped into two's-complement order."""
    bits = struct.unpack(">q", struct.pack(">d", math.nan if math.isnan(number) else number))[0]
    return bits if bits >= 0 else bits ^ 0x7FFF_FFFF_FFFF_FFFF


@given(st.floats(), st.floats())
def test_floats_order_as_double_compare(a: float, b: float) -> None:
    ka, kb = java_double_compare_key(a), java_double_compare_key(b)
    assert (order_key(a) < order_key(b)) == (ka < kb)
    assert (order_key(a) == order_key(b)) == (ka == kb)


def test_the_edges_of_the_float_order() -> None:
    mixed = [math.nan, math.inf, 1.0, 0.0, -0.0, -math.inf, -5e-324, 5e-324]
    ordered = sorted(mixed, key=order_key)
    assert [repr(x) for x in ordered] == [
        "-inf", "-5e-324", "-0.0", "0.0", "5e-324", "1.0", "inf", "nan"
    ]  # fmt: skip


def test_bool_int_and_float_are_different_values() -> None:
    assert len({order_key(v) for v in (True, 1, 1.0)}) == 3
    assert not same_value(1, 1.0) and not same_value(True, 1)
    assert not same_value((1,), (1.0,)) and not same_value(((True,),), ((1,),))
    assert same_value((0.0, ("a",)), (-0.0, ("a",)))  # IEEE equality within a kind
    assert not same_value(math.nan, math.nan)


def _holds(predicate: Predicate) -> bool:
    txn = Txn(reads=(), update=Update((Put(KEY, Const(1)),), (predicate,)))
    return execute(txn, {})[1].applied


def test_predicates_are_type_strict_inside_tuples() -> None:
    # Python's == says (1,) == (True,) == (1.0,); a condition must not.
    assert not _holds(Predicate("=", Const((1,)), Const((True,))))
    assert not _holds(Predicate("=", Const((1,)), Const((1.0,))))
    assert _holds(Predicate("!=", Const(((1,), 2)), Const(((1.0,), 2))))
    assert _holds(Predicate("=", Const((1.5, "x")), Const((1.5, "x"))))
    # Ordering tuples is element by element in order_key's order, kinds apart.
    assert _holds(Predicate("<", Const((1, -0.0)), Const((1, 0.0))))
    assert _holds(Predicate("<", Const((math.inf,)), Const((math.nan,))))
    assert _holds(Predicate("<=", Const((math.nan,)), Const((math.nan,))))
    txn = Txn(
        reads=(),
        update=Update((Put(KEY, Const(1)),), (Predicate("<", Const((True,)), Const((2,))),)),
    )
    assert execute(txn, {})[1].error == "cannot order bool against int"


def test_float_arithmetic_is_ieee_and_never_mixes_with_integers() -> None:
    def run(left: object, right: object, op: str = "+") -> tuple[object, str | None]:
        txn = Txn(reads=(KEY,), returns=(BinOp(op, Const(left), Const(right)),))  # type: ignore[arg-type]
        result = execute(txn, {})[1]
        return (result.returned[0] if result.returned else None), result.error

    assert run(0.1, 0.2) == (0.30000000000000004, None)
    assert run(1e308, 1e308) == (math.inf, None)
    assert run(0.5, 0.25, "-") == (0.25, None)
    nan, error = run(math.inf, math.inf, "-")
    assert error is None and isinstance(nan, float) and math.isnan(nan)
    # Whatever NaN the machine makes, the result is the canonical one, bit for bit.
    assert struct.pack(">d", nan) == struct.pack(">d", math.nan)
    for left, right in ((1, 1.0), (1.0, 1), (True, 1.0)):
        value, error = run(left, right)
        assert value is None and error is not None and "two integers or two floats" in error
    txn = Txn(
        reads=(), update=Update((Put(KEY, Const(1)),), (Predicate("<", Const(1), Const(2.0)),))
    )
    assert execute(txn, {})[1].error == "cannot order int against float"


def test_a_float_is_msgpack_float64_on_the_wire_with_its_exact_bits() -> None:
    for number in (1.5, -0.0, math.inf, 5e-324, 0.1):
        data = encode_message(ReadOk(7, TxnId(1, 1, 0, 1), ((KEY, number),)))
        assert b"\xcb" + struct.pack(">d", number) in data
        decoded = decode_message(data)
        assert isinstance(decoded, ReadOk)
        value = decoded.values[0][1]
        assert type(value) is float and struct.pack(">d", value) == struct.pack(">d", number)
    decoded = decode_message(encode_message(ReadOk(7, TxnId(1, 1, 0, 1), ((KEY, (1, 1.0, True)),))))
    assert isinstance(decoded, ReadOk)
    assert [type(v) for v in decoded.values[0][1]] == [int, float, bool]  # type: ignore[union-attr]


def test_nan_and_negative_zero_cannot_name_a_row() -> None:
    for bad in (math.nan, -0.0, ((1, -0.0),)):
        with pytest.raises(InvalidTransaction, match=r"NaN or -0\.0"):
            RowAt(KEY, (bad,))
        with pytest.raises(InvalidTransaction, match=r"NaN or -0\.0"):
            WriteOp(KEY, (1,), clustering=(bad,))
        # Behind values of the kinds most clusterings hold, too.
        with pytest.raises(InvalidTransaction, match=r"NaN or -0\.0"):
            RowAt(KEY, ("a", 1, b"x", True, bad))
    with pytest.raises(InvalidTransaction, match="null clustering value"):
        RowAt(KEY, ("a", 1, None))
    RowAt(KEY, (0.0,))
    RowAt(KEY, ("a", 1, b"x", True, 0.5))


def test_float_clustering_keys_sort_as_double_compare_and_match_strictly() -> None:
    store = MemoryPartitions()
    keys = [2.0, -math.inf, 1e-300, -1.5, math.inf, 0.0]
    store.write([WriteOp(KEY, (k,), clustering=(k,)) for k in keys], TS)
    # A row at the integer 2 or True is another row than the float's.
    store.write([WriteOp(KEY, ("int",), clustering=(2,))], TS)
    later = Timestamp(1, 2_000_000, 0, 1)
    everything = Slice(KEY)
    rows = store.read([everything], later)[KEY].get(everything)
    assert [ck for ck, _ in rows] == [
        (2,),
        (-math.inf,),
        (-1.5,),
        (0.0,),
        (1e-300,),
        (2.0,),
        (math.inf,),
    ]  # type: ignore[union-attr]
    bounded = Slice(KEY, (), Bound(0.0, False), Bound(2.0, True))
    got = store.read([bounded], later)[KEY].get(bounded)
    assert [ck for ck, _ in got] == [(1e-300,), (2.0,)]  # type: ignore[union-attr]
    nested = MemoryPartitions()
    nested.write([WriteOp(KEY, (1,), clustering=((1,), "a"))], TS)
    # A prefix of (True,) does not match a row whose first value is (1,).
    assert nested.read([Slice(KEY, ((True,),))], later)[KEY].get(Slice(KEY, ((True,),))) == ()
    assert len(nested.read([Slice(KEY, ((1,),))], later)[KEY].get(Slice(KEY, ((1,),)))) == 1  # type: ignore[arg-type]
