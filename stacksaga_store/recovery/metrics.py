"""Recovery engine metrics: counters and gauges in memory, exposed with prometheus-client
(``render()`` for the text, ``serve_metrics`` for ``GET /metrics`` over HTTP).

What is counted (names as rendered):

* ``stacksaga_recovery_dispatch_total{kind,outcome}``: Tier-5 rows handled by a Retry-Node;
  ``kind`` RETRY/RESTORE, ``outcome`` a
  :class:`~stacksaga_store.recovery.retry_node.DispatchOutcome`;
* ``stacksaga_recovery_backlog{window}``: rows read but not yet dispatched successfully, per
  window, as of the last pass over it (0 once the window was cleared; dropped afterwards);
* ``stacksaga_recovery_buckets_dropped_total{kind}``, ``..._buckets_skipped_total`` (odd buckets
  dropped unread because their live count was 0, accord mode), ``..._instances_dropped_total``;
* ``stacksaga_recovery_lease_changes_total`` and ``stacksaga_recovery_lease_lost_total``;
* ``stacksaga_recovery_compaction_total{tier}``: Tier-2 windows and Tier-1 days Node-0 deleted,
  ``..._compaction_blocked_total{gate}``: windows kept by Gate 1 (markers) or Gate 2 (time);
* ``stacksaga_recovery_dispatch_seconds_total``: time spent in dispatches (rate = throughput);
* ``stacksaga_recovery_cycles_total``: Retry-Node passes.

One object per process; everything runs on one event loop, so plain ints suffice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from accord_cassandra.metrics_http import MetricsServer

__all__ = ["BACKLOG_WINDOWS_MAX", "RecoveryMetrics", "serve_metrics"]

PREFIX = "stacksaga_recovery"

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

    def registry(self) -> CollectorRegistry:
        """A prometheus-client registry that reads these figures at every scrape."""
        registry = CollectorRegistry()
        registry.register(_Collector(self))
        return registry

    def render(self) -> str:
        """Prometheus text exposition format."""
        return generate_latest(self.registry()).decode()


class _Collector(Collector):
    def __init__(self, metrics: RecoveryMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        dispatched = CounterMetricFamily(
            f"{PREFIX}_dispatch", "Tier-5 rows handled by a Retry-Node", labels=["kind", "outcome"]
        )
        for (kind, outcome), count in sorted(metrics.dispatched.items()):
            dispatched.add_metric([kind, outcome], count)
        yield dispatched
        backlog = GaugeMetricFamily(
            f"{PREFIX}_backlog", "Rows left per window after the last pass", labels=["window"]
        )
        for window, rows in sorted(metrics.backlog.items()):
            backlog.add_metric([window], rows)
        yield backlog
        dropped = CounterMetricFamily(
            f"{PREFIX}_buckets_dropped", "Buckets dropped after their rows", labels=["kind"]
        )
        for kind, count in sorted(metrics.buckets_dropped.items()):
            dropped.add_metric([kind], count)
        yield dropped
        for name, help_text, value in (
            ("buckets_skipped", "Odd buckets dropped unread", metrics.buckets_skipped),
            ("instances_dropped", "Instances dropped from a window", metrics.instances_dropped),
            ("lease_changes", "Leases adopted", metrics.lease_changes),
            ("lease_lost", "Leases lost", metrics.lease_lost),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", help_text, value=value)
        compaction = CounterMetricFamily(
            f"{PREFIX}_compaction", "Windows and days Node-0 deleted", labels=["tier"]
        )
        for tier, count in sorted(metrics.compaction.items()):
            compaction.add_metric([tier], count)
        yield compaction
        blocked = CounterMetricFamily(
            f"{PREFIX}_compaction_blocked", "Windows kept by a compaction gate", labels=["gate"]
        )
        for gate, count in sorted(metrics.compaction_blocked.items()):
            blocked.add_metric([gate], count)
        yield blocked
        yield CounterMetricFamily(
            f"{PREFIX}_dispatch_seconds", "Time spent in dispatches", value=metrics.dispatch_seconds
        )
        yield CounterMetricFamily(f"{PREFIX}_cycles", "Retry-Node passes", value=metrics.cycles)


async def serve_metrics(metrics: RecoveryMetrics, listen: str = "127.0.0.1:0") -> MetricsServer:
    """Serve ``metrics`` at ``GET /metrics`` on ``listen`` (port 0: any free port; the
    returned server's ``bound`` names it) until its ``stop()``."""
    server = MetricsServer(listen, metrics.registry())
    await server.start()
    return server
