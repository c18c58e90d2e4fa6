"""The recovery engine's metrics over HTTP (prometheus-client), names as documented."""

from __future__ import annotations

import asyncio

from accord_cassandra.cluster import metrics_of
from stacksaga_store.recovery.metrics import RecoveryMetrics, serve_metrics


def test_recovery_metrics_are_served_on_a_port_the_kernel_picked() -> None:
    metrics = RecoveryMetrics()

    async def scenario() -> tuple[str, dict[str, float], dict[str, float]]:
        server = await serve_metrics(metrics, "127.0.0.1:0")
        try:
            before = await asyncio.to_thread(metrics_of, server.bound)
            metrics.dispatched["RETRY", "DISPATCHED"] += 3
            metrics.set_backlog("w1", 7)
            metrics.compaction_blocked["gate1_markers"] += 1
            metrics.dispatch_seconds += 0.25
            metrics.cycles += 2
            after = await asyncio.to_thread(metrics_of, server.bound)
        finally:
            await server.stop()
        return server.bound, before, after

    bound, before, after = asyncio.run(scenario())
    assert not bound.endswith(":0")
    assert before["stacksaga_recovery_cycles_total"] == 0
    assert 'stacksaga_recovery_dispatch_total{kind="RETRY",outcome="DISPATCHED"}' not in before
    assert after['stacksaga_recovery_dispatch_total{kind="RETRY",outcome="DISPATCHED"}'] == 3
    assert after['stacksaga_recovery_backlog{window="w1"}'] == 7
    assert after['stacksaga_recovery_compaction_blocked_total{gate="gate1_markers"}'] == 1
    assert after["stacksaga_recovery_dispatch_seconds_total"] == 0.25
    assert after["stacksaga_recovery_cycles_total"] == 2
    for name in ("buckets_skipped", "instances_dropped", "lease_changes", "lease_lost"):
        assert after[f"stacksaga_recovery_{name}_total"] == 0
    assert metrics.render().count("# TYPE stacksaga_recovery_") == 11
