"""Tables written through Accord: their columns, value types, and how rows become keys.

An Accord key is one Cassandra partition, ``(keyspace, table, partition key)``. Its token is
Cassandra's own Murmur3 token of the serialized partition key (:mod:`accord_cassandra.tokens`),
so shards line up with Cassandra's token ranges. Its name is
``keyspace.table:<hex of the routing key>``, which is unique, stable and reversible.

The value of a key inside the protocol is the partition (:mod:`accord.primitives.rows`):
rows by clustering key (the tuple of clustering column values, ``()`` for a table without
clustering columns), each row the tuple of its regular columns in the table's column order,
and a static row, the tuple of the static columns. ``clustering`` lists the clustering
columns in key order with their order (``asc``/``desc``); ``static`` the static columns.
"""

from __future__ import annotations

import decimal
import ipaddress
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from accord import (
    DeleteRange,
    DeleteRow,
    Key,
    MakeTuple,
    PutRow,
    PutStatic,
    WriteOp,
    WriteScope,
)
from accord_cassandra import tokens
from accord_cassandra.errors import AccordCassandraError

INT_TYPES = {"int": 32, "bigint": 64, "smallint": 16, "tinyint": 8, "counter": 64, "varint": 64}
TEXT_TYPES = frozenset({"text", "varchar", "ascii"})
# Time types as integers: timestamp (ms since the epoch), date (days since the epoch), time
# (ns since midnight); inet as its canonical text; decimal as its canonical text.
TIME_TYPES = {
    "timestamp": (-(2**63), 2**63 - 1),
    "date": (-(2**31), 2**31 - 1),
    "time": (0, 86_400 * 10**9 - 1),
}
SUPPORTED_TYPES = frozenset(
    {*INT_TYPES, *TEXT_TYPES, *TIME_TYPES, "blob", "boolean", "uuid", "timeuuid", "inet", "decimal"}
)
# Their core values do not order as Cassandra orders them (text for inet and decimal).
NOT_CLUSTERING_TYPES = frozenset({"inet", "decimal"})
NOT_PARTITION_KEY_TYPES = frozenset({"decimal"})
# A row or value larger than this is refused before it reaches the protocol.
MAX_VALUE_BYTES = 64 * 1024
# Cassandra's limit on a serialized partition key (an unsigned 16-bit length).
MAX_PARTITION_KEY_BYTES = 0xFFFF


class SchemaError(AccordCassandraError, ValueError):
    """A request names a keyspace, table or column that does not exist, or a value of the
    wrong type for its column. The message names the culprit."""


@dataclass(frozen=True, slots=True)
class TableSchema:
    keyspace: str
    table: str
    partition_key: tuple[tuple[str, str], ...]
    columns: tuple[tuple[str, str], ...]
    clustering: tuple[tuple[str, str, str], ...] = ()
    static: tuple[tuple[str, str], ...] = ()
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.partition_key:
            raise SchemaError(f"{self.qualified}: a table needs a partition key")
        clustering = tuple((name, cql_type) for name, cql_type, _ in self.clustering)
        for name, cql_type in (*self.partition_key, *clustering, *self.columns, *self.static):
            if cql_type == "counter":
                raise SchemaError(
                    f"{self.qualified}.{name} is a counter: counter tables cannot be written "
                    "through Accord (a counter update is not idempotent under USING TIMESTAMP)"
                )
            if cql_type not in SUPPORTED_TYPES:
                raise SchemaError(f"{self.qualified}.{name}: CQL type {cql_type} is not supported")
        for name, cql_type in clustering:
            if cql_type in NOT_CLUSTERING_TYPES:
                raise SchemaError(
                    f"{self.qualified}.{name}: CQL type {cql_type} is not supported as a "
                    "clustering column (its Accord value would not sort as Cassandra sorts it)"
                )
        for name, cql_type in self.partition_key:
            if cql_type in NOT_PARTITION_KEY_TYPES:
                raise SchemaError(
                    f"{self.qualified}.{name}: CQL type {cql_type} is not supported in a "
                    "partition key"
                )
        for name, _, order in self.clustering:
            if order not in ("asc", "desc"):
                raise SchemaError(
                    f"{self.qualified}.{name}: clustering order {order!r} (asc, desc)"
                )
        if self.static and not self.clustering:
            raise SchemaError(f"{self.qualified}: static columns need clustering columns")
        object.__setattr__(self, "_index", {name: i for i, (name, _) in enumerate(self.columns)})

    def clustering_index(self, column: str) -> int:
        for index, (name, _, _) in enumerate(self.clustering):
            if name == column:
                return index
        if any(name == column for name, _ in self.columns):
            raise SchemaError(f"{self.qualified}.{column} is not a clustering column")
        raise SchemaError(f"unknown clustering column {column!r} in {self.qualified}")

    def static_index(self, column: str) -> int | None:
        for index, (name, _) in enumerate(self.static):
            if name == column:
                return index
        return None

    def check_clustering(self, values: Sequence[object], *, full: bool) -> tuple[object, ...]:
        """``values`` as a clustering key (``full``) or prefix of this table, type-checked."""
        if len(values) > len(self.clustering) or (full and len(values) != len(self.clustering)):
            raise SchemaError(
                f"{self.qualified} has {len(self.clustering)} clustering column(s), "
                f"got {len(values)} value(s)"
            )
        out = []
        for (name, cql_type, _), value in zip(self.clustering, values, strict=False):
            if value is None:
                raise SchemaError(f"{self.qualified}.{name}: a clustering value cannot be null")
            out.append(check_type(f"{self.qualified}.{name}", cql_type, value))
        return tuple(out)

    @property
    def qualified(self) -> str:
        return f"{self.keyspace}.{self.table}"

    def column_index(self, column: str) -> int:
        index = self._index.get(column)
        if index is None:
            key_columns = {name for name, _ in self.partition_key}
            if column in key_columns:
                raise SchemaError(
                    f"{self.qualified}.{column} is a partition key column; "
                    "it cannot be read or set as a value"
                )
            raise SchemaError(f"unknown column {column!r} in {self.qualified}")
        return index

    def column_type(self, column: str) -> str:
        if self.static_index(column) is not None:
            return dict(self.static)[column]
        return self.columns[self.column_index(column)][1]

    def routing_key(self, values: Sequence[object]) -> bytes:
        if len(values) != len(self.partition_key):
            raise SchemaError(
                f"{self.qualified} has {len(self.partition_key)} partition key column(s), "
                f"got {len(values)} value(s)"
            )
        parts = [
            serialize(name, cql_type, value, self.qualified)
            for (name, cql_type), value in zip(self.partition_key, values, strict=True)
        ]
        try:
            routing = parts[0] if len(parts) == 1 else tokens.composite_key(parts)
        except ValueError as error:  # a component too long for its 16-bit length prefix
            raise SchemaError(f"{self.qualified}: {error}") from None
        if len(routing) > MAX_PARTITION_KEY_BYTES:
            # Cassandra refuses longer keys, so a committed write to one could never land:
            # every replica would retry it forever.
            raise SchemaError(
                f"{self.qualified}: a partition key of {len(routing)} bytes exceeds Cassandra's "
                f"limit of {MAX_PARTITION_KEY_BYTES} bytes"
            )
        return routing

    def key(self, values: Sequence[object]) -> Key:
        routing = self.routing_key(values)
        return Key(tokens.murmur3_token(routing), f"{self.qualified}:{routing.hex()}")

    def check_value(self, column: str, value: object) -> object:
        return check_type(f"{self.qualified}.{column}", self.column_type(column), value)


def check_type(where: str, cql_type: str, value: object) -> object:
    """``value`` if it fits ``cql_type`` (None always fits), else :class:`SchemaError`."""
    if value is None:
        return None
    if cql_type in INT_TYPES:
        bits = INT_TYPES[cql_type]
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaError(f"{where} is {cql_type}; got {type(value).__name__} {value!r}")
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise SchemaError(f"{where} is {cql_type}; {value} is out of range")
        return value
    if cql_type in TEXT_TYPES:
        if not isinstance(value, str):
            raise SchemaError(f"{where} is {cql_type}; got {type(value).__name__} {value!r}")
        if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
            raise SchemaError(f"{where}: text longer than {MAX_VALUE_BYTES} bytes")
        if cql_type == "ascii" and not value.isascii():
            raise SchemaError(f"{where} is ascii; got non-ASCII text")
        return value
    if cql_type == "blob":
        if not isinstance(value, bytes):
            raise SchemaError(f"{where} is blob; got {type(value).__name__}")
        if len(value) > MAX_VALUE_BYTES:
            raise SchemaError(f"{where}: blob longer than {MAX_VALUE_BYTES} bytes")
        return value
    if cql_type == "boolean":
        if not isinstance(value, bool):
            raise SchemaError(f"{where} is boolean; got {type(value).__name__} {value!r}")
        return value
    if cql_type in TIME_TYPES:
        low, high = TIME_TYPES[cql_type]
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaError(f"{where} is {cql_type}; got {type(value).__name__} {value!r}")
        if not low <= value <= high:
            raise SchemaError(f"{where} is {cql_type}; {value} is out of range")
        return value
    if cql_type == "inet":
        try:
            return str(ipaddress.ip_address(str(value)))
        except ValueError:
            raise SchemaError(f"{where} is inet; {value!r} is not an IP address") from None
    if cql_type == "decimal":
        if not isinstance(value, str):
            raise SchemaError(f"{where} is decimal (as text); got {type(value).__name__}")
        try:
            number = decimal.Decimal(value)
        except decimal.InvalidOperation:
            raise SchemaError(f"{where} is decimal; {value!r} is not a number") from None
        if not number.is_finite() or len(value) > 1000:
            raise SchemaError(f"{where} is decimal; {value!r} is not a finite number")
        return str(number)
    if cql_type in ("uuid", "timeuuid"):
        try:
            parsed = uuid.UUID(str(value))
        except ValueError:
            raise SchemaError(f"{where} is {cql_type}; {value!r} is not a UUID") from None
        if cql_type == "timeuuid" and parsed.version != 1:
            # Cassandra refuses any other version in a timeuuid column, after commit.
            raise SchemaError(f"{where} is timeuuid; {value!r} is not a version 1 UUID")
        return str(parsed)
    raise SchemaError(f"{where}: CQL type {cql_type} is not supported")


def serialize(name: str, cql_type: str, value: object, table: str) -> bytes:
    """A partition key value in Cassandra's native serialization (for its token)."""
    where = f"{table}.{name}"
    if value is None:
        raise SchemaError(f"{where}: a partition key value cannot be null")
    checked = check_type(where, cql_type, value)
    if cql_type in TEXT_TYPES:
        assert isinstance(checked, str)
        return tokens.text_key(checked)
    if cql_type == "blob":
        assert isinstance(checked, bytes)
        return checked
    if cql_type in ("int",):
        assert isinstance(checked, int)
        return tokens.int_key(checked)
    if cql_type in ("bigint", "counter", "varint"):
        assert isinstance(checked, int)
        return tokens.bigint_key(checked)
    if cql_type == "smallint":
        assert isinstance(checked, int)
        return checked.to_bytes(2, "big", signed=True)
    if cql_type == "tinyint":
        assert isinstance(checked, int)
        return checked.to_bytes(1, "big", signed=True)
    if cql_type == "boolean":
        return b"\x01" if checked else b"\x00"
    if cql_type in ("timestamp", "time"):
        assert isinstance(checked, int)
        return tokens.bigint_key(checked)
    if cql_type == "date":
        assert isinstance(checked, int)
        # Cassandra's date: unsigned 32-bit days with the epoch at 2^31.
        return (checked + 2**31).to_bytes(4, "big")
    if cql_type == "inet":
        return ipaddress.ip_address(str(checked)).packed
    return tokens.uuid_key(uuid.UUID(str(checked)))


class Catalog:
    """The tables the sidecar may touch, by ``keyspace.table``."""

    def __init__(
        self, tables: Sequence[TableSchema] = (), unusable: Mapping[str, str] | None = None
    ) -> None:
        self._tables: dict[str, TableSchema] = {t.qualified: t for t in tables}
        # The store's say on a TTL'd write (table, write, from a peer): why it cannot be
        # honoured, or None; unset, every TTL within the core's bounds is (the memory store).
        self.ttl_check: Callable[[TableSchema, PutRow | PutStatic, bool], str | None] | None = None
        # Tables that exist but cannot be served, with the reason (named in errors).
        self.unusable: dict[str, str] = dict(unusable or {})

    def add(self, table: TableSchema) -> None:
        self._tables[table.qualified] = table

    def table(self, keyspace: str, table: str) -> TableSchema:
        found = self._tables.get(f"{keyspace}.{table}")
        if found is None:
            why = self.unusable.get(f"{keyspace}.{table}")
            if why is not None:
                raise SchemaError(f"table {keyspace}.{table} cannot be used through Accord: {why}")
            known_keyspaces = sorted(
                {t.keyspace for t in self._tables.values()}
                | {name.split(".", 1)[0] for name in self.unusable}
            )
            if keyspace not in known_keyspaces:
                raise SchemaError(f"unknown keyspace {keyspace!r}")
            raise SchemaError(f"unknown table {keyspace}.{table}")
        return found

    def for_key(self, key: Key) -> TableSchema:
        qualified = key.name.split(":", 1)[0]
        found = self._tables.get(qualified)
        if found is None:
            raise SchemaError(f"no table {qualified} for key {key.name}")
        return found

    def tables(self) -> list[TableSchema]:
        return [self._tables[name] for name in sorted(self._tables)]

    @staticmethod
    def from_mapping(spec: Mapping[str, Mapping[str, Sequence[Sequence[str]]]]) -> Catalog:
        """Tables from config (docs/sidecars.md): ``{"ks.t": {"partition_key": [[name, type]],
        "clustering": [[name, type, "asc"|"desc"]], "columns": [...], "static": [...]}}``."""
        catalog = Catalog()
        for qualified, table in spec.items():
            keyspace, _, name = qualified.partition(".")
            if not keyspace or not name:
                raise SchemaError(f"table name {qualified!r} must be keyspace.table")
            clustering = []
            for column in table.get("clustering", ()):
                if len(column) not in (2, 3):
                    raise SchemaError(
                        f"{qualified}.clustering: {column!r} is not [name, type, order]"
                    )
                order = column[2] if len(column) == 3 else "asc"
                clustering.append((column[0], column[1], order))
            catalog.add(
                TableSchema(
                    keyspace,
                    name,
                    tuple((c[0], c[1]) for c in table.get("partition_key", ())),
                    tuple((c[0], c[1]) for c in table.get("columns", ())),
                    tuple(clustering),
                    tuple((c[0], c[1]) for c in table.get("static", ())),
                )
            )
        return catalog


def check_key(catalog: Catalog, key: Key) -> TableSchema:
    """The table of ``key``, if it is a key this catalog could have made; else SchemaError.

    Peers send keys: one naming no served table, or a token that is not its partition's,
    would land a write nowhere or on replicas that do not own it.
    """
    table = catalog.for_key(key)
    try:
        routing = routing_key_of(key)
    except ValueError:
        raise SchemaError(f"key {key.name[:80]!r} has no routing key") from None
    if tokens.murmur3_token(routing) != key.token:
        raise SchemaError(f"key {key.name[:80]!r} has token {key.token}, not its partition's")
    return table


def check_row(
    table: TableSchema, row: object, columns: tuple[tuple[str, str], ...] | None = None
) -> None:
    """SchemaError unless ``row`` (a written value) fits ``table``'s columns (or the
    ``columns`` given: the static ones for a static row)."""
    columns = table.columns if columns is None else columns
    if row is None:
        return
    if not isinstance(row, tuple) or len(row) != len(columns):
        raise SchemaError(f"{table.qualified}: a row needs {len(columns)} values")
    for (name, cql_type), value in zip(columns, row, strict=True):
        check_type(f"{table.qualified}.{name}", cql_type, value)


def check_write(table: TableSchema, write: WriteOp) -> None:
    """SchemaError unless a computed write fits ``table``: its clustering key or prefix, its
    bounds and its row (static columns for a static row)."""
    full = write.scope is WriteScope.ROW
    if write.scope in (WriteScope.ROW, WriteScope.RANGE):
        if full and not table.clustering and write.clustering == ():
            pass
        else:
            table.check_clustering(write.clustering, full=full)
    if write.scope is WriteScope.RANGE:
        index = len(write.clustering)
        for bound in (write.lower, write.upper):
            if bound is None:
                continue
            if index >= len(table.clustering):
                raise SchemaError(f"{table.qualified}: a range past the last clustering column")
            name, cql_type, _ = table.clustering[index]
            check_type(f"{table.qualified}.{name}", cql_type, bound.value)
    if write.scope is WriteScope.STATIC and not write.delete:
        check_row(table, write.value, table.static)
    elif write.scope is WriteScope.ROW and not write.delete:
        check_row(table, write.value)


def check_txn_write(catalog: Catalog, write: object) -> None:
    """SchemaError unless a peer's declared row write could land: its clustering key fits
    the table, a literal row has the table's width, and a TTL is one the store honours."""
    if isinstance(write, PutRow | DeleteRow):
        table = catalog.for_key(write.key)
        if write.clustering or table.clustering:
            table.check_clustering(write.clustering, full=True)
    elif isinstance(write, DeleteRange):
        catalog.for_key(write.key).check_clustering(write.prefix, full=False)
    if isinstance(write, PutRow | PutStatic):
        table = catalog.for_key(write.key)
        width = len(table.static if isinstance(write, PutStatic) else table.columns)
        if isinstance(write.value, MakeTuple) and len(write.value.items) != width:
            raise SchemaError(f"{table.qualified}: a row of the wrong width")
        if write.ttl is not None and catalog.ttl_check is not None:
            problem = catalog.ttl_check(table, write, True)
            if problem is not None:
                raise SchemaError(problem)


def routing_key_of(key: Key) -> bytes:
    return bytes.fromhex(key.name.split(":", 1)[1])


def _deserialize(cql_type: str, data: bytes) -> object:
    if cql_type in TEXT_TYPES:
        return data.decode("utf-8")
    if cql_type == "blob":
        return data
    if cql_type == "boolean":
        return data != b"\x00"
    if cql_type in ("uuid", "timeuuid"):
        return str(uuid.UUID(bytes=data))
    if cql_type == "date":
        return int.from_bytes(data, "big") - 2**31
    if cql_type == "inet":
        return str(ipaddress.ip_address(data))
    return int.from_bytes(data, "big", signed=True)


def partition_values(table: TableSchema, routing: bytes) -> tuple[object, ...]:
    """The partition key values a routing key was built from (inverse of ``routing_key``)."""
    if len(table.partition_key) == 1:
        return (_deserialize(table.partition_key[0][1], routing),)
    values: list[object] = []
    offset = 0
    for _, cql_type in table.partition_key:
        length = int.from_bytes(routing[offset : offset + 2], "big")
        values.append(_deserialize(cql_type, routing[offset + 2 : offset + 2 + length]))
        offset += 3 + length
    return tuple(values)
