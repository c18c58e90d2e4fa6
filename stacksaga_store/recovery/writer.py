"""The Standard-Node writer: the recovery engine's side of the orchestrator (seed Part 4).

Theory of operation
-------------------
:class:`RecoveryWriter` implements :class:`~stacksaga_store.saga.handoff.RecoveryHandoff`, so an
orchestrator built with it *is* a Standard-Node:

* ``register_watchdog`` (onTransactionStart): a watchdog row at ``W + delay-windows`` in an odd
  bucket; returns the :class:`~stacksaga_store.store.model.RestorePath` that the orchestrator
  stores in es_transaction;
* ``schedule_retry`` (onTransientFailure): a retry pointer at ``W + 1`` in an even bucket;
* ``release_watchdog`` (onTransactionComplete, freeze, quarantine): the watchdog is released
  (``ordered``: its row deleted in O(1); ``accord``: its ledger entry, atomically with the
  bucket's live count).

Identity. Each process start draws a fresh ``instance_id`` (a UUID4) and computes
``instance_id_token``, Cassandra's own Murmur3 token of it (:mod:`accord_cassandra.tokens`,
the same function Cassandra's ``token(...)`` applies to a text key). A restarted pod therefore
never writes into a dead pod's buckets; the dead pod's rows stay discoverable through Tier 3.

Buckets. Per write window there are two process-local counters (no database read, no lock:
the event loop serialises them): retry slots ``n = 0, 1, 2, ...`` go to even bucket
``(n // bucket-size) * 2`` and restore slots to odd bucket ``(n // bucket-size) * 2 + 1``. The
seed's pseudocode divides ``incrementAndGet()`` (starting at 1), which leaves its first bucket
one row short; counting from 0 puts exactly bucket-size rows in every bucket.

Writes per saga start. The Tier 1-4 upserts of a (window, instance, bucket) are issued once
per process, by the first start that needs them (concurrent starts await the same task), so
in steady state a start costs the Tier-5 row plus the es_transaction row: 2 Cassandra writes
(the ``accord`` mode: in its start's state change, one Accord transaction that concurrent
starts share, whose condition reads the bucket's Tier-4 row; Tiers 1-4 are registered ahead
in a transaction of their own unless the window may have been walked, then they ride in the
start's change). Remembered buckets are forgotten once their
window is older than the reader's window, so memory stays bounded by the windows in flight.

Write lanes (accord mode). Accord orders every pair of transactions that touch a common
key, and a sidecar admits only a few at a time per key; with one instance id, every saga
start of a window names the same Tier-4 row (the cached-bucket condition) and the same Tier-5
partition, so starts ran one key's worth at a time. A writer in the ``accord`` mode therefore
draws ``recovery.accord.write-lanes`` instance ids (default 16) and sends slot *n* to lane
``n % lanes``: concurrent starts name different Tier-4 rows and Tier-5 partitions and commit
side by side. Each lane is an ordinary instance to the readers (its own Tier-3 marker,
token and buckets), so its rows also spread over the Retry-Nodes' token ranges; the cost is
up to ``lanes`` times more Tier-3/4 rows and Tier-5 partitions per window, each registered
once. ``ordered`` mode keeps the seed's one instance id: its plain writes do not serialise.

Late writes. A retry pointer can reach Cassandra after its window W+1 started (a long pause, a
slow network); a Retry-Node may then already have walked that window and dropped the bucket,
and the bucket's partition tombstone, newer than the row's write timestamp, shadows the row
even though it landed afterwards. The writer notices (its clock is at or past W+1's start
when the row is acknowledged): it writes Tiers 1-4 again (a row that survived is found on the
next pass) and writes the pointer again into the window after its clock's current one, which
no reader has read yet, so the saga retries a window later instead of waiting for the
watchdog. Readers lag window starts by at least ``READ_GRACE_FLOOR``
(:mod:`stacksaga_store.recovery.windows`), so "no reader has read it" holds while clocks
disagree by less than that.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime

from accord_cassandra.tokens import murmur3_token, text_key
from stacksaga_store.clock import Clock, SystemClock
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import StackSagaError, check_state
from stacksaga_store.recovery.commit_modes import (
    TIER4_PART,
    CommitMode,
    CrashPoint,
    CrashPoints,
    bucket_of,
    path_of,
)
from stacksaga_store.recovery.directory import BucketKind, BucketRef, Directory, DirectoryScope
from stacksaga_store.recovery.windows import WindowId, WindowMath
from stacksaga_store.saga.handoff import RetryRequest
from stacksaga_store.store.accord_store import StateChangeConflict, after_commit, current_change
from stacksaga_store.store.cql import StoreUnavailableError
from stacksaga_store.store.events import CassandraEventStore
from stacksaga_store.store.model import RestorePath, TransactionKey
from stacksaga_store.store.states import RunningStatus

__all__ = ["RecoveryWriter", "instance_token", "new_instance_id"]

logger = logging.getLogger(__name__)

# A retry pointer acknowledged after its window started is written again into the next
# window, at most this many times in all (each late one means a pause of a window or more).
LATE_POINTER_ATTEMPTS = 3
# Accord: watchdogs released by a step's change, so the completion does not delete again.
RELEASED_REMEMBERED = 10_000
# Accord: instance ids a writer spreads its slots over (recovery.accord.write-lanes).
LANES_MAX = 256


def new_instance_id() -> str:
    """A fresh instance id per process start (seed: a restarted pod never reuses buckets)."""
    return str(uuid.uuid4())


def instance_token(instance_id: str) -> int:
    """Cassandra's Murmur3 token of a text value (equal to ``SELECT token(instance_id)``)."""
    return murmur3_token(text_key(instance_id))


class RecoveryWriter:
    """The Standard-Node half of the recovery engine. One per process (one instance_id)."""

    def __init__(
        self,
        *,
        directory: Directory,
        events: CassandraEventStore,
        settings: StackSagaSettings,
        commit: CommitMode,
        clock: Clock | None = None,
        instance_id: str | None = None,
        crash: CrashPoints | None = None,
        lanes: int = 1,
    ) -> None:
        """``lanes``: instance ids to spread slots over (1 in ``ordered`` mode: the seed's
        one instance per process; module docstring, "Write lanes")."""
        recovery = settings.cassandra.recovery
        check_state(1 <= lanes <= LANES_MAX, f"write lanes must be 1..{LANES_MAX}, got {lanes}")
        self.directory = directory
        self.events = events
        self.commit = commit
        self.clock: Clock = clock or SystemClock()
        self.scope = DirectoryScope.of(settings.instance)
        self.windows = WindowMath(recovery.window_interval_minutes)
        check_state(
            self.windows.interval_minutes == directory.windows.interval_minutes,
            "writer and directory disagree on the window interval",
        )
        self.bucket_size = recovery.bucket_size
        self.delay_windows = recovery.restore.delay_windows
        self.instance_id = instance_id or new_instance_id()
        self.instance_id_token = instance_token(self.instance_id)
        self.instance_ids = (self.instance_id, *(new_instance_id() for _ in range(lanes - 1)))
        self._tokens = {i: instance_token(i) for i in self.instance_ids}
        self.crash = crash or CrashPoints()
        self._counters: dict[tuple[WindowId, BucketKind], int] = {}
        self._paths: dict[BucketRef, asyncio.Task[None]] = {}
        self._registered: set[BucketRef] = set()  # accord: Tiers 1-4 committed
        self._released: OrderedDict[TransactionKey, RestorePath] = OrderedDict()
        self._pruned_before: WindowId | None = None
        self.late_repairs = 0

    # -- slots and buckets -------------------------------------------------------------------

    def allocate(self, window: WindowId, kind: BucketKind) -> BucketRef:
        """The next slot of ``kind`` in ``window``: its bucket (rolls over at bucket-size).

        With write lanes, slot *n* goes to lane ``n % lanes`` (that lane's instance id) as
        slot ``n // lanes`` of the lane, so every bucket still holds at most bucket-size
        rows (module docstring, "Write lanes")."""
        slot = self._counters.get((window, kind), 0)
        self._counters[window, kind] = slot + 1
        lanes = len(self.instance_ids)
        lane, slot = slot % lanes, slot // lanes
        index = (slot // self.bucket_size) * 2 + (1 if kind is BucketKind.RESTORE else 0)
        return BucketRef(window, self.instance_ids[lane], index)

    async def _ensure_path(self, bucket: BucketRef) -> None:
        """Tier 1-4 (and the mode's bucket set-up), once per bucket per process."""
        if self.commit.atomic:
            return  # accord: _insert() puts them into the state change itself
        await self._once(bucket, lambda: self._register(bucket))

    async def _once(self, bucket: BucketRef, work: Callable[[], Awaitable[None]]) -> None:
        """``work`` for ``bucket`` once per process: concurrent callers await the same task,
        and one that failed or was cancelled runs again for the next caller."""
        task = self._paths.get(bucket)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(work())
            self._paths[bucket] = task
        # Shielded: a cancelled saga start must not cancel the registration others await.
        await asyncio.shield(task)

    async def _register(self, bucket: BucketRef) -> None:
        await self.directory.register_path(self.scope, bucket, self._tokens[bucket.instance_id])
        await self.commit.prepare_bucket(self.scope, bucket)

    async def _insert(self, bucket: BucketRef, key: TransactionKey) -> None:
        """The Tier-5 row, after Tiers 1-4 (ordered: once per bucket per process).

        Accord: in the open state change. Tiers 1-4 ride along until a change carrying them
        committed (then the bucket is cached) and whenever the bucket's window may have been
        walked already (the clock is past its start); a cached insert holds only while the
        bucket's Tier-4 row exists, so the cache can never hide a missing upper tier: a
        refused change forgets the bucket (:meth:`_refused`).
        """
        if not self.commit.atomic:
            await self._ensure_path(bucket)
            await self.directory.insert_entry(self.scope, bucket, key.transaction_id)
            return
        walked = self.clock.now() >= self.windows.start(bucket.window)
        if not walked and bucket not in self._registered:
            await self._register_ahead(bucket)
        cached = not walked and bucket in self._registered
        if not cached:
            # The window may have been walked (or the registration ahead failed): Tiers 1-4
            # ride in this change, and the bucket is cached once a change carrying them
            # committed.
            await self._register(bucket)
        after_commit(lambda: self._registered.add(bucket))
        change = current_change()
        if change is not None:
            change.on_refused.append(lambda conflict: self._refused(bucket, conflict))
        await self.directory.insert_entry(
            self.scope,
            bucket,
            key.transaction_id,
            tier4_cached=cached,
            instance_id_token=self._tokens[bucket.instance_id],
            on_repair=self._repaired,
        )

    async def _register_ahead(self, bucket: BucketRef) -> None:
        """Accord: Tiers 1-4 of a bucket its window's reader has not walked yet, in their own
        transaction, once per bucket per process (concurrent starts await the same task),
        before any start names the bucket. Every start of the bucket then takes the cached
        form (one read of the Tier-4 row, no upper-tier write), so starts of one lane batch
        together (ChangeBatcher): when the first start carried Tiers 1-4 itself, the
        lane's next starts, sent before it committed or in its own batch (whose conditions
        read the state before it), were refused and sent again alone, and the lanes' first
        starts, which all write the window's Tier-1 and Tier-2 rows, could not share a
        transaction. The cached form's condition still guards the Tier-5 row in its own
        transaction, so the cache can never hide a dropped upper tier. A failure here is
        not fatal: the start carries Tiers 1-4 itself, as before."""

        async def register() -> None:
            await self.directory.register_path(
                self.scope, bucket, self._tokens[bucket.instance_id], alone=True
            )
            self._registered.add(bucket)

        try:
            await self._once(bucket, register)
        except StackSagaError as exc:
            logger.info("tiers 1-4 of %s not registered ahead (%s); in the start", bucket, exc)

    def _repaired(self) -> None:
        self.late_repairs += 1
        logger.info("a cached bucket was dropped under a state change: tiers 1-4 again")

    def _refused(self, bucket: BucketRef, conflict: StateChangeConflict) -> None:
        if any(part.startswith(TIER4_PART) for part in conflict.parts):
            self._registered.discard(bucket)
            self._paths.pop(bucket, None)

    def _prune(self, now: datetime) -> None:
        """Forget buckets of windows a reader may already have walked (bounded memory)."""
        # One window of slack: a caller's timestamp may lag the clock a little, and a counter
        # that restarted at 0 for a window still being written would overfill its bucket.
        horizon = self.windows.shift(self.windows.window_at(now), -1)
        if self._pruned_before == horizon:
            return
        self._pruned_before = horizon
        for key in [k for k in self._counters if k[0] < horizon]:
            del self._counters[key]
        for bucket in [b for b, t in self._paths.items() if b.window < horizon and t.done()]:
            del self._paths[bucket]
        self._registered = {b for b in self._registered if b.window >= horizon}

    # -- RecoveryHandoff -------------------------------------------------------------------------

    async def register_watchdog(self, key: TransactionKey, started_at: datetime) -> RestorePath:
        """onTransactionStart: the watchdog at W + delay-windows, odd bucket."""
        self._check_scope(key)
        self._prune(started_at)
        window = self.windows.restore_window(started_at, self.delay_windows)
        return await self._write_watchdog(key, window)

    async def _write_watchdog(self, key: TransactionKey, window: WindowId) -> RestorePath:
        bucket = self.allocate(window, BucketKind.RESTORE)
        await self._insert(bucket, key)
        self.crash.hit(CrashPoint.WATCHDOG_INDEXED)
        path = path_of(bucket, self.windows)
        await self.commit.arm(key, path)
        self.crash.hit(CrashPoint.WATCHDOG_ARMED)
        return path

    async def schedule_retry(self, request: RetryRequest) -> None:
        """onTransientFailure: the retry pointer at W + 1, even bucket (module docstring:
        a pointer acknowledged late is written again into a window no reader has read)."""
        self._check_scope(request.key)
        self.crash.hit(CrashPoint.RETRY_BEFORE_POINTER)
        self._prune(request.failed_at)
        window = self.windows.retry_window(request.failed_at)
        if self.commit.atomic:
            # Accord: a committed pointer is never lost to a drop (AccordDirectory), and a
            # window already walked is walked again, so no late repair is needed.
            await self._insert(self.allocate(window, BucketKind.RETRY), request.key)
            return
        for attempt in range(LATE_POINTER_ATTEMPTS):
            bucket = self.allocate(window, BucketKind.RETRY)
            await self._ensure_path(bucket)
            await self.directory.insert_entry(self.scope, bucket, request.key.transaction_id)
            now = self.clock.now()
            if now < self.windows.start(window):
                logger.debug(
                    "retry pointer: txn=%s window=%s bucket=%d",
                    request.key,
                    window,
                    bucket.bucket_index,
                )
                return
            # Late: a reader may have walked the window and dropped this bucket, its
            # partition tombstone shadowing the row (written before, landed after).
            # Tiers 1-4 again, for a row that survived; a fresh pointer for one that did not.
            self.late_repairs += 1
            logger.info(
                "late retry pointer in %s (%d of %d): tiers 1-4 again",
                window,
                attempt + 1,
                LATE_POINTER_ATTEMPTS,
            )
            await self._register(bucket)
            self._prune(now)
            window = self.windows.retry_window(now)
        logger.warning(
            "retry pointer of %s late %d times; the restore watchdog covers it",
            request.key,
            LATE_POINTER_ATTEMPTS,
        )

    async def release_watchdog(
        self, key: TransactionKey, path: RestorePath | None, status: RunningStatus
    ) -> None:
        """onTransactionComplete: best effort (a failure leaves a watchdog the restore pickup
        finds finished and deletes without re-running it)."""
        self.crash.hit(CrashPoint.RELEASE_BEFORE)
        if path is None:
            return
        if self.commit.atomic:
            # The last step's change released it; the orchestrator's completion asks again.
            if self._released.get(key) == path:
                return
            after_commit(lambda: self._remember_release(key, path))
        try:
            await self.commit.release(key, path)
        except (StoreUnavailableError, StackSagaError) as exc:
            logger.warning(
                "watchdog of %s (%s) not released (%s); the restore pickup will", key, status, exc
            )

    def _remember_release(self, key: TransactionKey, path: RestorePath) -> None:
        self._released[key] = path
        while len(self._released) > RELEASED_REMEMBERED:
            self._released.popitem(last=False)

    # -- restore pickup ------------------------------------------------------------------------

    async def rearm(self, key: TransactionKey, old: RestorePath) -> RestorePath:
        """A Retry-Node is about to re-invoke a restored transaction: arm a new watchdog at
        W + delay-windows first, so the transaction is never without one (module
        :mod:`stacksaga_store.recovery.commit_modes`), then point es_transaction at it."""
        self._check_scope(key)
        now = self.clock.now()
        self._prune(now)
        window = self.windows.restore_window(now, self.delay_windows)
        bucket = self.allocate(window, BucketKind.RESTORE)
        new = path_of(bucket, self.windows)
        # Accord: one transaction, refused (StateChangeConflict) if the transaction finished
        # or its watchdog moved meanwhile. Ordered: the writes below, in this order.
        async with self.events.state_change("rearm"):
            await self._insert(bucket, key)
            await self.commit.move(key, old, new)
            await self.events.write_restore_path(key, new, expect=old)
        return new

    def bucket_of(self, path: RestorePath) -> BucketRef:
        return bucket_of(path, self.windows)

    def _check_scope(self, key: TransactionKey) -> None:
        check_state(
            (key.region, key.cluster, key.service_name)
            == (self.scope.region, self.scope.cluster, self.scope.service_name),
            f"{key} is outside this writer's scope {self.scope}",
        )
