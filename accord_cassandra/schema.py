"""Tables written through Accord: their columns, value types, and how rows become keys.

An Accord key is one Cassandra partition, ``(keyspace, table, partition key)``. Its token is
Cassandra's own Murmur3 token of the serialized partition key (:mod:`accord_cassandra.tokens`),
so shards line up with Cassandra's token ranges. Its name is
``keyspace.table:<hex of the routing key>``, which is unique, stable and reversible.

The value of a key inside the protocol is the row's regular columns as a tuple, in the
table's column order, or ``None`` when the row does not exist. Tables must have no
clustering columns: a partition is one row.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from accord import Key
from accord_cassandra import tokens
from accord_cassandra.errors import AccordCassandraError

INT_TYPES = {"int": 32, "bigint": 64, "smallint": 16, "tinyint": 8, "counter": 64, "varint": 64}
TEXT_TYPES = frozenset({"text", "varchar", "ascii"})
SUPPORTED_TYPES = frozenset({*INT_TYPES, *TEXT_TYPES, "blob", "boolean", "uuid", "timeuuid"})
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
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.partition_key:
            raise SchemaError(f"{self.qualified}: a table needs a partition key")
        for name, cql_type in (*self.partition_key, *self.columns):
            if cql_type not in SUPPORTED_TYPES:
                raise SchemaError(f"{self.qualified}.{name}: CQL type {cql_type} is not supported")
        object.__setattr__(self, "_index", {name: i for i, (name, _) in enumerate(self.columns)})

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
    return tokens.uuid_key(uuid.UUID(str(checked)))


class Catalog:
    """The tables the sidecar may touch, by ``keyspace.table``."""

    def __init__(
        self, tables: Sequence[TableSchema] = (), unusable: Mapping[str, str] | None = None
    ) -> None:
        self._tables: dict[str, TableSchema] = {t.qualified: t for t in tables}
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
        """Tables from config: ``{"ks.t": {"partition_key": [[name, type]], "columns": [...]}}``."""
        catalog = Catalog()
        for qualified, table in spec.items():
            keyspace, _, name = qualified.partition(".")
            if not keyspace or not name:
                raise SchemaError(f"table name {qualified!r} must be keyspace.table")
            catalog.add(
                TableSchema(
                    keyspace,
                    name,
                    tuple((c[0], c[1]) for c in table.get("partition_key", ())),
                    tuple((c[0], c[1]) for c in table.get("columns", ())),
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


def check_row(table: TableSchema, row: object) -> None:
    """SchemaError unless ``row`` (a written value) fits ``table``'s columns."""
    if row is None:
        return
    if not isinstance(row, tuple) or len(row) != len(table.columns):
        raise SchemaError(f"{table.qualified}: a row needs {len(table.columns)} values")
    for (name, cql_type), value in zip(table.columns, row, strict=True):
        check_type(f"{table.qualified}.{name}", cql_type, value)


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
