"""Shards over token ranges, their replicas, fast-path electorates and quorum sizes.

Quorum math (reference: Accord ``Shard.java``; the CEP-15 proposal, "Fast-path voters can be
a subset of replicas"): with n replicas, f = floor((n-1)/2) failures are tolerated; a slow
quorum is n - f; with an electorate of e >= n - f voters, a fast quorum is
floor((f + e) / 2) + 1 and the fast path is impossible once 1 + e - fq electorate members
have voted against it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from accord.invariants import ConfigurationError
from accord.primitives import TOKEN_MAX, TOKEN_MIN, Key, TokenRange


def max_failures(replicas: int) -> int:
    return (replicas - 1) // 2


def slow_quorum_size(replicas: int) -> int:
    return replicas - max_failures(replicas)


def fast_quorum_size(replicas: int, electorate: int) -> int:
    f = max_failures(replicas)
    if electorate < replicas - f or electorate > replicas:
        raise ConfigurationError(
            f"electorate of {electorate} is outside [n - f, n] = [{replicas - f}, {replicas}]"
        )
    return (f + electorate) // 2 + 1


def fast_path_reject_size(replicas: int, electorate: int) -> int:
    return 1 + electorate - fast_quorum_size(replicas, electorate)


@dataclass(frozen=True, slots=True)
class Shard:
    """A token range replicated on ``replicas``; ``electorate`` may vote on the fast path."""

    range: TokenRange
    replicas: tuple[int, ...]
    electorate: frozenset[int]
    slow_quorum: int = field(init=False)
    fast_quorum: int = field(init=False)
    fast_reject: int = field(init=False)

    def __post_init__(self) -> None:
        if len(set(self.replicas)) != len(self.replicas) or not self.replicas:
            raise ConfigurationError(f"shard {self.range} has duplicate or no replicas")
        if not self.electorate <= set(self.replicas):
            raise ConfigurationError(f"shard {self.range}: electorate is not a subset of replicas")
        n, e = len(self.replicas), len(self.electorate)
        object.__setattr__(self, "slow_quorum", slow_quorum_size(n))
        object.__setattr__(self, "fast_quorum", fast_quorum_size(n, e))
        object.__setattr__(self, "fast_reject", fast_path_reject_size(n, e))

    def contains(self, key: Key) -> bool:
        return self.range.contains(key.token)


@dataclass(frozen=True, slots=True)
class Topology:
    """Non-overlapping shards that cover the whole ring, for one epoch."""

    epoch: int
    shards: tuple[Shard, ...]
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # shards_for / replicas_of of a tuple of keys: asked for every message a coordinator
    # or a replica handles, for the same few key sets. Bounded: cleared when full.
    _shards_cache: dict[tuple[Key, ...], tuple[Shard, ...]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _replicas_cache: dict[tuple[Key, ...], tuple[int, ...]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.shards, key=lambda s: s.range.start))
        if not ordered or ordered[0].range.start != TOKEN_MIN or ordered[-1].range.end != TOKEN_MAX:
            raise ConfigurationError("shards must cover the whole token ring")
        for before, after in itertools.pairwise(ordered):
            if before.range.end != after.range.start:
                raise ConfigurationError(
                    f"shards {before.range} and {after.range} leave a gap or overlap"
                )
        object.__setattr__(self, "shards", ordered)
        object.__setattr__(self, "_ends", tuple(s.range.end for s in ordered))

    def shard_for(self, key: Key) -> Shard:
        # TOKEN_MIN belongs to no (start, end] range; Cassandra maps it to TOKEN_MAX.
        token = TOKEN_MAX if key.token == TOKEN_MIN else key.token
        return self.shards[bisect.bisect_left(self._ends, token)]

    def shards_for(self, keys: Iterable[Key]) -> tuple[Shard, ...]:
        if type(keys) is tuple:
            cached = self._shards_cache.get(keys)
            if cached is None:
                cached = self._shards_of(keys)
                if len(self._shards_cache) >= _CACHE_MAX:
                    self._shards_cache.clear()
                self._shards_cache[keys] = cached
            return cached
        return self._shards_of(keys)

    def _shards_of(self, keys: Iterable[Key]) -> tuple[Shard, ...]:
        seen: dict[TokenRange, Shard] = {}
        for key in keys:
            shard = self.shard_for(key)
            seen.setdefault(shard.range, shard)
        return tuple(seen[r] for r in sorted(seen, key=lambda r: r.start))

    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for s in self.shards for n in s.replicas}))

    def replicas_of(self, keys: Iterable[Key]) -> tuple[int, ...]:
        if type(keys) is tuple:
            cached = self._replicas_cache.get(keys)
            if cached is None:
                cached = tuple(sorted({n for s in self.shards_for(keys) for n in s.replicas}))
                if len(self._replicas_cache) >= _CACHE_MAX:
                    self._replicas_cache.clear()
                self._replicas_cache[keys] = cached
            return cached
        return tuple(sorted({n for s in self.shards_for(keys) for n in s.replicas}))

    def owns(self, node: int, key: Key) -> bool:
        return node in self.shard_for(key).replicas


_CACHE_MAX = 65_536


def preferred_electorate(
    replicas: Sequence[int], size: int, preference: Sequence[int] = ()
) -> frozenset[int]:
    """The ``size`` replicas that come first in ``preference`` (replicas it does not name
    follow, in replica order): the shard's fast-path voters.

    Which replicas vote changes only latency, never safety: every electorate of a legal
    size keeps the quorum intersections recovery relies on (``tests/unit/test_topology.py``).
    A nearer electorate makes a nearer fast quorum, for coordinators near it.
    """
    if not 1 <= size <= len(replicas):
        raise ConfigurationError(f"electorate of {size} from {len(replicas)} replicas")
    rank = {node: index for index, node in enumerate(preference)}
    ordered = sorted(range(len(replicas)), key=lambda i: (rank.get(replicas[i], len(rank)), i))
    return frozenset(replicas[i] for i in ordered[:size])


def ring_topology(
    nodes: Sequence[int],
    replication_factor: int,
    *,
    shards_per_node: int = 1,
    electorate_size: int | None = None,
    electorate_preference: Sequence[int] = (),
    epoch: int = 1,
) -> Topology:
    """Evenly split the ring into ``len(nodes) * shards_per_node`` ranges, each replicated
    on ``replication_factor`` consecutive nodes (SimpleStrategy-like placement).

    ``electorate_size`` defaults to every replica; a smaller one must still be >= n - f.
    The electorate is the first replicas in ``electorate_preference``
    (:func:`preferred_electorate`), by default the first in ring order.
    """
    if not 1 <= replication_factor <= len(nodes):
        raise ConfigurationError(
            f"replication factor {replication_factor} needs 1..{len(nodes)} nodes"
        )
    count = len(nodes) * shards_per_node
    width = (TOKEN_MAX - TOKEN_MIN) // count
    bounds = [TOKEN_MIN + i * width for i in range(count)] + [TOKEN_MAX]
    electorate = replication_factor if electorate_size is None else electorate_size
    lowest = replication_factor - max_failures(replication_factor)
    if not lowest <= electorate <= replication_factor:
        raise ConfigurationError(
            f"electorate of {electorate} is outside [n - f, n] = [{lowest}, {replication_factor}]"
        )
    shards = []
    for i in range(count):
        replicas = tuple(nodes[(i + j) % len(nodes)] for j in range(replication_factor))
        shards.append(
            Shard(
                TokenRange(bounds[i], bounds[i + 1]),
                replicas,
                preferred_electorate(replicas, electorate, electorate_preference),
            )
        )
    return Topology(epoch, tuple(shards))


__all__ = [
    "Shard",
    "Topology",
    "fast_path_reject_size",
    "fast_quorum_size",
    "max_failures",
    "preferred_electorate",
    "ring_topology",
    "slow_quorum_size",
]
