"""CQL values in the native protocol's serialization, to and from the core's forms
(accord_cassandra/schema.py): a timestamp as ms, a date as days, a time as ns, a uuid, inet or
decimal as text, a duration as ``(months, days, nanos)``, a set as a sorted tuple, a map as a
tuple of ``(key, value)`` pairs, a tuple or UDT as a tuple of its fields.

``encode_type`` writes a type's [option] for result and bind-variable metadata.
"""

from __future__ import annotations

import decimal
import ipaddress
import struct
import uuid
from collections.abc import Sequence
from typing import cast

from accord_cassandra.native.frame import NOT_SET, Malformed, Reader, Writer
from accord_cassandra.schema import CqlType, parse_type

SCALAR_CODES = {
    "ascii": 0x0001,
    "bigint": 0x0002,
    "blob": 0x0003,
    "boolean": 0x0004,
    "counter": 0x0005,
    "decimal": 0x0006,
    "double": 0x0007,
    "float": 0x0008,
    "int": 0x0009,
    "timestamp": 0x000B,
    "uuid": 0x000C,
    "varchar": 0x000D,
    "text": 0x000D,
    "varint": 0x000E,
    "timeuuid": 0x000F,
    "inet": 0x0010,
    "date": 0x0011,
    "time": 0x0012,
    "smallint": 0x0013,
    "tinyint": 0x0014,
}
CUSTOM = 0x0000
LIST, MAP, SET, UDT, TUPLE = 0x0020, 0x0021, 0x0022, 0x0030, 0x0031
# Protocol v4 has no code for duration: Cassandra sends it as this custom type.
DURATION_CLASS = "org.apache.cassandra.db.marshal.DurationType"
FIXED = {"int": 4, "bigint": 8, "counter": 8, "smallint": 2, "tinyint": 1, "timestamp": 8}


def encode_type(t: CqlType | str, keyspace: str) -> bytes:
    """The [option] of ``t`` (a UDT is named in ``keyspace``)."""
    if isinstance(t, str):
        t = parse_type(t)
    w = Writer()
    _type(w, t, keyspace)
    return w.build()


def _type(w: Writer, t: CqlType, keyspace: str) -> None:
    if t.name in SCALAR_CODES:
        w.short(SCALAR_CODES[t.name])
    elif t.name == "duration":
        w.short(CUSTOM).string(DURATION_CLASS)
    elif t.name in ("list", "set"):
        w.short(LIST if t.name == "list" else SET)
        _type(w, t.args[0], keyspace)
    elif t.name == "map":
        w.short(MAP)
        _type(w, t.args[0], keyspace)
        _type(w, t.args[1], keyspace)
    elif t.name == "tuple":
        w.short(TUPLE).short(len(t.args))
        for sub in t.args:
            _type(w, sub, keyspace)
    elif t.name == "udt":
        ks, _, name = t.udt.rpartition(".")
        w.short(UDT).string(ks or keyspace).string(name).short(len(t.args))
        for field_name, sub in zip(t.fields, t.args, strict=True):
            w.string(field_name)
            _type(w, sub, keyspace)
    else:  # pragma: no cover - parse_type admits only the types above
        raise ValueError(f"no native protocol type for {t.text()}")


def decode(t: CqlType | str, data: bytes | None) -> object:
    """A bound [value]'s bytes as the core value of type ``t`` (None for null);
    :class:`Malformed` if the bytes cannot be of that type."""
    if isinstance(t, str):
        t = parse_type(t)
    if data is None:
        return None
    try:
        return _decode(t, data)
    except Malformed:
        raise
    except (ValueError, struct.error, UnicodeDecodeError, decimal.DecimalException) as error:
        raise Malformed(f"not a {t.text()} value: {error}") from None


def _decode(t: CqlType, data: bytes) -> object:
    name = t.name
    if name in FIXED:
        if len(data) != FIXED[name]:
            raise Malformed(f"a {name} value is {FIXED[name]} bytes, not {len(data)}")
        return int.from_bytes(data, "big", signed=True)
    if name == "varint":
        if not data:
            raise Malformed("an empty varint")
        return int.from_bytes(data, "big", signed=True)
    if name in ("text", "varchar", "ascii"):
        return data.decode("ascii" if name == "ascii" else "utf-8")
    if name == "blob":
        return bytes(data)
    if name == "boolean":
        if len(data) != 1:
            raise Malformed(f"a boolean value is 1 byte, not {len(data)}")
        return data != b"\x00"
    if name in ("double", "float"):
        size = 8 if name == "double" else 4
        if len(data) != size:
            raise Malformed(f"a {name} value is {size} bytes, not {len(data)}")
        return float(struct.unpack(">d" if size == 8 else ">f", data)[0])
    if name == "date":
        if len(data) != 4:
            raise Malformed(f"a date value is 4 bytes, not {len(data)}")
        return int.from_bytes(data, "big") - 2**31
    if name == "time":
        if len(data) != 8:
            raise Malformed(f"a time value is 8 bytes, not {len(data)}")
        return int.from_bytes(data, "big", signed=True)
    if name in ("uuid", "timeuuid"):
        if len(data) != 16:
            raise Malformed(f"a {name} value is 16 bytes, not {len(data)}")
        return str(uuid.UUID(bytes=bytes(data)))
    if name == "inet":
        if len(data) not in (4, 16):
            raise Malformed(f"an inet value is 4 or 16 bytes, not {len(data)}")
        return str(ipaddress.ip_address(bytes(data)))
    if name == "decimal":
        reader = Reader(data)
        scale = reader.int32()
        unscaled = int.from_bytes(reader.take(len(data) - 4), "big", signed=True)
        return str(decimal.Decimal(unscaled).scaleb(-scale))
    if name == "duration":
        reader = Reader(data)
        parts = (_vint(reader), _vint(reader), _vint(reader))
        reader.done()
        return parts
    if name in ("list", "set"):
        reader = Reader(data)
        items = [_element(t.args[0], reader) for _ in range(_count(reader))]
        reader.done()
        return items
    if name == "map":
        reader = Reader(data)
        entries = [
            (_element(t.args[0], reader), _element(t.args[1], reader))
            for _ in range(_count(reader))
        ]
        reader.done()
        return entries
    if name in ("tuple", "udt"):
        reader = Reader(data)
        fields: list[object] = []
        for sub in t.args:
            if reader.at == len(data):  # a UDT value may leave out trailing fields
                fields.append(None)
                continue
            raw = reader.blob()
            fields.append(None if raw is None else _decode(sub, raw))
        reader.done()
        return tuple(fields)
    raise Malformed(f"type {t.text()} has no native decoding here")  # pragma: no cover


def _count(reader: Reader) -> int:
    n = reader.int32()
    if n < 0:
        raise Malformed(f"a collection of {n} elements")
    return n


def _element(t: CqlType, reader: Reader) -> object:
    raw = reader.blob()
    if raw is None:
        raise Malformed("a null element inside a collection")
    value = _decode(t, raw)
    # Elements are hashable (a set of frozen lists is given as a list of tuples).
    return tuple(cast("list[object]", value)) if isinstance(value, list) else value


def encode(t: CqlType | str, value: object) -> bytes | None:
    """The bytes of core value ``value`` of type ``t`` (None for null)."""
    if isinstance(t, str):
        t = parse_type(t)
    if value is None:
        return None
    return _encode(t, value)


def _encode(t: CqlType, value: object) -> bytes:
    name = t.name
    if name in FIXED:
        return int(cast("int", value)).to_bytes(FIXED[name], "big", signed=True)
    if name == "varint":
        number = int(cast("int", value))
        size = max(1, (number + (number < 0)).bit_length() // 8 + 1)
        return number.to_bytes(size, "big", signed=True)
    if name in ("text", "varchar", "ascii"):
        return str(value).encode("utf-8")
    if name == "blob":
        return bytes(cast("bytes", value))
    if name == "boolean":
        return b"\x01" if value else b"\x00"
    if name == "double":
        return struct.pack(">d", value)
    if name == "float":
        return struct.pack(">f", value)
    if name == "date":
        return (int(cast("int", value)) + 2**31).to_bytes(4, "big")
    if name == "time":
        return int(cast("int", value)).to_bytes(8, "big", signed=True)
    if name in ("uuid", "timeuuid"):
        return uuid.UUID(str(value)).bytes
    if name == "inet":
        return ipaddress.ip_address(str(value)).packed
    if name == "decimal":
        exact = decimal.Decimal(str(value))
        sign, digits, exponent = exact.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        scale = -int(exponent)
        size = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
        return struct.pack(">i", scale) + unscaled.to_bytes(size, "big", signed=True)
    if name == "duration":
        months, days, nanos = cast("Sequence[int]", value)
        return _write_vint(months) + _write_vint(days) + _write_vint(nanos)
    items = list(cast("Sequence[object]", value))
    if name in ("list", "set"):
        w = Writer().int32(len(items))
        for item in items:
            w.blob(_encode(t.args[0], item))
        return w.build()
    if name == "map":
        w = Writer().int32(len(items))
        for entry in items:
            k, v = cast("Sequence[object]", entry)
            w.blob(_encode(t.args[0], k)).blob(_encode(t.args[1], v))
        return w.build()
    if name in ("tuple", "udt"):
        w = Writer()
        for sub, item in zip(t.args, items, strict=True):
            w.blob(None if item is None else _encode(sub, item))
        return w.build()
    raise ValueError(f"type {t.text()} has no native encoding here")  # pragma: no cover


def _vint(reader: Reader) -> int:
    """Cassandra's signed vint: a zigzag-encoded unsigned vint whose first byte's leading
    ones count the extra bytes."""
    first = reader.byte()
    extra = 0
    while extra < 8 and first & (0x80 >> extra):
        extra += 1
    value = first & (0xFF >> (extra + 1)) if extra < 8 else 0
    for byte in reader.take(extra):
        value = (value << 8) | byte
    return (value >> 1) ^ -(value & 1)


def _write_vint(number: int) -> bytes:
    value = (number << 1) ^ (number >> 63)  # zigzag (64-bit)
    value &= 2**64 - 1
    for extra in range(9):
        bits = 7 - extra if extra < 8 else 0
        if value < 1 << (bits + 8 * extra):
            if extra == 8:
                return b"\xff" + value.to_bytes(8, "big")
            body = value.to_bytes(extra + 1, "big")
            prefix = (0xFF << (8 - extra)) & 0xFF
            return bytes([body[0] | prefix]) + body[1:]
    raise ValueError(f"vint {number} out of range")  # pragma: no cover


def is_not_set(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == NOT_SET
