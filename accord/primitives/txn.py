"""Transactions: reads plus a declarative, wire-safe update.

A transaction names the keys it reads and an :class:`Update`: a condition over read values
and writes whose values are expressions over read values. No Python callables ever appear,
so a transaction can be journaled, sent between replicas and re-executed by a recovery
coordinator on another machine with exactly the same outcome.

Values are ``None`` (absent), ``bool``, ``int``, ``str``, ``bytes``, or tuples of values
(lists, for list-append). :func:`execute` is total: an expression that fails to evaluate
(say ``"a" - 1``) yields a deterministic error result with no writes, never an exception
that one replica raises and another does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from accord.invariants import InvalidTransaction
from accord.primitives.keys import Key
from accord.primitives.timestamp import Kind

Value: TypeAlias = object

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


@dataclass(frozen=True, slots=True)
class Const:
    value: Value


@dataclass(frozen=True, slots=True)
class ReadOf:
    """The value read at ``key``, or ``default`` when the key is absent."""

    key: Key
    default: Value = None


@dataclass(frozen=True, slots=True)
class BinOp:
    op: BinaryOperator
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPERATORS:
            raise InvalidTransaction(f"unknown operator {self.op!r}")


@dataclass(frozen=True, slots=True)
class Item:
    """Element ``index`` of a tuple value (a column of a row); None when absent."""

    value: Expr
    index: int


@dataclass(frozen=True, slots=True)
class MakeTuple:
    """A tuple built from expressions (a row of columns)."""

    items: tuple[Expr, ...]


Expr: TypeAlias = Const | ReadOf | BinOp | Item | MakeTuple


@dataclass(frozen=True, slots=True)
class Predicate:
    """``left <op> right``; ``is_null``/``not_null`` take no right-hand side."""

    op: CompareOperator
    left: Expr
    right: Expr | None = None

    def __post_init__(self) -> None:
        if self.op not in COMPARE_OPERATORS:
            raise InvalidTransaction(f"unknown comparison {self.op!r}")
        unary = self.op in ("is_null", "not_null")
        if unary != (self.right is None):
            raise InvalidTransaction(f"comparison {self.op!r} has the wrong number of operands")


@dataclass(frozen=True, slots=True)
class Put:
    key: Key
    value: Expr


@dataclass(frozen=True, slots=True)
class Delete:
    key: Key


Write: TypeAlias = Put | Delete


@dataclass(frozen=True, slots=True)
class Update:
    """Writes applied only when every predicate in ``condition`` holds (AND)."""

    writes: tuple[Write, ...]
    condition: tuple[Predicate, ...] = ()


@dataclass(frozen=True, slots=True)
class WriteOp:
    """A computed write: ``value`` is ignored when ``delete`` is set."""

    key: Key
    value: Value
    delete: bool = False


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What the client sees: the values read, whether the condition held, any error."""

    reads: tuple[tuple[Key, Value], ...]
    applied: bool
    error: str | None = None

    def read(self, key: Key) -> Value:
        for k, v in self.reads:
            if k == key:
                return v
        return None


def _expr_keys(expr: Expr | None, into: set[Key]) -> None:
    if isinstance(expr, ReadOf):
        into.add(expr.key)
    elif isinstance(expr, BinOp):
        _expr_keys(expr.left, into)
        _expr_keys(expr.right, into)
    elif isinstance(expr, Item):
        _expr_keys(expr.value, into)
    elif isinstance(expr, MakeTuple):
        for item in expr.items:
            _expr_keys(item, into)


@dataclass(frozen=True, slots=True)
class Txn:
    """A transaction: the keys it reads (returned to the client) and an optional update."""

    reads: tuple[Key, ...]
    update: Update | None = None
    kind: Kind = field(init=False)
    keys: tuple[Key, ...] = field(init=False)
    read_keys: tuple[Key, ...] = field(init=False)
    write_keys: tuple[Key, ...] = field(init=False)

    def __post_init__(self) -> None:
        needed: set[Key] = set(self.reads)
        writes: set[Key] = set()
        if self.update is not None:
            for predicate in self.update.condition:
                _expr_keys(predicate.left, needed)
                _expr_keys(predicate.right, needed)
            for write in self.update.writes:
                writes.add(write.key)
                if isinstance(write, Put):
                    _expr_keys(write.value, needed)
        if not needed and not writes:
            raise InvalidTransaction("a transaction must read or write at least one key")
        object.__setattr__(self, "kind", Kind.WRITE if writes else Kind.READ)
        object.__setattr__(self, "read_keys", tuple(sorted(needed)))
        object.__setattr__(self, "write_keys", tuple(sorted(writes)))
        object.__setattr__(self, "keys", tuple(sorted(needed | writes)))


class _EvalError(Exception):
    pass


def _evaluate(expr: Expr, values: Mapping[Key, Value]) -> Value:
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, ReadOf):
        value = values.get(expr.key)
        return expr.default if value is None else value
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
    left = _evaluate(expr.left, values)
    right = _evaluate(expr.right, values)
    if expr.op == "concat":
        if not isinstance(left, tuple | type(None)) or not isinstance(right, tuple | type(None)):
            raise _EvalError(
                f"concat needs lists, got {type(left).__name__} and {type(right).__name__}"
            )
        return (left or ()) + (right or ())
    if not _is_number(left) or not _is_number(right):
        raise _EvalError(
            f"{expr.op} needs integers, got {type(left).__name__} and {type(right).__name__}"
        )
    assert isinstance(left, int) and isinstance(right, int)  # narrowed by _is_number
    value = left + right if expr.op == "+" else left - right
    if not INT64_MIN <= value <= INT64_MAX:
        # Values cross the wire and Cassandra as signed 64-bit integers: overflow is a
        # deterministic error result, the same on every replica, never a value no codec takes.
        raise _EvalError(f"{expr.op} overflows a signed 64-bit integer")
    return value


def _depth(value: Value) -> int:
    if not isinstance(value, tuple):
        return 0
    return 1 + max((_depth(item) for item in value), default=0)


def _is_number(value: Value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compare(predicate: Predicate, values: Mapping[Key, Value]) -> bool:
    left = _evaluate(predicate.left, values)
    if predicate.op == "is_null":
        return left is None
    if predicate.op == "not_null":
        return left is not None
    assert predicate.right is not None  # checked in Predicate.__post_init__
    right = _evaluate(predicate.right, values)
    # Equality is type-strict, so True never equals 1 and 1 never equals "1".
    if predicate.op == "=":
        return type(left) is type(right) and left == right
    if predicate.op == "!=":
        return not (type(left) is type(right) and left == right)
    if left is None or right is None or type(left) is not type(right):
        raise _EvalError(f"cannot order {type(left).__name__} against {type(right).__name__}")
    try:
        if predicate.op == "<":
            return bool(left < right)  # type: ignore[operator]
        if predicate.op == "<=":
            return bool(left <= right)  # type: ignore[operator]
        if predicate.op == ">":
            return bool(left > right)  # type: ignore[operator]
        return bool(left >= right)  # type: ignore[operator]
    except TypeError as error:
        raise _EvalError(str(error)) from None


def execute(txn: Txn, values: Mapping[Key, Value]) -> tuple[tuple[WriteOp, ...], TxnResult]:
    """The writes and client result of ``txn`` given the values read at its executeAt.

    Deterministic and total: the same inputs give the same outputs on every machine.
    """
    reads = tuple((key, values.get(key)) for key in txn.reads)
    update = txn.update
    if update is None:
        return (), TxnResult(reads, applied=True)
    try:
        if not all(_compare(p, values) for p in update.condition):
            return (), TxnResult(reads, applied=False)
        writes = tuple(
            WriteOp(w.key, None, delete=True)
            if isinstance(w, Delete)
            else WriteOp(w.key, _evaluate(w.value, values))
            for w in update.writes
        )
    except _EvalError as error:
        return (), TxnResult(reads, applied=False, error=str(error))
    return writes, TxnResult(reads, applied=True)
