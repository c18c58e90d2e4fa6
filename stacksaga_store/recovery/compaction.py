"""Node-0's directory compaction: the two-gate deletion of Tier-2 windows and Tier-1 dates.

Theory of operation (seed Part 4, "Node-0's Two-Gate Protocol")
----------------------------------------------------------------
Retry-Nodes delete only what they own below a window (Tier-5 buckets, Tier-4 rows, their
Tier-3 markers). The shared upper tiers are deleted by one node only, Node-0 (the holder of the
lowest token range), and only when both gates pass:

* **Gate 1 (completion):** the window's Tier-3 partition, read *without* a token filter, is
  empty: no Retry-Node anywhere has work left in it (:meth:`Directory.window_has_instances`).
* **Gate 2 (time):** the current time is past the window's end (plus ``read-grace``): no
  Standard-Node still targets it. A future window (a restore watchdog's W + delay-windows)
  never passes, whatever Tier 3 says.

A late writer can still add a Tier-3 marker between Gate 1 and the delete. Node-0 therefore
reads Tier 3 once more *after* deleting the Tier-2 row and puts the row back if a marker
appeared (:meth:`Directory.restore_window`): either that read sees the marker, or the writer's
own Tier-2 upsert, which it issues after its Tier-3 one (:meth:`RecoveryWriter` re-registers
late pointers), lands after the delete.

A date goes from Tier 1 when none of its windows is left in Tier 2 *and* the whole day is over
(no writer can add a window to it); the same read-after-delete check guards it.

Only dates within the lookback horizon are visited, like the Retry-Nodes' own traversal.
Compaction reads Tier 2 and the heads of Tier-3 partitions only: O(windows), never rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from stacksaga_store.recovery.directory import Directory, DirectoryScope
from stacksaga_store.recovery.metrics import RecoveryMetrics
from stacksaga_store.recovery.windows import WindowMath, date_text, parse_date_text

__all__ = ["Compactor"]

logger = logging.getLogger(__name__)


class Compactor:
    """Two-gate compaction of Tiers 2 and 1 for one scope (run by Node-0 only)."""

    def __init__(
        self,
        *,
        directory: Directory,
        scope: DirectoryScope,
        windows: WindowMath,
        lookback_days: int,
        grace: timedelta = timedelta(0),
        metrics: RecoveryMetrics | None = None,
    ) -> None:
        self.directory = directory
        self.scope = scope
        self.windows = windows
        self.lookback_days = lookback_days
        self.grace = grace
        self.metrics = metrics or RecoveryMetrics()

    async def compact(self, now: datetime, guard: Callable[[], None]) -> dict[str, int]:
        """One compaction sweep; ``guard`` runs before every query (the lease check)."""
        counts = {"windows_deleted": 0, "days_deleted": 0, "gate1_blocked": 0, "gate2_blocked": 0}
        today = self.windows.window_at(now).day
        first = today - timedelta(days=self.lookback_days)
        guard()
        days = await self.directory.active_days(self.scope, date_text(first), date_text(today))
        for day in days:
            remaining = await self._compact_day(day, now, guard, counts)
            if remaining or not self.windows.day_closed(parse_date_text(day), now, self.grace):
                continue
            guard()
            await self.directory.drop_day(self.scope, day)
            guard()
            if await self.directory.windows_of_day(self.scope, day):
                # A window was registered meanwhile (late writer): put the date back.
                await self.directory.restore_window(
                    self.scope, (await self.directory.windows_of_day(self.scope, day))[0]
                )
                continue
            counts["days_deleted"] += 1
            self.metrics.compaction["tier1_days"] += 1
            logger.info("node-0 compaction: date %s removed from tier 1", day)
        return counts

    async def _compact_day(
        self, day: str, now: datetime, guard: Callable[[], None], counts: dict[str, int]
    ) -> int:
        """Deletes what passes both gates; returns how many windows of the day remain."""
        guard()
        remaining = 0
        for window in await self.directory.windows_of_day(self.scope, day):
            if not self.windows.closed(window, now, self.grace):
                remaining += 1
                counts["gate2_blocked"] += 1
                self.metrics.compaction_blocked["gate2_time"] += 1
                continue
            guard()
            if await self.directory.window_has_instances(self.scope, window):
                remaining += 1
                counts["gate1_blocked"] += 1
                self.metrics.compaction_blocked["gate1_markers"] += 1
                continue
            guard()
            await self.directory.drop_window(self.scope, window)
            guard()
            if await self.directory.window_has_instances(self.scope, window):
                await self.directory.restore_window(self.scope, window)
                remaining += 1
                continue
            counts["windows_deleted"] += 1
            self.metrics.compaction["tier2_windows"] += 1
        return remaining
