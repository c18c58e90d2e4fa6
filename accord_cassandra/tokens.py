"""Cassandra's own Murmur3 partitioner token for a partition key.

An Accord key is a Cassandra partition, and its token must be exactly the one Cassandra
computes, or shards and replicas disagree with the ring. cassandra-driver's Murmur3 is a
port of Cassandra's `MurmurHash.hash3_x64_128`, which sign-extends the tail bytes; `mmh3`
does not, so it gives a different token whenever one of the last `len % 16` bytes is >= 0x80
(UTF-8 `ключ`: Cassandra 1182936647932017555, mmh3 -693430156023627069). Hence no mmh3.

Routing keys follow the driver and Cassandra: a single-column key is the column's serialized
value; a composite key is, for each component, a 2-byte big-endian length, the bytes, and 0x00.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable

from cassandra.metadata import Murmur3Token

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
_MAX_COMPONENT = 0xFFFF


def murmur3_token(routing_key: bytes) -> int:
    """The Murmur3Partitioner token of a serialized partition key.

    Cassandra maps the hash Long.MIN_VALUE to Long.MAX_VALUE (MIN is its ring's minimum
    token, which no key may own); Murmur3Token.from_key does the same.
    """
    return int(Murmur3Token.from_key(bytes(routing_key)).value)


def text_key(value: str) -> bytes:
    """A `text`/`varchar` (or `ascii`) partition key value: its UTF-8 bytes."""
    return value.encode("utf-8")


def blob_key(value: bytes) -> bytes:
    return bytes(value)


def int_key(value: int) -> bytes:
    """A CQL `int`: 4-byte big-endian two's complement."""
    return struct.pack(">i", value)


def bigint_key(value: int) -> bytes:
    """A CQL `bigint`: 8-byte big-endian two's complement."""
    return struct.pack(">q", value)


def uuid_key(value: uuid.UUID) -> bytes:
    """A CQL `uuid` or `timeuuid`: its 16 bytes."""
    return value.bytes


def composite_key(components: Iterable[bytes]) -> bytes:
    """Routing key of a multi-column partition key from each column's serialized value."""
    parts = []
    for component in components:
        if len(component) > _MAX_COMPONENT:
            raise ValueError(f"a composite key component is limited to {_MAX_COMPONENT} bytes")
        parts.append(struct.pack(">H", len(component)) + component + b"\x00")
    return b"".join(parts)
