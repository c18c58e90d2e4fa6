"""``stacksaga-store directory show``: the live directory tree of one service, as text.

It walks the tiers exactly as a Retry-Node does (Tier 1 for the date range, then Tier 2, Tier
3 over the whole ring, Tier 4, Tier 5 counted page by page), so it costs what one pass costs
and never scans a table. Dates from ``today - lookback-days`` to the furthest restore window
(``today + delay-windows``) are shown; windows not yet readable are marked ``(future)``.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from accord_cassandra.tokens import MAX_TOKEN, MIN_TOKEN
from stacksaga_store.recovery.commit_modes import CommitMode
from stacksaga_store.recovery.directory import Directory, DirectoryScope
from stacksaga_store.recovery.windows import WindowMath, date_text

__all__ = ["render_directory"]

ROWS_COUNTED_MAX = 1_000_000


async def render_directory(
    *,
    directory: Directory,
    commit: CommitMode,
    scope: DirectoryScope,
    windows: WindowMath,
    now: datetime,
    lookback_days: int,
    delay_windows: int,
) -> list[str]:
    """The tree, one line per node; totals last."""
    today = windows.window_at(now).day
    ahead = math.ceil(delay_windows * windows.interval_minutes / 1440) + 1
    first, last = today - timedelta(days=lookback_days), today + timedelta(days=ahead)
    limit = windows.read_limit(now)
    lines = [
        f"directory of {scope} ({windows.interval_minutes}-minute windows, "
        f"commit-mode {commit.name.value}; now {now.isoformat()})"
    ]
    totals = {"days": 0, "windows": 0, "instances": 0, "buckets": 0, "rows": 0}
    for day in await directory.active_days(scope, date_text(first), date_text(last)):
        totals["days"] += 1
        lines.append(f"{day}")
        for window in await directory.windows_of_day(scope, day):
            totals["windows"] += 1
            start = windows.start(window).strftime("%H:%M")
            end = windows.end(window).strftime("%H:%M")
            state = "" if window <= limit else " (future)"
            lines.append(f"  window {windows.minute_of_day(window)} [{start}-{end} UTC]{state}")
            instances = directory.instances(scope, window, MIN_TOKEN, MAX_TOKEN)
            async for instance in instances:
                totals["instances"] += 1
                lines.append(
                    f"    instance {instance.instance_id} token {instance.instance_id_token}"
                )
                for bucket in await directory.buckets(scope, instance):
                    totals["buckets"] += 1
                    rows = 0
                    async for page in directory.entries(scope, bucket):
                        rows += len(page)
                        if rows >= ROWS_COUNTED_MAX:
                            break
                    totals["rows"] += rows
                    live = await commit.bucket_live(scope, bucket)
                    extra = "" if live is None else f", {live} live watchdogs"
                    kind = bucket.kind.value
                    lines.append(f"      bucket {bucket.bucket_index} {kind}: {rows} rows{extra}")
    lines.append("total: " + ", ".join(f"{count} {name}" for name, count in totals.items()))
    return lines
