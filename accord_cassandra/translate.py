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
assigned to), oversize requests, a row both deleted and upserted.
"""

from __future__ import annotations

from collections.abc import Mapping

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
            if expr.binary.op not in ("+", "-") or expr.binary.op not in BINARY_OPERATORS:
                raise RequestError(f"{where}: unknown operator {expr.binary.op!r} (use + or -)")
            left, left_type = self.expr(expr.binary.left, expected_type, where, depth + 1)
            right, right_type = self.expr(
                expr.binary.right, left_type or expected_type, where, depth + 1
            )
            op = "+" if expr.binary.op == "+" else "-"
            return BinOp(op, left, right), left_type or right_type
        raise RequestError(f"{where}: empty expression")

    def condition(self, condition: pb.Condition, index: int) -> Predicate:
        where = f"condition {index}"
        if condition.op not in COMPARE_OPERATORS:
            raise RequestError(f"{where}: unknown comparison {condition.op!r}")
        left, left_type = self.expr(condition.left, None, where)
        if condition.op in ("is_null", "not_null"):
            if condition.HasField("right"):
                raise RequestError(f"{where}: {condition.op} takes no right-hand side")
            return Predicate(condition.op, left)  # type: ignore[arg-type]
        if not condition.HasField("right"):
            raise RequestError(f"{where}: {condition.op} needs a right-hand side")
        right, _ = self.expr(condition.right, left_type, where)
        return Predicate(condition.op, left, right)  # type: ignore[arg-type]


def to_txn(request: pb.TransactRequest, catalog: Catalog) -> tuple[Txn, dict[str, Key]]:
    """The Accord transaction for ``request`` and the key of each LET name."""
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
        writes = _writes(request, builder)
        reads = tuple(sorted({key for _, key in builder.lets.values()}))
        if not reads and not writes:
            raise RequestError("a transaction must read (LET) or write at least one row")
        update = Update(writes, predicates) if writes or predicates else None
        txn = Txn(reads=reads, update=update)
    except SchemaError as error:
        raise RequestError(str(error)) from None
    return txn, {name: key for name, (_, key) in builder.lets.items()}


def _writes(request: pb.TransactRequest, builder: _Builder) -> tuple[Put | Delete, ...]:
    writes: dict[Key, Put | Delete] = {}
    for index, mutation in enumerate(request.mutations):
        table, key = builder.row(mutation.row)
        if key in writes:
            raise RequestError(f"mutation {index}: row {key.name} is mutated twice")
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
            if inferred is not None and _family(inferred) != _family(column_type):
                raise RequestError(f"{where} is {column_type}; the expression computes {inferred}")
            assigned[column_index] = expr
        if not assigned:
            raise RequestError(f"mutation {index}: an upsert must set at least one column")
        row = tuple(assigned.get(i, Item(ReadOf(key), i)) for i in range(len(table.columns)))
        writes[key] = Put(key, MakeTuple(row))
    return tuple(writes[k] for k in sorted(writes))


def _family(cql_type: str) -> str:
    if cql_type in INT_TYPES:
        return "int"
    return "text" if cql_type in TEXT_TYPES else cql_type


def to_response(
    txn_id: str, result: TxnResult, lets: Mapping[str, Key], catalog: Catalog
) -> pb.TransactResponse:
    response = pb.TransactResponse(txn_id=txn_id, applied=result.applied, error=result.error or "")
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
