"""The parsed form of one ``BEGIN TRANSACTION … COMMIT TRANSACTION`` text, before any value is
bound: what a CQL endpoint's PREPARE keeps, and what :mod:`accord_cassandra.cql.build` turns
into a client :class:`~accord_cassandra.client.Transaction` once the bind values are known.

Every node carries the ``line``/``column`` (1-based) where it starts, for error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pos:
    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}:{self.column}"


@dataclass(frozen=True)
class Literal:
    """A constant: None, bool, int, float, str, bytes or uuid.UUID."""

    value: object
    pos: Pos


@dataclass(frozen=True)
class Marker:
    """A bind marker: ``?`` (``name`` None) or ``:name``; ``index`` counts every marker of the
    text in order, as the native protocol numbers bind values."""

    index: int
    name: str | None
    pos: Pos


@dataclass(frozen=True)
class Collection:
    """``[…]`` (list), ``{…}`` (set), ``{k: v, …}`` (map: items alternate key and value),
    ``(a, b, …)`` (tuple), ``{}`` (empty, "braces")."""

    kind: str
    items: tuple[Expr, ...]
    pos: Pos


@dataclass(frozen=True)
class Ref:
    """``name`` (a LET as a whole, or a column of the updated row) or ``name.column``."""

    name: str
    column: str | None
    pos: Pos


@dataclass(frozen=True)
class Count:
    let: str
    pos: Pos


@dataclass(frozen=True)
class Binary:
    op: str  # "+" or "-"
    left: Expr
    right: Expr
    pos: Pos


Expr = Literal | Marker | Collection | Ref | Count | Binary


@dataclass(frozen=True)
class Relation:
    column: str
    op: str  # "=", "<", "<=", ">", ">="
    value: Expr
    pos: Pos


@dataclass(frozen=True)
class Table:
    keyspace: str | None
    name: str
    pos: Pos

    def __str__(self) -> str:
        return self.name if self.keyspace is None else f"{self.keyspace}.{self.name}"


@dataclass(frozen=True)
class Select:
    """The SELECT of a LET, or the transaction's plain SELECT: ``columns`` None for ``*``."""

    columns: tuple[str, ...] | None
    table: Table
    where: tuple[Relation, ...]
    order: tuple[tuple[str, str], ...]  # (column, "asc"|"desc")
    limit: Expr | None
    pos: Pos


@dataclass(frozen=True)
class Let:
    name: str
    select: Select
    pos: Pos


@dataclass(frozen=True)
class Condition:
    """``op``: "=", "!=", "<", "<=", ">", ">=", "is_null", "not_null", "exists", "not_exists"."""

    op: str
    left: Expr
    right: Expr | None
    pos: Pos


@dataclass(frozen=True)
class Assignment:
    column: str
    op: str  # "=", "+=", "-="
    value: Expr
    pos: Pos


@dataclass(frozen=True)
class Insert:
    table: Table
    columns: tuple[str, ...]
    values: tuple[Expr, ...]
    ttl: Expr | None
    pos: Pos


@dataclass(frozen=True)
class Update:
    table: Table
    assignments: tuple[Assignment, ...]
    where: tuple[Relation, ...]
    ttl: Expr | None
    pos: Pos


@dataclass(frozen=True)
class Delete:
    table: Table
    columns: tuple[str, ...]
    where: tuple[Relation, ...]
    pos: Pos


Modification = Insert | Update | Delete


@dataclass(frozen=True)
class Transaction:
    lets: tuple[Let, ...]
    # ``SELECT a.x, b.y;``: the references; ``SELECT … FROM …;``: the select; at most one.
    returning: tuple[Ref, ...] | None
    select: Select | None
    conditions: tuple[Condition, ...] | None  # None: no IF block
    modifications: tuple[Modification, ...]
    markers: tuple[Marker, ...] = field(default=())
