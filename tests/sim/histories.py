"""Shared by the history checkers' tests: short builders for hand-made histories, and
generators that turn random serial executions into concurrent histories (valid by
construction, so a checker that rejects one is wrong)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from accord.sim.history import History, MicroOp, Operation, OpStatus
from accord.sim.verify import (
    Verdict,
)

# ---------------------------------------------------------------------------
# helpers


def r(key: str, value: object = None) -> MicroOp:
    return MicroOp("r", key, value)


def app(key: str, value: int) -> MicroOp:
    return MicroOp("append", key, value)


def put(key: str, value: object) -> MicroOp:
    return MicroOp("put", key, value)


def op(
    op_id: int,
    mops: Sequence[MicroOp],
    inv: int,
    done: int | None = None,
    status: OpStatus = "ok",
) -> Operation:
    """An operation; ``done`` defaults to ``inv + 10`` (ignored for info ops)."""
    completed = None if status == "info" else (inv + 10 if done is None else done)
    return Operation(op_id, op_id, inv, completed, status, tuple(mops))


def hist(*ops: Operation) -> History:
    return History(tuple(ops))


def names(v: Verdict) -> set[str]:
    return set(v.anomaly_names)


def assert_only(v: Verdict, name: str) -> None:
    assert not v.valid, v.summary()
    assert names(v) == {name}, v.summary()


def assert_valid(v: Verdict) -> None:
    assert v.valid, v.summary()
    assert v.anomalies == ()
    assert v.stats["anomalies"] == 0


# ---------------------------------------------------------------------------
# generators: serial executions turned into concurrent histories


@dataclass
class SerialTxn:
    mops: list[MicroOp]
    status: OpStatus
    point: int  # position in the serial order (virtual time)
    applied: bool


@dataclass
class ListAppendSim:
    """A serial list-append database with rotating keys (lists stay short)."""

    rng: random.Random
    active_keys: int = 3
    max_per_key: int = 10_000
    state: dict[str, list[int]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    next_key: int = 0
    next_value: int = 1

    def __post_init__(self) -> None:
        for _ in range(self.active_keys):
            self._new_key()

    def _new_key(self) -> None:
        name = f"k{self.next_key}"
        self.next_key += 1
        self.keys.append(name)
        self.state[name] = []

    def txn(self, applied: bool, known_reads: bool) -> list[MicroOp]:
        mops: list[MicroOp] = []
        for _ in range(self.rng.randint(1, 4)):
            key = self.rng.choice(self.keys)
            if self.rng.random() < 0.5:
                seen = tuple(self.state[key]) if applied and known_reads else None
                mops.append(r(key, seen))
            else:
                value = self.next_value
                self.next_value += 1
                mops.append(app(key, value))
                if applied:
                    self.state[key].append(value)
                    if len(self.state[key]) >= self.max_per_key:
                        self.keys.remove(key)
                        self._new_key()
        return mops

    def read_all(self) -> list[MicroOp]:
        return [r(k, tuple(self.state[k])) for k in sorted(self.state)]


def to_history(txns: Sequence[SerialTxn], rng: random.Random, spread: int) -> History:
    """Give each serial txn an interval around its serial point, so real time agrees.

    A completes before B is invoked => A.point <= A.done < B.inv <= B.point,
    so any real-time order is also serial order.
    """
    timed = []
    for t in txns:
        inv = t.point - rng.randint(0, spread)
        done = None if t.status == "info" else t.point + rng.randint(0, spread)
        timed.append((inv, t.point, done, t))
    timed.sort(key=lambda x: (x[0], x[1]))
    # one op in flight per process: reuse the process that freed up earliest
    free: list[tuple[int, int]] = []
    n_procs = 0
    ops = []
    for op_id, (inv, _, done, t) in enumerate(timed):
        if free and free[0][0] < inv:
            _, proc = heapq.heappop(free)
        else:
            proc = n_procs
            n_procs += 1
        if done is not None:  # info ops never free their process
            heapq.heappush(free, (done, proc))
        ops.append(Operation(op_id, proc, inv, done, t.status, tuple(t.mops)))
    return History(tuple(ops))


def gen_list_append(
    seed: int,
    n: int,
    *,
    spread: int = 250,
    active_keys: int = 3,
    max_per_key: int = 10_000,
    final_reads: int = 0,
) -> History:
    rng = random.Random(seed)
    sim = ListAppendSim(rng, active_keys, max_per_key)
    txns: list[SerialTxn] = []
    for i in range(n):
        roll = rng.random()
        status: OpStatus
        if roll < 0.8:
            status, applied = "ok", True
        elif roll < 0.87:
            status, applied = "info", True
        elif roll < 0.94:
            status, applied = "info", False
        else:
            status, applied = "fail", False
        mops = sim.txn(applied, known_reads=status == "ok")
        txns.append(SerialTxn(mops, status, 100 * (i + 1), applied))
    for j in range(final_reads):
        txns.append(SerialTxn(sim.read_all(), "ok", 100 * (n + 1 + j) + 10 * spread, True))
    return to_history(txns, rng, spread)
