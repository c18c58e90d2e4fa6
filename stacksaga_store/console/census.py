"""The console's in-memory index of es_transaction: one bounded, token-paged read of the
table's key and status columns, repeated every ``interval`` seconds.

Why a census and not per-query reads: es_transaction is keyed by transaction id (seed Part 1),
so "every FROZEN saga of order-service since 10:00" has no partition to read; the store's own
paths never scan. The console is the one reader that needs such questions answered, so it
pays for one scan of four small columns per interval, bounded by ``rows_max`` (the figures
say ``partial`` beyond it), and answers search, counts and the live counters from the result.
Consecutive censuses are compared to count what happened in between (starts, completions,
retries, restores, freezes), so the counters work whichever process writes the sagas.

In the accord commit mode the rows are read with plain CQL as well: a census may lag an
Accord commit by the replicas' apply delay, which a console can live with (one saga's page
reads it through the store's own read path).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from stacksaga_store.clock import to_utc
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind
from stacksaga_store.store.states import FINAL_STATUSES, PARKED_STATUSES, RunningStatus

__all__ = ["Census", "CensusRow", "LiveSample", "SagaCensus"]

PAGE_ROWS = 1000
ROWS_MAX_DEFAULT = 100_000
SAMPLES_KEPT = 120
MIN_TOKEN = -(2**63)
_RETRY_WAITING = frozenset(
    {RunningStatus.FAILED_WITH_RETRYABLE_ERROR, RunningStatus.REVERT_FAILED_WITH_RETRYABLE_ERROR}
)


@dataclass(frozen=True, slots=True)
class CensusRow:
    service_name: str
    transaction_id: uuid.UUID
    status: RunningStatus
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Census:
    """One pass over es_transaction (this region and cluster only)."""

    taken_at: datetime
    rows: dict[tuple[str, uuid.UUID], CensusRow]
    partial: bool  # rows_max was reached: rows beyond it are not in this census
    scanned: int

    def counts(self) -> dict[str, int]:
        counts = {status.value: 0 for status in RunningStatus}
        for row in self.rows.values():
            counts[row.status.value] += 1
        return counts

    def services(self) -> list[str]:
        return sorted({service for service, _ in self.rows})


@dataclass(frozen=True, slots=True)
class LiveSample:
    """What changed between two censuses (the live page's one point)."""

    at: datetime
    seconds: float
    starts: int
    completions: int
    retries: int
    restores: int
    freezes: int
    frozen_now: int
    running_now: int
    retrying_now: int
    total: int
    partial: bool

    @property
    def starts_per_second(self) -> float:
        return self.starts / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "at": self.at.isoformat(),
            "seconds": round(self.seconds, 3),
            "starts": self.starts,
            "starts_per_second": round(self.starts_per_second, 3),
            "completions": self.completions,
            "retries": self.retries,
            "restores": self.restores,
            "freezes": self.freezes,
            "frozen_now": self.frozen_now,
            "running_now": self.running_now,
            "retrying_now": self.retrying_now,
            "total": self.total,
            "partial": self.partial,
        }


@dataclass
class SagaCensus:
    """Takes censuses on demand (coalesced) and keeps the last one plus live totals."""

    cql: CqlSession
    keyspace: str
    region: str
    cluster: str
    rows_max: int = ROWS_MAX_DEFAULT
    current: Census | None = None
    samples: deque[LiveSample] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    totals: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("starts", "completions", "retries", "restores", "freezes"), 0
        )
    )
    _prepared: Prepared | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _started_mono: float = float("-inf")
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def prepare(self) -> None:
        self._prepared = await self.cql.prepare(
            "SELECT token(region, cluster, service_name, transaction_id) AS row_token, "
            "region, cluster, service_name, transaction_id, running_status, created_at, "
            f"updated_at FROM {self.keyspace}.es_transaction "
            "WHERE token(region, cluster, service_name, transaction_id) > ? LIMIT ?",
            kind=StatementKind.READ,
            table="es_transaction",
        )

    async def fresh(self, max_age: float, now: Callable[[], datetime]) -> Census:
        """A census begun at most ``max_age`` seconds before this call (0: begun after it,
        so every write acknowledged before the call is in it); callers waiting together
        share one scan."""
        asked = time.monotonic()
        async with self._lock:
            if self.current is not None and self._started_mono >= asked - max_age:
                return self.current
            started = time.monotonic()
            census = await self._take(now())
            self._record(census)
            self._started_mono = started
            self.current = census
        async with self.changed:
            self.changed.notify_all()
        return census

    async def _take(self, now: datetime) -> Census:
        prepared = self._prepared
        if prepared is None:
            raise RuntimeError("SagaCensus.prepare() was not awaited")
        rows: dict[tuple[str, uuid.UUID], CensusRow] = {}
        after, scanned, partial = MIN_TOKEN, 0, False
        while True:
            page = await self.cql.execute(prepared, [after, PAGE_ROWS])
            for row in page:
                scanned += 1
                if row["region"] != self.region or row["cluster"] != self.cluster:
                    continue
                try:
                    status = RunningStatus(row["running_status"])
                except ValueError:
                    continue  # a status this version does not know: not the console's to judge
                key = (row["service_name"], row["transaction_id"])
                rows[key] = CensusRow(
                    row["service_name"],
                    row["transaction_id"],
                    status,
                    to_utc(row["created_at"]),
                    to_utc(row["updated_at"]),
                )
            if len(page) < PAGE_ROWS:
                break
            if scanned >= self.rows_max:
                partial = True
                break
            after = int(page[-1]["row_token"])
        return Census(now, rows, partial, scanned)

    def _record(self, census: Census) -> None:
        previous = self.current
        if previous is None:
            return
        counts = dict.fromkeys(self.totals, 0)
        for key, row in census.rows.items():
            before = previous.rows.get(key)
            if before is None:
                if previous.partial:
                    continue  # perhaps only beyond the last census' bound
                counts["starts"] += 1
                old_status = None
            else:
                old_status = before.status
            if old_status == row.status and (before is None or before.updated_at == row.updated_at):
                continue
            if row.status in FINAL_STATUSES and old_status not in FINAL_STATUSES:
                counts["completions"] += 1
            if row.status in _RETRY_WAITING and (
                old_status != row.status
                or (before is not None and before.updated_at != row.updated_at)
            ):
                counts["retries"] += 1
            if old_status in PARKED_STATUSES and row.status not in PARKED_STATUSES:
                counts["restores"] += 1
            if row.status in PARKED_STATUSES and old_status not in PARKED_STATUSES:
                counts["freezes"] += 1
        for name, value in counts.items():
            self.totals[name] += value
        statuses = [row.status for row in census.rows.values()]
        seconds = (census.taken_at - previous.taken_at).total_seconds()
        self.samples.append(
            LiveSample(
                at=census.taken_at,
                seconds=max(seconds, 0.0),
                starts=counts["starts"],
                completions=counts["completions"],
                retries=counts["retries"],
                restores=counts["restores"],
                freezes=counts["freezes"],
                frozen_now=sum(1 for s in statuses if s in PARKED_STATUSES),
                running_now=sum(
                    1
                    for s in statuses
                    if s not in PARKED_STATUSES
                    and s not in FINAL_STATUSES
                    and s not in _RETRY_WAITING
                ),
                retrying_now=sum(1 for s in statuses if s in _RETRY_WAITING),
                total=len(statuses),
                partial=census.partial,
            )
        )
