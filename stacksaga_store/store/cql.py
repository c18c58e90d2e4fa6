"""The asyncio face of a cassandra-driver session: prepared statements only, counted.

Theory of operation
-------------------
cassandra-driver runs its own IO thread. ``session.execute_async`` returns a ``ResponseFuture``
whose callbacks run on that thread (or synchronously, on the calling thread, if the response
already arrived). :func:`_bridge` turns it into an ``asyncio.Future`` of the event loop that
asked, handing results over with ``loop.call_soon_threadsafe`` only; nothing of asyncio is touched
from the driver's thread. A future the caller cancelled (``asyncio.wait_for`` timeout, task
cancellation) is left alone when the late answer arrives: the request itself cannot be recalled,
which is why every write this package issues is either idempotent or an LWT whose outcome is
re-read (:mod:`stacksaga_store.store.protection`).

Every statement is prepared once per :class:`CqlSession` and carries its consistency level:
reads use ``read-consistency-level``, writes and batches ``write-consistency-level``, LWTs add the
matching serial level (LOCAL_SERIAL for LOCAL_QUORUM, SERIAL for QUORUM), and ``SERIAL`` reads
(:attr:`StatementKind.SERIAL_READ`) see every LWT decided before them. Quorum writes plus quorum
reads make a completed write visible to every later read (W + R > RF), which is what the
RELAXED_WITH_DEDUP read check relies on.

Paging is off: every read names one partition and carries an explicit ``LIMIT``, so one response
holds all of it and nothing is silently truncated (:class:`RowLimitExceeded` if it would be).

:class:`StatementCounts` counts what was sent, by kind and table, for the bench and for tests
that pin the number of round trips of a code path.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cassandra import (
    ConsistencyLevel,
    CoordinationFailure,
    InvalidRequest,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.cluster import NoHostAvailable, ResponseFuture, Session
from cassandra.query import BatchStatement, BatchType, BoundStatement, PreparedStatement

from stacksaga_store.config.settings import SagaSupportConsistencyLevel
from stacksaga_store.errors import SchemaMismatchError, StackSagaError, check_state

__all__ = [
    "CqlSession",
    "Prepared",
    "RowLimitExceeded",
    "StatementCounts",
    "StatementKind",
    "StoreUnavailableError",
]

logger = logging.getLogger(__name__)

Row = dict[str, Any]
# Cassandra rejects a batch above batch_size_fail_threshold (50 KiB by default); the store's
# batches hold two or three statements, so a bigger one is a bug.
BATCH_STATEMENTS_MAX = 16


class StoreUnavailableError(StackSagaError):
    """Cassandra did not answer in time or lacked replicas. Retryable.

    ``outcome_unknown`` is True for a write that timed out: it may or may not have been applied.
    """

    retryable = True

    def __init__(self, message: str, *, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class RowLimitExceeded(StackSagaError):
    """A read returned more rows than its LIMIT allows the caller to handle."""


class StatementKind(StrEnum):
    READ = "read"
    SERIAL_READ = "serial_read"
    WRITE = "write"
    LWT = "lwt"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepared statement with what the counters need to know about it."""

    statement: PreparedStatement
    kind: StatementKind
    table: str

    @property
    def is_write(self) -> bool:
        return self.kind in (StatementKind.WRITE, StatementKind.LWT)


@dataclass
class StatementCounts:
    """Statements sent since creation (or the last :meth:`reset`)."""

    by_kind: Counter[str] = field(default_factory=Counter)
    by_table: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    batch_statements: int = 0

    def record(self, prepared: Prepared) -> None:
        self.by_kind[prepared.kind.value] += 1
        self.by_table[f"{prepared.kind.value}:{prepared.table}"] += 1

    @property
    def mutations(self) -> int:
        """Rows written, whether alone, in a batch or as an LWT."""
        return self.by_kind[StatementKind.WRITE.value] + self.by_kind[StatementKind.LWT.value]

    @property
    def requests(self) -> int:
        """Round trips from the client: a batch is one request."""
        singles = sum(self.by_kind.values())
        return singles - self.batch_statements + self.batches

    def snapshot(self) -> dict[str, Any]:
        return {
            "by_kind": dict(sorted(self.by_kind.items())),
            "by_table": dict(sorted(self.by_table.items())),
            "batches": self.batches,
            "mutations": self.mutations,
            "requests": self.requests,
        }

    def reset(self) -> None:
        self.by_kind.clear()
        self.by_table.clear()
        self.batches = 0
        self.batch_statements = 0


def serial_level_for(level: SagaSupportConsistencyLevel) -> int:
    """LOCAL_SERIAL keeps Paxos in the local datacenter, matching LOCAL_QUORUM."""
    if level is SagaSupportConsistencyLevel.LOCAL_QUORUM:
        return int(ConsistencyLevel.LOCAL_SERIAL)
    return int(ConsistencyLevel.SERIAL)


def driver_level(level: SagaSupportConsistencyLevel) -> int:
    return int(getattr(ConsistencyLevel, level.value))


class CqlSession:
    """Prepared-statement execution on the running event loop, with counters."""

    def __init__(
        self,
        session: Session,
        *,
        read_level: SagaSupportConsistencyLevel,
        write_level: SagaSupportConsistencyLevel,
    ) -> None:
        self.session = session
        self.read_level = read_level
        self.write_level = write_level
        self.counts = StatementCounts()
        self._prepared: dict[str, Prepared] = {}

    async def prepare(self, cql: str, *, kind: StatementKind, table: str) -> Prepared:
        """Prepare once (cached by text); the blocking driver call runs in a worker thread."""
        cached = self._prepared.get(cql)
        if cached is not None:
            check_state(cached.kind is kind, f"statement prepared twice as {cached.kind}/{kind}")
            return cached
        loop = asyncio.get_running_loop()
        try:
            statement = await loop.run_in_executor(None, self.session.prepare, cql)
        except (NoHostAvailable, OperationTimedOut) as exc:
            raise StoreUnavailableError(f"prepare failed: {exc}", outcome_unknown=False) from exc
        except InvalidRequest as exc:
            raise SchemaMismatchError(
                [f"{table}: {exc}; run `python -m stacksaga_store schema apply`"]
            ) from exc
        self._configure(statement, kind)
        prepared = Prepared(statement=statement, kind=kind, table=table)
        self._prepared[cql] = prepared
        return prepared

    def _configure(self, statement: PreparedStatement, kind: StatementKind) -> None:
        if kind is StatementKind.READ:
            statement.consistency_level = driver_level(self.read_level)
        elif kind is StatementKind.SERIAL_READ:
            statement.consistency_level = serial_level_for(self.write_level)
        else:
            statement.consistency_level = driver_level(self.write_level)
            statement.serial_consistency_level = serial_level_for(self.write_level)
        # Reads and plain writes of fixed values may be retried by the driver; an LWT may not:
        # a retried IF NOT EXISTS would report "not applied" for its own first attempt.
        statement.is_idempotent = kind is not StatementKind.LWT

    async def execute(
        self, prepared: Prepared, params: Sequence[Any], *, row_limit: int | None = None
    ) -> list[Row]:
        """Run one statement; returns its rows (an LWT returns one row with ``[applied]``)."""
        bound = prepared.statement.bind(list(params))
        # Paging off: reads carry their own LIMIT (see module docstring).
        bound.fetch_size = None
        self.counts.record(prepared)
        rows = await self._send(bound, prepared.is_write)
        if row_limit is not None and len(rows) > row_limit:
            raise RowLimitExceeded(f"{prepared.table}: {len(rows)} rows > limit {row_limit}")
        return rows

    async def execute_batch(self, statements: Sequence[tuple[Prepared, Sequence[Any]]]) -> None:
        """One LOGGED batch: every statement is eventually applied, or none (batchlog).

        No isolation across partitions; callers only rely on atomicity.
        """
        check_state(0 < len(statements) <= BATCH_STATEMENTS_MAX, "batch size out of range")
        batch = BatchStatement(
            batch_type=BatchType.LOGGED, consistency_level=driver_level(self.write_level)
        )
        for prepared, params in statements:
            check_state(prepared.kind is StatementKind.WRITE, "only plain writes go in a batch")
            batch.add(prepared.statement, list(params))
            self.counts.record(prepared)
        self.counts.batches += 1
        self.counts.batch_statements += len(statements)
        await self._send(batch, True)

    async def execute_lwt_batch(
        self, statements: Sequence[tuple[Prepared, Sequence[Any]]]
    ) -> list[Row]:
        """One conditional batch (every statement an LWT on the same partition): all
        conditions hold and every statement applies, or nothing does. Returns the rows
        Cassandra answers with (``[applied]`` first)."""
        check_state(0 < len(statements) <= BATCH_STATEMENTS_MAX, "batch size out of range")
        batch = BatchStatement(
            batch_type=BatchType.LOGGED,
            consistency_level=driver_level(self.write_level),
            serial_consistency_level=serial_level_for(self.write_level),
        )
        for prepared, params in statements:
            check_state(prepared.kind is StatementKind.LWT, "a conditional batch holds LWTs")
            batch.add(prepared.statement, list(params))
            self.counts.record(prepared)
        self.counts.batches += 1
        self.counts.batch_statements += len(statements)
        return await self._send(batch, True)

    async def _send(self, statement: BoundStatement | BatchStatement, is_write: bool) -> list[Row]:
        loop = asyncio.get_running_loop()
        try:
            response = self.session.execute_async(statement)
            rows = await _bridge(loop, response)
        except (WriteTimeout, OperationTimedOut) as exc:
            raise StoreUnavailableError(
                f"{type(exc).__name__}: {exc}", outcome_unknown=is_write
            ) from exc
        except (ReadTimeout, Unavailable, NoHostAvailable, CoordinationFailure) as exc:
            # Unavailable is raised before any replica is written; a CoordinationFailure of a
            # write (WriteFailure) may have reached some replicas.
            unknown = is_write and isinstance(exc, CoordinationFailure)
            raise StoreUnavailableError(
                f"{type(exc).__name__}: {exc}", outcome_unknown=unknown
            ) from exc
        return rows


def _bridge(loop: asyncio.AbstractEventLoop, response: ResponseFuture) -> asyncio.Future[list[Row]]:
    """An asyncio future completed from the driver's IO thread via call_soon_threadsafe."""
    future: asyncio.Future[list[Row]] = loop.create_future()

    def deliver(rows: Any, error: BaseException | None) -> None:
        # Runs on the loop thread. A cancelled caller no longer wants the answer.
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
            return
        if response.has_more_pages:
            future.set_exception(RowLimitExceeded("a read returned more than one page"))
            return
        future.set_result(list(rows) if rows else [])

    def on_rows(rows: Any) -> None:
        _call_soon(loop, deliver, rows, None)

    def on_error(error: BaseException) -> None:
        _call_soon(loop, deliver, None, error)

    response.add_callbacks(on_rows, on_error)
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        # The loop closed while the request was in flight (shutdown); nobody awaits it now.
        logger.debug("dropping a Cassandra response: its event loop is closed")
