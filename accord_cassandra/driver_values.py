"""Core values (schema.py's mapping of each CQL type) to cassandra-driver's values and back."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any, cast

from accord_cassandra.schema import (
    CANONICAL_SCALARS,
    INT_TYPES,
    TEXT_TYPES,
    CqlType,
    check_type,
    parse_type,
)

# Scalar types whose canonical core value is also the driver's.
_AS_IS = frozenset({*INT_TYPES, *TEXT_TYPES, "blob", "boolean"})


def to_driver(cql_type: str, value: object) -> object:
    """A core value of a ``cql_type`` column as the driver takes it, in its canonical form
    (check_type: a float column's value rounded to binary32, as the memory store holds it)."""
    if value is None:
        return None
    if cql_type in _AS_IS and CANONICAL_SCALARS[cql_type](value):
        return value
    if cql_type == "timestamp" and not isinstance(value, int):
        raise ValueError(f"a timestamp is milliseconds as an integer, not {value!r}")
    return _driver_value(parse_type(cql_type), check_type(cql_type, cql_type, value))


class _Entries:
    """A map value as the driver serializes one (``len`` and ``items``), keeping the core's
    entry order and taking keys a dict could not hold (a frozen list)."""

    def __init__(self, entries: list[tuple[object, object]]) -> None:
        self.entries = entries

    def __len__(self) -> int:
        return len(self.entries)

    def items(self) -> list[tuple[object, object]]:
        return self.entries


def _driver_value(t: CqlType, value: object) -> object:
    if value is None:
        return None
    if t.composite:
        items = value if isinstance(value, tuple) else ()
        if t.name in ("list", "set"):
            return [_driver_value(t.args[0], item) for item in items]
        if t.name == "map":
            return _Entries(
                [
                    (_driver_value(t.args[0], k), _driver_value(t.args[1], v))
                    for k, v in cast("tuple[tuple[object, object], ...]", items)
                ]
            )
        return tuple(_driver_value(sub, item) for sub, item in zip(t.args, items, strict=True))
    if t.name in ("uuid", "timeuuid"):
        return uuid.UUID(str(value))
    if t.name == "timestamp":
        return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=_int(value))
    if t.name == "date":
        from cassandra.util import Date

        return Date(value)
    if t.name == "time":
        from cassandra.util import Time

        return Time(value)
    if t.name == "decimal":
        return decimal.Decimal(str(value))
    if t.name == "duration":
        from cassandra.util import Duration

        months, days, nanos = cast("tuple[int, int, int]", value)
        return Duration(months, days, nanos)
    return value


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"expected an integer, not {value!r}")
    return value


def from_driver(value: object, cql_type: str | None = None) -> object:
    """A driver value as the core's (schema.py's mapping of each CQL type); a composite
    one (a collection, tuple, UDT or duration) needs its ``cql_type``, and comes back in
    its canonical form (sets and maps sorted)."""
    if (
        cql_type is not None
        and value is not None
        and (cql_type == "duration" or parse_type(cql_type).composite)
    ):
        return check_type(cql_type, cql_type, _core_value(parse_type(cql_type), value))
    return _scalar_from_driver(value)


def _core_value(t: CqlType, value: object) -> object:
    if value is None:
        return None
    if t.name == "duration":
        return (
            getattr(value, "months", None),
            getattr(value, "days", None),
            getattr(value, "nanoseconds", None),
        )
    if not t.composite:
        return _scalar_from_driver(value)
    if t.name in ("list", "set"):
        return tuple(_core_value(t.args[0], item) for item in cast("list[object]", value))
    if t.name == "map":
        pairs = cast("Any", value).items()
        return tuple((_core_value(t.args[0], k), _core_value(t.args[1], v)) for k, v in pairs)
    fields = tuple(cast("tuple[object, ...]", value))
    fields += (None,) * (len(t.args) - len(fields))  # a UDT written with fewer fields
    return tuple(_core_value(sub, item) for sub, item in zip(t.args, fields, strict=True))


def _scalar_from_driver(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime.datetime):
        # The driver reads a timestamp through float seconds, a few microseconds off far
        # from the epoch: to the nearest millisecond, not down, or it reads back 1 ms less.
        delta = value.replace(tzinfo=None) - datetime.datetime(1970, 1, 1)
        return (delta.days * 86_400 + delta.seconds) * 1000 + (delta.microseconds + 500) // 1000
    if isinstance(value, decimal.Decimal):
        return str(value)
    days = getattr(value, "days_from_epoch", None)
    if isinstance(days, int):
        return days
    nanos = getattr(value, "nanosecond_time", None)
    if isinstance(nanos, int):
        return nanos
    return value
