"""Transactions: reads plus a declarative, wire-safe update.

A transaction names the keys it reads and an :class:`Update`: a condition over read values
and writes whose values are expressions over read values. No Python callables ever appear,
so a transaction can be journaled, sent between replicas and re-executed by a recovery
coordinator on another machine with exactly the same outcome.

Values are ``None`` (absent), ``bool``, ``int`` (signed 64-bit), ``float`` (IEEE 754 binary64),
``str``, ``bytes``, or tuples of values (lists, for list-append; also the forms a schema
gives collections, tuples and durations). ``bool``, ``int`` and ``float`` are distinct:
``True`` is not ``1`` and ``1`` is not ``1.0`` (:func:`~accord.primitives.rows.same_value`).
Arithmetic takes two integers or two floats; float ``+`` and ``-`` are IEEE 754's,
correctly rounded and so the same on every machine (docs/accord.md). :func:`execute` is
total: an expression that fails to evaluate (say ``"a" - 1``) yields a deterministic error
result with no writes, never an exception that one replica raises and another does not.

A key's value is a partition (:mod:`accord.primitives.rows`): rows by clustering key and a
static row. :class:`ReadOf`, :class:`Put` and :class:`Delete` address the row at clustering
key ``()``, which is the whole partition of a table without clustering columns (and the
only row the simulator and Maelstrom use). :class:`RowOf`, :class:`SliceOf`,
:class:`CountOf` and :class:`StaticOf` read rows, slices and the static row;
:class:`PutRow`, :class:`PutStatic`, :class:`DeleteRow`, :class:`DeleteRange` and
:class:`DeletePartition` write them, with an optional TTL judged as of executeAt: a row
written at executeAt E with TTL t is visible to a transaction at executeAt X iff
``X.hlc < E.hlc + t`` seconds, so two executions of one read never disagree.

Expressions, predicates, writes and updates are frozen ``msgspec.Struct`` s laid out as their
wire form (``array_like``, each kind tagged with its wire code), so :mod:`accord.codec`
decodes a transaction straight into them; they compare and hash field by field like the
frozen dataclasses they were. An operator is held as its :class:`Operator` or
:class:`Comparison` member, whose value is its wire code, whether given so or as its symbol.

Within one transaction every write lands with the same timestamp, so, as in Cassandra, a
range or partition deletion beside a row write it covers wins; two writes of one row keep
the later in ``Update.writes`` order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal, TypeAlias, TypeVar, cast

import msgspec

from accord.invariants import InvalidTransaction
from accord.primitives.keys import Key
from accord.primitives.rows import (
    MAX_TTL_SECONDS,
    Bound,
    Clustering,
    RowAt,
    Selection,
    Slice,
    StaticAt,
    Value,
    _check_bounds,
    _check_clustering,
    _odd_float,
    order_key,
    read_results,
    same_value,
)
from accord.primitives.timestamp import Int64, Kind

_M = TypeVar("_M", bound=IntEnum)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Tuples nest at most this deep on the wire (accord.codec uses the same bound).
MAX_VALUE_DEPTH = 32

BinaryOperator = Literal["+", "-", "concat"]
CompareOperator = Literal["=", "!=", "<", "<=", ">", ">=", "is_null", "not_null"]
BINARY_OPERATORS: frozenset[str] = frozenset({"+", "-", "concat"})
COMPARE_OPERATORS: frozenset[str] = frozenset(
    {"=", "!=", "<", "<=", ">", ">=", "is_null", "not_null"}
)


class Operator(IntEnum):
    """A :class:`BinOp`'s operator. Its value is its wire code (durable: never renumber);
    a ``BinOp`` built from the operator's symbol holds the member."""

    PLUS = 0
    MINUS = 1
    CONCAT = 2

    @property
    def symbol(self) -> BinaryOperator:
        return _OPERATOR_SYMBOLS[self]


class Comparison(IntEnum):
    """A :class:`Predicate`'s comparison; its value is its wire code (never renumber)."""

    EQ = 0
    NE = 1
    LT = 2
    LE = 3
    GT = 4
    GE = 5
    IS_NULL = 6
    NOT_NULL = 7

    @property
    def symbol(self) -> CompareOperator:
        return _COMPARISON_SYMBOLS[self]


_OPERATOR_SYMBOLS: tuple[BinaryOperator, ...] = ("+", "-", "concat")
_COMPARISON_SYMBOLS: tuple[CompareOperator, ...] = (
    "=",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "is_null",
    "not_null",
)
_OPERATORS: dict[object, Operator] = {s: Operator(i) for i, s in enumerate(_OPERATOR_SYMBOLS)}
_COMPARISONS: dict[object, Comparison] = {
    s: Comparison(i) for i, s in enumerate(_COMPARISON_SYMBOLS)
}


def _member(op: object, members: dict[object, _M], what: str) -> _M:
    # A symbol (the API's spelling) or a member (what decoding yields); a bare int is
    # neither, so code and symbol can never be confused.
    if type(op) is str:
        member = members.get(op)
        if member is not None:
            return member
    elif type(op) in (Operator, Comparison) and op in members.values():
        return op  # type: ignore[return-value]
    raise InvalidTransaction(f"unknown {what} {op!r}")


class Const(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=0):
    value: Value


class ReadOf(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=1):
    """The value read at ``key``, or ``default`` when the key is absent."""

    key: Key
    default: Value = None


class BinOp(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=2):
    """``left op right``; ``op`` is given as a symbol (``"+"``) or an :class:`Operator` and
    held as the latter."""

    op: Operator | BinaryOperator
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if type(self.op) is not Operator:
            msgspec.structs.force_setattr(self, "op", _member(self.op, _OPERATORS, "operator"))


class Item(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=3):
    """Element ``index`` of a tuple value (a column of a row); None when absent."""

    value: Expr
    index: Int64


class MakeTuple(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=4):
    """A tuple built from expressions (a row of columns)."""

    items: tuple[Expr, ...]


class RowOf(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=5):
    """The row at ``clustering`` of ``key``'s partition (a tuple of its regular columns), or
    ``default`` when absent."""

    key: Key
    clustering: Clustering = ()
    default: Value = None

    def __post_init__(self) -> None:
        _check_clustering(self.clustering, "a row's clustering key")

    @property
    def selection(self) -> RowAt:
        return RowAt(self.key, self.clustering)


class SliceOf(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=6):
    """The rows of a slice: a tuple of ``(clustering, row)`` pairs in the order asked for."""

    slice: Slice


class CountOf(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=7):
    """How many rows a slice returns (0 when none: ``> 0`` tests existence)."""

    slice: Slice


class StaticOf(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=8):
    """The partition's static row (a tuple of its static columns), or None."""

    key: Key


Expr: TypeAlias = Const | ReadOf | BinOp | Item | MakeTuple | RowOf | SliceOf | CountOf | StaticOf


class Predicate(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """``left <op> right``; ``is_null``/``not_null`` take no right-hand side."""

    op: Comparison | CompareOperator
    left: Expr
    right: Expr | None = None

    def __post_init__(self) -> None:
        op = self.op
        if type(op) is not Comparison:
            op = _member(op, _COMPARISONS, "comparison")
            msgspec.structs.force_setattr(self, "op", op)
        unary = op is Comparison.IS_NULL or op is Comparison.NOT_NULL
        if unary != (self.right is None):
            raise InvalidTransaction(f"comparison {op.symbol!r} has the wrong number of operands")


class Put(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=0):
    key: Key
    value: Expr


class Delete(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=1):
    key: Key


def _check_ttl(ttl: int | None) -> None:
    if ttl is not None and (type(ttl) is not int or not 1 <= ttl <= MAX_TTL_SECONDS):
        raise InvalidTransaction(
            f"TTL {ttl!r} is not a whole number of seconds from 1 to {MAX_TTL_SECONDS}"
        )


class PutRow(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=2):
    """Write every regular column of the row at ``clustering`` (``value``: their tuple);
    with ``ttl``, the row stops being visible ``ttl`` seconds after executeAt."""

    key: Key
    clustering: Clustering
    value: Expr
    ttl: Int64 | None = None

    def __post_init__(self) -> None:
        _check_clustering(self.clustering, "a row's clustering key")
        _check_ttl(self.ttl)


class PutStatic(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=3):
    """Write every static column of the partition (``value``: their tuple)."""

    key: Key
    value: Expr
    ttl: Int64 | None = None

    def __post_init__(self) -> None:
        _check_ttl(self.ttl)


class DeleteRow(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=4):
    key: Key
    clustering: Clustering

    def __post_init__(self) -> None:
        _check_clustering(self.clustering, "a row's clustering key")


class DeleteRange(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=5):
    """Delete the rows a :class:`Slice` with this prefix and these bounds would match."""

    key: Key
    prefix: Clustering = ()
    lower: Bound | None = None
    upper: Bound | None = None

    def __post_init__(self) -> None:
        _check_clustering(self.prefix, "a range delete's clustering prefix")
        _check_bounds(self.lower, self.upper)


class DeletePartition(msgspec.Struct, frozen=True, gc=False, array_like=True, tag=6):
    """Delete every row and the static row."""

    key: Key


Write: TypeAlias = Put | Delete | PutRow | PutStatic | DeleteRow | DeleteRange | DeletePartition


class Update(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Writes applied only when every predicate in ``condition`` holds (AND)."""

    writes: tuple[Write, ...]
    condition: tuple[Predicate, ...] = ()


class WriteScope(IntEnum):
    """What part of a partition a computed write replaces (journaled: never renumber)."""

    ROW = 0  # the row at ``clustering``
    STATIC = 1
    RANGE = 2  # delete only: rows a slice of ``clustering`` (the prefix) and bounds matches
    PARTITION = 3  # delete only


@dataclass(frozen=True, slots=True)
class WriteOp:
    """A computed write: ``value`` is ignored when ``delete`` is set.

    ``WriteOp(key, value)`` writes the row at ``()``, the form every store had before
    partitions held rows.
    """

    key: Key
    value: Value
    delete: bool = False
    scope: WriteScope = WriteScope.ROW
    clustering: Clustering = ()
    lower: Bound | None = None
    upper: Bound | None = None
    ttl: int | None = None

    def __post_init__(self) -> None:
        if self.scope in (WriteScope.RANGE, WriteScope.PARTITION) and not self.delete:
            raise InvalidTransaction(f"a {self.scope.name.lower()} write must be a delete")
        if self.ttl is not None and self.delete:
            raise InvalidTransaction("a delete has no TTL")
        _check_ttl(self.ttl)
        if any(_odd_float(v) for v in self.clustering):
            raise InvalidTransaction("a write's clustering key holds NaN or -0.0")

    @property
    def deletes_partition(self) -> bool:
        """A partition delete, or a range delete with no prefix and no bounds: Cassandra has
        only ``DELETE … WHERE pk = ?`` for the latter, which removes the static row too, so
        every store treats the two alike."""
        return self.scope is WriteScope.PARTITION or (
            self.scope is WriteScope.RANGE
            and not self.clustering
            and self.lower is None
            and self.upper is None
        )


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What the client sees: the values read, whether the condition held, any error.

    A batch's result (:meth:`Txn.batch`) holds one result per part in ``parts``, in the
    parts' order, and nothing else (``applied`` is True: the batch executed)."""

    reads: tuple[tuple[Key, Value], ...]
    applied: bool
    error: str | None = None
    returned: tuple[Value, ...] = ()
    """The values of ``Txn.returns`` (empty when they fail to evaluate)."""
    parts: tuple[TxnResult, ...] = ()
    """Codec version 4: each part's own result, when this is a batch's."""

    def read(self, key: Key) -> Value:
        for k, v in self.reads:
            if k == key:
                return v
        return None


def _expr_selections(expr: Expr | None, into: dict[Selection, None]) -> None:
    # By exact type, constants first: the structs are final, and this runs for every
    # transaction built or decoded.
    kind = type(expr)
    if kind is Const or expr is None:
        return
    if kind is ReadOf:
        into[RowAt(cast("ReadOf", expr).key)] = None
    elif kind is BinOp:
        binop = cast("BinOp", expr)
        _expr_selections(binop.left, into)
        _expr_selections(binop.right, into)
    elif kind is RowOf:
        into[cast("RowOf", expr).selection] = None
    elif kind is SliceOf or kind is CountOf:
        into[cast("SliceOf", expr).slice] = None
    elif kind is StaticOf:
        into[StaticAt(cast("StaticOf", expr).key)] = None
    elif kind is Item:
        _expr_selections(cast("Item", expr).value, into)
    elif kind is MakeTuple:
        for item in cast("MakeTuple", expr).items:
            _expr_selections(item, into)


_VALUE_WRITES: frozenset[type[Write]] = frozenset({Put, PutRow, PutStatic})


MAX_BATCH_PARTS = 256
"""Most parts a batch may hold (checked when one is built and when one is decoded)."""


@dataclass(frozen=True, slots=True)
class Txn:
    """A transaction: the keys whose row at ``()`` it returns to the client (``reads``), an
    optional update, and expressions over what it read whose values it also returns
    (``returns``, evaluated before the update's writes, like a ``LET`` then ``SELECT``).

    Or a batch (:meth:`batch`): client transactions coordinated as one, ``parts``, with no
    reads, update or returns of its own. Its keys and selections are the union of its
    parts'; no part writes a key another part reads or writes, so every order of the
    parts is a serial order at the batch's one executeAt (docs/accord.md, "Batches").
    """

    reads: tuple[Key, ...]
    update: Update | None = None
    returns: tuple[Expr, ...] = ()
    parts: tuple[Txn, ...] = ()
    kind: Kind = field(init=False)
    keys: tuple[Key, ...] = field(init=False)
    read_keys: tuple[Key, ...] = field(init=False)
    write_keys: tuple[Key, ...] = field(init=False)
    selections: tuple[Selection, ...] = field(init=False)
    """Everything the transaction reads, each once, in a deterministic order."""

    def __post_init__(self) -> None:
        if self.parts:
            self._derive_batch(check_disjoint=True)
            return
        needed: dict[Selection, None] = {RowAt(key): None for key in self.reads}
        writes: set[Key] = set()
        for expr in self.returns:
            _expr_selections(expr, needed)
        if self.update is not None:
            for predicate in self.update.condition:
                _expr_selections(predicate.left, needed)
                _expr_selections(predicate.right, needed)
            for write in self.update.writes:
                writes.add(write.key)
                if type(write) in _VALUE_WRITES:
                    _expr_selections(write.value, needed)  # type: ignore[union-attr]
        if not needed and not writes:
            raise InvalidTransaction("a transaction must read or write at least one key")
        read = {selection.key for selection in needed}
        object.__setattr__(self, "kind", Kind.WRITE if writes else Kind.READ)
        object.__setattr__(self, "read_keys", tuple(sorted(read)))
        object.__setattr__(self, "write_keys", tuple(sorted(writes)))
        object.__setattr__(self, "keys", tuple(sorted(read | writes)))
        object.__setattr__(self, "selections", tuple(needed))

    @classmethod
    def batch(cls, parts: tuple[Txn, ...]) -> Txn:
        """``parts`` coordinated as one transaction; InvalidTransaction unless there are 2 to
        :data:`MAX_BATCH_PARTS` of them, none a batch itself, and they are disjoint
        (:func:`disjoint`)."""
        return cls((), None, (), parts)

    @classmethod
    def _overlapping_batch(cls, parts: tuple[Txn, ...]) -> Txn:
        # Only for the planted bug batch_ignores_disjointness (accord/local/bugs.py).
        txn = object.__new__(cls)
        for name, value in (("reads", ()), ("update", None), ("returns", ()), ("parts", parts)):
            object.__setattr__(txn, name, value)
        txn._derive_batch(check_disjoint=False)
        return txn

    def _derive_batch(self, *, check_disjoint: bool) -> None:
        parts = self.parts
        if self.reads or self.update is not None or self.returns:
            raise InvalidTransaction("a batch has no reads, update or returns of its own")
        if not 2 <= len(parts) <= MAX_BATCH_PARTS:
            raise InvalidTransaction(
                f"a batch holds 2 to {MAX_BATCH_PARTS} parts, not {len(parts)}"
            )
        needed: dict[Selection, None] = {}
        read: set[Key] = set()
        writes: set[Key] = set()
        for index, part in enumerate(parts):
            if type(part) is not Txn or part.parts:
                raise InvalidTransaction(f"part {index} of a batch is not a plain transaction")
            if check_disjoint and not disjoint(part, read, writes):
                raise InvalidTransaction(
                    f"part {index} of a batch writes a key another part uses, or uses a key "
                    "another part writes"
                )
            needed.update(dict.fromkeys(part.selections))
            read.update(part.read_keys)
            writes.update(part.write_keys)
        object.__setattr__(self, "kind", Kind.WRITE if writes else Kind.READ)
        object.__setattr__(self, "read_keys", tuple(sorted(read)))
        object.__setattr__(self, "write_keys", tuple(sorted(writes)))
        object.__setattr__(self, "keys", tuple(sorted(read | writes)))
        object.__setattr__(self, "selections", tuple(needed))

    def selections_of(self, keys: tuple[Key, ...]) -> tuple[Selection, ...]:
        """The selections on ``keys`` (what a replica owning them reads)."""
        owned = set(keys)
        return tuple(s for s in self.selections if s.key in owned)


def disjoint(txn: Txn, used: set[Key] | frozenset[Key], written: set[Key] | frozenset[Key]) -> bool:
    """Whether ``txn`` may join a batch whose parts use the keys ``used`` (read or written)
    and write ``written``: it writes none of ``used`` and uses none of ``written``. Reads may
    overlap reads. Then no part sees another's writes nor overwrites what another wrote or
    read, so every order of the parts is a serial order."""
    return used.isdisjoint(txn.write_keys) and written.isdisjoint(txn.keys)


class _EvalError(Exception):
    pass


def _selected(values: Mapping[Key, Value], selection: Selection) -> Value:
    value, error = read_results(values, selection)
    if error is not None:
        raise _EvalError(error)
    return value


def _evaluate(expr: Expr, values: Mapping[Key, Value]) -> Value:
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, ReadOf):
        value = _selected(values, RowAt(expr.key))
        return expr.default if value is None else value
    if isinstance(expr, RowOf):
        value = _selected(values, expr.selection)
        return expr.default if value is None else value
    if isinstance(expr, SliceOf):
        return _selected(values, expr.slice)
    if isinstance(expr, CountOf):
        rows = _selected(values, expr.slice)
        return len(rows) if isinstance(rows, tuple) else 0
    if isinstance(expr, StaticOf):
        return _selected(values, StaticAt(expr.key))
    if isinstance(expr, Item):
        row = _evaluate(expr.value, values)
        if row is None:
            return None
        if not isinstance(row, tuple):
            raise _EvalError(f"item {expr.index} of a {type(row).__name__}, not a tuple")
        return row[expr.index] if -len(row) <= expr.index < len(row) else None
    if isinstance(expr, MakeTuple):
        made = tuple(_evaluate(item, values) for item in expr.items)
        if _depth(made) > MAX_VALUE_DEPTH:
            raise _EvalError(f"a tuple nested deeper than {MAX_VALUE_DEPTH} levels")
        return made
    op = cast("Operator", expr.op).symbol  # a member since BinOp.__post_init__
    left = _evaluate(expr.left, values)
    right = _evaluate(expr.right, values)
    if op == "concat":
        if not isinstance(left, tuple | type(None)) or not isinstance(right, tuple | type(None)):
            raise _EvalError(
                f"concat needs lists, got {type(left).__name__} and {type(right).__name__}"
            )
        return (left or ()) + (right or ())
    if type(left) is float and type(right) is float:
        # IEEE 754 binary64, correctly rounded: the same result on every machine, but for
        # a NaN's sign and payload (x86 and ARM differ), so a NaN result is the one NaN.
        number = left + right if op == "+" else left - right
        return math.nan if math.isnan(number) else number
    if not _is_number(left) or not _is_number(right):
        what = "two integers or two floats" if float in (type(left), type(right)) else "integers"
        raise _EvalError(f"{op} needs {what}, got {type(left).__name__} and {type(right).__name__}")
    assert isinstance(left, int) and isinstance(right, int)  # narrowed by _is_number
    value = left + right if op == "+" else left - right
    if not INT64_MIN <= value <= INT64_MAX:
        # Values cross the wire and Cassandra as signed 64-bit integers: overflow is a
        # deterministic error result, the same on every replica, never a value no codec takes.
        raise _EvalError(f"{op} overflows a signed 64-bit integer")
    return value


def _depth(value: Value) -> int:
    if not isinstance(value, tuple):
        return 0
    return 1 + max((_depth(item) for item in value), default=0)


def _is_number(value: Value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compare(predicate: Predicate, values: Mapping[Key, Value]) -> bool:
    op = cast("Comparison", predicate.op).symbol  # a member since Predicate.__post_init__
    left = _evaluate(predicate.left, values)
    if op == "is_null":
        return left is None
    if op == "not_null":
        return left is not None
    assert predicate.right is not None  # checked in Predicate.__post_init__
    right = _evaluate(predicate.right, values)
    # Equality is type-strict, element by element, so True never equals 1 nor 1 equals 1.0.
    if op == "=":
        return same_value(left, right)
    if op == "!=":
        return not same_value(left, right)
    if left is None or right is None or type(left) is not type(right):
        raise _EvalError(f"cannot order {type(left).__name__} against {type(right).__name__}")
    if type(left) is tuple:
        sign = _tuple_order(left, right)  # type: ignore[arg-type]
        return {"<": sign < 0, "<=": sign <= 0, ">": sign > 0}.get(op, sign >= 0)
    try:
        if op == "<":
            return bool(left < right)  # type: ignore[operator]
        if op == "<=":
            return bool(left <= right)  # type: ignore[operator]
        if op == ">":
            return bool(left > right)  # type: ignore[operator]
        return bool(left >= right)  # type: ignore[operator]
    except TypeError as error:
        raise _EvalError(str(error)) from None


def _tuple_order(left: tuple[Value, ...], right: tuple[Value, ...]) -> int:
    """-1, 0 or 1: tuples element by element, then the shorter first. Each pair must be of
    one kind, as for scalars (Python would order True against 1); floats inside a tuple
    order by ``order_key`` (Double.compare), since Python's tuple comparison treats a NaN
    as equal to itself only when it is the same object."""
    for a, b in zip(left, right, strict=False):
        if type(a) is not type(b):
            raise _EvalError(f"cannot order {type(a).__name__} against {type(b).__name__}")
        if type(a) is tuple:
            sign = _tuple_order(a, b)  # type: ignore[arg-type]
        else:
            ka, kb = order_key(a), order_key(b)
            sign = (ka > kb) - (ka < kb)
        if sign:
            return sign
    return (len(left) > len(right)) - (len(left) < len(right))


def _row_value(value: Value, what: str) -> Value:
    if value is not None and _depth(value) > MAX_VALUE_DEPTH:
        raise _EvalError(f"{what} nests deeper than {MAX_VALUE_DEPTH} levels")
    return value


def _computed(write: Write, values: Mapping[Key, Value]) -> WriteOp:
    if isinstance(write, Put):
        return WriteOp(write.key, _evaluate(write.value, values))
    if isinstance(write, Delete):
        return WriteOp(write.key, None, delete=True)
    if isinstance(write, PutRow):
        value = _row_value(_evaluate(write.value, values), "a row")
        if value is None:
            # Writing nothing is deleting: a TTL on it would mean nothing.
            return WriteOp(write.key, None, delete=True, clustering=write.clustering)
        return WriteOp(write.key, value, clustering=write.clustering, ttl=write.ttl)
    if isinstance(write, PutStatic):
        value = _row_value(_evaluate(write.value, values), "a static row")
        if value is None:
            return WriteOp(write.key, None, delete=True, scope=WriteScope.STATIC)
        return WriteOp(write.key, value, scope=WriteScope.STATIC, ttl=write.ttl)
    if isinstance(write, DeleteRow):
        return WriteOp(write.key, None, delete=True, clustering=write.clustering)
    if isinstance(write, DeleteRange):
        return WriteOp(
            write.key,
            None,
            delete=True,
            scope=WriteScope.RANGE,
            clustering=write.prefix,
            lower=write.lower,
            upper=write.upper,
        )
    return WriteOp(write.key, None, delete=True, scope=WriteScope.PARTITION)


def _last_per_target(writes: list[WriteOp]) -> tuple[WriteOp, ...]:
    # Two writes of one row (or static row) in one transaction: the later wins, on every
    # store alike (they would otherwise share a timestamp and a store would pick by content).
    # Rows told apart type-strictly, as stores key them: (1,) and (1.0,) are two rows.
    seen: dict[tuple[object, ...], int] = {}
    for index, write in enumerate(writes):
        if write.scope in (WriteScope.ROW, WriteScope.STATIC):
            seen[(write.key, write.scope, order_key(write.clustering))] = index
    return tuple(
        write
        for index, write in enumerate(writes)
        if write.scope not in (WriteScope.ROW, WriteScope.STATIC)
        or seen[(write.key, write.scope, order_key(write.clustering))] == index
    )


def execute(txn: Txn, values: Mapping[Key, Value]) -> tuple[tuple[WriteOp, ...], TxnResult]:
    """The writes and client result of ``txn`` given what was read at its executeAt.

    ``values`` maps each read key to its :class:`~accord.primitives.rows.PartitionRead` (or,
    from a store without partitions, to its row at ``()``). Deterministic and total: the
    same inputs give the same outputs on every machine.

    A batch evaluates every part against the same ``values``, each on its own: one part's
    error or false condition never touches another's result or writes. Its writes are the
    parts' in order (disjoint, so no part's write replaces another's).
    """
    if txn.parts:
        writes: list[WriteOp] = []
        results = []
        for part in txn.parts:
            part_writes, result = _execute_one(part, values)
            writes.extend(part_writes)
            results.append(result)
        return _last_per_target(writes), TxnResult((), applied=True, parts=tuple(results))
    return _execute_one(txn, values)


def _execute_one(txn: Txn, values: Mapping[Key, Value]) -> tuple[tuple[WriteOp, ...], TxnResult]:
    try:
        reads = tuple((key, _selected(values, RowAt(key))) for key in txn.reads)
    except _EvalError as error:
        reads = tuple((key, None) for key in txn.reads)
        return (), TxnResult(reads, applied=False, error=str(error))
    try:
        returned = tuple(_evaluate(expr, values) for expr in txn.returns)
    except _EvalError as error:
        return (), TxnResult(reads, applied=False, error=str(error))
    update = txn.update
    if update is None:
        return (), TxnResult(reads, applied=True, returned=returned)
    try:
        if not all(_compare(p, values) for p in update.condition):
            return (), TxnResult(reads, applied=False, returned=returned)
        writes = _last_per_target([_computed(w, values) for w in update.writes])
    except _EvalError as error:
        return (), TxnResult(reads, applied=False, error=str(error), returned=returned)
    return writes, TxnResult(reads, applied=True, returned=returned)
