"""An AST plus bind values plus the tables' schema to a client API
:class:`~accord_cassandra.client.Transaction`, and the client's result back to the rows of the
transaction's SELECT.

The schema is needed: the client API names a row by its partition key values in key order
and its clustering values in clustering order, while CQL names them by column in a WHERE
clause, so the parser must know each table's key columns (and checks every other column
named against it).

Refused, each with a :class:`CqlError` naming the construct (the client API cannot express
it, or Cassandra refuses it too):

* ``USING TIMESTAMP`` (Accord picks write timestamps), ``USING TTL`` on DELETE,
  ``IF NOT EXISTS`` / ``IF EXISTS`` / ``IF cond`` on one statement (use the transaction's
  ``IF … THEN``), a SELECT or LET without a WHERE naming the whole partition key by ``=``;
* WHERE relations other than ``=`` on key columns and at most one lower and one upper bound on
  the clustering column after the ``=`` prefix (no ``IN``, no ``!=``, no filtering on regular
  columns), ORDER BY that is neither the table's clustering order nor its reverse;
* ``*``, ``/``, ``%``, unary minus on a non-literal, functions and casts (the API computes
  ``+`` and ``-`` only); ``col = value + col`` (prepend); UDT literals ``{field: v}`` (give a
  tuple of the fields in order) and duration literals (give a ``(months, days, nanos)``
  tuple through a bind marker);
* reading a partition key column as a value (``src.id``): the API reads regular, static and
  clustering columns;
* ``DELETE col`` of a key column, deleting columns of anything but one whole row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord_cassandra.client import Expression, Result, RowHandle, Transaction
from accord_cassandra.cql import ast
from accord_cassandra.cql.parser import CqlError, parse
from accord_cassandra.schema import Catalog, SchemaError, TableSchema
from accord_cassandra.v1 import client_pb2 as pb

Params = Sequence[object] | Mapping[str, object]
# Names of the reads the parser adds (a plain SELECT's, a ``col += v``'s): LET names of the
# text cannot start with "_".
HIDDEN_PREFIX = "_"
SELECT_LET = "_select"


@dataclass(frozen=True)
class Returned:
    """One column of the transaction's SELECT: where its value is in the client's result."""

    label: str
    let: str
    column: str
    # "row": a single-row LET's (or a slice's static) column; "first": the first row of a
    # slice with LIMIT 1; "key": a key column given in the LET's WHERE (``value``).
    source: str
    value: object = None


@dataclass(frozen=True)
class CqlResult:
    """What a transaction text returns: ``applied`` (its IF held, or it had none), the
    ``columns`` and ``rows`` of its SELECT (none without one), and the client ``result``
    with every LET's row (the parser's own reads, named ``_…``, among them)."""

    applied: bool
    columns: list[str]
    rows: list[tuple[object, ...]]
    result: Result


@dataclass
class Bound:
    """A transaction text with its values bound: ``transaction`` for the client API, and how
    to read the rows of its SELECT from the result (:meth:`rows`)."""

    transaction: Transaction
    columns: list[str] = field(default_factory=list)
    returned: list[Returned] = field(default_factory=list)
    # A plain SELECT's LET: its rows are the result's rows of that LET.
    select_let: str | None = None
    select_table: TableSchema | None = None
    select_key: dict[str, object] = field(default_factory=dict)
    select_slice: bool = False

    def result(self, result: Result) -> CqlResult:
        return CqlResult(result.applied, list(self.columns), self.rows(result), result)

    def rows(self, result: Result) -> list[tuple[object, ...]]:
        """The rows the transaction's SELECT returns, as Cassandra would: one row of the LET
        columns named (values of a row that does not exist are null), or the plain SELECT's
        rows (none when its row does not exist)."""
        if self.select_let is not None:
            return self._select_rows(result)
        if not self.returned:
            return []
        row: list[object] = []
        for ref in self.returned:
            if ref.source == "key":
                found = result.rows.get(ref.let)
                exists = found is not None or bool(result.slices.get(ref.let))
                row.append(ref.value if exists else None)
            elif ref.source == "first":
                entries = result.slices.get(ref.let) or []
                row.append(entries[0].get(ref.column) if entries else None)
            else:
                values = result.rows.get(ref.let)
                row.append(None if values is None else values.get(ref.column))
        return [tuple(row)]

    def _select_rows(self, result: Result) -> list[tuple[object, ...]]:
        name = self.select_let
        if name is None:  # pragma: no cover - checked by the caller
            return []
        statics = result.rows.get(name) or {}
        entries: list[dict[str, object]]
        if self.select_slice:
            entries = result.slices.get(name) or []
        else:
            found = result.rows.get(name)
            entries = [] if found is None else [found]
        out = []
        for entry in entries:
            # A single row's clustering values are not in its columns: they are its key.
            values = {**statics, **entry, **self.select_key}
            out.append(tuple(values.get(c) for c in self.columns))
        return out


@dataclass(frozen=True)
class Prepared:
    """A parsed transaction text, ready to bind values many times (a CQL endpoint's
    PREPARE): ``markers`` lists the bind markers in order."""

    text: str
    tree: ast.Transaction
    catalog: Catalog

    @property
    def markers(self) -> tuple[ast.Marker, ...]:
        return self.tree.markers

    def bind_columns(self) -> list[BindColumn | None]:
        """What each marker binds, as a native-protocol PREPARED result describes its
        variables: the column (``[limit]``, ``[ttl]``) and CQL type, or None where the text
        does not say (an element of a collection literal, a table it does not know)."""
        return _bind_columns(self.tree, self.catalog)

    def bind(self, params: Params | None = None) -> Bound:
        from accord_cassandra.translate import RequestError

        try:
            return _Binder(self.tree, self.catalog, _values(self.tree.markers, params)).build()
        except RequestError as error:  # a bound value the client API has no form for
            raise CqlError(str(error)) from None


@dataclass(frozen=True)
class BindColumn:
    keyspace: str
    table: str
    name: str
    cql_type: str


def _bind_columns(tree: ast.Transaction, catalog: Catalog) -> list[BindColumn | None]:
    out: list[BindColumn | None] = [None] * len(tree.markers)

    def lookup(table: ast.Table) -> TableSchema | None:
        if table.keyspace is None:
            return None
        try:
            return catalog.table(table.keyspace, table.name)
        except SchemaError:
            return None

    def typed(schema: TableSchema, column: str) -> BindColumn | None:
        kinds = dict(schema.partition_key) | {n: t for n, t, _ in schema.clustering}
        kinds |= dict(schema.columns) | dict(schema.static)
        found = kinds.get(column)
        return None if found is None else BindColumn(schema.keyspace, schema.table, column, found)

    def mark(expr: ast.Expr | None, spec: BindColumn | None) -> None:
        if isinstance(expr, ast.Marker):
            out[expr.index] = spec
        elif isinstance(expr, ast.Binary):  # + and - keep their operands' type
            mark(expr.left, spec)
            mark(expr.right, spec)

    def special(expr: ast.Expr | None, schema: TableSchema | None, name: str) -> None:
        if schema is not None:
            mark(expr, BindColumn(schema.keyspace, schema.table, name, "int"))

    def where(schema: TableSchema | None, relations: Sequence[ast.Relation]) -> None:
        for relation in relations:
            mark(relation.value, None if schema is None else typed(schema, relation.column))

    lets: dict[str, TableSchema] = {}
    selects = [(let.name, let.select) for let in tree.lets]
    if tree.select is not None:
        selects.append((SELECT_LET, tree.select))
    for name, select in selects:
        schema = lookup(select.table)
        if schema is not None:
            lets[name] = schema
        where(schema, select.where)
        special(select.limit, schema, "[limit]")

    def side(expr: ast.Expr) -> BindColumn | None:
        if isinstance(expr, ast.Ref) and expr.column is not None and expr.name in lets:
            return typed(lets[expr.name], expr.column)
        if isinstance(expr, ast.Binary):
            return side(expr.left) or side(expr.right)
        return None

    for condition in tree.conditions or ():
        if condition.right is not None:
            mark(condition.right, side(condition.left))
            mark(condition.left, side(condition.right))
    for m in tree.modifications:
        schema = lookup(m.table)
        if isinstance(m, ast.Insert):
            for column, value in zip(m.columns, m.values, strict=True):
                mark(value, None if schema is None else typed(schema, column))
            special(m.ttl, schema, "[ttl]")
        elif isinstance(m, ast.Update):
            for a in m.assignments:
                mark(a.value, None if schema is None else typed(schema, a.column))
            where(schema, m.where)
            special(m.ttl, schema, "[ttl]")
        else:
            where(schema, m.where)
    return out


def as_catalog(schema: Catalog | Mapping[str, Any]) -> Catalog:
    """A :class:`Catalog`, or the ``tables:`` mapping of a sidecar config made into one."""
    if isinstance(schema, Catalog):
        return schema
    try:
        return Catalog.from_mapping(schema)
    except SchemaError as error:
        raise CqlError(f"schema: {error}") from None


def prepare(text: str, schema: Catalog | Mapping[str, Any]) -> Prepared:
    return Prepared(text, parse(text), as_catalog(schema))


def bind(text: str, params: Params | None, schema: Catalog | Mapping[str, Any]) -> Bound:
    """Parse ``text`` and bind ``params`` (a sequence for ``?`` markers, or a mapping by name
    for ``:name`` markers): the client API transaction, or :class:`CqlError`."""
    return prepare(text, schema).bind(params)


def _values(markers: Sequence[ast.Marker], params: Params | None) -> list[object]:
    if params is None:
        params = ()
    if isinstance(params, Mapping):
        out = []
        for marker in markers:
            if marker.name is None:
                raise CqlError(
                    f"{marker.pos}: a positional marker ? cannot be bound by name; "
                    "give the values as a sequence"
                )
            if marker.name not in params:
                raise CqlError(f"{marker.pos}: no value bound for :{marker.name}")
            out.append(params[marker.name])
        unused = sorted(set(params) - {m.name for m in markers})
        if unused:
            raise CqlError(f"values bound for names the text has no marker for: {unused}")
        return out
    if isinstance(params, str | bytes):
        raise CqlError("bind values are a sequence or a mapping, not a single string")
    values = list(params)
    if len(values) != len(markers):
        raise CqlError(
            f"the text has {len(markers)} bind marker(s) but {len(values)} value(s) were given"
        )
    return values


class _Constant:
    """A value with no LET in it (a literal, a bound value, a collection of them)."""

    def __init__(self, value: object) -> None:
        self.value = value


class _Binder:
    def __init__(self, tree: ast.Transaction, catalog: Catalog, values: list[object]) -> None:
        self.tree = tree
        self.catalog = catalog
        self.values = values
        self.txn = Transaction()
        # LET name -> (table, key values by column, slice with its limit or None, columns).
        self.lets: dict[str, _LetInfo] = {}
        self.hidden = 0

    # -- helpers -------------------------------------------------------------------------

    def table(self, table: ast.Table) -> TableSchema:
        if table.keyspace is None:
            raise CqlError(
                f"{table.pos}: name the keyspace of table {table.name} (keyspace.table): "
                "a transaction has no current keyspace"
            )
        try:
            return self.catalog.table(table.keyspace, table.name)
        except SchemaError as error:
            raise CqlError(f"{table.pos}: {error}") from None

    def constant(self, expr: ast.Expr, where: str) -> object:
        value = self.value(expr, where)
        if not isinstance(value, _Constant):
            raise CqlError(f"{expr.pos}: {where} must be a literal or a bind marker")
        return value.value

    def value(self, expr: ast.Expr, where: str, assigned: str | None = None) -> object:
        """A _Constant, or a client Expression / pb.Expr-backed value."""
        if isinstance(expr, ast.Literal):
            return _Constant(expr.value)
        if isinstance(expr, ast.Marker):
            return _Constant(self.values[expr.index])
        if isinstance(expr, ast.Collection):
            if expr.kind == "map":
                for field_name in expr.items[::2]:
                    if (
                        isinstance(field_name, ast.Ref)
                        and field_name.column is None
                        and field_name.name not in self.lets
                    ):
                        raise CqlError(
                            f"{field_name.pos}: a UDT literal {{{field_name.name}: …}} is not "
                            "supported: give the fields as a tuple, in the type's order"
                        )
            items = [self.constant(i, f"an element of a {expr.kind} literal") for i in expr.items]
            if expr.kind == "map":
                return _Constant(dict(zip(items[::2], items[1::2], strict=True)))
            if expr.kind == "tuple":
                return _Constant(tuple(items))
            return _Constant(items)  # list, set, {}: the same elements on the wire
        if isinstance(expr, ast.Count):
            self.let_info(expr.let, expr.pos)
            return RowHandle(expr.let).count()
        if isinstance(expr, ast.Ref):
            if expr.column is None:
                if expr.name in self.lets:
                    raise CqlError(
                        f"{expr.pos}: LET {expr.name} as a whole only takes IS NULL, IS NOT "
                        f"NULL, EXISTS; name a column ({expr.name}.column)"
                    )
                raise CqlError(f"{expr.pos}: unknown LET name {expr.name!r}")
            info = self.let_info(expr.name, expr.pos)
            info.check_column(expr.column, expr.pos, as_value=True)
            return RowHandle(expr.name)[expr.column]
        left = self.value(expr.left, where)
        right = self.value(expr.right, where)
        return Expression(
            pb.Expr(binary=pb.BinaryExpr(op=expr.op, left=_pb(left), right=_pb(right)))
        )

    def let_info(self, name: str, pos: ast.Pos) -> _LetInfo:
        if name.startswith(HIDDEN_PREFIX):  # the parser's own reads are not the text's to name
            raise CqlError(
                f"{pos}: LET names starting with '_' are reserved for the reads the parser "
                f"adds; the text cannot name {name!r}"
            )
        info = self.lets.get(name)
        if info is None:
            known = ", ".join(sorted(n for n in self.lets if not n.startswith(HIDDEN_PREFIX)))
            raise CqlError(
                f"{pos}: unknown LET name {name!r}" + (f" (LETs: {known})" if known else "")
            )
        return info

    # -- WHERE ---------------------------------------------------------------------------

    def key(
        self, table: TableSchema, where: Sequence[ast.Relation], statement: str, pos: ast.Pos
    ) -> _Key:
        equal: dict[str, object] = {}
        ranges: list[tuple[ast.Relation, object]] = []  # a bound and its bound value
        keys = [n for n, _ in table.partition_key]
        clustering = [n for n, _, _ in table.clustering]
        for relation in where:
            column = relation.column
            if column not in keys and column not in clustering:
                if table.static_index(column) is not None or any(
                    n == column for n, _ in table.columns
                ):
                    raise CqlError(
                        f"{relation.pos}: {statement} WHERE restricts {table.qualified}.{column}, "
                        "which is not a key column (a transaction reads by key, no filtering)"
                    )
                raise CqlError(f"{relation.pos}: unknown column {column!r} in {table.qualified}")
            value = self.constant(relation.value, f"the value of {column} in WHERE")
            if relation.op == "=":
                if column in equal:
                    raise CqlError(f"{relation.pos}: {column} is restricted twice by =")
                equal[column] = value
            elif column in keys:
                raise CqlError(
                    f"{relation.pos}: partition key column {column} takes = only "
                    f"(a transaction names whole partitions), not {relation.op}"
                )
            else:
                ranges.append((relation, value))
        missing = [k for k in keys if k not in equal]
        if missing:
            raise CqlError(
                f"{pos}: {statement} on {table.qualified} needs the whole partition key by =; "
                f"missing {', '.join(missing)}"
            )
        prefix: list[object] = []
        for name in clustering:
            if name not in equal:
                break
            prefix.append(equal[name])
        extra = [c for c in clustering[len(prefix) :] if c in equal]
        if extra:
            raise CqlError(
                f"{pos}: {table.qualified}.{extra[0]} is restricted by = but "
                f"{clustering[len(prefix)]}, before it, is not"
            )
        bounds: dict[str, object] = {}
        range_column: str | None = None
        for relation, bound_value in ranges:
            if relation.column != (
                clustering[len(prefix)] if len(prefix) < len(clustering) else None
            ):
                nxt = clustering[len(prefix)] if len(prefix) < len(clustering) else None
                raise CqlError(
                    f"{relation.pos}: a range on {table.qualified}.{relation.column} needs = on "
                    "every clustering column before it and none after; "
                    + (
                        f"the range can only be on {nxt}"
                        if nxt
                        else "every clustering column is given by ="
                    )
                )
            range_column = relation.column
            op = {">": "gt", ">=": "ge", "<": "lt", "<=": "le"}[relation.op]
            side = "lower" if op in ("gt", "ge") else "upper"
            if any(k.startswith(side) for k in bounds):
                raise CqlError(f"{relation.pos}: two {side} bounds on {relation.column}")
            bounds[f"{side}:{op}"] = bound_value
        return _Key(
            [equal[k] for k in keys],
            prefix,
            range_column,
            {k.split(":")[1]: v for k, v in bounds.items()},
            {k: equal[k] for k in keys} | {c: equal[c] for c in clustering if c in equal},
        )

    # -- statements ----------------------------------------------------------------------

    def build(self) -> Bound:
        tree = self.tree
        for let in tree.lets:
            if let.name.startswith(HIDDEN_PREFIX):
                raise CqlError(
                    f"{let.pos}: LET names starting with '_' are reserved for the reads the "
                    f"parser adds; rename {let.name!r}"
                )
            if let.name in self.lets:
                raise CqlError(f"{let.pos}: LET {let.name} is defined twice")
            self.add_let(let.name, let.select, "LET")
        bound = Bound(self.txn)
        if tree.select is not None:
            self.add_let(SELECT_LET, tree.select, "SELECT")
            info = self.lets[SELECT_LET]
            table = info.table
            bound.select_let = SELECT_LET
            bound.select_table = table
            bound.select_key = info.key_values
            bound.select_slice = info.slice
            bound.columns = list(info.selected) if info.selected is not None else _star(table)
        if tree.returning is not None:
            for ref in tree.returning:
                info = self.let_info(ref.name, ref.pos)
                column = ref.column or ""
                source = info.check_column(column, ref.pos, as_value=False)
                label = f"{ref.name}.{column}"
                bound.columns.append(label)
                bound.returned.append(
                    Returned(label, ref.name, column, source, info.key_values.get(column))
                )
        if tree.conditions is not None:
            self.txn.where(*(self.condition(c) for c in tree.conditions))
        for modification in tree.modifications:
            self.modification(modification)
        return bound

    def add_let(self, name: str, select: ast.Select, statement: str) -> None:
        table = self.table(select.table)
        where = f"{statement} {name}" if statement == "LET" else statement
        if not select.where:
            raise CqlError(f"{select.pos}: {where} needs a WHERE naming the partition key")
        key = self.key(table, select.where, where, select.pos)
        selected = None
        if select.columns is not None:
            for column in select.columns:
                _check_exists(table, column, select.pos)
            selected = select.columns
        limit: int | None = None
        if select.limit is not None:
            value = self.constant(select.limit, "LIMIT")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CqlError(
                    f"{select.limit.pos}: LIMIT must be a positive integer, not {value!r}"
                )
            limit = value
        reversed_ = self.order(table, select.order, select.pos)
        full = len(key.prefix) == len(table.clustering) and key.column is None
        if full:
            self.txn.let(name, table.keyspace, table.table, key.partition, key.prefix)
        else:
            try:
                self.txn.let_slice(
                    name,
                    table.keyspace,
                    table.table,
                    key.partition,
                    key.prefix,
                    column=key.column,
                    reversed=reversed_,
                    limit=limit,
                    **key.bounds,
                )
            except ValueError as error:  # pragma: no cover - bounds are checked above
                raise CqlError(f"{select.pos}: {error}") from None
        self.lets[name] = _LetInfo(name, table, not full, limit, selected, key.named)

    def order(self, table: TableSchema, order: Sequence[tuple[str, str]], pos: ast.Pos) -> bool:
        if not order:
            return False
        if not table.clustering:
            raise CqlError(f"{pos}: ORDER BY on {table.qualified}, which has no clustering columns")
        flips = set()
        for (column, direction), (name, _, table_order) in zip(
            order, table.clustering, strict=False
        ):
            if column != name:
                raise CqlError(
                    f"{pos}: ORDER BY must list {table.qualified}'s clustering columns in order "
                    f"({', '.join(n for n, _, _ in table.clustering)}); got {column}"
                )
            flips.add(direction != table_order)
        if len(order) > len(table.clustering):
            raise CqlError(f"{pos}: ORDER BY lists more columns than the clustering key")
        if len(flips) != 1:
            raise CqlError(
                f"{pos}: ORDER BY must be the clustering order of {table.qualified} or its reverse"
            )
        return flips.pop()

    def condition(self, c: ast.Condition) -> pb.Condition:
        if c.op in ("exists", "not_exists"):
            ref = c.left
            if not isinstance(ref, ast.Ref):  # pragma: no cover - the grammar gives a name
                raise CqlError(f"{c.pos}: EXISTS takes a LET name")
            self.let_info(ref.name, ref.pos)
            handle = RowHandle(ref.name)
            return handle.exists() if c.op == "exists" else handle.not_exists()
        if c.op in ("is_null", "not_null"):
            left = c.left
            if isinstance(left, ast.Ref) and left.column is None:
                self.let_info(left.name, left.pos)
                return pb.Condition(op=c.op, left=pb.Expr(row=left.name))
            value = self.value(left, "IS NULL")
            return pb.Condition(op=c.op, left=_pb(value))
        if c.right is None:  # pragma: no cover - the grammar gives two sides
            raise CqlError(f"{c.pos}: a comparison needs two sides")
        left_value = self.value(c.left, "a condition")
        right_value = self.value(c.right, "a condition")
        if isinstance(left_value, _Constant) and isinstance(right_value, _Constant):
            raise CqlError(
                f"{c.pos}: a condition compares LET values; both sides here are constants"
            )
        return pb.Condition(op=c.op, left=_pb(left_value), right=_pb(right_value))

    def ttl(self, expr: ast.Expr | None) -> int | None:
        if expr is None:
            return None
        value = self.constant(expr, "USING TTL")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CqlError(
                f"{expr.pos}: USING TTL takes seconds, a non-negative integer, not {value!r}"
            )
        return value or None  # TTL 0 is no TTL, as in Cassandra

    def modification(self, m: ast.Modification) -> None:
        table = self.table(m.table)
        keys = {n for n, _ in table.partition_key}
        clustering = [n for n, _, _ in table.clustering]
        if isinstance(m, ast.Insert):
            if len(set(m.columns)) != len(m.columns):
                raise CqlError(f"{m.pos}: INSERT names a column twice")
            given = dict(zip(m.columns, m.values, strict=True))
            relations = [
                ast.Relation(c, "=", given[c], given[c].pos)
                for c in m.columns
                if c in keys or c in clustering
            ]
            key = self.key(table, relations, "INSERT", m.pos)
            inserted = {
                c: self.assigned(table, c, v)
                for c, v in given.items()
                if c not in keys and c not in clustering
            }
            self.upsert(table, key, inserted, self.ttl(m.ttl), m.pos, "INSERT")
            return
        key = self.key(table, m.where, "UPDATE" if isinstance(m, ast.Update) else "DELETE", m.pos)
        if isinstance(m, ast.Update):
            assignments: dict[str, object] = {}
            for a in m.assignments:
                if a.column in assignments:
                    raise CqlError(f"{a.pos}: UPDATE sets {a.column} twice")
                if a.column in keys or a.column in clustering:
                    raise CqlError(
                        f"{a.pos}: UPDATE cannot SET key column {table.qualified}.{a.column}"
                    )
                assignments[a.column] = self.assignment(table, key, a)
            self.upsert(table, key, assignments, self.ttl(m.ttl), m.pos, "UPDATE")
            return
        if key.column is not None:
            if m.columns:
                raise CqlError(f"{m.pos}: DELETE of columns names one whole row, not a range")
            self.txn.delete_range(
                table.keyspace,
                table.table,
                key.partition,
                key.prefix,
                column=key.column,
                **key.bounds,
            )
            return
        if m.columns:
            for column in m.columns:
                if column in keys or column in clustering:
                    raise CqlError(f"{m.pos}: DELETE of key column {table.qualified}.{column}")
                _check_exists(table, column, m.pos)
            statics = all(table.static_index(c) is not None for c in m.columns)
            if len(key.prefix) != len(clustering) and not (statics and not key.prefix):
                raise CqlError(
                    f"{m.pos}: DELETE of columns needs every clustering column of "
                    f"{table.qualified} by = (or only static columns and no clustering)"
                )
            self.txn.update(
                table.keyspace,
                table.table,
                key.partition,
                key.prefix,
                values=dict.fromkeys(m.columns),
            )
            return
        if not key.prefix:
            self.txn.delete_partition(table.keyspace, table.table, key.partition)
        else:
            self.txn.delete(table.keyspace, table.table, key.partition, key.prefix)

    def upsert(
        self,
        table: TableSchema,
        key: _Key,
        assignments: dict[str, object],
        ttl: int | None,
        pos: ast.Pos,
        statement: str,
    ) -> None:
        if key.column is not None:
            raise CqlError(f"{pos}: {statement} writes one row; a range names several")
        if len(key.prefix) != len(table.clustering):
            statics = assignments and all(table.static_index(c) is not None for c in assignments)
            if key.prefix or not statics:
                names = ", ".join(n for n, _, _ in table.clustering)
                raise CqlError(
                    f"{pos}: {statement} of {table.qualified} needs every clustering column "
                    f"({names}) by =, or static columns only and no clustering"
                )
        values = {c: (v.value if isinstance(v, _Constant) else v) for c, v in assignments.items()}
        self.txn.update(
            table.keyspace, table.table, key.partition, key.prefix, ttl=ttl, values=values
        )

    def assigned(self, table: TableSchema, column: str, expr: ast.Expr) -> object:
        _check_exists(table, column, expr.pos)
        return self.value(expr, f"the value of {column}")

    def assignment(self, table: TableSchema, key: _Key, a: ast.Assignment) -> object:
        _check_exists(table, a.column, a.pos)
        value = a.value
        op = a.op
        # ``col = col + v`` / ``col = col - v``: Cassandra's spelling of ``col += v``.
        if (
            op == "="
            and isinstance(value, ast.Binary)
            and isinstance(value.left, ast.Ref)
            and value.left.column is None
            and value.left.name == a.column
            and value.left.name not in self.lets
        ):
            op = "+=" if value.op == "+" else "-="
            value = value.right
        if op == "=":
            if (
                isinstance(value, ast.Binary)
                and isinstance(value.right, ast.Ref)
                and value.right.column is None
                and value.right.name == a.column
                and value.right.name not in self.lets
            ):
                raise CqlError(
                    f"{a.pos}: {a.column} = … + {a.column} (a list prepend) is not supported"
                )
            return self.value(value, f"the value of {a.column}")
        # ``col += v``: a read of the row itself, added as a LET of its own.
        current = self.hidden_row(table, key, a.pos, table.static_index(a.column) is not None)
        delta = self.value(value, f"the value added to {a.column}")
        return Expression(
            pb.Expr(
                binary=pb.BinaryExpr(
                    op=op[0],
                    left=pb.Expr(column=pb.ColumnRef(let=current, column=a.column)),
                    right=_pb(delta),
                )
            )
        )

    def hidden_row(self, table: TableSchema, key: _Key, pos: ast.Pos, static: bool) -> str:
        """The LET reading the row (or, for a static column, the partition's static row)
        that ``+=`` updates: one per row, shared by its columns."""
        whole = len(key.prefix) == len(table.clustering)
        if key.column is not None or not (whole or (static and not key.prefix)):
            raise CqlError(
                f"{pos}: += and -= need one whole row (every clustering column by =), "
                "or a static column and no clustering"
            )
        for name, info in self.lets.items():
            if name.startswith("_row") and info.table == table and info.key_values == key.named:
                return name
        self.hidden += 1
        name = f"_row{self.hidden}"
        if whole:
            self.txn.let(name, table.keyspace, table.table, key.partition, key.prefix)
        else:  # the static row comes with any slice of the partition; read at most one row
            self.txn.let_slice(name, table.keyspace, table.table, key.partition, (), limit=1)
        self.lets[name] = _LetInfo(name, table, not whole, 1, None, key.named)
        return name


@dataclass
class _Key:
    partition: list[object]
    prefix: list[object]
    column: str | None
    bounds: dict[str, object]
    named: dict[str, object]


@dataclass
class _LetInfo:
    name: str
    table: TableSchema
    slice: bool
    limit: int | None
    selected: tuple[str, ...] | None
    key_values: dict[str, object]

    def check_column(self, column: str, pos: ast.Pos, *, as_value: bool) -> str:
        """Where ``column`` of this LET is read from (see :class:`Returned`)."""
        table = self.table
        _check_exists(table, column, pos)
        if self.selected is not None and column not in self.selected:
            raise CqlError(
                f"{pos}: LET {self.name} selects {', '.join(self.selected)}; "
                f"{self.name}.{column} is not among them"
            )
        keys = {n for n, _ in table.partition_key}
        if column in keys:
            if as_value:
                raise CqlError(
                    f"{pos}: {self.name}.{column} is a partition key column; the client API "
                    "reads regular, static and clustering columns as values"
                )
            return "key"
        if table.static_index(column) is not None:
            return "row"
        clustering = [n for n, _, _ in table.clustering]
        if self.slice and self.limit != 1:
            raise CqlError(
                f"{pos}: LET {self.name} is a slice; a column of it needs LIMIT 1 "
                "(use COUNT or EXISTS for more rows)"
            )
        if column in clustering:
            if as_value:
                return "row"
            return "first" if self.slice else "key"
        return "first" if self.slice else "row"


def _check_exists(table: TableSchema, column: str, pos: ast.Pos) -> None:
    known = (
        {n for n, _ in table.partition_key}
        | {n for n, _, _ in table.clustering}
        | {n for n, _ in table.columns}
        | {n for n, _ in table.static}
    )
    if column not in known:
        raise CqlError(f"{pos}: unknown column {column!r} in {table.qualified}")


def _star(table: TableSchema) -> list[str]:
    """``SELECT *``'s columns in Cassandra's order: partition key, clustering, then the others
    by name."""
    rest = sorted([n for n, _ in table.columns] + [n for n, _ in table.static])
    return [n for n, _ in table.partition_key] + [n for n, _, _ in table.clustering] + rest


def _pb(value: object) -> pb.Expr:
    from accord_cassandra.translate import value_to_proto

    if isinstance(value, _Constant):
        value = value.value
    if isinstance(value, Expression):
        return value.proto
    if isinstance(value, pb.Expr):  # pragma: no cover - values are wrapped
        return value
    return pb.Expr(literal=value_to_proto(value))
