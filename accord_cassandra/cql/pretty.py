"""A client API transaction printed as Accord CQL text that parses back to the same
transaction (given the same schema): for logs, for the tests' round trips, and for users
moving from the builder API to text.

The parser adds reads of its own, LETs whose names start with ``_`` (a plain SELECT's
``_select``, ``c += v``'s ``_row1``, …), and refuses such names in text. So those reads
print as the statements that make them, never by name; a transaction whose ``_`` LETs are
not exactly what the parser would add has no text form and is refused naming the LET."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accord_cassandra.cql.build import HIDDEN_PREFIX, SELECT_LET
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


def select(catalog: Catalog, entry: pb.Let) -> str:
    """``SELECT * FROM … WHERE …`` reading what ``entry`` reads (no ``;``)."""
    table = _table(catalog, entry.row)
    spec = entry.slice if entry.HasField("slice") else None
    text = (
        f"SELECT * FROM {name(table.keyspace)}.{name(table.table)} "
        f"WHERE {_where(table, entry.row, spec)}"
    )
    if spec is not None:
        if spec.reversed:
            first, _, order = table.clustering[0]
            text += f" ORDER BY {name(first)} {'ASC' if order == 'desc' else 'DESC'}"
        if spec.limit:
            text += f" LIMIT {spec.limit}"
    return text


def let(catalog: Catalog, entry: pb.Let) -> str:
    return f"LET {name(entry.name)} = ({select(catalog, entry)});"


def _increment(a: pb.Assignment, rows: frozenset[str]) -> str | None:
    """``c += v`` / ``c -= v`` for an assignment the parser makes of one (``c = _rowN.c ± v``
    with ``_rowN`` among ``rows``), else None."""
    value = a.value
    if value.WhichOneof("kind") != "binary" or value.binary.op not in ("+", "-"):
        return None
    left = value.binary.left
    if left.WhichOneof("kind") != "column" or left.column.let not in rows:
        return None
    if left.column.column != a.column:
        return None
    return f"{name(a.column)} {value.binary.op}= {expr(value.binary.right)}"


def mutation(catalog: Catalog, m: pb.Mutation, rows: frozenset[str] = frozenset()) -> str:
    """One statement; assignments that read ``rows`` (the parser's ``c += v`` reads) print as
    ``+=`` / ``-=``."""
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
        sets = ", ".join(
            _increment(a, rows) or f"{name(a.column)} = {expr(a.value)}" for a in m.upsert.set
        )
        return f"UPDATE {target}{using} SET {sets} WHERE {_where(table, m.row, None)};"
    if kind == "delete_range":
        return f"DELETE FROM {target} WHERE {_where(table, m.row, m.delete_range)};"
    return f"DELETE FROM {target} WHERE {_where(table, m.row, None)};"


def _refused(entry_name: str, why: str) -> CqlError:
    return CqlError(
        f"LET {entry_name!r} has no text form: names starting with {HIDDEN_PREFIX!r} are "
        f"reserved for the reads the parser adds, and {why}; give it another name"
    )


def _row_read(catalog: Catalog, m: pb.Mutation, a: pb.Assignment, hidden: str) -> pb.Let:
    """The read the parser adds for ``c += v`` on ``m``'s row: the whole row, or the static row
    of a partition (a slice of at most one row)."""
    table = _table(catalog, m.row)
    if len(m.row.clustering) == len(table.clustering):
        return pb.Let(row=m.row)
    if m.row.clustering or table.static_index(a.column) is None:
        raise _refused(hidden, f"{a.column} += … needs one whole row or a static column")
    row = pb.RowRef(keyspace=m.row.keyspace, table=m.row.table, partition_key=m.row.partition_key)
    return pb.Let(row=row, slice=pb.Slice(limit=1))


def _names(e: pb.Expr) -> Iterator[str]:
    """Every LET ``e`` reads."""
    kind = e.WhichOneof("kind")
    if kind == "column":
        yield e.column.let
    elif kind in ("count", "row"):
        yield e.count if kind == "count" else e.row
    elif kind == "binary":
        yield from _names(e.binary.left)
        yield from _names(e.binary.right)


@dataclass(frozen=True)
class _Reads:
    lets: list[pb.Let]  # the text's own LETs
    select: pb.Let | None  # a plain SELECT's read
    rows: frozenset[str]  # the ``c += v`` reads


def _parser_reads(request: pb.TransactRequest, catalog: Catalog) -> _Reads:
    """Split the LETs into the text's and the parser's own, checking the parser's are exactly
    what parsing the printed text adds: after the text's LETs, the SELECT's read first, then one
    ``_rowN`` per row that ``+=`` updates, numbered in order of first use, and none of them
    named anywhere else."""
    lets = list(request.lets)
    split = next((i for i, e in enumerate(lets) if e.name.startswith(HIDDEN_PREFIX)), len(lets))
    own, added = lets[:split], lets[split:]
    for entry in added:
        if not entry.name.startswith(HIDDEN_PREFIX):
            raise CqlError(
                f"LET {entry.name!r} has no text form here: it follows {added[0].name!r}, and "
                "the text's LETs come before the reads the parser adds"
            )
    select_let = added.pop(0) if added and added[0].name == SELECT_LET else None
    rows = frozenset(e.name for e in added)
    expected: list[pb.Let] = []
    by_read: dict[bytes, str] = {}
    used: set[str] = set()
    for m in request.mutations:
        for a in m.upsert.set if m.WhichOneof("kind") == "upsert" else ():
            if _increment(a, rows) is None:
                used.update(_names(a.value))
                continue
            hidden = a.value.binary.left.column.let
            used.update(_names(a.value.binary.right))
            read = _row_read(catalog, m, a, hidden)
            shape = read.SerializeToString(deterministic=True)
            if shape not in by_read:
                by_read[shape] = f"_row{len(by_read) + 1}"
                read.name = by_read[shape]
                expected.append(read)
            if by_read[shape] != hidden:
                raise _refused(hidden, f"the parser would read this row as {by_read[shape]!r}")
    for c in request.conditions:
        used.update(_names(c.left))
        if c.HasField("right"):
            used.update(_names(c.right))
    for entry in [*([select_let] if select_let is not None else []), *added]:
        if entry.name in used:
            raise _refused(entry.name, "it is read by name")
    for index, entry in enumerate(added):
        if index >= len(expected) or entry != expected[index]:
            raise _refused(entry.name, "it is not the read of a row that += updates, in order")
    return _Reads(own, select_let, rows)


def to_cql(
    transaction: Transaction | pb.TransactRequest,
    catalog: Catalog,
    returning: Sequence[tuple[str, str]] = (),
) -> str:
    """The text of ``transaction`` (the tables must be in ``catalog``); ``returning`` adds
    ``SELECT let.column, …;``. A ``delete`` with no clustering value prints as a partition
    delete, which it is (docs/sidecars.md). The reads the parser itself adds print as what
    adds them: LET ``_select`` as a plain ``SELECT … FROM …;``, the ``_rowN`` of ``c = _rowN.c
    + v`` as ``c += v``. Any other LET named ``_…`` is a :class:`CqlError` naming it."""
    request = transaction if isinstance(transaction, pb.TransactRequest) else transaction.request
    reads = _parser_reads(request, catalog)
    for let_name, _ in returning:
        if let_name.startswith(HIDDEN_PREFIX):
            raise _refused(let_name, "the text cannot return its columns")
    lines = ["BEGIN TRANSACTION"]
    lines += [f"  {let(catalog, entry)}" for entry in reads.lets]
    if reads.select is not None:
        if returning:
            raise CqlError(
                "a transaction text has one SELECT: this one's plain SELECT (LET "
                f"{SELECT_LET!r}) leaves no room for returning {list(returning)}"
            )
        lines.append(f"  {select(catalog, reads.select)};")
    if returning:
        lines.append("  SELECT " + ", ".join(f"{name(a)}.{name(b)}" for a, b in returning) + ";")
    body = [f"  {mutation(catalog, m, reads.rows)}" for m in request.mutations]
    if request.conditions:
        lines.append("  IF " + " AND ".join(condition(c) for c in request.conditions) + " THEN")
        lines += ["  " + line for line in body]
        lines.append("  END IF")
    else:
        lines += body
    lines.append("COMMIT TRANSACTION")
    return "\n".join(lines)
