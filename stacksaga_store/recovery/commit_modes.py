"""Commit modes: how a saga's state changes and its directory rows agree after a crash.

Theory of operation
-------------------
A saga's recovery state lives in rows no single Cassandra write covers: es_transaction (status,
restore_*), its tryouts, its execution markers, and the directory (Tier-5 row of its restore
watchdog in an odd bucket, of a retry pointer in an even one, Tiers 1-4 above them). A crash
between two writes must never orphan a saga (a non-final transaction without a live pointer
or watchdog) nor re-run a committed step. Two modes, chosen by
``stacksaga.cassandra.recovery.commit-mode``:

``ordered`` (no Accord; the seed's writes, put in an order that is safe at every crash point)
    ========================  ==============================================================
    when                      order and why a crash in between is harmless
    ========================  ==============================================================
    saga start                Tier 1-4 (once per bucket), Tier-5 watchdog row, *then*
                              es_transaction. A crash after the watchdog leaves a row whose
                              transaction does not exist: restore pickup reads no
                              es_transaction and deletes the row.
    transient failure         the retry pointer, *then* the failed tryout and the status
                              FAILED_WITH_RETRYABLE_ERROR. A crash before the pointer is a
                              crash mid-step (the watchdog restores the saga); after it, the
                              pointer resumes the saga at W+1 whatever its status says.
    completion                the final status, *then* the watchdog delete. A crash in between
                              leaves a watchdog of a finished saga: pickup reads the status
                              (final) and deletes the row, never re-runs it.
    restore pickup            a *new* watchdog (Tier 5, then es_transaction.restore_*), then
                              re-invoke; the old row goes with its bucket. The saga is covered
                              by a watchdog at every instant.
    ========================  ==============================================================

    Its known gaps, which only the accord mode closes: a crash between the status and the
    pointer, a pointer that lands as its bucket's partition is tombstoned, and clock skew with
    ``read-grace`` 0 leave the saga to its restore watchdog (``delay-windows`` later).

``accord`` (every state change is one Accord transaction over the seed's own tables)
    The seed's nine tables, in the seed's keyspace, are written only through the Accord
    sidecars (:mod:`stacksaga_store.store.accord_store`: why *only*). Each state change of a
    saga is one transaction (concurrent changes of other sagas may share it, each whole), so
    there is no boundary inside it to crash at:

    ==========================  ==========================================================
    state change                one transaction (conditions in brackets)
    ==========================  ==========================================================
    start                       es_transaction [absent], Tier-5 watchdog row, Tiers 1-4
                                the first time this process uses the bucket, else
                                [the bucket's Tier-4 row exists]
    step success                status + payload, tryout [index free], marker COMMITTED
                                [STRICT: lease still ours; RELAXED: none, the tryout's
                                condition refuses a second record], and on the last step
                                the watchdog row delete
    transient failure           retry pointer (+ Tiers 1-4 or [Tier-4 row exists]), tryout
                                [index free], status FAILED_WITH_RETRYABLE_ERROR
    permanent failure           tryout, status, marker FAILED [lease ours / no marker];
                                freeze: + es_frozen_transaction row + watchdog delete
    completion                  final status + watchdog delete
    quarantine                  tryout, status, es_frozen_transaction row, watchdog delete
    admin restore (unfreeze)    tryout, status, frozen row delete, new watchdog + restore_*,
                                FAILED marker delete [still FAILED]
    restore re-arm              new watchdog row, old row delete, restore_* [still the old
                                path, transaction active]
    ==========================  ==========================================================

    A crash before a transaction leaves the saga as the previous change left it (its
    pointer or watchdog still live); after it, the new state with its own pointer or
    watchdog. The Tier-5 row is the watchdog, as in ``ordered``, so a live saga always has
    exactly one (a re-arm moves it atomically). The Retry-Node reads buckets with Accord
    slice reads and drops one only if it holds exactly what was dispatched
    (:class:`AccordDirectory`), so no pointer is lost to a drop, whatever the clocks say.
    STRICT leases are conditional inserts with a TTL, commits conditional updates: nothing
    in this mode uses LWT or a logged batch.

:class:`CrashPoints` lets tests stop a writer at each boundary of the ordered table (a
*simulated crash*: the process's memory is abandoned, nothing after the point runs); in the
accord mode the same points fall before the change's transaction, and
:class:`~stacksaga_store.store.accord_store.CommitCrashes` stops it just before or after it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from stacksaga_store.config.settings import CommitModeName
from stacksaga_store.errors import (
    check_state,
)
from stacksaga_store.recovery.directory import (
    TIER5_PAGE_ROWS_DEFAULT,
    BucketKind,
    BucketRef,
    Directory,
    DirectoryEntry,
    DirectoryScope,
    DispatchedPage,
    InstanceRef,
)
from stacksaga_store.recovery.windows import WindowId, WindowMath
from stacksaga_store.store.accord_store import (
    ACCORD_COMMIT_ATTEMPTS_MAX,
    SLICE_ROWS_MAX,
    AccordGateway,
    AccordOutcome,
    ChangeRunner,
    CommitCrashes,
    Part,
    uuid_of,
)
from stacksaga_store.store.cql import CqlSession
from stacksaga_store.store.model import RestorePath, TransactionKey

__all__ = [
    "ACCORD_COMMIT_ATTEMPTS_MAX",
    "AccordCommit",
    "AccordDirectory",
    "AccordGateway",
    "CommitMode",
    "CommitModeName",
    "CrashPoint",
    "CrashPoints",
    "OrderedCommit",
    "SimulatedCrash",
    "WatchdogLiveness",
    "bucket_of",
    "path_of",
]

logger = logging.getLogger(__name__)


class WatchdogLiveness(StrEnum):
    LIVE = "LIVE"  # this row is the transaction's current watchdog
    GONE = "GONE"  # released or moved: the row is an index leftover
    UNKNOWN = "UNKNOWN"  # the mode cannot tell; decide by the transaction's status


# -- crash injection -----------------------------------------------------------------------


class CrashPoint(StrEnum):
    """Boundaries between the writes of a commit (see the module docstring's tables)."""

    WATCHDOG_INDEXED = "watchdog-indexed"  # Tier 1-5 written; accord: ledger not committed
    WATCHDOG_ARMED = "watchdog-armed"  # watchdog complete; es_transaction not written
    RETRY_BEFORE_POINTER = "retry-before-pointer"  # step failed; nothing of it written yet
    RELEASE_BEFORE = "release-before"  # final status written; watchdog still there
    REARM_BEFORE_RESUME = "rearm-before-resume"  # restore pickup re-armed; not re-invoked


class SimulatedCrash(BaseException):
    """Raised at an armed :class:`CrashPoint`. A BaseException so no ``except Exception`` in
    the code under test can swallow it: like a SIGKILL, nothing after the point runs."""

    def __init__(self, point: CrashPoint) -> None:
        super().__init__(f"simulated crash at {point.value}")
        self.point = point


class CrashPoints:
    """Armed points fire once each. Production code holds an empty instance."""

    def __init__(self, *points: CrashPoint, commits: Sequence[tuple[str, str]] = ()) -> None:
        self._armed = set(points)
        self.fired: list[CrashPoint] = []
        # Accord mode: (state change label, "before" | "after") its transaction.
        self.commits = CommitCrashes(*commits)

    def arm(self, point: CrashPoint) -> None:
        self._armed.add(point)

    def hit(self, point: CrashPoint) -> None:
        if point in self._armed:
            self._armed.discard(point)
            self.fired.append(point)
            raise SimulatedCrash(point)


# -- paths ---------------------------------------------------------------------------------


def path_of(bucket: BucketRef, windows: WindowMath) -> RestorePath:
    """The es_transaction.restore_* value of a watchdog row in ``bucket``."""
    check_state(bucket.bucket_index % 2 == 1, "a watchdog lives in an odd bucket")
    return RestorePath(
        date_of_year=bucket.window.date_of_year,
        window=windows.minute_of_day(bucket.window),
        instance_id=bucket.instance_id,
        bucket=bucket.bucket_index,
    )


def bucket_of(path: RestorePath, windows: WindowMath) -> BucketRef:
    return BucketRef(
        windows.from_key(path.date_of_year, path.window), path.instance_id, path.bucket
    )


class CommitMode(Protocol):
    """What the writer and the Retry-Node need from a mode. Every method is idempotent."""

    name: ClassVar[CommitModeName]
    atomic: ClassVar[bool]  # state changes are one transaction (accord)

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """Once per odd bucket a writer opens, after its Tier 1-4 rows."""
        ...

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        """After the Tier-5 watchdog row of a new transaction is written."""
        ...

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        """The transaction ended (or was parked): its watchdog must not fire."""
        ...

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        """A restore pickup re-armed the watchdog at ``new`` (its Tier-5 row is written)."""
        ...

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        """Is the watchdog row at ``path`` the transaction's live watchdog?"""
        ...

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        """Live watchdogs in an odd bucket, or None when the mode does not count them."""
        ...

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """After a Retry-Node dropped the bucket's Tier-5 partition and Tier-4 row."""
        ...

    async def forget(self, key: TransactionKey, path: RestorePath) -> None:
        """The restore row at ``path`` is not the transaction's live watchdog: drop it now
        (accord) or leave it to its bucket's drop (ordered)."""
        ...


class OrderedCommit:
    """No Accord: the Tier-5 row *is* the watchdog; the writes are ordered (module doc)."""

    name: ClassVar[CommitModeName] = CommitModeName.ORDERED
    atomic: ClassVar[bool] = False

    def __init__(self, directory: Directory, scope: DirectoryScope) -> None:
        self.directory = directory
        self.scope = scope

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        return None

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        # The seed's O(1) delete: one row of the odd partition, by its full primary key.
        bucket = bucket_of(path, self.directory.windows)
        await self.directory.delete_entry(self.scope, bucket, key.transaction_id)

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        # The old row is dropped with its bucket once the Retry-Node dispatched all of it.
        return None

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        return WatchdogLiveness.UNKNOWN

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        return None

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None

    async def forget(self, key: TransactionKey, path: RestorePath) -> None:
        return None


# -- accord -------------------------------------------------------------------------------------


class AccordCommit:
    """Accord v2: the Tier-5 row is the watchdog, as in ``ordered``, but it changes only
    inside the saga's state change (one Accord transaction, module docstring)."""

    name: ClassVar[CommitModeName] = CommitModeName.ACCORD
    atomic: ClassVar[bool] = True

    def __init__(self, directory: AccordDirectory, scope: DirectoryScope) -> None:
        self.directory = directory
        self.scope = scope

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        return None  # the Tier-5 row and es_transaction.restore_* share the start's change

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        await self.forget(key, path)

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        # In the re-arm's change: the old row goes as the new one comes.
        await self.forget(key, old)

    async def forget(self, key: TransactionKey, path: RestorePath) -> None:
        bucket = bucket_of(path, self.directory.windows)
        await self.directory.delete_entry(self.scope, bucket, key.transaction_id)

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        return WatchdogLiveness.UNKNOWN  # decided by es_transaction, read through Accord

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        return None

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None


# -- accord v2: the directory through Accord ------------------------------------------------------

T1, T2, T3 = "es_days_by_year", "es_recovery_windows_by_day", "es_instances_by_recovery_window"
T4, T5 = "es_buckets_by_instance", "es_recovery_transactions_by_instance"


class AccordDirectory(Directory):
    """Tier 1-5 writes as parts of the open state change (or alone), Tier-5 reads as Accord
    slice reads, and every delete conditional on what it deletes being done with:

    * a Tier-5 bucket goes only if it holds exactly the rows that were dispatched (pointers
      are never deleted one by one, so an equal count is the same set; restore rows are
      deleted by their pickup, so a restore bucket goes once empty): a pointer that lands
      while its bucket is dropped is ordered before the drop, which then sees one row more
      and keeps the bucket, or after it, in a bucket its Tier-4 row no longer names, which
      the pointer's own condition (the Tier-4 row exists) refuses, so the writer re-registers
      Tiers 1-4 with it;
    * a Tier-3, 2 or 1 row goes only while the partition below it is empty, so a Tier-4 row
      always has its Tiers 1-3 above it.
    """

    def __init__(
        self, cql: CqlSession, keyspace: str, windows: WindowMath, runner: ChangeRunner
    ) -> None:
        super().__init__(cql, keyspace, windows)
        self.runner = runner

    def _window_key(self, scope: DirectoryScope, window: WindowId) -> list[object]:
        return [*scope.params(), window.date_of_year, self.windows.minute_of_day(window)]

    def _t4_key(self, scope: DirectoryScope, bucket: BucketRef) -> list[object]:
        return [*self._window_key(scope, bucket.window), bucket.instance_id]

    def _t5_key(self, scope: DirectoryScope, bucket: BucketRef) -> list[object]:
        return [*self._t4_key(scope, bucket), bucket.bucket_index]

    async def register_path(
        self,
        scope: DirectoryScope,
        bucket: BucketRef,
        instance_id_token: int,
        *,
        alone: bool = False,
    ) -> None:
        """Tiers 1-4 of ``bucket``: a part of the open state change, or (``alone``) an Accord
        transaction of their own, now (ahead of the starts that will use the bucket)."""
        ks, window = self.keyspace, bucket.window
        t1 = [*scope.params(), window.year]
        t2 = [*scope.params(), window.date_of_year]
        t3 = self._window_key(scope, window)
        t4 = self._t4_key(scope, bucket)

        def build(txn: Any, tag: str) -> None:
            txn.update(ks, T1, t1, (window.date_of_year,))
            txn.update(ks, T2, t2, (self.windows.minute_of_day(window),))
            txn.update(ks, T3, t3, (instance_id_token, bucket.instance_id))
            txn.update(ks, T4, t4, (bucket.bucket_index,))

        if alone:
            await self.runner.now(Part("tiers 1-4", build, lane=bucket.instance_id))
        else:
            await self.runner.submit(Part("tiers 1-4", build, lane=bucket.instance_id), "tiers")

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
        """The Tier-5 row. ``tier4_cached``: Tiers 1-4 are not in this change, so it holds
        only while the bucket's Tier-4 row exists; refused (a Retry-Node dropped the bucket
        after walking its window), the part repairs itself: it writes Tiers 1-4 with the row
        (``instance_id_token`` needed) and the change is sent again, ``on_repair`` told."""
        ks, t4, t5 = self.keyspace, self._t4_key(scope, bucket), self._t5_key(scope, bucket)
        window = bucket.window
        cached = [tier4_cached]  # False once repaired (or never cached: Tiers 1-4 elsewhere)

        def build(txn: Any, tag: str) -> None:
            if cached[0]:
                head = txn.let(f"{tag}b", ks, T4, t4, (bucket.bucket_index,))
                txn.where(head.exists())
            elif tier4_cached:  # repaired
                txn.update(ks, T1, [*scope.params(), window.year], (window.date_of_year,))
                txn.update(
                    ks,
                    T2,
                    [*scope.params(), window.date_of_year],
                    (self.windows.minute_of_day(window),),
                )
                txn.update(
                    ks, T3, self._window_key(scope, window), (instance_id_token, bucket.instance_id)
                )
                txn.update(ks, T4, t4, (bucket.bucket_index,))
            txn.update(ks, T5, t5, (transaction_id,))

        def mine(outcome: AccordOutcome, tag: str) -> bool:
            return not cached[0] or outcome.rows.get(f"{tag}b") is not None

        def held(outcome: AccordOutcome, tag: str) -> bool:
            return not cached[0] or outcome.rows.get(f"{tag}b") is not None

        def repair() -> bool:
            if not cached[0] or instance_id_token is None:
                return False
            cached[0] = False
            if on_repair is not None:
                on_repair()
            return True

        await self.runner.submit(
            Part(
                f"{TIER4_PART} {bucket}",
                build,
                mine if tier4_cached else None,
                repair if tier4_cached else None,
                held if tier4_cached else None,
                lane=bucket.instance_id,
            ),
            "entry",
        )

    async def delete_entry(
        self, scope: DirectoryScope, bucket: BucketRef, transaction_id: uuid.UUID
    ) -> None:
        ks, t5 = self.keyspace, self._t5_key(scope, bucket)

        def build(txn: Any, tag: str) -> None:
            txn.delete(ks, T5, t5, (transaction_id,))

        await self.runner.submit(Part("watchdog delete", build, lane=bucket.instance_id), "release")

    async def entries(
        self,
        scope: DirectoryScope,
        bucket: BucketRef,
        *,
        page_rows: int = TIER5_PAGE_ROWS_DEFAULT,
    ) -> AsyncGenerator[list[DirectoryEntry], None]:
        """Tier 5 as Accord slice reads, page by page (at most the sidecars' slice cap)."""
        check_state(page_rows >= 1, "page_rows must be >= 1")
        limit = min(page_rows, SLICE_ROWS_MAX)
        ks, t5 = self.keyspace, self._t5_key(scope, bucket)
        after: uuid.UUID | None = None
        while True:

            def build(txn: Any, after: uuid.UUID | None = after) -> None:
                txn.let_slice("s", ks, T5, t5, column="transaction_id", gt=after, limit=limit)

            rows = (await self.runner.gateway.read(build)).slices.get("s", [])
            if not rows:
                return
            page = [DirectoryEntry(scope, bucket, uuid_of(r["transaction_id"])) for r in rows]
            yield page
            if len(rows) < limit:
                return
            after = page[-1].transaction_id

    async def drop_dispatched(
        self, scope: DirectoryScope, bucket: BucketRef, pages: Sequence[DispatchedPage]
    ) -> bool:
        """Drop a bucket whose pages were all dispatched; False if rows came in meanwhile
        (the bucket stays for the next pass). See the class docstring."""
        ks, t4, t5 = self.keyspace, self._t4_key(scope, bucket), self._t5_key(scope, bucket)
        kept = [p for p in pages if bucket.kind is BucketKind.RETRY]
        # Pages before the last: a range delete each, while the range holds what was read.
        for page in kept[:-1]:

            def build_range(txn: Any, page: DispatchedPage = page) -> Any:
                s = txn.let_slice(
                    "s",
                    ks,
                    T5,
                    t5,
                    column="transaction_id",
                    gt=page.after,
                    le=page.last,
                    limit=page.rows + 1,
                )
                txn.where(s.count() == page.rows)
                txn.delete_range(ks, T5, t5, column="transaction_id", gt=page.after, le=page.last)

            if not await self._conditional(build_range):
                return False
        tail = kept[-1] if kept else None
        after = tail.after if tail else None
        expected = tail.rows if tail else 0

        def build_drop(txn: Any) -> Any:
            s = txn.let_slice(
                "s", ks, T5, t5, column="transaction_id", gt=after, limit=expected + 1
            )
            txn.where(s.count() == expected)
            txn.delete_partition(ks, T5, t5)
            txn.delete(ks, T4, t4, (bucket.bucket_index,))

        return await self._conditional(build_drop)

    async def drop_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """An empty bucket only (the conditional form is :meth:`drop_dispatched`)."""
        await self.drop_dispatched(scope, bucket, [])

    async def _conditional(self, build: Callable[[Any], Any]) -> bool:
        outcome = await self.runner.gateway.read(build)
        return outcome.applied

    async def drop_instance(self, scope: DirectoryScope, instance: InstanceRef) -> None:
        ks = self.keyspace
        t3 = self._window_key(scope, instance.window)
        t4 = [*t3, instance.instance_id]

        def build(txn: Any) -> None:
            below = txn.let_slice("s", ks, T4, t4, limit=1)
            txn.where(below.not_exists())
            txn.delete(ks, T3, t3, (instance.instance_id_token, instance.instance_id))

        await self._conditional(build)

    async def drop_window(self, scope: DirectoryScope, window: WindowId) -> None:
        ks, t3 = self.keyspace, self._window_key(scope, window)
        t2 = [*scope.params(), window.date_of_year]

        def build(txn: Any) -> None:
            below = txn.let_slice("s", ks, T3, t3, limit=1)
            txn.where(below.not_exists())
            txn.delete(ks, T2, t2, (self.windows.minute_of_day(window),))

        await self._conditional(build)

    async def restore_window(self, scope: DirectoryScope, window: WindowId) -> None:
        ks = self.keyspace
        t1 = [*scope.params(), window.year]
        t2 = [*scope.params(), window.date_of_year]

        def build(txn: Any, tag: str) -> None:
            txn.update(ks, T2, t2, (self.windows.minute_of_day(window),))
            txn.update(ks, T1, t1, (window.date_of_year,))

        await self.runner.submit(Part("tiers 1-2", build), "tiers")

    async def drop_day(self, scope: DirectoryScope, date_of_year: str) -> None:
        ks = self.keyspace
        t1 = [*scope.params(), int(date_of_year[:4])]
        t2 = [*scope.params(), date_of_year]

        def build(txn: Any) -> None:
            below = txn.let_slice("s", ks, T2, t2, limit=1)
            txn.where(below.not_exists())
            txn.delete(ks, T1, t1, (date_of_year,))

        await self._conditional(build)


TIER4_PART = "tier-4 row of"
