"""The event store: es_transaction, es_transaction_tryout and es_frozen_transaction.

Theory of operation
-------------------
A transaction is one es_transaction row plus its tryout rows and, while frozen or quarantined,
one es_frozen_transaction row. All three tables share the partition key
``(region, cluster, service_name, transaction_id)``, so they live on the same replicas, and
:meth:`CassandraEventStore.read` fetches all of them with three single-partition reads sent
concurrently (one partition read per table; no scan, no ALLOW FILTERING).

Writes and why they are safe:

* es_transaction is written with plain (non-LWT) writes and the driver's client timestamps. Its
  writers take turns: the orchestrator owning a transaction writes between steps, and a step's
  result is written under its execution marker (:mod:`stacksaga_store.store.protection`). Mixing LWT
  into this table would be worse, not better: a plain write with a client timestamp older than
  a Paxos ballot's is silently lost, so a table is either all-LWT or all-plain.
* Tryouts are appended with ``INSERT ... IF NOT EXISTS`` at the next index (an LWT). Two writers
  racing for one index cannot overwrite each other: the loser moves to the next index. That
  keeps the history gap-free and append-only even when duplicate deliveries run the same step
  concurrently (RELAXED_WITH_DEDUP allows that). An LWT that times out is resolved by a SERIAL
  read of the index, which finishes any in-flight Paxos round before answering.
* Freeze and restore change es_transaction and es_frozen_transaction together in one LOGGED
  batch: both partitions eventually get the change, or neither.

In the ``accord`` commit mode :class:`~stacksaga_store.store.accord_store.AccordEventStore`
replaces every write and read above with Accord transactions (no LWT, no batch), and
:meth:`CassandraEventStore.state_change` groups a saga state change's writes into one.

Limits: :data:`TRYOUTS_PER_TRANSACTION_MAX` tryouts per transaction (Temporal-style history
cap; a saga that needs more is looping), :data:`PAYLOAD_BYTES_MAX` per payload (Cassandra warns
on batches over 5 KiB and fails over 50 KiB; the payload rides in batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from stacksaga_store.clock import to_utc
from stacksaga_store.errors import (
    StackSagaError,
    TransactionHistoryFullError,
    TransactionNotFoundError,
    check_state,
)
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind, StoreUnavailableError
from stacksaga_store.store.model import (
    FencingRow,
    FrozenRecord,
    RestorePath,
    TransactionKey,
    TransactionRecord,
    TransactionView,
)
from stacksaga_store.store.states import ExecutionType, RunningStatus, TryoutRecord, TryoutStatus

__all__ = [
    "PAYLOAD_BYTES_MAX",
    "TRYOUTS_PER_TRANSACTION_MAX",
    "CassandraEventStore",
    "EventStore",
    "StateWrite",
]

logger = logging.getLogger(__name__)

TRYOUTS_PER_TRANSACTION_MAX = 10_000
PAYLOAD_BYTES_MAX = 40 * 1024
# Index collisions happen only between concurrent appenders of one transaction; each collision
# moves the appender forward, so a handful of attempts covers any realistic duplicate burst.
APPEND_ATTEMPTS_MAX = 32
_PK = "region = ? AND cluster = ? AND service_name = ? AND transaction_id = ?"
_PK_COLUMNS = "region, cluster, service_name, transaction_id"


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A new status and payload for es_transaction, as a statement ready to send or batch."""

    prepared: Prepared
    params: tuple[Any, ...]


class EventStore(Protocol):
    """What the orchestrator needs from a store; :class:`CassandraEventStore` implements it.

    Durability: every method returns only after Cassandra acknowledged the write at the
    configured write consistency level.
    """

    async def create(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None,
    ) -> TransactionRecord: ...

    async def read(self, key: TransactionKey) -> TransactionView: ...

    def state_write(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> StateWrite: ...

    async def write_state(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> None: ...

    async def append_tryout(
        self,
        key: TransactionKey,
        index: int,
        *,
        executor: str,
        execution_type: ExecutionType,
        status: TryoutStatus,
        now: datetime,
    ) -> TryoutRecord: ...

    async def freeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        reason: str,
        now: datetime,
    ) -> FrozenRecord: ...

    async def unfreeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None = None,
    ) -> None: ...


class CassandraEventStore:
    """:class:`EventStore` on Cassandra. Call :meth:`prepare` once before use."""

    def __init__(self, cql: CqlSession, keyspace: str) -> None:
        self.cql = cql
        self.keyspace = keyspace
        self._statements: dict[str, Prepared] = {}

    async def prepare(self) -> None:
        """Prepare every statement up front, so a missing table fails at start-up."""
        ks = self.keyspace
        specs: dict[str, tuple[str, StatementKind, str]] = {
            "create": (
                f"INSERT INTO {ks}.es_transaction ({_PK_COLUMNS}, running_status, created_at, "
                "updated_at, payload, restore_date, restore_window, restore_instance_id, "
                "restore_bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                StatementKind.WRITE,
                "es_transaction",
            ),
            "state": (
                f"UPDATE {ks}.es_transaction SET running_status = ?, updated_at = ?, payload = ? "
                f"WHERE {_PK}",
                StatementKind.WRITE,
                "es_transaction",
            ),
            "restore_path": (
                f"UPDATE {ks}.es_transaction SET restore_date = ?, restore_window = ?, "
                f"restore_instance_id = ?, restore_bucket = ? WHERE {_PK}",
                StatementKind.WRITE,
                "es_transaction",
            ),
            "read": (
                f"SELECT * FROM {ks}.es_transaction WHERE {_PK}",
                StatementKind.READ,
                "es_transaction",
            ),
            "tryout_insert": (
                f"INSERT INTO {ks}.es_transaction_tryout ({_PK_COLUMNS}, tryout_index, executor, "
                "execution_type, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "IF NOT EXISTS",
                StatementKind.LWT,
                "es_transaction_tryout",
            ),
            "tryout_one": (
                f"SELECT * FROM {ks}.es_transaction_tryout WHERE {_PK} AND tryout_index = ?",
                StatementKind.SERIAL_READ,
                "es_transaction_tryout",
            ),
            "tryouts": (
                f"SELECT * FROM {ks}.es_transaction_tryout WHERE {_PK} LIMIT ?",
                StatementKind.READ,
                "es_transaction_tryout",
            ),
            "frozen_insert": (
                f"INSERT INTO {ks}.es_frozen_transaction ({_PK_COLUMNS}, frozen_at, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                StatementKind.WRITE,
                "es_frozen_transaction",
            ),
            "frozen_delete": (
                f"DELETE FROM {ks}.es_frozen_transaction WHERE {_PK}",
                StatementKind.WRITE,
                "es_frozen_transaction",
            ),
            "frozen_read": (
                f"SELECT * FROM {ks}.es_frozen_transaction WHERE {_PK}",
                StatementKind.READ,
                "es_frozen_transaction",
            ),
        }
        for name, (cql, kind, table) in specs.items():
            self._statements[name] = await self.cql.prepare(cql, kind=kind, table=table)

    def state_change(
        self, label: str, *, fence: FencingRow | None = None
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """The writes of one saga state change. Here (the ``ordered`` mode) each is sent on
        its own, in the order the orchestrator issues them; the accord mode's store
        (:mod:`stacksaga_store.store.accord_store`) commits them as one transaction, refused
        if ``fence`` names an epoch its row no longer holds. (Ordered mode fences through
        the STRICT marker's commit condition instead.)"""
        return contextlib.nullcontext()

    def _statement(self, name: str) -> Prepared:
        statement = self._statements.get(name)
        if statement is None:
            raise StackSagaError("CassandraEventStore.prepare() was not awaited")
        return statement

    # -- es_transaction ---------------------------------------------------------------------

    async def create(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None,
    ) -> TransactionRecord:
        """Insert the es_transaction row. Ids are random UUIDs, so no existence check."""
        _check_payload(payload)
        path = restore_path
        params = [
            *key.params(),
            status.value,
            now,
            now,
            payload,
            path.date_of_year if path else None,
            path.window if path else None,
            path.instance_id if path else None,
            path.bucket if path else None,
        ]
        await self.cql.execute(self._statement("create"), params)
        return TransactionRecord(key, status, now, now, payload, restore_path)

    def state_write(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> StateWrite:
        """The status/payload update, unsent, so write protection can batch it with a marker."""
        _check_payload(payload)
        params = (status.value, now, payload, *key.params())
        return StateWrite(self._statement("state"), params)

    async def write_state(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> None:
        write = self.state_write(key, status, payload, now)
        await self.cql.execute(write.prepared, write.params)

    async def write_restore_path(
        self, key: TransactionKey, path: RestorePath, *, expect: RestorePath | None = None
    ) -> None:
        """Point es_transaction.restore_* at a new watchdog (the recovery engine re-arms one
        when it restores a transaction); only those four cells change. ``expect`` (the
        watchdog being replaced) is checked by the accord mode only."""
        params = [path.date_of_year, path.window, path.instance_id, path.bucket, *key.params()]
        await self.cql.execute(self._statement("restore_path"), params)

    async def read_record(self, key: TransactionKey) -> TransactionRecord | None:
        rows = await self.cql.execute(self._statement("read"), key.params(), row_limit=1)
        return _record(key, rows[0]) if rows else None

    async def read(self, key: TransactionKey) -> TransactionView:
        """The transaction, its whole tryout history and its frozen row, read concurrently."""
        record, tryouts, frozen = await asyncio.gather(
            self.read_record(key), self.read_tryouts(key), self.read_frozen(key)
        )
        if record is None:
            raise TransactionNotFoundError(f"no transaction {key}")
        return TransactionView(record=record, tryouts=tryouts, frozen=frozen)

    # -- es_transaction_tryout --------------------------------------------------------------

    async def read_tryouts(self, key: TransactionKey) -> tuple[TryoutRecord, ...]:
        limit = TRYOUTS_PER_TRANSACTION_MAX
        rows = await self.cql.execute(
            self._statement("tryouts"), [*key.params(), limit], row_limit=limit
        )
        return tuple(_tryout(row) for row in rows)

    async def append_tryout(
        self,
        key: TransactionKey,
        index: int,
        *,
        executor: str,
        execution_type: ExecutionType,
        status: TryoutStatus,
        now: datetime,
    ) -> TryoutRecord:
        """Append at ``index`` or, if a concurrent writer took it, at the next free index.

        The returned record's index tells the caller whether the history moved under it.
        """
        # Cassandra keeps milliseconds; compare what was stored, not what was sent.
        stored_at = now.replace(microsecond=now.microsecond // 1000 * 1000)
        wanted = (executor, execution_type, status, stored_at)
        for _ in range(APPEND_ATTEMPTS_MAX):
            if index >= TRYOUTS_PER_TRANSACTION_MAX:
                raise TransactionHistoryFullError(
                    f"{key}: {TRYOUTS_PER_TRANSACTION_MAX} tryouts recorded; no more accepted"
                )
            params = [*key.params(), index, executor, execution_type.value, status.value, now]
            existing = await self._insert_tryout(key, index, params)
            if existing is None:
                return TryoutRecord(index, executor, execution_type, status, stored_at)
            found = _tryout(existing)
            if (found.executor, found.execution_type, found.status, found.created_at) == wanted:
                # Our own insert, applied by an attempt whose answer was lost.
                return found
            index += 1
        raise StoreUnavailableError(
            f"{key}: tryout append lost {APPEND_ATTEMPTS_MAX} index races", outcome_unknown=False
        )

    async def _insert_tryout(
        self, key: TransactionKey, index: int, params: Sequence[Any]
    ) -> dict[str, Any] | None:
        """None if our row went in; else the row that holds the index."""
        try:
            rows = await self.cql.execute(self._statement("tryout_insert"), params)
        except StoreUnavailableError as exc:
            if not exc.outcome_unknown:
                raise
            # A SERIAL read completes any in-flight Paxos round, so it tells whether ours won.
            found = await self.cql.execute(
                self._statement("tryout_one"), [*key.params(), index], row_limit=1
            )
            if not found:
                raise
            return found[0]
        check_state(len(rows) == 1, "an LWT answers with exactly one row")
        return None if rows[0]["[applied]"] else rows[0]

    # -- es_frozen_transaction ----------------------------------------------------------------

    async def read_frozen(self, key: TransactionKey) -> FrozenRecord | None:
        rows = await self.cql.execute(self._statement("frozen_read"), key.params(), row_limit=1)
        if not rows:
            return None
        return FrozenRecord(frozen_at=to_utc(rows[0]["frozen_at"]), reason=rows[0]["reason"])

    async def freeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        reason: str,
        now: datetime,
    ) -> FrozenRecord:
        """Status and frozen row in one LOGGED batch (both partitions, or neither)."""
        check_state(status in (RunningStatus.FROZEN, RunningStatus.QUARANTINED), "not parked")
        state = self.state_write(key, status, payload, now)
        await self.cql.execute_batch(
            [
                (state.prepared, state.params),
                (self._statement("frozen_insert"), [*key.params(), now, reason]),
            ]
        )
        return FrozenRecord(frozen_at=now, reason=reason)

    async def unfreeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None = None,
    ) -> None:
        """Delete the frozen row and set the restored status (and a new restore path, if the
        recovery engine gave one), in one LOGGED batch."""
        state = self.state_write(key, status, payload, now)
        statements: list[tuple[Prepared, Sequence[Any]]] = [
            (state.prepared, state.params),
            (self._statement("frozen_delete"), key.params()),
        ]
        if restore_path is not None:
            path = restore_path
            params = [path.date_of_year, path.window, path.instance_id, path.bucket, *key.params()]
            statements.append((self._statement("restore_path"), params))
        await self.cql.execute_batch(statements)


def _check_payload(payload: bytes) -> None:
    if len(payload) > PAYLOAD_BYTES_MAX:
        raise StackSagaError(
            f"payload is {len(payload)} bytes; the limit is {PAYLOAD_BYTES_MAX} "
            "(keep large documents elsewhere and store a reference)"
        )


def _record(key: TransactionKey, row: dict[str, Any]) -> TransactionRecord:
    path = None
    if row.get("restore_date") is not None:
        path = RestorePath(
            date_of_year=row["restore_date"],
            window=row["restore_window"],
            instance_id=row["restore_instance_id"],
            bucket=row["restore_bucket"],
        )
    return TransactionRecord(
        key=key,
        running_status=RunningStatus(row["running_status"]),
        created_at=to_utc(row["created_at"]),
        updated_at=to_utc(row["updated_at"]),
        payload=bytes(row["payload"] or b""),
        restore_path=path,
    )


def _tryout(row: dict[str, Any]) -> TryoutRecord:
    return TryoutRecord(
        tryout_index=row["tryout_index"],
        executor=row["executor"],
        execution_type=ExecutionType(row["execution_type"]),
        status=TryoutStatus(row["status"]),
        created_at=to_utc(row["created_at"]),
    )


def new_transaction_id() -> uuid.UUID:
    """Random (v4): spreads transactions evenly over the Murmur3 ring (seed Part 2)."""
    return uuid.uuid4()
