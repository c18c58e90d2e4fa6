"""A client API transaction printed as Accord CQL text that parses back to the same
transaction (given the same schema): for logs, for the tests' round trips, and for users
moving from the builder API to text."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accord_cassandra.cql.parser import CqlError
from accord_cassandra.schema import Catalog, TableSchema
from accord_cassandra.v1 import client_pb2 as pb

if TYPE_CHECKING:
    from accord_cassandra.client import Transaction

_PLAIN = re.compile(r"[a-z][a-z0-9_]*\Z")
# Words the grammar takes as keywords where a name could be: quoted when used as names.
_KEYWORDS = frozenset(
    [
        *("begin", "transaction", "commit", "let", "select", "from", "where", "and", "order"),
        *("by", "asc", "desc", "limit", "if", "then", "end", "insert", "into", "values"),
        *("update", "set", "delete", "using", "ttl", "timestamp", "is", "not", "null"),
        *("exists", "count", "key", "true", "false", "nan", "infinity"),
    ]
)


def name(text: str) -> str:
    if _PLAIN.match(text) and text not in _KEYWORDS:
        return text
    return '"' + text.replace('"', '""') + '"'


def value(v: pb.Value) -> str:
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null":
        return "null"
    if kind == "boolean":
        return "true" if v.boolean else "false"
    if kind == "int":
        return str(v.int)
    if kind == "float64":
        number = v.float64
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        text = repr(number)
        return text if any(c in text for c in ".e") else text + ".0"
    if kind == "text":
        return "'" + v.text.replace("'", "''") + "'"
    if kind == "blob":
        return "0x" + v.blob.hex()
    return "[" + ", ".join(value(item) for item in v.elements.items) + "]"


def expr(e: pb.Expr, *, nested: bool = False) -> str:
    kind = e.WhichOneof("kind")
    if kind == "literal":
        return value(e.literal)
    if kind == "column":
        return f"{name(e.column.let)}.{name(e.column.column)}"
    if kind == "count":
        return f"COUNT({name(e.count)})"
    if kind == "row":
        return name(e.row)
    if kind == "binary":
        text = f"{expr(e.binary.left)} {e.binary.op} {expr(e.binary.right, nested=True)}"
        return f"({text})" if nested else text
    raise CqlError(f"an expression of kind {kind!r} has no CQL form")


def condition(c: pb.Condition) -> str:
    if c.op == "exists":
        return f"EXISTS {expr(c.left)}"
    if c.op == "not_exists":
        return f"NOT EXISTS {expr(c.left)}"
    if c.op == "is_null":
        return f"{expr(c.left)} IS NULL"
    if c.op == "not_null":
        return f"{expr(c.left)} IS NOT NULL"
    return f"{expr(c.left)} {c.op} {expr(c.right)}"


def _where(table: TableSchema, row: pb.RowRef, spec: pb.Slice | None) -> str:
    parts = [
        f"{name(n)} = {value(v)}"
        for (n, _), v in zip(table.partition_key, row.partition_key, strict=True)
    ]
    parts += [
        f"{name(n)} = {value(v)}"
        for (n, _, _), v in zip(table.clustering, row.clustering, strict=False)
    ]
    if spec is not None and spec.column:
        if spec.HasField("lower"):
            op = ">=" if spec.lower.inclusive else ">"
            parts.append(f"{name(spec.column)} {op} {value(spec.lower.value)}")
        if spec.HasField("upper"):
            op = "<=" if spec.upper.inclusive else "<"
            parts.append(f"{name(spec.column)} {op} {value(spec.upper.value)}")
    return " AND ".join(parts)


def _table(catalog: Catalog, row: pb.RowRef) -> TableSchema:
    return catalog.table(row.keyspace, row.table)


def let(catalog: Catalog, entry: pb.Let) -> str:
    table = _table(catalog, entry.row)
    spec = entry.slice if entry.HasField("slice") else None
    text = (
        f"LET {name(entry.name)} = (SELECT * FROM {name(table.keyspace)}.{name(table.table)} "
        f"WHERE {_where(table, entry.row, spec)}"
    )
    if spec is not None:
        if spec.reversed:
            first, _, order = table.clustering[0]
            text += f" ORDER BY {name(first)} {'ASC' if order == 'desc' else 'DESC'}"
        if spec.limit:
            text += f" LIMIT {spec.limit}"
    return text + ");"


def mutation(catalog: Catalog, m: pb.Mutation) -> str:
    table = _table(catalog, m.row)
    target = f"{name(table.keyspace)}.{name(table.table)}"
    kind = m.WhichOneof("kind")
    if kind == "upsert":
        using = f" USING TTL {m.ttl}" if m.ttl else ""
        if not m.upsert.set:
            keys = [n for n, _ in table.partition_key] + [n for n, _, _ in table.clustering]
            given = list(m.row.partition_key) + list(m.row.clustering)
            return (
                f"INSERT INTO {target} ({', '.join(name(k) for k in keys[: len(given)])}) "
                f"VALUES ({', '.join(value(v) for v in given)}){using};"
            )
        sets = ", ".join(f"{name(a.column)} = {expr(a.value)}" for a in m.upsert.set)
        return f"UPDATE {target}{using} SET {sets} WHERE {_where(table, m.row, None)};"
    if kind == "delete_range":
        return f"DELETE FROM {target} WHERE {_where(table, m.row, m.delete_range)};"
    return f"DELETE FROM {target} WHERE {_where(table, m.row, None)};"


def to_cql(
    transaction: Transaction | pb.TransactRequest,
    catalog: Catalog,
    returning: Sequence[tuple[str, str]] = (),
) -> str:
    """The text of ``transaction`` (the tables must be in ``catalog``); ``returning`` adds
    ``SELECT let.column, …;``. A ``delete`` with no clustering value prints as a partition
    delete, which it is (docs/sidecars.md). The reads the parser itself adds (LETs named
    ``_…``, for ``+=`` and a plain SELECT) print as LETs, which the parser then refuses."""
    request = transaction if isinstance(transaction, pb.TransactRequest) else transaction.request
    lines = ["BEGIN TRANSACTION"]
    lines += [f"  {let(catalog, entry)}" for entry in request.lets]
    if returning:
        lines.append("  SELECT " + ", ".join(f"{name(a)}.{name(b)}" for a, b in returning) + ";")
    body = [f"  {mutation(catalog, m)}" for m in request.mutations]
    if request.conditions:
        lines.append("  IF " + " AND ".join(condition(c) for c in request.conditions) + " THEN")
        lines += ["  " + line for line in body]
        lines.append("  END IF")
    else:
        lines += body
    lines.append("COMMIT TRANSACTION")
    return "\n".join(lines)
