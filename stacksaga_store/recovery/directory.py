"""The 5-tier recovery directory on Cassandra: every read and write of Tiers 1-5.

Theory of operation (seed Part 4, "The 5-Tier Directory")
----------------------------------------------------------
::

    es_days_by_year                       Tier 1  (scope, year)                  -> date_of_year
    es_recovery_windows_by_day            Tier 2  (scope, date)                  -> minute_of_day
    es_instances_by_recovery_window       Tier 3  (scope, date, minute)          -> token, instance
    es_buckets_by_instance                Tier 4  (scope, date, minute, instance) -> bucket_index
    es_recovery_transactions_by_instance  Tier 5  (scope, ..., instance, bucket)  -> transaction_id

Every statement names one partition with its full key, the tier above providing the key of
the tier below; nothing scans, nothing uses ALLOW FILTERING. ``scope`` is (region, cluster,
service_name), so virtual clusters are separate partitions of the same tables.

Reads are bounded: each carries a LIMIT and larger results are paged by clustering key
(``transaction_id > last`` for Tier 5, ``(instance_id_token, instance_id) > (last)`` for Tier 3),
because :class:`~stacksaga_store.store.cql.CqlSession` keeps the driver's paging off. That is also
how a Retry-Node *streams* a 50,000-row Tier-5 bucket without holding it in memory.

Deletes: a Tier-5 bucket is dropped with one partition delete (a single partition tombstone,
O(1)); a restore watchdog is deleted as one row (the cell tombstones the seed quarantines in odd
buckets); Tiers 1-4 lose one clustering row each.

Statement counts per tier are in :attr:`CqlSession.counts` (the bench reads them).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stacksaga_store.config.settings import InstanceProperties
from stacksaga_store.errors import StackSagaError, check_state
from stacksaga_store.recovery.windows import WindowId, WindowMath
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind

__all__ = [
    "BUCKETS_PER_INSTANCE_MAX",
    "BucketKind",
    "BucketRef",
    "Directory",
    "DirectoryEntry",
    "DirectoryScope",
    "DispatchedPage",
    "InstanceRef",
    "bucket_kind",
]

# Limits on what one read returns (put a limit on everything). A window has at most 1440
# minutes per day; instances per window are bounded by the seed's 50,000-row Tier-3 ceiling
# and paged; buckets per instance-window are rows / bucket-size * 2, so a 10,000 cap means
# 250 million rows from one pod in one minute.
WINDOWS_PER_DAY_MAX = 1440
DAYS_PER_QUERY_MAX = 400
INSTANCE_PAGE_ROWS = 500
BUCKETS_PER_INSTANCE_MAX = 10_000
TIER5_PAGE_ROWS_DEFAULT = 1000

_SCOPE = "region = ? AND cluster = ? AND service_name = ?"


@dataclass(frozen=True, slots=True, order=True)
class DirectoryScope:
    """(region, cluster, service_name): the prefix of every directory partition key."""

    region: str
    cluster: str
    service_name: str

    @classmethod
    def of(cls, instance: InstanceProperties) -> DirectoryScope:
        return cls(instance.region, instance.cluster, instance.service_name)

    def params(self) -> list[object]:
        return [self.region, self.cluster, self.service_name]

    def __str__(self) -> str:
        return f"{self.region}/{self.cluster}/{self.service_name}"


class BucketKind(StrEnum):
    RETRY = "RETRY"  # even bucket_index
    RESTORE = "RESTORE"  # odd bucket_index


def bucket_kind(bucket_index: int) -> BucketKind:
    """Even buckets hold retry pointers, odd buckets restore watchdogs (seed)."""
    check_state(bucket_index >= 0, f"bucket index {bucket_index} < 0")
    return BucketKind.RESTORE if bucket_index % 2 else BucketKind.RETRY


@dataclass(frozen=True, slots=True, order=True)
class InstanceRef:
    """A Tier-3 row: a writer instance that has buckets in a window."""

    window: WindowId
    instance_id_token: int
    instance_id: str


@dataclass(frozen=True, slots=True, order=True)
class BucketRef:
    """A Tier-4 row: the key of one Tier-5 partition."""

    window: WindowId
    instance_id: str
    bucket_index: int

    @property
    def kind(self) -> BucketKind:
        return bucket_kind(self.bucket_index)


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """A Tier-5 row: a transaction id at a bucket of the directory."""

    scope: DirectoryScope
    bucket: BucketRef
    transaction_id: uuid.UUID

    @property
    def kind(self) -> BucketKind:
        return self.bucket.kind


@dataclass(frozen=True, slots=True)
class DispatchedPage:
    """A Tier-5 page a Retry-Node dispatched in full: ids after ``after`` up to ``last``."""

    after: uuid.UUID | None
    last: uuid.UUID
    rows: int


class Directory:
    """Tier 1-5 statements for one keyspace. Call :meth:`prepare` once."""

    def __init__(self, cql: CqlSession, keyspace: str, windows: WindowMath) -> None:
        self.cql = cql
        self.keyspace = keyspace
        self.windows = windows
        self._statements: dict[str, Prepared] = {}

    async def prepare(self) -> None:
        ks = self.keyspace
        t1, t2, t3 = (
            "es_days_by_year",
            "es_recovery_windows_by_day",
            "es_instances_by_recovery_window",
        )
        t4, t5 = "es_buckets_by_instance", "es_recovery_transactions_by_instance"
        day = f"{_SCOPE} AND date_of_year = ?"
        window = f"{day} AND minute_of_day = ?"
        instance = f"{window} AND instance_id = ?"
        bucket = f"{instance} AND bucket_index = ?"
        scope_cols = "region, cluster, service_name"
        read, write = StatementKind.READ, StatementKind.WRITE
        specs: dict[str, tuple[str, StatementKind, str]] = {
            "t1_put": (
                f"INSERT INTO {ks}.{t1} ({scope_cols}, year, date_of_year) VALUES (?, ?, ?, ?, ?)",
                write,
                t1,
            ),
            "t1_range": (
                f"SELECT date_of_year FROM {ks}.{t1} WHERE {_SCOPE} AND year = ? "
                "AND date_of_year >= ? AND date_of_year <= ? LIMIT ?",
                read,
                t1,
            ),
            "t1_delete": (
                f"DELETE FROM {ks}.{t1} WHERE {_SCOPE} AND year = ? AND date_of_year = ?",
                write,
                t1,
            ),
            "t2_put": (
                f"INSERT INTO {ks}.{t2} ({scope_cols}, date_of_year, minute_of_day) "
                "VALUES (?, ?, ?, ?, ?)",
                write,
                t2,
            ),
            "t2_list": (
                f"SELECT minute_of_day FROM {ks}.{t2} WHERE {day} AND minute_of_day <= ? LIMIT ?",
                read,
                t2,
            ),
            "t2_delete": (f"DELETE FROM {ks}.{t2} WHERE {window}", write, t2),
            "t3_put": (
                f"INSERT INTO {ks}.{t3} ({scope_cols}, date_of_year, minute_of_day, "
                "instance_id_token, instance_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                write,
                t3,
            ),
            # The seed's Tier-3 read, bounded by the leased token range, paged by clustering key.
            "t3_range": (
                f"SELECT instance_id_token, instance_id FROM {ks}.{t3} WHERE {window} "
                "AND (instance_id_token, instance_id) > (?, ?) AND instance_id_token <= ? LIMIT ?",
                read,
                t3,
            ),
            "t3_range_first": (
                f"SELECT instance_id_token, instance_id FROM {ks}.{t3} WHERE {window} "
                "AND instance_id_token >= ? AND instance_id_token <= ? LIMIT ?",
                read,
                t3,
            ),
            # Node-0's Gate 1: the whole partition, no token filter; one row answers it.
            "t3_any": (f"SELECT instance_id FROM {ks}.{t3} WHERE {window} LIMIT 1", read, t3),
            "t3_delete": (
                f"DELETE FROM {ks}.{t3} WHERE {window} AND instance_id_token = ? "
                "AND instance_id = ?",
                write,
                t3,
            ),
            "t4_put": (
                f"INSERT INTO {ks}.{t4} ({scope_cols}, date_of_year, minute_of_day, instance_id, "
                "bucket_index) VALUES (?, ?, ?, ?, ?, ?, ?)",
                write,
                t4,
            ),
            "t4_list": (
                f"SELECT bucket_index FROM {ks}.{t4} WHERE {instance} LIMIT ?",
                read,
                t4,
            ),
            "t4_delete": (f"DELETE FROM {ks}.{t4} WHERE {bucket}", write, t4),
            "t5_put": (
                f"INSERT INTO {ks}.{t5} ({scope_cols}, date_of_year, minute_of_day, instance_id, "
                "bucket_index, transaction_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                write,
                t5,
            ),
            "t5_first": (
                f"SELECT transaction_id FROM {ks}.{t5} WHERE {bucket} LIMIT ?",
                read,
                t5,
            ),
            "t5_next": (
                f"SELECT transaction_id FROM {ks}.{t5} WHERE {bucket} AND transaction_id > ? "
                "LIMIT ?",
                read,
                t5,
            ),
            "t5_delete_row": (
                f"DELETE FROM {ks}.{t5} WHERE {bucket} AND transaction_id = ?",
                write,
                t5,
            ),
            # One partition tombstone for the whole bucket (seed: O(1) drop).
            "t5_drop": (f"DELETE FROM {ks}.{t5} WHERE {bucket}", write, t5),
        }
        for name, (text, kind, table) in specs.items():
            self._statements[name] = await self.cql.prepare(text, kind=kind, table=table)

    def statement(self, name: str) -> Prepared:
        found = self._statements.get(name)
        if found is None:
            raise StackSagaError("Directory.prepare() was not awaited")
        return found

    def _window_params(self, scope: DirectoryScope, window: WindowId) -> list[object]:
        return [*scope.params(), window.date_of_year, self.windows.minute_of_day(window)]

    def _bucket_params(self, scope: DirectoryScope, bucket: BucketRef) -> list[object]:
        return [*self._window_params(scope, bucket.window), bucket.instance_id, bucket.bucket_index]

    async def _run(self, name: str, params: Sequence[Any], limit: int | None = None) -> list[Any]:
        return await self.cql.execute(self.statement(name), params, row_limit=limit)

    # -- writes (Standard-Node) -------------------------------------------------------------

    async def register_path(
        self,
        scope: DirectoryScope,
        bucket: BucketRef,
        instance_id_token: int,
        *,
        alone: bool = False,
    ) -> None:
        """Tier 1-4 upserts for one (window, instance, bucket), top-down as in the seed.

        Idempotent; the writer issues them once per bucket per process. (``alone``: for the
        accord mode's directory; plain writes are always their own.)
        """
        window = bucket.window
        await self._run("t1_put", [*scope.params(), window.year, window.date_of_year])
        await self._run("t2_put", self._window_params(scope, window))
        await self._run(
            "t3_put", [*self._window_params(scope, window), instance_id_token, bucket.instance_id]
        )
        await self._run("t4_put", self._bucket_params(scope, bucket))

    async def insert_entry(
        self,
        scope: DirectoryScope,
        bucket: BucketRef,
        transaction_id: uuid.UUID,
        *,
        tier4_cached: bool = False,
        instance_id_token: int | None = None,
        on_repair: Callable[[], None] | None = None,
    ) -> None:
        """The Tier-5 row (the keywords matter to the accord mode's directory only)."""
        await self._run("t5_put", [*self._bucket_params(scope, bucket), transaction_id])

    async def delete_entry(
        self, scope: DirectoryScope, bucket: BucketRef, transaction_id: uuid.UUID
    ) -> None:
        """The seed's O(1) watchdog delete: one row of one partition, by its full key."""
        await self._run("t5_delete_row", [*self._bucket_params(scope, bucket), transaction_id])

    # -- reads (Retry-Node) ------------------------------------------------------------------

    async def active_days(self, scope: DirectoryScope, first: str, last: str) -> list[str]:
        """Tier 1: active dates in [first, last] (ISO text), ascending, across years."""
        days: list[str] = []
        for year in range(int(first[:4]), int(last[:4]) + 1):
            rows = await self._run(
                "t1_range",
                [*scope.params(), year, first, last, DAYS_PER_QUERY_MAX],
                DAYS_PER_QUERY_MAX,
            )
            days.extend(row["date_of_year"] for row in rows)
        return days

    async def windows_of_day(
        self, scope: DirectoryScope, date_of_year: str, *, up_to_minute: int = 1439
    ) -> list[WindowId]:
        """Tier 2: the active windows of a day with minute_of_day <= up_to_minute, ascending."""
        rows = await self._run(
            "t2_list",
            [*scope.params(), date_of_year, up_to_minute, WINDOWS_PER_DAY_MAX],
            WINDOWS_PER_DAY_MAX,
        )
        return [self.windows.from_key(date_of_year, row["minute_of_day"]) for row in rows]

    async def instances(
        self, scope: DirectoryScope, window: WindowId, token_min: int, token_max: int
    ) -> AsyncGenerator[InstanceRef, None]:
        """Tier 3 rows with token in [token_min, token_max] (inclusive), in token order, paged."""
        params = self._window_params(scope, window)
        rows = await self._run(
            "t3_range_first", [*params, token_min, token_max, INSTANCE_PAGE_ROWS]
        )
        while rows:
            for row in rows:
                yield InstanceRef(window, row["instance_id_token"], row["instance_id"])
            if len(rows) < INSTANCE_PAGE_ROWS:
                return
            last = rows[-1]
            rows = await self._run(
                "t3_range",
                [
                    *params,
                    last["instance_id_token"],
                    last["instance_id"],
                    token_max,
                    INSTANCE_PAGE_ROWS,
                ],
            )

    async def window_has_instances(self, scope: DirectoryScope, window: WindowId) -> bool:
        """Node-0's Gate 1: does any Tier-3 marker remain in the window (any token)?"""
        return bool(await self._run("t3_any", self._window_params(scope, window), 1))

    async def buckets(self, scope: DirectoryScope, instance: InstanceRef) -> list[BucketRef]:
        """Tier 4: the bucket indexes of one instance in one window, ascending."""
        rows = await self._run(
            "t4_list",
            [
                *self._window_params(scope, instance.window),
                instance.instance_id,
                BUCKETS_PER_INSTANCE_MAX,
            ],
            BUCKETS_PER_INSTANCE_MAX,
        )
        return [BucketRef(instance.window, instance.instance_id, r["bucket_index"]) for r in rows]

    async def entries(
        self,
        scope: DirectoryScope,
        bucket: BucketRef,
        *,
        page_rows: int = TIER5_PAGE_ROWS_DEFAULT,
    ) -> AsyncGenerator[list[DirectoryEntry], None]:
        """Tier 5: the bucket's transaction ids, page by page, in clustering order."""
        check_state(page_rows >= 1, "page_rows must be >= 1")
        params = self._bucket_params(scope, bucket)
        rows = await self._run("t5_first", [*params, page_rows])
        while rows:
            yield [DirectoryEntry(scope, bucket, row["transaction_id"]) for row in rows]
            if len(rows) < page_rows:
                return
            rows = await self._run("t5_next", [*params, rows[-1]["transaction_id"], page_rows])

    # -- deletes (Retry-Node, Node-0) -----------------------------------------------------------

    async def drop_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """The Tier-5 partition (one partition tombstone), then its Tier-4 row.

        In this order, so a crash in between leaves a Tier-4 row pointing at an empty
        partition (harmless: the next reader finds nothing and drops the row), never a Tier-5
        partition nobody can find.
        """
        params = self._bucket_params(scope, bucket)
        await self._run("t5_drop", params)
        await self._run("t4_delete", params)

    async def drop_dispatched(
        self, scope: DirectoryScope, bucket: BucketRef, pages: Sequence[DispatchedPage]
    ) -> bool:
        """Drop a bucket whose ``pages`` were all dispatched; True once it is gone. Here
        unconditionally (the accord mode's directory checks nothing came in meanwhile)."""
        await self.drop_bucket(scope, bucket)
        return True

    async def drop_instance(self, scope: DirectoryScope, instance: InstanceRef) -> None:
        """The Tier-3 marker, once every bucket of the instance in the window is gone."""
        await self._run(
            "t3_delete",
            [
                *self._window_params(scope, instance.window),
                instance.instance_id_token,
                instance.instance_id,
            ],
        )

    async def drop_window(self, scope: DirectoryScope, window: WindowId) -> None:
        """Tier 2 row (Node-0 only, after both gates)."""
        await self._run("t2_delete", self._window_params(scope, window))

    async def restore_window(self, scope: DirectoryScope, window: WindowId) -> None:
        """Re-insert a Tier-2 row Node-0 deleted while a late writer added a Tier-3 marker."""
        await self._run("t2_put", self._window_params(scope, window))
        await self._run("t1_put", [*scope.params(), window.year, window.date_of_year])

    async def drop_day(self, scope: DirectoryScope, date_of_year: str) -> None:
        """Tier 1 row (Node-0 only, once the day has no windows and cannot get new ones)."""
        await self._run("t1_delete", [*scope.params(), int(date_of_year[:4]), date_of_year])
