"""The Retry-Node: walks the directory top-down and re-invokes what it finds (seed Part 4).

Theory of operation
-------------------
One *pass* (:meth:`RetryNode.run_pass`) under the lease held when it starts:

1. Tier 1: the active dates from ``today - lookback-days`` to today, ascending;
2. Tier 2: each date's windows ascending, only those ``<= W`` (readers never touch W+1);
3. Tier 3: the instances of the window whose ``instance_id_token`` lies in the leased range
   (token order, paged): disjoint leases mean disjoint instances, without locks;
4. Tier 4: the instance's buckets; Tier 5: each bucket streamed page by page. Each row is a
   *dispatch* (:class:`Dispatcher`), at most ``recovery.concurrency`` at a time. The payload is
   read lazily, by the dispatcher, from es_transaction: Tier 5 holds only ids.
5. A bucket whose rows were 100% dispatched successfully, while no shutdown is under way, is
   dropped (one partition tombstone, then its Tier-4 row); an instance whose buckets are all
   dropped loses its Tier-3 marker. Anything less and the bucket stays for the next pass or
   the next node: a SIGKILL mid-bucket loses nothing, and the execution markers make a step
   that committed before the kill a no-op when its transaction is re-invoked.

Windows are processed strictly in order; within a window, instances in token order (the
seed's ordering guarantee). After its pass, the holder of the lowest range (*Node-0*) runs the
two-gate compaction of Tiers 2 and 1 (:mod:`stacksaga_store.recovery.compaction`).

Lease checks. Before every query and every dispatch the node checks that the lease it started
the pass with is still the current one (same range, same epoch) and still valid on the lease
source's monotonic clock (:meth:`RetryNode._guard`); otherwise :class:`RangeLeaseLost` ends the
pass at once. In-flight dispatches are awaited, never abandoned, and reported to the lease
source, which releases a revoked lease only when none is left running. A dispatch in flight
is fenced by the same test (:class:`LeaseFence`, handed to ``Orchestrator.resume``): a
multi-step resume stops between steps once the lease is gone (the row counts as FAILED, so its
bucket stays); a STRICT step whose lease moved while it ran does not commit (its marker
lease is dropped); a RELAXED_WITH_DEDUP one writes nothing if the range's new holder recorded
the same step meanwhile (its stale status would overwrite the new holder's). A resume that a
step's marker lease stopped (LEASE_BUSY, LEASE_LOST) counts as FAILED too: the saga did not
move, so its row stays.

A write the *store* refuses on the lease's epoch (accord: a state change's epoch condition;
ordered STRICT: the transaction's epoch row, :mod:`stacksaga_store.store.protection`) is the
store's word that the range moved, whatever this node's lease clock says (a paused or
suspended process wakes believing its lease). It ends the lease (:class:`FenceRefusals`): the
resume stops, every dispatch of the node under that epoch stops at its next step, the pass
ends at its next check, the bucket stays for the new holder, the lease source drops the lease
(the coordinator client hands it back and asks for a new one) and the node never dispatches
under that epoch again.

:class:`SagaDispatcher` is the seed's pickup logic on the real orchestrator:

* retry row (even bucket): re-invoke unless the transaction is final, parked or missing (its
  watchdog covers those). Besides the retry states (FAILED_WITH_RETRYABLE_ERROR /
  REVERT_FAILED_WITH_RETRYABLE_ERROR) that includes an active status: a resume that stopped
  mid-way (fenced, or its node died) must not wait for the restore watchdog. The markers make
  committed steps no-ops; under RELAXED_WITH_DEDUP a step another worker is running right now
  (an event-driven ``deliver``) can run twice, the mode's stated trade-off;
* restore row (odd bucket): status check first. Final, parked or missing: release the
  watchdog (``ordered``: delete the row) and do *not* re-run. Otherwise re-arm a new watchdog
  at W + delay-windows, then re-invoke (so a transaction is never left without a watchdog).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Protocol

from stacksaga_store.clock import Clock, SystemClock
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import LeaseFencedError, check_state
from stacksaga_store.recovery.commit_modes import CommitMode, CrashPoint, WatchdogLiveness, path_of
from stacksaga_store.recovery.compaction import Compactor
from stacksaga_store.recovery.directory import (
    BucketKind,
    BucketRef,
    Directory,
    DirectoryEntry,
    DirectoryScope,
    DispatchedPage,
    InstanceRef,
)
from stacksaga_store.recovery.metrics import RecoveryMetrics
from stacksaga_store.recovery.windows import WindowId, WindowMath, date_text, reader_grace
from stacksaga_store.recovery.writer import RecoveryWriter
from stacksaga_store.ring.leases import Lease, LeaseSource, RangeLeaseLost, ring_row_name
from stacksaga_store.saga.orchestrator import Orchestrator, SagaOutcome, StepFence
from stacksaga_store.store.accord_store import StateChangeConflict
from stacksaga_store.store.model import FencingRow, TransactionKey
from stacksaga_store.store.states import FINAL_STATUSES, PARKED_STATUSES

__all__ = [
    "DispatchOutcome",
    "Dispatcher",
    "FenceRefusals",
    "PassReport",
    "RetryNode",
    "SagaDispatcher",
]

logger = logging.getLogger(__name__)

TIER5_PAGE_ROWS = 500


class DispatchOutcome(StrEnum):
    """What one Tier-5 row came to. Everything but FAILED counts as dispatched."""

    RESUMED = "RESUMED"  # re-invoked through Orchestrator.resume
    NOT_PENDING = "NOT_PENDING"  # retry row of a transaction that no longer waits for it
    MISSING = "MISSING"  # no es_transaction (a writer died before creating it)
    RELEASED = "RELEASED"  # restore row of a finished/parked transaction: watchdog released
    GONE = "GONE"  # restore row whose watchdog was released or moved already
    FAILED = "FAILED"  # could not be handled now; the bucket is kept


class FenceRefusals:
    """The epochs the store refused a node's writes on: lost for good.

    A refusal is the store's word that the range moved (the coordinator persisted a later
    epoch, which it does only once every lease of this one was released or had expired by
    the coordinator's clock). The node's own clock may disagree (a paused or suspended
    process): it must not. So a refused epoch is never dispatched under again, and the lease
    source, if it can (``drop(epoch)``), drops the lease at once and asks for a new one.
    """

    def __init__(self, leases: LeaseSource) -> None:
        self.leases = leases
        self.through: int | None = None  # every epoch up to this one was refused

    def refused(self, epoch: int) -> bool:
        return self.through is not None and epoch <= self.through

    def refuse(self, epoch: int) -> None:
        if self.refused(epoch):
            return
        self.through = epoch
        logger.warning(
            "lease epoch %d refused by the store: the range moved; this node stops using it",
            epoch,
        )
        drop = getattr(self.leases, "drop", None)
        if callable(drop):
            drop(epoch)


class LeaseFence:
    """The lease a dispatch started under, as a :class:`~stacksaga_store.saga.orchestrator.
    StepFence`: its epoch until the range moved, None from then on.

    Moved means: the source's current lease is another range or epoch, or the lease's validity
    ended on the source's monotonic clock. A lease *revoked* for a rebalance still holds while
    it is valid: the coordinator hands the range on only once this node released it (after its
    dispatches finished) or its validity ended plus a margin (:mod:`stacksaga_store.ring.leases`),
    so the step in flight may commit. The validity used is the latest renewal seen.
    """

    def __init__(
        self,
        leases: LeaseSource,
        lease: Lease,
        scope: DirectoryScope | None = None,
        refusals: FenceRefusals | None = None,
    ) -> None:
        self.leases = leases
        self.lease = lease
        self.scope = scope
        # Shared by the node's dispatches: one refusal ends the epoch for all of them.
        self.refusals = refusals or FenceRefusals(leases)

    def fencing_row(self) -> FencingRow | None:
        """The epoch row of a coordinator's lease (none for a static one: nothing moves it)."""
        if self.scope is None or not getattr(self.leases, "persists_epochs", False):
            return None
        name = ring_row_name(self.lease.service_name)
        return FencingRow(self.scope.region, self.scope.cluster, name, self.lease.epoch)

    def refused(self) -> None:
        self.refusals.refuse(self.lease.epoch)

    def token(self) -> str | None:
        if self.refusals.refused(self.lease.epoch):
            return None
        current = self.leases.current()
        lease = self.lease
        if current is not None:
            if (current.range, current.epoch) != (lease.range, lease.epoch):
                return None
            self.lease = lease = current
        if not lease.valid(self.leases.monotonic()):
            return None
        return f"e{lease.epoch}"


# The fence of the dispatch running in this task (set by RetryNode._dispatch), so dispatchers
# keep their one-argument signature.
DISPATCH_FENCE: contextvars.ContextVar[LeaseFence | None] = contextvars.ContextVar(
    "stacksaga_dispatch_fence", default=None
)


class Reentry(Protocol):
    """How a dispatch re-invokes a transaction (same contract as ``Orchestrator.resume``:
    raise LeaseFencedError once the fence is lost; ``stopped_by`` set if the saga did not move)."""

    async def __call__(
        self, transaction_id: uuid.UUID, *, fence: StepFence | None = None
    ) -> SagaOutcome: ...


class Dispatcher(Protocol):
    """Handles one Tier-5 row. Must be idempotent: a row can be dispatched again after a
    crash before its bucket was dropped."""

    async def dispatch(self, entry: DirectoryEntry) -> DispatchOutcome: ...


class SagaDispatcher:
    """The seed's retry and restore pickup on the orchestrator (module docstring)."""

    def __init__(
        self,
        *,
        orchestrator: Orchestrator,
        writer: RecoveryWriter,
        commit: CommitMode,
        reenter: Reentry | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.reenter: Reentry = reenter or orchestrator.resume
        self.events = orchestrator.store
        self.writer = writer
        self.commit = commit

    async def dispatch(self, entry: DirectoryEntry) -> DispatchOutcome:
        scope = entry.scope
        key = TransactionKey(scope.region, scope.cluster, scope.service_name, entry.transaction_id)
        if entry.kind is BucketKind.RETRY:
            return await self._retry(key)
        return await self._restore(key, entry.bucket)

    async def _retry(self, key: TransactionKey) -> DispatchOutcome:
        record = await self.events.read_record(key)
        if record is None:
            return DispatchOutcome.MISSING
        status = record.running_status
        if status in FINAL_STATUSES or status in PARKED_STATUSES:
            return DispatchOutcome.NOT_PENDING
        # Active (IN_PROGRESS, COMPENSATING, STARTED) under a retry row: a resume that stopped
        # mid-way since the row was written (fenced by its lease, or its node killed). Left to
        # the watchdog it would wait delay-windows; the markers skip what already committed.
        return await self._resume(key)

    async def _resume(self, key: TransactionKey) -> DispatchOutcome:
        try:
            outcome = await self.reenter(key.transaction_id, fence=DISPATCH_FENCE.get())
        except LeaseFencedError as exc:
            logger.info("%s; the row stays for the range's next holder", exc)
            return DispatchOutcome.FAILED
        if outcome.stopped_by is not None:
            # A step's marker lease was another holder's, or ours was lost: the saga did not
            # move. Its holder may be a fenced Retry-Node that will not carry it on either, so
            # the row stays (a later pass finds the step committed, or runs it).
            logger.info("txn=%s: %s; the row stays", key, outcome.note)
            return DispatchOutcome.FAILED
        return DispatchOutcome.RESUMED

    async def _restore(self, key: TransactionKey, bucket: BucketRef) -> DispatchOutcome:
        path = path_of(bucket, self.writer.windows)
        liveness = await self.commit.liveness(key, path)
        if liveness is WatchdogLiveness.GONE:
            return DispatchOutcome.GONE
        record = await self.events.read_record(key)
        if (
            record is None
            or record.running_status in FINAL_STATUSES
            or record.running_status in PARKED_STATUSES
        ):
            # Seed: a finished transaction's watchdog whose delete failed. Delete, never re-run.
            await self.commit.release(key, path)
            return DispatchOutcome.RELEASED
        if liveness is WatchdogLiveness.UNKNOWN and record.restore_path not in (None, path):
            # An earlier pickup re-armed the watchdog elsewhere; this row is the old one
            # (ordered: left for its bucket's drop; accord: deleted now, so the bucket empties).
            await self.commit.forget(key, path)
            return DispatchOutcome.GONE
        try:
            await self.writer.rearm(key, path)
        except StateChangeConflict as exc:
            # Accord: finished or re-armed since the read; this row is not its watchdog.
            logger.info("restore of %s: %s", key, exc)
            await self.commit.forget(key, path)
            return DispatchOutcome.GONE
        self.writer.crash.hit(CrashPoint.REARM_BEFORE_RESUME)
        return await self._resume(key)


@dataclass
class PassReport:
    """What one pass did."""

    epoch: int
    windows: list[WindowId] = field(default_factory=list)
    instances: int = 0
    rows: int = 0
    dispatched: int = 0
    failed: int = 0
    buckets_dropped: int = 0
    buckets_kept: int = 0
    node_zero: bool = False
    shutdown: bool = False
    compaction: dict[str, int] = field(default_factory=dict)


class _Shutdown(Exception):
    """Internal: a shutdown was requested; unwind without dropping anything."""


class RetryNode:
    """A Retry-Node for one service scope. Create, then :meth:`run` or :meth:`run_pass`."""

    def __init__(
        self,
        *,
        directory: Directory,
        dispatcher: Dispatcher,
        commit: CommitMode,
        leases: LeaseSource,
        settings: StackSagaSettings,
        clock: Clock | None = None,
        metrics: RecoveryMetrics | None = None,
        node_id: str = "retry-node",
        page_rows: int = TIER5_PAGE_ROWS,
        compactor: Compactor | None = None,
    ) -> None:
        recovery = settings.cassandra.recovery
        self.directory = directory
        self.dispatcher = dispatcher
        self.commit = commit
        self.leases = leases
        self.clock: Clock = clock or SystemClock()
        self.metrics = metrics or RecoveryMetrics()
        self.node_id = node_id
        self.scope = DirectoryScope.of(settings.instance)
        self.windows = WindowMath(recovery.window_interval_minutes)
        self.lookback_days = recovery.retry.lookback_days
        self.read_grace: timedelta = reader_grace(recovery.read_grace)
        self.page_rows = page_rows
        self.compactor = compactor or Compactor(
            directory=directory,
            scope=self.scope,
            windows=self.windows,
            lookback_days=self.lookback_days,
            grace=self.read_grace,
            metrics=self.metrics,
        )
        self.refusals = FenceRefusals(leases)
        self._slots = asyncio.Semaphore(recovery.concurrency)
        self._in_flight = 0
        self._shutdown = False
        self._last_epoch: int | None = None

    # -- control -----------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """Stop starting dispatches; running ones finish; no bucket is dropped from now on."""
        self._shutdown = True

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def run(self, *, stop: asyncio.Event, idle_seconds: float = 1.0) -> None:
        """Passes until ``stop`` is set (then a graceful shutdown)."""
        while not stop.is_set():
            try:
                await self.run_pass()
            except RangeLeaseLost as exc:
                self.metrics.lease_lost += 1
                logger.info("node=%s pass ended: %s", self.node_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), idle_seconds)
        self.request_shutdown()

    # -- one pass ------------------------------------------------------------------------------

    async def run_pass(self) -> PassReport:
        """One top-down pass over the directory (module docstring). Raises RangeLeaseLost."""
        lease = self.leases.current()
        if lease is None or not lease.valid(self.leases.monotonic()):
            raise RangeLeaseLost(f"node={self.node_id}: no valid lease")
        if self.refusals.refused(lease.epoch):
            raise RangeLeaseLost(f"node={self.node_id}: lease epoch {lease.epoch} was refused")
        if lease.epoch != self._last_epoch:
            self.metrics.lease_changes += 1
            self._last_epoch = lease.epoch
        report = PassReport(epoch=lease.epoch, node_zero=lease.is_node_zero)
        self.metrics.cycles += 1
        try:
            await self._walk(lease, report)
            if lease.is_node_zero:
                report.compaction = await self.compactor.compact(
                    self.clock.now(), lambda: self._guard(lease)
                )
        except _Shutdown:
            report.shutdown = True
        return report

    async def _walk(self, lease: Lease, report: PassReport) -> None:
        now = self.clock.now()
        limit = self.windows.read_limit(now, self.read_grace)
        first = limit.day - timedelta(days=self.lookback_days)
        self._guard(lease)
        days = await self.directory.active_days(self.scope, date_text(first), limit.date_of_year)
        for day in days:
            up_to = 1439 if day < limit.date_of_year else self.windows.minute_of_day(limit)
            self._guard(lease)
            for window in await self.directory.windows_of_day(self.scope, day, up_to_minute=up_to):
                await self._process_window(lease, window, report)

    def _guard(self, lease: Lease) -> None:
        """Before every query and every dispatch: the pass's lease must still be ours."""
        if self._shutdown:
            raise _Shutdown
        current = self.leases.current()
        if current is None or (current.range, current.epoch) != (lease.range, lease.epoch):
            raise RangeLeaseLost(f"node={self.node_id}: lease epoch {lease.epoch} replaced")
        if not current.valid(self.leases.monotonic()):
            raise RangeLeaseLost(f"node={self.node_id}: lease epoch {lease.epoch} expired")
        if self.refusals.refused(lease.epoch):
            # The store refused a dispatch's write on this epoch: the range moved.
            raise RangeLeaseLost(f"node={self.node_id}: lease epoch {lease.epoch} refused")

    async def _process_window(self, lease: Lease, window: WindowId, report: PassReport) -> None:
        report.windows.append(window)
        backlog = 0
        self._guard(lease)
        instances = self.directory.instances(self.scope, window, lease.range.start, lease.range.end)
        async with contextlib.aclosing(instances):
            async for instance in instances:
                check_state(lease.range.contains(instance.instance_id_token), "outside the lease")
                report.instances += 1
                backlog += await self._process_instance(lease, instance, report)
                self._guard(lease)
        self.metrics.set_backlog(str(window), backlog)

    async def _process_instance(
        self, lease: Lease, instance: InstanceRef, report: PassReport
    ) -> int:
        """Returns the rows left behind (backlog)."""
        self._guard(lease)
        buckets = await self.directory.buckets(self.scope, instance)
        left = 0
        for bucket in buckets:
            left += await self._process_bucket(lease, bucket, report)
        if left == 0 and not self._shutdown:
            self._guard(lease)
            await self.directory.drop_instance(self.scope, instance)
            self.metrics.instances_dropped += 1
        return left

    async def _process_bucket(self, lease: Lease, bucket: BucketRef, report: PassReport) -> int:
        self._guard(lease)
        live = await self.commit.bucket_live(self.scope, bucket)
        if live == 0:
            # Accord mode: every watchdog of this bucket was released; drop it unread.
            self._guard(lease)
            await self._drop(bucket)
            self.metrics.buckets_skipped += 1
            report.buckets_dropped += 1
            return 0
        tasks: list[asyncio.Task[bool]] = []
        seen: list[DispatchedPage] = []
        try:
            self._guard(lease)
            pages = self.directory.entries(self.scope, bucket, page_rows=self.page_rows)
            async with contextlib.aclosing(pages):
                async for page in pages:
                    after = seen[-1].last if seen else None
                    seen.append(DispatchedPage(after, page[-1].transaction_id, len(page)))
                    await self._dispatch_page(lease, page, tasks)
                    self._guard(lease)  # before the next page's query
        finally:
            # In-flight dispatches finish even when the pass ends early: never abandon one.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, Exception):
                    raise result  # a (simulated) crash inside a dispatch stops the node
        succeeded = sum(1 for result in results if result is True)
        report.rows += len(results)
        report.dispatched += succeeded
        report.failed += len(results) - succeeded
        if self._shutdown or succeeded < len(results):
            report.buckets_kept += 1
            return max(1, len(results) - succeeded)
        self._guard(lease)
        if not await self._drop(bucket, seen):
            # Accord: rows came in while it was walked (a late pointer); next pass.
            report.buckets_kept += 1
            return 1
        report.buckets_dropped += 1
        return 0

    async def _dispatch_page(
        self, lease: Lease, page: Sequence[DirectoryEntry], tasks: list[asyncio.Task[bool]]
    ) -> None:
        for entry in page:
            await self._slots.acquire()
            try:
                # Checked after the wait for a slot, which can be long.
                self._guard(lease)
            except BaseException:
                self._slots.release()
                raise
            tasks.append(asyncio.create_task(self._dispatch(entry, lease)))

    async def _dispatch(self, entry: DirectoryEntry, lease: Lease) -> bool:
        # Own task, own context: the fence is this dispatch's alone.
        DISPATCH_FENCE.set(LeaseFence(self.leases, lease, self.scope, self.refusals))
        self._in_flight += 1
        self.leases.note_in_flight(self._in_flight)
        started = time.perf_counter()
        outcome = DispatchOutcome.FAILED
        try:
            outcome = await self.dispatcher.dispatch(entry)
        except Exception:
            logger.exception(
                "node=%s dispatch of %s from %s failed; the bucket is kept",
                self.node_id,
                entry.transaction_id,
                entry.bucket,
            )
        finally:
            self._in_flight -= 1
            self.leases.note_in_flight(self._in_flight)
            self._slots.release()
            self.metrics.dispatch_seconds += time.perf_counter() - started
            self.metrics.dispatched[entry.kind.value, outcome.value] += 1
        return outcome is not DispatchOutcome.FAILED

    async def _drop(self, bucket: BucketRef, pages: Sequence[DispatchedPage] = ()) -> bool:
        if not await self.directory.drop_dispatched(self.scope, bucket, pages):
            return False
        await self.commit.retire_bucket(self.scope, bucket)
        self.metrics.buckets_dropped[bucket.kind.value] += 1
        return True
