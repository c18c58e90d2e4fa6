"""Recovery engine metrics: counters and gauges in memory, rendered as Prometheus text.

What is counted (names as rendered):

* ``stacksaga_recovery_dispatch_total{kind,outcome}``: Tier-5 rows handled by a Retry-Node;
  ``kind`` RETRY/RESTORE, ``outcome`` a :class:`~stacksaga_store.retry_node.DispatchOutcome`;
* ``stacksaga_recovery_backlog{window}``: rows read but not yet dispatched successfully, per
  window, as of the last pass over it (0 once the window was cleared; dropped afterwards);
* ``stacksaga_recovery_buckets_dropped_total{kind}``, ``..._buckets_skipped_total`` (odd buckets
  dropped unread because their live count was 0, accord mode), ``..._instances_dropped_total``;
* ``stacksaga_recovery_lease_changes_total`` and ``stacksaga_recovery_lease_lost_total``;
* ``stacksaga_recovery_compaction_total{tier}``: Tier-2 windows and Tier-1 days Node-0 deleted,
  ``..._compaction_blocked_total{gate}``: windows kept by Gate 1 (markers) or Gate 2 (time);
* ``stacksaga_recovery_dispatch_seconds_total``: time spent in dispatches (rate = throughput).

One object per process; everything runs on one event loop, so plain ints suffice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["BACKLOG_WINDOWS_MAX", "RecoveryMetrics"]

# Gauges per window are kept for this many windows (oldest dropped first): a bound on memory.
BACKLOG_WINDOWS_MAX = 2048


@dataclass
class RecoveryMetrics:
    dispatched: Counter[tuple[str, str]] = field(default_factory=Counter)
    backlog: dict[str, int] = field(default_factory=dict)
    buckets_dropped: Counter[str] = field(default_factory=Counter)
    buckets_skipped: int = 0
    instances_dropped: int = 0
    lease_changes: int = 0
    lease_lost: int = 0
    compaction: Counter[str] = field(default_factory=Counter)
    compaction_blocked: Counter[str] = field(default_factory=Counter)
    dispatch_seconds: float = 0.0
    cycles: int = 0

    def set_backlog(self, window: str, rows: int) -> None:
        self.backlog[window] = rows
        while len(self.backlog) > BACKLOG_WINDOWS_MAX:
            del self.backlog[next(iter(self.backlog))]

    @property
    def dispatch_total(self) -> int:
        return sum(self.dispatched.values())

    def snapshot(self) -> dict[str, object]:
        return {
            "dispatched": {f"{k}:{o}": n for (k, o), n in sorted(self.dispatched.items())},
            "backlog": dict(sorted(self.backlog.items())),
            "buckets_dropped": dict(sorted(self.buckets_dropped.items())),
            "buckets_skipped": self.buckets_skipped,
            "instances_dropped": self.instances_dropped,
            "lease_changes": self.lease_changes,
            "lease_lost": self.lease_lost,
            "compaction": dict(sorted(self.compaction.items())),
            "compaction_blocked": dict(sorted(self.compaction_blocked.items())),
            "dispatch_seconds": round(self.dispatch_seconds, 6),
            "cycles": self.cycles,
        }

    def render(self) -> str:
        """Prometheus text exposition format."""
        lines = []
        prefix = "stacksaga_recovery"
        for (kind, outcome), count in sorted(self.dispatched.items()):
            lines.append(f'{prefix}_dispatch_total{{kind="{kind}",outcome="{outcome}"}} {count}')
        for window, rows in sorted(self.backlog.items()):
            lines.append(f'{prefix}_backlog{{window="{window}"}} {rows}')
        for kind, count in sorted(self.buckets_dropped.items()):
            lines.append(f'{prefix}_buckets_dropped_total{{kind="{kind}"}} {count}')
        lines.append(f"{prefix}_buckets_skipped_total {self.buckets_skipped}")
        lines.append(f"{prefix}_instances_dropped_total {self.instances_dropped}")
        lines.append(f"{prefix}_lease_changes_total {self.lease_changes}")
        lines.append(f"{prefix}_lease_lost_total {self.lease_lost}")
        for tier, count in sorted(self.compaction.items()):
            lines.append(f'{prefix}_compaction_total{{tier="{tier}"}} {count}')
        for gate, count in sorted(self.compaction_blocked.items()):
            lines.append(f'{prefix}_compaction_blocked_total{{gate="{gate}"}} {count}')
        lines.append(f"{prefix}_dispatch_seconds_total {self.dispatch_seconds:.6f}")
        lines.append(f"{prefix}_cycles_total {self.cycles}")
        return "\n".join(lines) + "\n"
