"""Transactions and load shapes shared by the sidecar suites.

All transactions use the bank table of ``accord_cassandra.cluster`` (``id text PRIMARY KEY,
balance bigint``):

* :func:`transfer`: the multi-partition transfer of the demo (2 LETs, a condition, 2 upserts);
* :func:`conditional_set`: single-partition ``SET balance = v IF balance >= t``, the same
  statement as the LWT it is compared with;
* :func:`conditional_debit`: single-partition read-modify-write (``balance - amount``), which
  CQL cannot express in one LWT (no arithmetic on non-counter columns).

Load runs are closed loops with a bounded number of transactions in flight and a bounded
duration or count; latencies are client-side wall time around ``transact``.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from accord_cassandra.client import AsyncClient, Transaction, TransactionError
from accord_cassandra.cluster import metrics_of
from bench.report import Progress

KEYSPACE = "bank"
TABLE = "accounts"
INITIAL_BALANCE = 1_000_000
PRELOAD_BATCH = 64  # the client API's limit on mutations per transaction
T = TypeVar("T")


def transfer(source: str, target: str, amount: int, keyspace: str = KEYSPACE) -> Transaction:
    t = Transaction()
    src = t.let("src", keyspace, TABLE, source)
    dst = t.let("dst", keyspace, TABLE, target)
    t.where(src["balance"] >= amount)
    t.update(keyspace, TABLE, source, balance=src["balance"] - amount)
    t.update(keyspace, TABLE, target, balance=dst["balance"] + amount)
    return t


def conditional_set(key: str, value: int, threshold: int, keyspace: str = KEYSPACE) -> Transaction:
    t = Transaction()
    row = t.let("row", keyspace, TABLE, key)
    t.where(row["balance"] >= threshold)
    t.update(keyspace, TABLE, key, balance=value)
    return t


def conditional_debit(key: str, amount: int, keyspace: str = KEYSPACE) -> Transaction:
    t = Transaction()
    row = t.let("row", keyspace, TABLE, key)
    t.where(row["balance"] >= amount)
    t.update(keyspace, TABLE, key, balance=row["balance"] - amount)
    return t


async def preload(
    client: AsyncClient, keys: Sequence[str], *, keyspace: str = KEYSPACE, label: str = "preload"
) -> None:
    """Give every key INITIAL_BALANCE, 64 keys per transaction."""
    progress = Progress(label, len(keys))
    for start in range(0, len(keys), PRELOAD_BATCH):
        setup = Transaction()
        chunk = keys[start : start + PRELOAD_BATCH]
        for key in chunk:
            setup.update(keyspace, TABLE, key, balance=INITIAL_BALANCE)
        await client.transact(setup)
        progress.advance(len(chunk))


class Zipf:
    """Zipf-distributed ranks over ``n`` keys with exponent ``s`` (rank 0 hottest)."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        weights = [1.0 / (rank + 1) ** s for rank in range(n)]
        total = sum(weights)
        running = 0.0
        self.cumulative: list[float] = []
        for weight in weights:
            running += weight / total
            self.cumulative.append(running)
        self.rng = rng

    def sample(self) -> int:
        index = bisect.bisect_left(self.cumulative, self.rng.random())
        return min(index, len(self.cumulative) - 1)

    def distinct_pair(self) -> tuple[int, int]:
        first = self.sample()
        # Bounded: with n >= 2 a different rank turns up within a few draws in practice, and
        # the fallback keeps the loop finite whatever the exponent.
        for _ in range(64):
            second = self.sample()
            if second != first:
                return first, second
        return first, (first + 1) % len(self.cumulative)

    def top_share(self, top: int) -> float:
        """Probability mass of the ``top`` hottest keys."""
        return self.cumulative[min(top, len(self.cumulative)) - 1]


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    applied: int = 0
    declined: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def committed(self) -> int:
        return self.applied + self.declined

    def merge(self, other: LoadResult) -> None:
        self.latencies_ms += other.latencies_ms
        self.applied += other.applied
        self.declined += other.declined
        for code, count in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + count
        self.seconds = max(self.seconds, other.seconds)


async def closed_loop(
    client: AsyncClient,
    make: Callable[[int], Transaction],
    *,
    inflight: int,
    count: int | None = None,
    seconds: float | None = None,
    pause_seconds: float = 0.0,
    progress: Progress | None = None,
) -> LoadResult:
    """``inflight`` workers issue ``make(i)`` back to back until ``count`` transactions were
    issued or ``seconds`` passed (at least one bound is required)."""

    async def call(index: int) -> bool:
        try:
            answer = await client.transact(make(index))
        except TransactionError as error:
            raise LoadError(error.code) from None
        return answer.applied

    return await closed_loop_calls(
        call,
        inflight=inflight,
        count=count,
        seconds=seconds,
        pause_seconds=pause_seconds,
        progress=progress,
    )


class LoadError(Exception):
    """One operation failed; ``code`` names how (a gRPC status, an exception class)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


async def closed_loop_calls(
    call: Callable[[int], Awaitable[bool]],
    *,
    inflight: int,
    count: int | None = None,
    seconds: float | None = None,
    pause_seconds: float = 0.0,
    progress: Progress | None = None,
) -> LoadResult:
    """The closed loop over any operation: ``call(i)`` returns whether it applied and
    raises :class:`LoadError` when it failed."""
    if count is None and seconds is None:
        raise ValueError("closed_loop needs a count or a duration")
    result = LoadResult()
    issued = 0
    deadline = time.monotonic() + seconds if seconds is not None else float("inf")
    limit = count if count is not None else 10**9

    async def worker() -> None:
        nonlocal issued
        while issued < limit and time.monotonic() < deadline:
            index = issued
            issued += 1
            started = time.perf_counter()
            try:
                applied = await call(index)
            except LoadError as error:
                result.errors[error.code] = result.errors.get(error.code, 0) + 1
            else:
                result.latencies_ms.append((time.perf_counter() - started) * 1000)
                if applied:
                    result.applied += 1
                else:
                    result.declined += 1
            if progress is not None:
                progress.advance()
            if pause_seconds:
                await asyncio.sleep(pause_seconds)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    result.seconds = time.monotonic() - started
    return result


OPEN_LOOP_MAX_OUTSTANDING = 4096


@dataclass
class OpenLoopResult(LoadResult):
    """An open loop's answers, plus how well it kept its schedule: ``issued`` operations
    started, ``skipped`` not started because ``OPEN_LOOP_MAX_OUTSTANDING`` were already
    outstanding, ``start_lag_ms`` how late each start was against its schedule."""

    issued: int = 0
    skipped: int = 0
    start_lag_ms: list[float] = field(default_factory=list)


async def open_loop_calls(
    call: Callable[[int], Awaitable[bool]], *, rate: float, seconds: float
) -> OpenLoopResult:
    """Operation *i* starts at ``i / rate`` seconds whatever earlier ones are doing (an
    open loop, as independent clients arrive), for ``seconds``; then the outstanding ones
    are awaited. Unlike a closed loop the offered rate does not fall when the system slows,
    so two systems can be compared at the same op/s. A start that finds
    ``OPEN_LOOP_MAX_OUTSTANDING`` operations outstanding is skipped and counted (the system
    is past saturation; the bound keeps the backlog finite)."""
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"open loop needs a positive rate and duration, not {rate}, {seconds}")
    result = OpenLoopResult()
    outstanding: set[asyncio.Task[None]] = set()

    async def one(index: int) -> None:
        started = time.perf_counter()
        try:
            applied = await call(index)
        except LoadError as error:
            result.errors[error.code] = result.errors.get(error.code, 0) + 1
            return
        result.latencies_ms.append((time.perf_counter() - started) * 1000)
        if applied:
            result.applied += 1
        else:
            result.declined += 1

    began = time.monotonic()
    total = int(rate * seconds)
    for index in range(total):
        due = began + index / rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
            now = time.monotonic()
        result.start_lag_ms.append(max(0.0, now - due) * 1000)
        if len(outstanding) >= OPEN_LOOP_MAX_OUTSTANDING:
            result.skipped += 1
            continue
        task = asyncio.ensure_future(one(index))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
        result.issued += 1
    if outstanding:
        await asyncio.gather(*outstanding)
    result.seconds = time.monotonic() - began
    return result


# ------------------------------------------------------------------------------------------
# Sidecar metrics


PATH_METRICS = ("accord_fast_path_total", "accord_slow_path_total")
OTHER_METRICS = (
    "accord_recoveries_total",
    "accord_invalidations_total",
    "accord_peer_messages_dropped_total",
    "accord_journal_syncs_total",
    "accord_journal_sync_seconds_total",
)


def scrape(addresses: Iterable[str]) -> dict[str, float]:
    """The path and recovery counters summed over sidecars."""
    total: dict[str, float] = {}
    for address in addresses:
        figures = metrics_of(address)
        for name in (*PATH_METRICS, *OTHER_METRICS):
            total[name] = total.get(name, 0.0) + figures.get(name, 0.0)
    return total


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time consumed so far by ``pids`` (all their threads), from /proc."""
    import os
    from pathlib import Path

    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the ")" that ends the command name, utime and stime are fields 12 and 13.
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def run_queue_seconds(pids: Iterable[int]) -> float:
    """Seconds the threads of ``pids`` have spent runnable but waiting for a CPU so far
    (``/proc/<pid>/task/*/schedstat``, second field): on a shared machine, how much of a
    latency is the scheduler's and not the code's."""
    from pathlib import Path

    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def fsync_ms_mean(counters: Mapping[str, float]) -> float | None:
    syncs = counters.get("accord_journal_syncs_total", 0.0)
    seconds = counters.get("accord_journal_sync_seconds_total", 0.0)
    return round(1000 * seconds / syncs, 2) if syncs else None


def fast_path_share(counters: Mapping[str, float]) -> float | None:
    fast = counters.get("accord_fast_path_total", 0.0)
    slow = counters.get("accord_slow_path_total", 0.0)
    return round(fast / (fast + slow), 4) if fast + slow else None


async def measured(
    addresses: Sequence[str], run: Callable[[], Awaitable[T]], pids: Sequence[int] = ()
) -> tuple[T, dict[str, float]]:
    """Run a load and return it with the sidecar counters it moved, plus
    ``sidecar_cpu_seconds``: the CPU time the processes ``pids`` spent meanwhile."""
    before = await asyncio.to_thread(scrape, addresses)
    cpu_before = cpu_seconds(pids)
    result = await run()
    cpu_after = cpu_seconds(pids)
    after = await asyncio.to_thread(scrape, addresses)
    moved = delta(after, before)
    moved["sidecar_cpu_seconds"] = round(cpu_after - cpu_before, 3)
    return result, moved


def cpu_ms_per_txn(counters: Mapping[str, float], txns: int) -> float | None:
    cpu = counters.get("sidecar_cpu_seconds")
    return round(1000 * cpu / txns, 2) if cpu is not None and txns else None
