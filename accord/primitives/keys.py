"""Keys, tokens, token ranges and routes.

A key is opaque to the protocol except for its token, which places it on the ring. The
simulator derives tokens with a stable hash; the Cassandra sidecar uses Cassandra's own
Murmur3 token of the partition key, so shards line up with Cassandra's token ranges.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

from accord.invariants import check_argument
from accord.primitives.timestamp import Int64

TOKEN_MIN = -(2**63)
TOKEN_MAX = 2**63 - 1


class Key(NamedTuple):
    """A routable key: ordered by token, then by name so equal tokens still have an order."""

    token: Int64
    name: str

    def __str__(self) -> str:
        return self.name


def sim_key(name: str) -> Key:
    """A key whose token is a stable 64-bit hash of its name (for simulation and demos)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    token = int.from_bytes(digest, "big", signed=True)
    # Cassandra never hands out TOKEN_MIN (it is the ring's exclusive start).
    return Key(token if token != TOKEN_MIN else TOKEN_MAX, name)


@dataclass(frozen=True, slots=True)
class TokenRange:
    """Tokens in ``(start, end]``, the same half-open convention as Cassandra's ranges."""

    start: int
    end: int

    def __post_init__(self) -> None:
        check_argument(self.start < self.end, "token range (%d, %d] is empty", self.start, self.end)

    def contains(self, token: int) -> bool:
        return self.start < token <= self.end


@dataclass(frozen=True, slots=True)
class Route:
    """The keys of a transaction plus its home key, whose shard tracks its progress."""

    home_key: Key
    keys: tuple[Key, ...]

    def __post_init__(self) -> None:
        check_argument(len(self.keys) > 0, "a route needs at least one key")
        check_argument(
            self.home_key in self.keys, "home key %s is not a participant", self.home_key
        )
