"""Seeded operation generators for the three workloads, after Jepsen's.

``lin-kv`` follows ``jepsen.tests.linearizable-register`` with ``jepsen.independent``:
worker threads form groups of ``2n`` (n = node count); each group works on one key at a
time, its first ``n`` threads reading and the others mixing ``[write cas cas]`` with
values 0..4. A group moves to a fresh key once the key has seen ``process_limit`` (20)
distinct processes, so a key's history never holds more than about ten unknown-outcome
writes, or ``per_key_limit`` operations (jittered by 10%, as Jepsen does, so groups drift
apart). Those two limits are what keep each key's linearizability search small.

``txn-list-append`` and ``txn-rw-register`` follow Elle's generator (``elle.txn``): a pool
of ``key_count`` active keys chosen with an exponential distribution, transactions of 1 to
``max_txn_length`` micro-ops, half of them reads; written values count up from 1 per key,
so every write is unique, and a key is retired for a fresh one after
``max_writes_per_key`` writes.

All randomness comes from the ``random.Random`` passed in, so one seed gives one
sequence of operations for a given completion order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final

LIN_KV_VALUES: Final = 5
PROCESS_LIMIT: Final = 20
PER_KEY_LIMIT: Final = 100
KEY_COUNT: Final = 10
MAX_TXN_LENGTH: Final = 4
MAX_WRITES_PER_KEY: Final = 16


@dataclass(frozen=True, slots=True)
class Invocation:
    """What a client sends: the Jepsen ``f`` and ``value``, and the request body."""

    f: str
    value: Any
    body: dict[str, Any]


@dataclass(slots=True)
class _Group:
    key: int
    ops: int = 0
    limit: int = PER_KEY_LIMIT
    processes: set[int] = field(default_factory=set)


class LinKvGenerator:
    """lin-kv: per-key groups of 2n threads (n readers, n writers/cas-ers)."""

    def __init__(
        self,
        node_count: int,
        concurrency: int,
        rng: random.Random,
        *,
        per_key_limit: int = PER_KEY_LIMIT,
        process_limit: int = PROCESS_LIMIT,
    ) -> None:
        group_size = 2 * node_count
        if concurrency % group_size:
            raise ValueError(
                f"lin-kv needs --concurrency to be a multiple of 2n = {group_size} "
                f"(jepsen.independent), got {concurrency}"
            )
        self.node_count = node_count
        self.group_size = group_size
        self.rng = rng
        self.per_key_limit = per_key_limit
        self.process_limit = process_limit
        self._next_key = 0
        self.groups = [self._fresh() for _ in range(concurrency // group_size)]

    def _fresh(self) -> _Group:
        key = self._next_key
        self._next_key += 1
        # Jepsen jitters the limit to 90-100% so groups do not switch keys in lockstep.
        limit = max(1, int(self.per_key_limit * (0.9 + 0.1 * self.rng.random())))
        return _Group(key, limit=limit)

    def next(self, thread: int, process: int) -> Invocation:
        index = thread // self.group_size
        group = self.groups[index]
        exhausted = group.ops >= group.limit or (
            process not in group.processes and len(group.processes) >= self.process_limit
        )
        if exhausted:
            group = self.groups[index] = self._fresh()
        group.ops += 1
        group.processes.add(process)
        key = group.key
        if thread % self.group_size < self.node_count:
            return Invocation("read", [key, None], {"type": "read", "key": key})
        kind = self.rng.choice(("write", "cas", "cas"))
        if kind == "write":
            value = self.rng.randrange(LIN_KV_VALUES)
            return Invocation("write", [key, value], {"type": "write", "key": key, "value": value})
        expected, new = self.rng.randrange(LIN_KV_VALUES), self.rng.randrange(LIN_KV_VALUES)
        return Invocation(
            "cas",
            [key, [expected, new]],
            {"type": "cas", "key": key, "from": expected, "to": new},
        )

    @property
    def keys_used(self) -> int:
        return self._next_key


class TxnGenerator:
    """txn-list-append (``append``) or txn-rw-register (``w``) transactions."""

    def __init__(
        self,
        workload: str,
        rng: random.Random,
        *,
        key_count: int = KEY_COUNT,
        max_txn_length: int = MAX_TXN_LENGTH,
        max_writes_per_key: int = MAX_WRITES_PER_KEY,
    ) -> None:
        if workload not in ("txn-list-append", "txn-rw-register"):
            raise ValueError(f"not a txn workload: {workload!r}")
        if key_count < 1 or max_txn_length < 1 or max_writes_per_key < 1:
            raise ValueError("key_count, max_txn_length and max_writes_per_key must be >= 1")
        self.write_f = "append" if workload == "txn-list-append" else "w"
        self.rng = rng
        self.max_txn_length = max_txn_length
        self.max_writes_per_key = max_writes_per_key
        self.active = list(range(key_count))
        self._next_key = key_count
        self._writes: dict[int, int] = {}
        # Key i of the pool is half as likely as key i-1 (Elle's exponential distribution).
        self._weights = [2.0 ** (-i) for i in range(key_count)]

    def next(self, thread: int, process: int) -> Invocation:
        del thread, process  # every thread draws from the same distribution
        mops: list[list[Any]] = []
        for _ in range(self.rng.randint(1, self.max_txn_length)):
            slot = self.rng.choices(range(len(self.active)), weights=self._weights)[0]
            key = self.active[slot]
            if self.rng.random() < 0.5:
                mops.append(["r", key, None])
                continue
            count = self._writes.get(key, 0) + 1
            self._writes[key] = count
            mops.append([self.write_f, key, count])
            if count >= self.max_writes_per_key:
                self.active[slot] = self._next_key
                self._next_key += 1
        return Invocation("txn", mops, {"type": "txn", "txn": [list(m) for m in mops]})

    @property
    def keys_used(self) -> int:
        return self._next_key


Generator = LinKvGenerator | TxnGenerator

__all__ = ["Generator", "Invocation", "LinKvGenerator", "TxnGenerator"]
