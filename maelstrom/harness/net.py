"""The simulated network between nodes: latency distributions and partitions.

Follows Maelstrom's ``net.clj``: client links have no latency and are never partitioned;
node-to-node messages are delayed by ``--latency`` milliseconds drawn from
``--latency-dist`` (constant, uniform on [0, 2x], or exponential with mean x; the last two
reorder messages), and a partition drops a message when it *arrives*, so a message in
flight when a partition starts is lost, and one sent just before it heals may survive.

A partition is a *grudge* (Jepsen's term): for each node, the set of nodes it refuses to
hear from. :func:`grudge` builds the shapes the nemesis uses:

``halves``
    a random split into two halves (with an odd count, the larger half is a majority);
``majorities-ring``
    every node sees a majority (itself and its neighbours on a shuffled ring), and no two
    nodes see the same majority, so there is never one connected majority component;
``bridge``
    two halves that cannot talk, and one bridge node that talks to both;
``one``
    one node isolated from all others.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

LATENCY_DISTRIBUTIONS: Final = ("constant", "uniform", "exponential")
PARTITION_SHAPES: Final = ("halves", "majorities-ring", "bridge", "one")
MAX_LATENCY_MS: Final = 60_000.0
"""Clamp on one drawn latency: an exponential tail must not hold a message for minutes."""

Grudge = Mapping[str, frozenset[str]]
"""dest -> sources whose messages ``dest`` drops."""


@dataclass(frozen=True, slots=True)
class Latency:
    """Node-to-node latency: ``mean_ms`` and a distribution from LATENCY_DISTRIBUTIONS."""

    mean_ms: float = 0.0
    distribution: str = "constant"

    def __post_init__(self) -> None:
        if self.distribution not in LATENCY_DISTRIBUTIONS:
            raise ValueError(
                f"unknown latency distribution {self.distribution!r}; "
                f"choose {', '.join(LATENCY_DISTRIBUTIONS)}"
            )
        if not 0 <= self.mean_ms <= MAX_LATENCY_MS:
            raise ValueError(f"latency must be within [0, {MAX_LATENCY_MS}] ms")

    def draw_seconds(self, rng: random.Random) -> float:
        if self.mean_ms == 0:
            return 0.0
        if self.distribution == "constant":
            ms = self.mean_ms
        elif self.distribution == "uniform":
            ms = rng.uniform(0, 2 * self.mean_ms)
        else:
            ms = rng.expovariate(1 / self.mean_ms)
        return min(ms, MAX_LATENCY_MS) / 1000


def _cut(groups: Sequence[Sequence[str]], nodes: Sequence[str]) -> dict[str, frozenset[str]]:
    """A grudge in which each node hears only nodes of its own groups."""
    grudges: dict[str, frozenset[str]] = {}
    for node in nodes:
        visible = {n for group in groups if node in group for n in group}
        grudges[node] = frozenset(n for n in nodes if n not in visible)
    return grudges


def grudge(shape: str, nodes: Sequence[str], rng: random.Random) -> dict[str, frozenset[str]]:
    """A partition of ``shape`` over ``nodes``, drawn with ``rng``."""
    if len(nodes) < 2:
        return {n: frozenset() for n in nodes}
    order = list(nodes)
    rng.shuffle(order)
    count = len(order)
    if shape == "halves":
        middle = count // 2
        return _cut([order[:middle], order[middle:]], nodes)
    if shape == "one":
        return _cut([order[:1], order[1:]], nodes)
    if shape == "bridge":
        if count < 3:
            return _cut([order[:1], order[1:]], nodes)
        middle = (count - 1) // 2
        bridge = order[middle]
        return _cut([order[: middle + 1], [bridge, *order[middle + 1 :]]], nodes)
    if shape == "majorities-ring":
        majority = count // 2 + 1
        reach = (majority - 1) // 2
        grudges = {}
        for i, node in enumerate(order):
            # Centred window of a majority; with an even majority the extra node is ahead.
            window = {order[(i + d) % count] for d in range(-reach, majority - reach)}
            grudges[node] = frozenset(n for n in nodes if n not in window)
        return grudges
    raise ValueError(f"unknown partition shape {shape!r}; choose {', '.join(PARTITION_SHAPES)}")


@dataclass(slots=True)
class NetStats:
    """Message counts, split as Maelstrom splits them (clients vs servers)."""

    client_sent: int = 0
    server_sent: int = 0
    server_delivered: int = 0
    server_dropped: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


__all__ = [
    "LATENCY_DISTRIBUTIONS",
    "PARTITION_SHAPES",
    "Grudge",
    "Latency",
    "NetStats",
    "grudge",
]
