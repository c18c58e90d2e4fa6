"""Client API <-> Accord transactions: the only place client protobuf meets accord types.

A ``TransactRequest`` becomes one :class:`accord.Txn`:

* each ``LET name = row`` reads that row's key; the row's value inside the protocol is the
  tuple of its regular columns (table order), ``None`` when absent;
* ``name.column`` is ``Item(ReadOf(key), column_index)``;
* an upsert is ``Put(key, MakeTuple(columns))`` where unassigned columns keep their current
  value (``Item(ReadOf(key), i)``, which makes the row part of the read set);
* a delete is ``Delete(key)``; conditions are AND-ed predicates.

Everything a client can get wrong is checked here, before the protocol sees it, and
reported as :class:`RequestError` naming the problem: unknown keyspace, table, column or LET
name, wrong value types (literals are checked against the column they are compared with or
assigned to), arithmetic on anything but integers, a column value that might not fit the
column it is copied into, oversize requests and keys, a row both deleted and upserted.

Why so strict: a transaction's writes are computed after it commits, and Cassandra refuses a
value its column cannot hold. A refused write cannot be dropped (replicas would diverge) nor
completed, so every replica would retry it forever and block the rows behind it. What cannot
be checked here, an integer computed for a column narrower than bigint, is range-checked by
guard predicates inside the transaction: out of range, the transaction fails with an error
and writes nothing, on every replica alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from accord import (
    BINARY_OPERATORS,
    COMPARE_OPERATORS,
    BinOp,
    Const,
    Delete,
    Expr,
    Item,
    Key,
    MakeTuple,
    Predicate,
    Put,
    ReadOf,
    Txn,
    TxnResult,
    Update,
)
from accord_cassandra.schema import (
    INT_TYPES,
    TEXT_TYPES,
    Catalog,
    SchemaError,
    TableSchema,
    check_type,
)
from accord_cassandra.v1 import client_pb2 as pb

MAX_LETS = 64
MAX_MUTATIONS = 64
MAX_CONDITIONS = 64
MAX_EXPR_DEPTH = 16
MAX_REQUEST_BYTES = 1024 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class RequestError(ValueError):
    """The client sent a request that cannot become a transaction."""


def value_from_proto(value: pb.Value) -> object:
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    return getattr(value, kind)


def value_to_proto(value: object) -> pb.Value:
    if value is None:
        return pb.Value(null=True)
    if isinstance(value, bool):
        return pb.Value(boolean=value)
    if isinstance(value, int):
        return pb.Value(int=value)
    if isinstance(value, str):
        return pb.Value(text=value)
    if isinstance(value, bytes):
        return pb.Value(blob=value)
    if isinstance(value, uuid.UUID):
        return pb.Value(text=str(value))
    raise RequestError(f"no client representation for {type(value).__name__}")


class _Builder:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.lets: dict[str, tuple[TableSchema, Key]] = {}

    def row(self, ref: pb.RowRef) -> tuple[TableSchema, Key]:
        if not ref.keyspace or not ref.table:
            raise RequestError("a row reference needs a keyspace and a table")
        table = self.catalog.table(ref.keyspace, ref.table)
        return table, table.key([value_from_proto(v) for v in ref.partition_key])

    def column(self, ref: pb.ColumnRef) -> tuple[Expr, str]:
        found = self.lets.get(ref.let)
        if found is None:
            raise RequestError(f"unknown LET name {ref.let!r}")
        table, key = found
        index = table.column_index(ref.column)
        return Item(ReadOf(key), index), table.columns[index][1]

    def expr(
        self, expr: pb.Expr, expected_type: str | None, where: str, depth: int = 0
    ) -> tuple[Expr, str | None]:
        if depth > MAX_EXPR_DEPTH:
            raise RequestError(f"{where}: expression nested deeper than {MAX_EXPR_DEPTH}")
        kind = expr.WhichOneof("kind")
        if kind == "literal":
            value = value_from_proto(expr.literal)
            if expected_type is not None:
                value = check_type(where, expected_type, value)
            return Const(value), expected_type
        if kind == "column":
            return self.column(expr.column)
        if kind == "binary":
            op = expr.binary.op
            if op not in ("+", "-") or op not in BINARY_OPERATORS:
                raise RequestError(f"{where}: unknown operator {op!r} (use + or -)")
            # Operands are computed in int64 whatever the column: `small + 200` may fit a
            # tinyint column though 200 does not; the result's range is guarded instead.
            # Arithmetic on anything but integers would only fail at execution, after the
            # transaction committed; refuse it while the client can still fix it.
            left, left_type = self.expr(expr.binary.left, _widen(expected_type), where, depth + 1)
            _check_integer_operand(expr.binary.left, left_type, op, where)
            right, right_type = self.expr(
                expr.binary.right, _widen(left_type or expected_type), where, depth + 1
            )
            _check_integer_operand(expr.binary.right, right_type, op, where)
            return BinOp("+" if op == "+" else "-", left, right), left_type or right_type
        raise RequestError(f"{where}: empty expression")

    def condition(self, condition: pb.Condition, index: int) -> Predicate:
        where = f"condition {index} ({_describe(condition.left)})"
        if condition.op not in COMPARE_OPERATORS:
            raise RequestError(f"{where}: unknown comparison {condition.op!r}")
        left, left_type = self.expr(condition.left, None, where)
        if condition.op in ("is_null", "not_null"):
            if condition.HasField("right"):
                raise RequestError(f"{where}: {condition.op} takes no right-hand side")
            return Predicate(condition.op, left)  # type: ignore[arg-type]
        if not condition.HasField("right"):
            raise RequestError(f"{where}: {condition.op} needs a right-hand side")
        right, right_type = self.expr(condition.right, left_type, where)
        if left_type is None and right_type is not None:
            # Only literals on the left: check them against the column on the right.
            left, left_type = self.expr(condition.left, right_type, where)
        if left_type is None and right_type is None:
            # Literals on both sides: their own types must agree, or the comparison fails
            # only when it is evaluated, after the transaction committed.
            left_type, right_type = _literal_type(condition.left), _literal_type(condition.right)
        if (
            left_type is not None
            and right_type is not None
            and _family(left_type) != _family(right_type)
        ):
            raise RequestError(
                f"{where}: cannot compare {left_type} with {right_type} "
                f"({_describe(condition.right)})"
            )
        return Predicate(condition.op, left, right)  # type: ignore[arg-type]


def _literal_type(expr: pb.Expr) -> str | None:
    """The CQL type a literal-only expression has by itself; None for null."""
    kind = expr.WhichOneof("kind")
    if kind == "binary":
        return "bigint"  # + and - take integers only (_check_integer_operand)
    if kind != "literal":
        return None
    value = value_from_proto(expr.literal)
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    return "text" if isinstance(value, str) else "blob"


def _widen(cql_type: str | None) -> str | None:
    return "bigint" if cql_type in INT_TYPES else cql_type


def _describe(expr: pb.Expr) -> str:
    """An expression as the client wrote it, for error messages."""
    kind = expr.WhichOneof("kind")
    if kind == "column":
        return f"{expr.column.let}.{expr.column.column}"
    if kind == "literal":
        return repr(value_from_proto(expr.literal))
    if kind == "binary":
        left, right = _describe(expr.binary.left), _describe(expr.binary.right)
        return f"{left} {expr.binary.op} {right}"
    return "an empty expression"


def _check_integer_operand(operand: pb.Expr, operand_type: str | None, op: str, where: str) -> None:
    kind = operand.WhichOneof("kind")
    if kind == "literal":
        value = value_from_proto(operand.literal)
        if not isinstance(value, int) or isinstance(value, bool):
            raise RequestError(f"{where}: {op} needs integers; got {value!r}")
    elif kind == "column" and operand_type is not None and operand_type not in INT_TYPES:
        raise RequestError(f"{where}: {op} needs integers; {_describe(operand)} is {operand_type}")


class Translation(NamedTuple):
    """A request as an Accord transaction."""

    txn: Txn
    # The key of each LET name.
    lets: dict[str, Key]
    # Columns narrower than 64 bits assigned a computed value, e.g. "shop.items.qty (int)":
    # such a value is range-checked at execution (see _range_guards).
    range_checked: tuple[str, ...] = ()


def to_txn(request: pb.TransactRequest, catalog: Catalog) -> Translation:
    """The Accord transaction for ``request``, with the key of each LET name."""
    if request.ByteSize() > MAX_REQUEST_BYTES:
        raise RequestError(f"request of {request.ByteSize()} bytes exceeds {MAX_REQUEST_BYTES}")
    for what, count, limit in (
        ("LETs", len(request.lets), MAX_LETS),
        ("mutations", len(request.mutations), MAX_MUTATIONS),
        ("conditions", len(request.conditions), MAX_CONDITIONS),
    ):
        if count > limit:
            raise RequestError(f"{count} {what} exceed the limit of {limit}")
    builder = _Builder(catalog)
    try:
        for let in request.lets:
            if not let.name:
                raise RequestError("a LET needs a name")
            if let.name in builder.lets:
                raise RequestError(f"LET name {let.name!r} is used twice")
            builder.lets[let.name] = builder.row(let.row)
        predicates = tuple(builder.condition(c, i) for i, c in enumerate(request.conditions))
        writes, guards, checked = _writes(request, builder)
        reads = tuple(sorted({key for _, key in builder.lets.values()}))
        if not reads and not writes:
            raise RequestError("a transaction must read (LET) or write at least one row")
        # The client's conditions come first: when one fails the result is a plain "not
        # applied", and only a transaction that would write evaluates the range guards.
        condition = predicates + guards
        update = Update(writes, condition) if writes or condition else None
        txn = Txn(reads=reads, update=update)
    except SchemaError as error:
        raise RequestError(str(error)) from None
    return Translation(txn, {name: key for name, (_, key) in builder.lets.items()}, checked)


def _describe_row(ref: pb.RowRef) -> str:
    values = ", ".join(repr(value_from_proto(v)) for v in ref.partition_key)
    return f"{ref.keyspace}.{ref.table}[{values}]"


def _writes(
    request: pb.TransactRequest, builder: _Builder
) -> tuple[tuple[Put | Delete, ...], tuple[Predicate, ...], tuple[str, ...]]:
    writes: dict[Key, Put | Delete] = {}
    guards: list[Predicate] = []
    checked: list[str] = []
    for index, mutation in enumerate(request.mutations):
        table, key = builder.row(mutation.row)
        if key in writes:
            raise RequestError(
                f"mutation {index}: row {_describe_row(mutation.row)} is mutated twice"
            )
        kind = mutation.WhichOneof("kind")
        if kind == "delete":
            writes[key] = Delete(key)
            continue
        if kind != "upsert":
            raise RequestError(f"mutation {index}: neither upsert nor delete")
        assigned: dict[int, Expr] = {}
        for assignment in mutation.upsert.set:
            where = f"mutation {index}: {table.qualified}.{assignment.column}"
            column_index = table.column_index(assignment.column)
            if column_index in assigned:
                raise RequestError(f"{where} is set twice")
            column_type = table.columns[column_index][1]
            expr, inferred = builder.expr(assignment.value, column_type, where)
            computed = assignment.value.WhichOneof("kind") == "binary"
            if inferred is not None and not _assignable(inferred, column_type, computed):
                raise RequestError(
                    f"{where} is {column_type}; the expression "
                    f"({_describe(assignment.value)}) computes {inferred}"
                )
            if computed and INT_TYPES.get(column_type, 64) < 64:
                guards.extend(_range_guards(expr, INT_TYPES[column_type]))
                checked.append(f"{table.qualified}.{assignment.column} ({column_type})")
            assigned[column_index] = expr
        if not assigned:
            raise RequestError(f"mutation {index}: an upsert must set at least one column")
        row = tuple(assigned.get(i, Item(ReadOf(key), i)) for i in range(len(table.columns)))
        writes[key] = Put(key, MakeTuple(row))
    return tuple(writes[k] for k in sorted(writes)), tuple(guards), tuple(checked)


def _assignable(source: str, target: str, computed: bool) -> bool:
    """Whether every value of type ``source`` is a valid ``target`` value.

    Cassandra refuses a value that does not fit its column, and by then the transaction has
    committed: the write would be retried forever. So a column may take another column's
    value only when it always fits (ascii into text, int into bigint, never the reverse).
    Computed integers are the exception: they are range-checked at execution instead.
    """
    if source in INT_TYPES and target in INT_TYPES:
        return computed or INT_TYPES[source] <= INT_TYPES[target]
    if source in TEXT_TYPES and target in TEXT_TYPES:
        return target != "ascii" or source == "ascii"
    return source == target


def _range_guards(expr: Expr, bits: int) -> tuple[Predicate, Predicate]:
    """Predicates that hold when ``expr`` fits a ``bits``-wide signed integer and make the
    transaction fail deterministically (no writes, an error result) when it does not.

    Accord's expressions have no range check of their own but do refuse any result outside
    int64, so shifting the value by the headroom between the column's bound and int64's
    overflows exactly when the value is out of the column's range.
    """
    high, low = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    return (
        Predicate("<=", BinOp("+", expr, Const(INT64_MAX - high)), Const(INT64_MAX)),
        Predicate(">=", BinOp("-", expr, Const(low - INT64_MIN)), Const(INT64_MIN)),
    )


def _family(cql_type: str) -> str:
    if cql_type in INT_TYPES:
        return "int"
    return "text" if cql_type in TEXT_TYPES else cql_type


def to_response(
    txn_id: str,
    result: TxnResult,
    lets: Mapping[str, Key],
    catalog: Catalog,
    *,
    range_checked: Sequence[str] = (),
) -> pb.TransactResponse:
    error = result.error or ""
    if error and range_checked and "overflows" in error:
        # A range guard (or a genuine int64 overflow) failed: name the columns it protects.
        error += f"; or a computed value is outside its column's range: {', '.join(range_checked)}"
    response = pb.TransactResponse(txn_id=txn_id, applied=result.applied, error=error)
    for name in sorted(lets):
        key = lets[name]
        table = catalog.for_key(key)
        value = result.read(key)
        row = pb.Row(let=name, exists=value is not None)
        if isinstance(value, tuple):
            for (column, _), cell in zip(table.columns, value, strict=False):
                row.columns.append(pb.Column(name=column, value=value_to_proto(cell)))
        response.rows.append(row)
    return response
