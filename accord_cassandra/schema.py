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
import functools
import ipaddress
import math
import re
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

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
from accord.api import ColumnKey, order_key
from accord_cassandra import tokens
from accord_cassandra.errors import AccordCassandraError

INT_TYPES = {"int": 32, "bigint": 64, "smallint": 16, "tinyint": 8, "counter": 64, "varint": 64}
TEXT_TYPES = frozenset({"text", "varchar", "ascii"})
# IEEE 754 binary32 and binary64, as Python floats (a float column's values are rounded to
# binary32 on their way in and on every store's write, so all stores hold the same value).
FLOAT_TYPES = frozenset({"float", "double"})
# Time types as integers: timestamp (ms since the epoch), date (days since the epoch), time
# (ns since midnight); inet as its canonical text; decimal as its canonical text.
# A timestamp is bounded to years 1-9999 (the range of the driver's datetime, through which
# the Cassandra store converts it): a committed write outside that range could never land.
TIMESTAMP_MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
TIMESTAMP_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
TIME_TYPES = {
    "timestamp": (TIMESTAMP_MIN_MS, TIMESTAMP_MAX_MS),
    "date": (-(2**31), 2**31 - 1),
    "time": (0, 86_400 * 10**9 - 1),
}
SCALAR_TYPES = frozenset(
    {
        *INT_TYPES,
        *TEXT_TYPES,
        *TIME_TYPES,
        *FLOAT_TYPES,
        "blob",
        "boolean",
        "uuid",
        "timeuuid",
        "inet",
        "decimal",
        "duration",
    }
)
# Every scalar type is served; composite ones (frozen<list|set|map<…>>, tuple<…>, frozen
# UDTs) are parsed from their type text by parse_type.
SUPPORTED_TYPES = SCALAR_TYPES
COLLECTIONS = frozenset({"list", "set", "map"})
# Their core values do not order as Cassandra orders them (text for inet and decimal), or
# Cassandra refuses them in a primary key (duration).
NOT_CLUSTERING_TYPES = frozenset({"inet", "decimal", "duration"})
NOT_PARTITION_KEY_TYPES = frozenset({"decimal", "duration"})
# Types whose core order (accord.primitives.rows.order_key) is Cassandra's comparator's, so
# they may sit inside a frozen collection, tuple or UDT clustering column. (A top-level uuid
# or timeuuid clustering column is ordered by column_order_key instead. Inside a composite
# they stay refused: Cassandra 5.0 was seen ordering frozen<set<uuid>> rows by the elements
# in the order the driver serialized them, not re-sorted by UUIDType.)
CASSANDRA_ORDERED = frozenset(
    {*INT_TYPES, *TEXT_TYPES, *TIME_TYPES, *FLOAT_TYPES, "blob", "boolean"}
)
# Cassandra refuses a duration as a set element or map key; a decimal's text tells 1.0 from
# 1.00 where Cassandra's comparator, which dedupes set elements, does not.
NOT_ELEMENT_TYPES = frozenset({"duration", "decimal"})
INT32 = 2**31
# A row or value larger than this is refused before it reaches the protocol.
MAX_VALUE_BYTES = 64 * 1024
# Cassandra's limit on a serialized partition key (an unsigned 16-bit length).
MAX_PARTITION_KEY_BYTES = 0xFFFF
# Elements of one collection value, and nesting of composite types.
MAX_COLLECTION_ELEMENTS = 10_000
MAX_TYPE_DEPTH = 8


class SchemaError(AccordCassandraError, ValueError):
    """A request names a keyspace, table or column that does not exist, or a value of the
    wrong type for its column. The message names the culprit."""


@dataclass(frozen=True, slots=True)
class CqlType:
    """A parsed CQL type. ``name`` is a scalar type, ``list``/``set``/``map``/``tuple``, or
    ``udt`` (``udt`` names it, ``fields`` its field names; ``args`` are the element, key and
    value, component or field types). ``frozen`` is set on a frozen collection or UDT
    (tuples are always frozen; everything inside a frozen type is)."""

    name: str
    args: tuple[CqlType, ...] = ()
    frozen: bool = False
    fields: tuple[str, ...] = ()
    udt: str = ""

    def text(self) -> str:
        """The canonical type text (a UDT spelled out: ``address{street: text}``), which
        parse_type reads back without the UDT's definition."""
        if self.name == "udt":
            inner = ", ".join(
                f"{f}: {t.text()}" for f, t in zip(self.fields, self.args, strict=True)
            )
            body = f"{self.udt}{{{inner}}}"
        elif self.args:
            body = f"{self.name}<{', '.join(t.text() for t in self.args)}>"
        else:
            return self.name
        return f"frozen<{body}>" if self.frozen and self.name != "tuple" else body

    @property
    def composite(self) -> bool:
        return bool(self.args)


UserTypes = Mapping[str, Sequence[Sequence[str]]]
"""User-defined types by name: their ``[field, type]`` pairs, in order."""


class _TypeParser:
    def __init__(self, text: str, udts: UserTypes) -> None:
        self.text, self.at, self.udts = text, 0, udts

    def fail(self, why: str) -> SchemaError:
        return SchemaError(f"CQL type {self.text}: {why}")

    def peek(self) -> str:
        while self.at < len(self.text) and self.text[self.at] == " ":
            self.at += 1
        return self.text[self.at] if self.at < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r} at {self.at}")
        self.at += 1

    def ident(self) -> str:
        self.peek()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in "<>{},: ":
            self.at += 1
        if start == self.at:
            raise self.fail(f"expected a name at {start}")
        return self.text[start : self.at]

    def parse(self, frozen: bool, depth: int, seen: tuple[str, ...] = ()) -> CqlType:
        if depth > MAX_TYPE_DEPTH:
            raise self.fail(f"nested deeper than {MAX_TYPE_DEPTH}")
        name = self.ident()
        if name == "frozen":
            self.expect("<")
            inner = self.parse(True, depth, seen)
            self.expect(">")
            return inner
        if self.peek() == "{":  # a UDT spelled out (CqlType.text)
            self.at += 1
            fields: list[tuple[str, CqlType]] = []
            while True:
                field_name = self.ident()
                self.expect(":")
                fields.append((field_name, self.parse(True, depth + 1, seen)))
                if self.peek() != ",":
                    break
                self.at += 1
            self.expect("}")
            return _udt(name, fields, frozen)
        if self.peek() == "<":
            self.at += 1
            args = [self.parse(frozen, depth + 1, seen)]
            while self.peek() == ",":
                self.at += 1
                args.append(self.parse(frozen, depth + 1, seen))
            self.expect(">")
            arity = {"list": 1, "set": 1, "map": 2}.get(name)
            if name == "tuple":
                return CqlType("tuple", tuple(args), True)
            if arity is None:
                raise self.fail(f"{name}<…> is not a type the sidecar serves")
            if len(args) != arity:
                raise self.fail(f"{name} takes {arity} type(s)")
            return CqlType(name, tuple(args), frozen)
        if name in SCALAR_TYPES or name == "counter":
            return CqlType(name)
        definition = self.udts.get(name)
        if definition is None:
            raise self.fail(f"{name} is not a type the sidecar serves")
        if name in seen:
            raise self.fail(f"user type {name} contains itself")
        fields = []
        for pair in definition:
            if len(pair) != 2:
                raise self.fail(f"user type {name}: {pair!r} is not [field, type]")
            sub = _TypeParser(str(pair[1]), self.udts)
            fields.append((str(pair[0]), sub.whole(True, depth + 1, (*seen, name))))
        return _udt(name, fields, frozen)

    def whole(self, frozen: bool, depth: int, seen: tuple[str, ...] = ()) -> CqlType:
        parsed = self.parse(frozen, depth, seen)
        if self.peek():
            raise self.fail(f"unexpected {self.text[self.at :]!r}")
        return parsed


def _udt(name: str, fields: Sequence[tuple[str, CqlType]], frozen: bool) -> CqlType:
    if not fields:
        raise SchemaError(f"user type {name} has no fields")
    return CqlType("udt", tuple(t for _, t in fields), frozen, tuple(f for f, _ in fields), name)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> CqlType:
    return _TypeParser(text, {}).whole(False, 0)


def parse_type(text: str, udts: UserTypes | None = None) -> CqlType:
    """``text`` (a CQL type as Cassandra's metadata spells it, or CqlType.text) parsed,
    with the user types ``udts`` resolved; SchemaError if the sidecar cannot serve it."""
    if not udts:
        return _parse_cached(text)
    return _TypeParser(text, udts).whole(False, 0)


def _refusal(where: str, t: CqlType, role: str) -> str | None:
    """Why a column of type ``t`` cannot be served in ``role`` (partition, clustering or
    regular), or None."""
    top = t.text()
    if t.name == "counter":
        return (
            f"{where} is a counter: counter tables cannot be written through Accord (a "
            "counter update is not idempotent under USING TIMESTAMP)"
        )
    if (t.name in COLLECTIONS or t.name == "udt") and not t.frozen:
        return (
            f"{where}: non-frozen {top} is not served through Accord (an element write "
            "such as a list append is not idempotent under replay); declare it frozen<…>"
        )
    for sub in (t, *_walk(t)):
        if sub.name == "counter" and sub is not t:
            return f"{where}: {top} holds a counter"
        if sub.name in ("set", "map") and (
            sub.args[0].name in NOT_ELEMENT_TYPES
            or any(x.name in NOT_ELEMENT_TYPES for x in _walk(sub.args[0]))
        ):
            return (
                f"{where}: {top}: a set element or map key of type {sub.args[0].text()} is "
                "not served (Cassandra refuses duration there; a decimal's text is not its "
                "order)"
            )
    if role == "partition" and (t.name in NOT_PARTITION_KEY_TYPES or t.composite):
        return f"{where}: CQL type {top} is not supported in a partition key"
    if role == "clustering":
        if t.name in NOT_CLUSTERING_TYPES:
            return (
                f"{where}: CQL type {top} is not supported as a clustering column (its "
                "Accord value would not sort as Cassandra sorts it)"
            )
        if t.composite and any(
            not sub.composite and sub.name not in CASSANDRA_ORDERED for sub in _walk(t)
        ):
            return (
                f"{where}: CQL type {top} is not supported as a clustering column (an "
                "element's Accord value would not sort as Cassandra sorts it)"
            )
    return None


def column_order_key(cql_type: str) -> ColumnKey | None:
    """The order of a clustering column of ``cql_type`` where its core value's
    (``order_key``) is not Cassandra's, else None: a uuid's or timeuuid's text sorts
    neither as UUIDType nor as TimeUUIDType does (docs/sidecars.md, "Ordering")."""
    if cql_type == "uuid":
        return _uuid_order
    if cql_type == "timeuuid":
        return _timeuuid_order
    return None


def _uuid_bytes(value: object) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise SchemaError(f"{value!r} is not a UUID, so it cannot order uuid rows") from None


def _uuid_order(value: object) -> tuple[object, ...]:
    # UUIDType: by the version nibble; a version 1 UUID then by its 60-bit timestamp, any
    # other by its high 64 bits unsigned; then the low 64 bits unsigned.
    parsed = _uuid_bytes(value)
    raw = parsed.bytes
    version = raw[6] >> 4
    high = parsed.time if version == 1 else int.from_bytes(raw[:8], "big")
    return (version, high, int.from_bytes(raw[8:], "big"))


def _timeuuid_order(value: object) -> tuple[object, ...]:
    # TimeUUIDType: by the 60-bit timestamp, then the low 8 bytes each as a *signed* byte
    # (unlike UUIDType; flipping each byte's top bit makes that an unsigned comparison).
    parsed = _uuid_bytes(value)
    low = bytes(byte ^ 0x80 for byte in parsed.bytes[8:])
    return (parsed.time, int.from_bytes(low, "big"))


def _walk(t: CqlType) -> list[CqlType]:
    out = []
    for arg in t.args:
        out.append(arg)
        out.extend(_walk(arg))
    return out


# Partition keys each table remembers (TableSchema.key) before it starts afresh, and the
# value types such a key may be made of: those whose equal values are the same key.
KEYS_REMEMBERED = 8192
_REMEMBERED_TYPES = frozenset((str, int, bool, bytes))


@dataclass(frozen=True, slots=True)
class TableSchema:
    keyspace: str
    table: str
    partition_key: tuple[tuple[str, str], ...]
    columns: tuple[tuple[str, str], ...]
    clustering: tuple[tuple[str, str, str], ...] = ()
    static: tuple[tuple[str, str], ...] = ()
    # User-defined types of the keyspace, by name: their [field, type] pairs. Column types
    # naming one are rewritten to their canonical text (CqlType.text), which spells it out.
    udts: UserTypes = field(default_factory=dict, repr=False, compare=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    # Derived once: every value written or read is checked against its column, and a
    # saga-store batch names thousands of them (formatting "ks.table.column" for each check
    # and scanning the column tuples was a tenth of translating such a request).
    _qualified: str = field(init=False, repr=False, compare=False)
    _where: dict[str, str] = field(init=False, repr=False, compare=False)
    _types: dict[str, str] = field(init=False, repr=False, compare=False)
    _static_index: dict[str, int] = field(init=False, repr=False, compare=False)
    _clustering_names: frozenset[str] = field(init=False, repr=False, compare=False)
    _keys: dict[tuple[tuple[type, ...], tuple[object, ...]], Key] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_qualified", f"{self.keyspace}.{self.table}")
        if not self.partition_key:
            raise SchemaError(f"{self.qualified}: a table needs a partition key")

        def resolved(name: str, cql_type: str, role: str) -> str:
            where = f"{self.qualified}.{name}"
            try:
                parsed = parse_type(cql_type, self.udts)
            except SchemaError as error:
                raise SchemaError(f"{where}: {error}") from None
            why = _refusal(where, parsed, role)
            if why is not None:
                raise SchemaError(why)
            return parsed.text()

        for part, role in (
            ("partition_key", "partition"),
            ("columns", "regular"),
            ("static", "regular"),
        ):
            columns = getattr(self, part)
            object.__setattr__(self, part, tuple((n, resolved(n, t, role)) for n, t in columns))
        object.__setattr__(
            self,
            "clustering",
            tuple((n, resolved(n, t, "clustering"), o) for n, t, o in self.clustering),
        )
        for name, _, order in self.clustering:
            if order not in ("asc", "desc"):
                raise SchemaError(
                    f"{self.qualified}.{name}: clustering order {order!r} (asc, desc)"
                )
        if self.static and not self.clustering:
            raise SchemaError(f"{self.qualified}: static columns need clustering columns")
        object.__setattr__(self, "_index", {name: i for i, (name, _) in enumerate(self.columns)})
        names = [
            *(n for n, _ in self.partition_key),
            *(n for n, _, _ in self.clustering),
            *(n for n, _ in self.columns),
            *(n for n, _ in self.static),
        ]
        object.__setattr__(self, "_where", {n: f"{self._qualified}.{n}" for n in names})
        object.__setattr__(self, "_types", {**dict(self.columns), **dict(self.static)})
        object.__setattr__(self, "_static_index", {n: i for i, (n, _) in enumerate(self.static)})
        object.__setattr__(self, "_clustering_names", frozenset(n for n, _, _ in self.clustering))
        object.__setattr__(self, "_keys", {})

    def where(self, column: str) -> str:
        """``keyspace.table.column``, as errors name a column."""
        found = self._where.get(column)
        return found if found is not None else f"{self._qualified}.{column}"

    def clustering_index(self, column: str) -> int:
        for index, (name, _, _) in enumerate(self.clustering):
            if name == column:
                return index
        if any(name == column for name, _ in self.columns):
            raise SchemaError(f"{self.qualified}.{column} is not a clustering column")
        raise SchemaError(f"unknown clustering column {column!r} in {self.qualified}")

    def static_index(self, column: str) -> int | None:
        return self._static_index.get(column)

    def is_clustering(self, column: str) -> bool:
        return column in self._clustering_names

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
            out.append(check_type(self._where[name], cql_type, value, key=True))
        return tuple(out)

    @property
    def qualified(self) -> str:
        return self._qualified

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
        found = self._types.get(column)
        return found if found is not None else self.columns[self.column_index(column)][1]

    def routing_key(self, values: Sequence[object]) -> bytes:
        if len(values) != len(self.partition_key):
            raise SchemaError(
                f"{self.qualified} has {len(self.partition_key)} partition key column(s), "
                f"got {len(values)} value(s)"
            )
        where = self._where
        parts = [
            serialize(where[name], cql_type, value)
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
        """The Accord key of the partition ``values`` name (checked, as :meth:`routing_key`).

        Remembered (up to KEYS_REMEMBERED per table): a saga-store batch names each hot
        partition (a write lane's Tier-4 row and Tier-5 partition) several times, and so
        does every batch after it; deriving a key (checks, serialization, Murmur3) was the
        larger part of translating such a request. The memo is keyed by the values' types
        as well, since ``1``, ``1.0`` and ``True`` are equal but not the same key (a bool
        is refused where an int is due), and takes scalar values that equality cannot
        confuse only."""
        types = tuple(map(type, values))
        if not _REMEMBERED_TYPES.issuperset(types):
            # Floats derive their key every time: 0.0 == -0.0, and -0.0 is refused as a key.
            return self._derive_key(values)
        memo = self._keys
        remembered = (types, tuple(values))
        found = memo.get(remembered)
        if found is not None:
            return found
        key = self._derive_key(values)
        if len(memo) >= KEYS_REMEMBERED:
            memo.clear()
        memo[remembered] = key
        return key

    def _derive_key(self, values: Sequence[object]) -> Key:
        routing = self.routing_key(values)
        return Key(tokens.murmur3_token(routing), f"{self._qualified}:{routing.hex()}")

    def check_value(self, column: str, value: object) -> object:
        return check_type(self.where(column), self.column_type(column), value)


def check_type(where: str, cql_type: str, value: object, *, key: bool = False) -> object:
    """``value`` if it fits ``cql_type`` (None always fits), else :class:`SchemaError`; in
    its canonical form: a float column's value rounded to binary32, an integer given for a
    float or double as that float, a set's elements and a map's entries sorted (by
    ``order_key``, Cassandra's order for the types a clustering column may hold) and
    deduplicated, a uuid or inet as its canonical text.

    ``key``: the value names a partition or a row (partition key, clustering value or
    bound), where NaN and -0.0 are refused.
    """
    if value is None:
        return None
    canonical = CANONICAL_SCALARS.get(cql_type)
    if canonical is not None and canonical(value):
        return value
    return _check(where, parse_type(cql_type), value, key)


def _check(where: str, t: CqlType, value: object, key: bool) -> object:
    if not t.composite:
        checked = _check_scalar(where, t.name, value)
        if key and type(checked) is float and _odd(checked):
            raise SchemaError(
                f"{where}: {checked!r} cannot name a partition, a row or a set element or "
                "map key (NaN and -0.0 are refused there: the stores could not agree on them)"
            )
        return checked
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple):
        raise SchemaError(f"{where} is {t.text()}; got {type(value).__name__} {value!r}")
    items = cast("tuple[object, ...]", value)
    if len(items) > MAX_COLLECTION_ELEMENTS:
        raise SchemaError(f"{where}: more than {MAX_COLLECTION_ELEMENTS} elements")
    if t.name in ("tuple", "udt"):
        if len(items) != len(t.args):
            raise SchemaError(f"{where} is {t.text()}; got {len(items)} of {len(t.args)} fields")
        names = t.fields or tuple(str(i) for i in range(len(t.args)))
        return tuple(
            None if item is None else _check(f"{where}.{name}", sub, item, key)
            for name, sub, item in zip(names, t.args, items, strict=True)
        )

    def element(item: object, sub: CqlType, what: str, as_key: bool) -> object:
        if item is None:
            raise SchemaError(f"{where}: a {what} of {t.text()} cannot be null")
        return _check(f"{where}[{what}]", sub, item, as_key)

    if t.name == "list":
        return tuple(element(item, t.args[0], "list element", key) for item in items)
    if t.name == "set":
        found = [element(item, t.args[0], "set element", True) for item in items]
        unique = {_strict(item): item for item in found}
        return tuple(unique[k] for k in sorted(unique))
    entries: dict[tuple[object, ...], tuple[object, object]] = {}
    for entry in items:
        if isinstance(entry, list):
            entry = tuple(entry)
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise SchemaError(f"{where} is {t.text()}; an entry is a (key, value) pair")
        pair = cast("tuple[object, object]", entry)
        k = element(pair[0], t.args[0], "map key", True)
        v = element(pair[1], t.args[1], "map value", key)
        if _strict(k) in entries:
            raise SchemaError(f"{where}: map key {k!r} given twice")
        entries[_strict(k)] = (k, v)
    return tuple(entries[k] for k in sorted(entries))


def _strict(value: object) -> tuple[object, ...]:
    return order_key(value)


def _odd(number: float) -> bool:
    return math.isnan(number) or (number == 0.0 and math.copysign(1.0, number) < 0)


def to_binary32(number: float) -> float:
    """``number`` rounded to the nearest IEEE 754 binary32 (ties to even; beyond the largest
    binary32, infinity), as a float column holds it."""
    if math.isnan(number) or math.isinf(number):
        return number
    try:
        return cast("float", struct.unpack(">f", struct.pack(">f", number))[0])
    except OverflowError:  # rounds past the largest binary32
        return math.copysign(math.inf, number)


def _check_duration(where: str, value: object) -> tuple[int, int, int]:
    if isinstance(value, list):
        value = tuple(value)
    if (
        not isinstance(value, tuple)
        or len(value) != 3
        or any(type(part) is not int for part in value)
    ):
        raise SchemaError(
            f"{where} is duration, a (months, days, nanoseconds) triple of integers; got {value!r}"
        )
    months, days, nanos = cast("tuple[int, int, int]", value)
    if not (-INT32 <= months < INT32 and -INT32 <= days < INT32 and -(2**63) <= nanos < 2**63):
        raise SchemaError(f"{where}: duration {value!r} is out of range")
    if not (min(value) >= 0 or max(value) <= 0):
        raise SchemaError(f"{where}: a duration's parts must all have one sign; got {value!r}")
    return months, days, nanos


def _check_scalar(where: str, cql_type: str, value: object) -> object:
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
            raise SchemaError(f"{where} is {cql_type}; {value} is out of range {low} to {high}")
        return value
    if cql_type in FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{where} is {cql_type}; got {type(value).__name__} {value!r}")
        try:
            real = float(value)
        except OverflowError:
            raise SchemaError(f"{where} is {cql_type}; {value} is out of range") from None
        return to_binary32(real) if cql_type == "float" else real
    if cql_type == "duration":
        return _check_duration(where, value)
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


def _integer_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda value: type(value) is int and low <= value <= high


def _short_ascii(value: object) -> bool:
    return type(value) is str and value.isascii() and len(value) <= MAX_VALUE_BYTES


_UUID_TEXT = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_text(value: object) -> bool:
    return type(value) is str and _UUID_TEXT.fullmatch(value) is not None


def _timeuuid_text(value: object) -> bool:
    # Version 1 and the RFC 4122 variant, as _check_scalar's uuid.UUID(...).version == 1.
    return _uuid_text(value) and value[14] == "1" and value[19] in "89ab"  # type: ignore[index]


# Per scalar CQL type, a test that a value already fits it in its canonical form, which
# check_type then returns as it is: most values a sidecar checks (each write's row on
# arrival, on every replica, and again on its way to the driver) are plain ASCII text,
# integers and UUID text, and the general check was ~12% of a sidecar's CPU under the
# saga store's load (bench.recovery, cProfile). Anything else takes the general check.
# Floats are not here: a float column rounds, and a key refuses NaN and -0.0.
CANONICAL_SCALARS: dict[str, Callable[[object], bool]] = {
    **{
        name: _integer_in(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        for name, bits in INT_TYPES.items()
    },
    **{name: _integer_in(low, high) for name, (low, high) in TIME_TYPES.items()},
    "text": _short_ascii,
    "varchar": _short_ascii,
    "ascii": _short_ascii,
    "blob": lambda value: type(value) is bytes and len(value) <= MAX_VALUE_BYTES,
    "boolean": lambda value: type(value) is bool,
    "uuid": _uuid_text,
    "timeuuid": _timeuuid_text,
}


def serialize(where: str, cql_type: str, value: object) -> bytes:
    """A partition key value in Cassandra's native serialization (for its token);
    ``where`` names its column in errors (``keyspace.table.column``)."""
    if value is None:
        raise SchemaError(f"{where}: a partition key value cannot be null")
    checked = check_type(where, cql_type, value, key=True)
    if cql_type == "float":
        return struct.pack(">f", checked)
    if cql_type == "double":
        return struct.pack(">d", checked)
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
        "clustering": [[name, type, "asc"|"desc"]], "columns": [...], "static": [...]}}``;
        an entry of ``fields`` alone, ``{"ks.address": {"fields": [[name, type], ...]}}``,
        declares the user-defined type ``address`` of keyspace ``ks``."""
        catalog = Catalog()
        udts: dict[str, dict[str, Sequence[Sequence[str]]]] = {}
        for qualified, table in spec.items():
            keyspace, _, name = qualified.partition(".")
            if not keyspace or not name:
                raise SchemaError(f"table name {qualified!r} must be keyspace.table")
            if "fields" in table:
                if set(table) != {"fields"}:
                    raise SchemaError(f"{qualified}: a user type has fields only")
                udts.setdefault(keyspace, {})[name] = table["fields"]
        for qualified, table in spec.items():
            if "fields" in table:
                continue
            keyspace, _, name = qualified.partition(".")
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
                    udts.get(keyspace, {}),
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
    where = table.where
    for (name, cql_type), value in zip(columns, row, strict=True):
        check_type(where(name), cql_type, value)


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
            check_type(table.where(name), cql_type, bound.value, key=True)
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
    if cql_type in FLOAT_TYPES:
        return struct.unpack(">f" if cql_type == "float" else ">d", data)[0]
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
