"""Client API <-> Accord transactions: the only place client protobuf meets accord types.

A ``TransactRequest`` becomes one :class:`accord.Txn`:

* each ``LET name = row`` reads that row's key; the row's value inside the protocol is the
  tuple of its regular columns (table order), ``None`` when absent;
* ``name.column`` is ``Item(ReadOf(key), column_index)``;
* an upsert is ``Put(key, MakeTuple(columns))`` where unassigned columns keep their current
  value (``Item(ReadOf(key), i)``, which makes the row part of the read set);
* a delete is ``Delete(key)``; conditions are AND-ed predicates.

A table with clustering columns (docs/sidecars.md, "Data model and limits"):

* a LET names one row by every clustering value (``RowOf``), or a slice (``SliceOf``: a
  clustering prefix, then bounds on the next clustering column, order, LIMIT); its static
  columns are ``StaticOf``; its rows reach the client through ``Txn.returns``;
* ``count``/``row`` expressions and ``exists``/``not_exists`` conditions test LET rows and
  slices; a column of a slice is allowed only with LIMIT 1 (its first row);
* an upsert is ``PutRow`` of the named row (unassigned columns keep their values) and
  ``PutStatic`` when it sets static columns, with an optional TTL; a delete is
  ``DeleteRow`` (every clustering value), ``DeleteRange`` (a prefix, or ``delete_range``
  bounds) or ``DeletePartition`` (no clustering value, or ``delete_partition``).

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
    MAX_ROWS_PER_SLICE,
    MAX_TTL_SECONDS,
    BinOp,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Expr,
    Item,
    Key,
    MakeTuple,
    Predicate,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    RowOf,
    Slice,
    SliceOf,
    StaticOf,
    Txn,
    TxnResult,
    Update,
)
from accord_cassandra.schema import (
    FLOAT_TYPES,
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


def value_from_proto(value: pb.Value, depth: int = 0) -> object:
    """A client value as the core's: ``elements`` (a collection, tuple, UDT or duration)
    as a tuple, ``float64`` as a float."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "elements":
        if depth >= MAX_EXPR_DEPTH:
            raise RequestError(f"a value nested deeper than {MAX_EXPR_DEPTH}")
        return tuple(value_from_proto(item, depth + 1) for item in value.elements.items)
    return getattr(value, kind)


def value_to_proto(value: object, depth: int = 0) -> pb.Value:
    """A value as the client API carries it; a client's list, tuple, set or frozenset
    becomes ``elements`` (a set's in any order: the sidecar sorts it), a dict the
    ``elements`` of its (key, value) entries."""
    if value is None:
        return pb.Value(null=True)
    if isinstance(value, bool):
        return pb.Value(boolean=value)
    if isinstance(value, int):
        return pb.Value(int=value)
    if isinstance(value, float):
        return pb.Value(float64=value)
    if isinstance(value, str):
        return pb.Value(text=value)
    if isinstance(value, bytes):
        return pb.Value(blob=value)
    if isinstance(value, uuid.UUID):
        return pb.Value(text=str(value))
    if isinstance(value, dict):
        value = tuple(value.items())
    if isinstance(value, tuple | list | set | frozenset):
        if depth >= MAX_EXPR_DEPTH:
            raise RequestError(f"a value nested deeper than {MAX_EXPR_DEPTH}")
        items = [value_to_proto(item, depth + 1) for item in value]
        return pb.Value(elements=pb.ValueList(items=items))
    raise RequestError(f"no client representation for {type(value).__name__}")


_Write = Put | Delete | PutRow | PutStatic | DeleteRow | DeleteRange | DeletePartition


class LetView(NamedTuple):
    """Where a LET's rows are in the result: the legacy row read (``returned`` None), or the
    indices in ``TxnResult.returned`` of its row or slice and of its static row."""

    name: str
    key: Key
    slice: bool
    returned: int | None
    static: int | None


class _Let(NamedTuple):
    table: TableSchema
    key: Key
    clustering: tuple[object, ...]
    slice: Slice | None


class _Builder:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.lets: dict[str, tuple[TableSchema, Key]] = {}
        self.views: dict[str, _Let] = {}

    def row(self, ref: pb.RowRef) -> tuple[TableSchema, Key]:
        if not ref.keyspace or not ref.table:
            raise RequestError("a row reference needs a keyspace and a table")
        table = self.catalog.table(ref.keyspace, ref.table)
        if len(ref.partition_key) != len(table.partition_key):
            names = ", ".join(name for name, _ in table.partition_key)
            raise RequestError(
                f"{table.qualified} has {len(table.partition_key)} partition key column(s) "
                f"({names}): every read or write names a whole partition key; "
                f"got {len(ref.partition_key)} value(s)"
            )
        return table, table.key([value_from_proto(v) for v in ref.partition_key])

    def clustering(self, table: TableSchema, ref: pb.RowRef) -> tuple[object, ...]:
        if ref.clustering and not table.clustering:
            raise RequestError(f"{table.qualified} has no clustering columns")
        return table.check_clustering([value_from_proto(v) for v in ref.clustering], full=False)

    def bounds(
        self, table: TableSchema, prefix: tuple[object, ...], spec: pb.Slice, where: str
    ) -> tuple[Bound | None, Bound | None]:
        if not spec.HasField("lower") and not spec.HasField("upper"):
            if spec.column:
                table.clustering_index(spec.column)
            return None, None
        if not spec.column:
            raise RequestError(f"{where}: a range needs the clustering column it restricts")
        index = table.clustering_index(spec.column)
        if index != len(prefix):
            expected = (
                table.clustering[len(prefix)][0]
                if len(prefix) < len(table.clustering)
                else "none (every clustering value is given)"
            )
            raise RequestError(
                f"{where}: a range on {table.qualified}.{spec.column} needs equality on every "
                f"clustering column before it; the next clustering column is {expected}"
            )
        name, cql_type, _ = table.clustering[index]
        out: list[Bound | None] = []
        for present, bound in (
            (spec.HasField("lower"), spec.lower),
            (spec.HasField("upper"), spec.upper),
        ):
            if not present:
                out.append(None)
                continue
            value = value_from_proto(bound.value)
            if value is None:
                raise RequestError(f"{where}: a bound on {table.qualified}.{name} cannot be null")
            out.append(
                Bound(
                    check_type(table.where(name), cql_type, value, key=True),
                    bound.inclusive,
                )
            )
        return out[0], out[1]

    def let(self, let: pb.Let) -> _Let:
        table, key = self.row(let.row)
        where = f"LET {let.name}"
        clustering = self.clustering(table, let.row)
        if not let.HasField("slice"):
            if len(clustering) != len(table.clustering):
                names = ", ".join(name for name, _, _ in table.clustering)
                raise RequestError(
                    f"{where}: a single row of {table.qualified} needs every clustering column "
                    f"({names}); read several with a slice"
                )
            return _Let(table, key, clustering, None)
        spec = let.slice
        if spec.limit > MAX_ROWS_PER_SLICE:
            raise RequestError(
                f"{where}: LIMIT {spec.limit} exceeds MAX_ROWS_PER_SLICE={MAX_ROWS_PER_SLICE}"
            )
        lower, upper = self.bounds(table, clustering, spec, where)
        part = Slice(key, clustering, lower, upper, spec.reversed, spec.limit or None)
        return _Let(table, key, clustering, part)

    def column(self, ref: pb.ColumnRef) -> tuple[Expr, str]:
        found = self.views.get(ref.let)
        if found is None:
            raise RequestError(f"unknown LET name {ref.let!r}")
        table, key, clustering, part = found
        static = table.static_index(ref.column)
        if static is not None:
            return Item(StaticOf(key), static), table.static[static][1]
        clustered = [name for name, _, _ in table.clustering]
        if part is None and not table.clustering:
            index = table.column_index(ref.column)
            return Item(ReadOf(key), index), table.columns[index][1]
        if part is not None and part.limit != 1:
            raise RequestError(
                f"{ref.let}.{ref.column}: LET {ref.let} is a slice; a column of it needs "
                "LIMIT 1 (use count or exists for more rows)"
            )
        first: Expr = RowOf(key, clustering) if part is None else Item(SliceOf(part), 0)
        if ref.column in clustered:
            position = clustered.index(ref.column)
            cql_type = table.clustering[position][1]
            if part is None:
                return Const(clustering[position]), cql_type
            return Item(Item(first, 0), position), cql_type
        index = table.column_index(ref.column)
        row: Expr = first if part is None else Item(first, 1)
        return Item(row, index), table.columns[index][1]

    def count(self, name: str) -> Expr:
        found = self.views.get(name)
        if found is None:
            raise RequestError(f"unknown LET name {name!r}")
        _, key, clustering, part = found
        return CountOf(part if part is not None else Slice(key, clustering))

    def whole_row(self, name: str, op: str, where: str) -> Predicate:
        found = self.views.get(name)
        if found is None:
            raise RequestError(f"unknown LET name {name!r}")
        table, key, clustering, part = found
        present = op in ("not_null", "exists")
        if part is None:
            row: Expr = ReadOf(key) if not table.clustering else RowOf(key, clustering)
            return Predicate("not_null" if present else "is_null", row)
        return Predicate(">" if present else "=", CountOf(part), Const(0))

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
        if kind == "count":
            return self.count(expr.count), "bigint"
        if kind == "row":
            raise RequestError(
                f"{where}: a whole LET row ({expr.row}) is only for is_null / not_null / "
                "exists / not_exists"
            )
        if kind == "binary":
            op = expr.binary.op
            if op not in ("+", "-") or op not in BINARY_OPERATORS:
                raise RequestError(f"{where}: unknown operator {op!r} (use + or -)")
            # Operands are computed in int64 whatever the column: `small + 200` may fit a
            # tinyint column though 200 does not; the result's range is guarded instead.
            # Arithmetic on anything but integers would only fail at execution, after the
            # transaction committed; refuse it while the client can still fix it.
            left, left_type = self.expr(expr.binary.left, _widen(expected_type), where, depth + 1)
            _check_number_operand(expr.binary.left, left_type, op, where)
            _check_number_operand(expr.binary.right, None, op, where)
            literal = _literal_type(expr.binary.right)
            if left_type and literal and _family(left_type) != _family(literal):
                raise RequestError(
                    f"{where}: {op} of {left_type} and {_describe(expr.binary.right)}: "
                    "integers and floats do not mix"
                )
            right, right_type = self.expr(
                expr.binary.right, _widen(left_type or expected_type), where, depth + 1
            )
            _check_number_operand(expr.binary.right, right_type, op, where)
            kinds = {
                _family(t)
                for t in (
                    left_type or _literal_type(expr.binary.left),
                    right_type or _literal_type(expr.binary.right),
                )
                if t is not None
            }
            if len(kinds) > 1:
                # The core's + and - take two integers or two floats, never one of each.
                raise RequestError(
                    f"{where}: {op} of {left_type} and {right_type}: integers and floats do not mix"
                )
            return BinOp("+" if op == "+" else "-", left, right), left_type or right_type
        raise RequestError(f"{where}: empty expression")

    def condition(self, condition: pb.Condition, index: int) -> Predicate:
        where = f"condition {index} ({_describe(condition.left)})"
        if condition.left.WhichOneof("kind") == "row" or condition.op in ("exists", "not_exists"):
            if condition.op not in ("is_null", "not_null", "exists", "not_exists"):
                raise RequestError(f"{where}: a whole LET row takes is_null/not_null/exists")
            if condition.left.WhichOneof("kind") != "row":
                raise RequestError(f"{where}: {condition.op} takes a whole LET row")
            if condition.HasField("right"):
                raise RequestError(f"{where}: {condition.op} takes no right-hand side")
            return self.whole_row(condition.left.row, condition.op, where)
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
        if condition.op in ("<", "<=", ">", ">=") and any(
            t is not None and not _ordered(t) for t in (left_type, right_type)
        ):
            raise RequestError(
                f"{where}: {condition.op} does not order {left_type or right_type} values "
                "(use = or !=)"
            )
        return Predicate(condition.op, left, right)  # type: ignore[arg-type]


def _literal_type(expr: pb.Expr) -> str | None:
    """The CQL type a literal-only expression has by itself; None for null."""
    kind = expr.WhichOneof("kind")
    if kind == "binary":
        # + and - take two integers or two floats (_check_number_operand).
        return _literal_type(expr.binary.left) or _literal_type(expr.binary.right)
    if kind != "literal":
        return None
    value = value_from_proto(expr.literal)
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if isinstance(value, tuple):
        return "a tuple"
    return "text" if isinstance(value, str) else "blob"


def _widen(cql_type: str | None) -> str | None:
    if cql_type in FLOAT_TYPES:
        return "double"  # computed in binary64; a float column rounds the result
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
    if kind == "count":
        return f"count({expr.count})"
    if kind == "row":
        return expr.row
    return "an empty expression"


def _check_number_operand(operand: pb.Expr, operand_type: str | None, op: str, where: str) -> None:
    kind = operand.WhichOneof("kind")
    if kind == "literal":
        value = value_from_proto(operand.literal)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise RequestError(f"{where}: {op} needs integers or floats; got {value!r}")
    elif (
        kind == "column"
        and operand_type is not None
        and operand_type not in INT_TYPES
        and operand_type not in FLOAT_TYPES
    ):
        raise RequestError(
            f"{where}: {op} needs integers or floats; {_describe(operand)} is {operand_type}"
        )


class Translation(NamedTuple):
    """A request as an Accord transaction."""

    txn: Txn
    # The key of each LET name.
    lets: dict[str, Key]
    # Columns narrower than 64 bits assigned a computed value, e.g. "shop.items.qty (int)":
    # such a value is range-checked at execution (see _range_guards).
    range_checked: tuple[str, ...] = ()
    # Where each LET's rows are in the result (to_response's ``views``).
    views: tuple[LetView, ...] = ()


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
            if let.name in builder.views:
                raise RequestError(f"LET name {let.name!r} is used twice")
            view = builder.let(let)
            builder.views[let.name] = view
            if view.slice is None and not view.table.clustering:
                builder.lets[let.name] = (view.table, view.key)
        predicates = tuple(builder.condition(c, i) for i, c in enumerate(request.conditions))
        writes, guards, checked = _writes(request, builder)
        reads = tuple(sorted({key for _, key in builder.lets.values()}))
        returns: list[Expr] = []
        views = []
        for name, (table, key, clustering, part) in builder.views.items():
            returned = static = None
            if part is not None or table.clustering:
                returned = len(returns)
                returns.append(SliceOf(part) if part is not None else RowOf(key, clustering))
            if table.static:
                static = len(returns)
                returns.append(StaticOf(key))
            views.append(LetView(name, key, part is not None, returned, static))
        if not reads and not writes and not returns:
            raise RequestError("a transaction must read (LET) or write at least one row")
        # The client's conditions come first: when one fails the result is a plain "not
        # applied", and only a transaction that would write evaluates the range guards.
        condition = predicates + guards
        update = Update(writes, condition) if writes or condition else None
        txn = Txn(reads=reads, update=update, returns=tuple(returns))
    except SchemaError as error:
        raise RequestError(str(error)) from None
    return Translation(
        txn,
        {name: view.key for name, view in builder.views.items()},
        checked,
        tuple(views),
    )


def _describe_row(ref: pb.RowRef) -> str:
    values = ", ".join(repr(value_from_proto(v)) for v in ref.partition_key)
    return f"{ref.keyspace}.{ref.table}[{values}]"


def _writes(
    request: pb.TransactRequest, builder: _Builder
) -> tuple[tuple[_Write, ...], tuple[Predicate, ...], tuple[str, ...]]:
    writes: dict[tuple[object, ...], _Write] = {}
    guards: list[Predicate] = []
    checked: list[str] = []

    def add(target: tuple[object, ...], write: _Write, index: int, ref: pb.RowRef) -> None:
        if target in writes:
            raise RequestError(f"mutation {index}: row {_describe_row(ref)} is mutated twice")
        check = builder.catalog.ttl_check
        if isinstance(write, PutRow | PutStatic) and write.ttl is not None and check is not None:
            problem = check(builder.catalog.for_key(write.key), write, False)
            if problem is not None:
                raise RequestError(f"mutation {index}: {problem}")
        writes[target] = write

    for index, mutation in enumerate(request.mutations):
        table, key = builder.row(mutation.row)
        clustering = builder.clustering(table, mutation.row)
        full = len(clustering) == len(table.clustering)
        kind = mutation.WhichOneof("kind")
        ttl = mutation.ttl or None
        if ttl is not None:
            if kind != "upsert":
                raise RequestError(f"mutation {index}: a TTL applies to an upsert only")
            if ttl > MAX_TTL_SECONDS:
                raise RequestError(
                    f"mutation {index}: TTL {ttl} exceeds the maximum {MAX_TTL_SECONDS} s"
                )
        if kind == "delete_partition":
            add((key, "partition"), DeletePartition(key), index, mutation.row)
            continue
        if kind == "delete_range":
            where = f"mutation {index}"
            lower, upper = builder.bounds(table, clustering, mutation.delete_range, where)
            target = (key, "range", clustering, lower, upper)
            add(target, DeleteRange(key, clustering, lower, upper), index, mutation.row)
            continue
        if kind == "delete":
            if not table.clustering:
                add((key, "row", ()), Delete(key), index, mutation.row)
            elif not clustering:
                add((key, "partition"), DeletePartition(key), index, mutation.row)
            elif full:
                add((key, "row", clustering), DeleteRow(key, clustering), index, mutation.row)
            else:
                add(
                    (key, "range", clustering, None, None),
                    DeleteRange(key, clustering),
                    index,
                    mutation.row,
                )
            continue
        if kind != "upsert":
            raise RequestError(f"mutation {index}: neither upsert nor delete")
        assigned: dict[int, Expr] = {}
        statics: dict[int, Expr] = {}
        for assignment in mutation.upsert.set:
            where = f"mutation {index}: {table.qualified}.{assignment.column}"
            static_index = table.static_index(assignment.column)
            if static_index is None and table.is_clustering(assignment.column):
                raise RequestError(
                    f"{where} is a clustering column; name the row by its clustering values"
                )
            column_index = (
                table.column_index(assignment.column) if static_index is None else static_index
            )
            target_map = assigned if static_index is None else statics
            if column_index in target_map:
                raise RequestError(f"{where} is set twice")
            column_type = table.column_type(assignment.column)
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
            target_map[column_index] = expr
        names_a_row = bool(table.clustering) and full
        if not assigned and not statics and not names_a_row:
            # A clustered row may be just its primary key (INSERT of the key columns).
            raise RequestError(f"mutation {index}: an upsert must set at least one column")
        if statics:
            static_row = tuple(
                statics.get(i, Item(StaticOf(key), i)) for i in range(len(table.static))
            )
            add((key, "static"), PutStatic(key, MakeTuple(static_row), ttl), index, mutation.row)
        if not assigned and not (table.clustering and full and clustering):
            continue
        if table.clustering and not full:
            names = ", ".join(name for name, _, _ in table.clustering)
            raise RequestError(
                f"mutation {index}: an upsert of a {table.qualified} row needs every "
                f"clustering column ({names})"
            )
        if not table.clustering:
            row = tuple(assigned.get(i, Item(ReadOf(key), i)) for i in range(len(table.columns)))
            if ttl is None:
                add((key, "row", ()), Put(key, MakeTuple(row)), index, mutation.row)
            else:
                add((key, "row", ()), PutRow(key, (), MakeTuple(row), ttl), index, mutation.row)
            continue
        current = RowOf(key, clustering)
        row = tuple(assigned.get(i, Item(current, i)) for i in range(len(table.columns)))
        add(
            (key, "row", clustering),
            PutRow(key, clustering, MakeTuple(row), ttl),
            index,
            mutation.row,
        )
    ordered = sorted(writes.items(), key=lambda item: (item[0][0], str(item[0][1:])))
    return tuple(write for _, write in ordered), tuple(guards), tuple(checked)


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
    if source in FLOAT_TYPES and target in FLOAT_TYPES:
        # Every double fits a float column, rounded to binary32 as CQL rounds a literal.
        return True
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
    if cql_type in FLOAT_TYPES:
        return "float"
    return "text" if cql_type in TEXT_TYPES else cql_type


def _ordered(cql_type: str) -> bool:
    """Whether ``<``/``>`` mean something for values of ``cql_type``: not for a collection,
    tuple, UDT or duration (Cassandra has no such order)."""
    return cql_type != "duration" and not cql_type.startswith(("frozen<", "tuple<", "a tuple"))


def to_response(
    txn_id: str,
    result: TxnResult,
    lets: Mapping[str, Key],
    catalog: Catalog,
    *,
    range_checked: Sequence[str] = (),
    views: Sequence[LetView] = (),
) -> pb.TransactResponse:
    error = result.error or ""
    if error and range_checked and "overflows" in error:
        # A range guard (or a genuine int64 overflow) failed: name the columns it protects.
        error += f"; or a computed value is outside its column's range: {', '.join(range_checked)}"
    response = pb.TransactResponse(txn_id=txn_id, applied=result.applied, error=error)
    shaped = {view.name: view for view in views}
    for name in sorted(lets):
        key = lets[name]
        table = catalog.for_key(key)
        view = shaped.get(name)
        if view is None or (view.returned is None and not view.slice):
            value = result.read(key)
            row = pb.Row(let=name, exists=value is not None)
            if isinstance(value, tuple):
                for (column, _), cell in zip(table.columns, value, strict=False):
                    row.columns.append(pb.Column(name=column, value=value_to_proto(cell)))
        else:
            found = _returned(result, view.returned)
            if view.slice:
                row = pb.Row(let=name, is_slice=True)
                entries = found if isinstance(found, tuple) else ()
                row.exists = bool(entries)
                for entry in entries:
                    clustering, cells = entry if isinstance(entry, tuple) else ((), ())
                    row.slice.append(_slice_row(table, clustering, cells))
            else:
                row = pb.Row(let=name, exists=found is not None)
                if isinstance(found, tuple):
                    for (column, _), cell in zip(table.columns, found, strict=False):
                        row.columns.append(pb.Column(name=column, value=value_to_proto(cell)))
            static = _returned(result, view.static)
            if view.static is not None:
                cells = static if isinstance(static, tuple) else (None,) * len(table.static)
                for (column, _), cell in zip(table.static, cells, strict=False):
                    row.columns.append(pb.Column(name=column, value=value_to_proto(cell)))
        response.rows.append(row)
    return response


def _returned(result: TxnResult, index: int | None) -> object:
    if index is None or index >= len(result.returned):
        return None
    return result.returned[index]


def _slice_row(table: TableSchema, clustering: object, cells: object) -> pb.SliceRow:
    out = pb.SliceRow()
    for (column, _, _), value in zip(
        table.clustering, clustering if isinstance(clustering, tuple) else (), strict=False
    ):
        out.columns.append(pb.Column(name=column, value=value_to_proto(value)))
    for (column, _), value in zip(
        table.columns, cells if isinstance(cells, tuple) else (), strict=False
    ):
        out.columns.append(pb.Column(name=column, value=value_to_proto(value)))
    return out
