"""Restart storms and hot-key bursts: the cluster serves again, and nothing acknowledged is lost.

The embedded tests start their own three sidecars (they are killed and flooded); the
Cassandra one kills the session's shared set and leaves it serving. The scenarios and their
figures live in tests/sidecar/storm.py; these tests assert outcomes only, with deadlines
generous enough to be hang guards rather than timings.

Before the fixes (journaled durability, bounded progress-log work, expiring peer queues,
per-key admission), the kill test failed: after the second restart no sidecar answered a
two-row read within 120 s, and recoveries kept rising with no load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord_cassandra.cluster import LocalSidecars
from tests.sidecar.conftest import EMBEDDED_TABLES, TOKEN, CassandraSidecars, _stop, log_tails
from tests.sidecar.storm import BurstReport, KillReport, burst, kill_storm

# Hang guards, not timings: on this shared 2-core machine a healthy cluster needs seconds.
SERVE_DEADLINE_SECONDS = 120.0
# The kill storm's load before the first kill and after each restarted node served again
# lasts until the cluster answered this many more transfers, instead of 8 and 12 fixed
# seconds: the next kill still comes only once the cluster is serving again, under load.
# Each node stays down DOWN_SECONDS as before (its restart adds seconds of start-up).
PHASE_PROGRESS = 20
DOWN_SECONDS = 4.0
QUIET_DEADLINE_SECONDS = 150.0
# Three sidecar processes after a burst of 300: RSS is ~80-150 MB each when healthy; the
# unbounded code grew ~5 MB/s per node. Checked per process.
RSS_BOUND_BYTES = 600 * 2**20
# Every answer a client can get: definite, or the documented unknowns (docs/sidecars.md,
# "Client errors"). CANCELLED (what overflow used to return) is not among them.
DEFINITE_OR_DOCUMENTED = {"ABORTED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[LocalSidecars]:
    cluster = LocalSidecars(
        tmp_path, tables=EMBEDDED_TABLES, client_token=TOKEN, extra={"drain_seconds": 1}
    )
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        _stop(cluster)


def _check_kills(report: KillReport, cluster: LocalSidecars) -> None:
    summary = report.summary()
    rejoins = {n: None if t is None else round(t, 1) for n, t in report.rejoin_seconds.items()}
    print(
        f"kill storm: {[f'{at:.1f}s {what}' for at, what in report.events]} rejoin={rejoins} "
        f"{dict(report.statuses)} ok per {report.window} s: {[n for _, n in report.windows]}"
    )
    context = f"{summary}\n{log_tails(cluster)}"
    for node_id, seconds in report.rejoin_seconds.items():
        assert seconds is not None, f"restarted sidecar {node_id} never served a read\n{context}"
    assert report.all_serving_seconds is not None, f"a sidecar stopped serving\n{context}"
    assert report.quiet_seconds is not None, (
        f"recoveries still rose {QUIET_DEADLINE_SECONDS} s after the load stopped\n{context}"
    )
    assert report.problems == [], context
    assert report.stalls == [], context
    assert report.statuses["ok"] > 0, context
    # Acknowledged work after the last restart: the cluster served, not just answered reads.
    assert report.answered_after_last_restart > 0, context


def test_sequential_kills_of_different_sidecars_embedded(sidecars: LocalSidecars) -> None:
    report = asyncio.run(
        kill_storm(
            sidecars,
            "bank",
            kills=(2, 3, 1),
            token=TOKEN,
            down=DOWN_SECONDS,
            progress=PHASE_PROGRESS,
            serve_deadline=SERVE_DEADLINE_SECONDS,
            quiet_deadline=QUIET_DEADLINE_SECONDS,
        )
    )
    _check_kills(report, sidecars)


@pytest.mark.cassandra
def test_sequential_kills_of_different_sidecars_cassandra(
    cassandra_sidecars: CassandraSidecars,
) -> None:
    try:
        report = asyncio.run(
            kill_storm(
                cassandra_sidecars.cluster,
                cassandra_sidecars.keyspace,
                kills=(2, 3),
                down=DOWN_SECONDS,
                progress=PHASE_PROGRESS,
                serve_deadline=SERVE_DEADLINE_SECONDS,
                quiet_deadline=QUIET_DEADLINE_SECONDS,
                first_transfer=50_000_000,
            )
        )
        _check_kills(report, cassandra_sidecars.cluster)
    finally:
        cassandra_sidecars.all_serving()


def _check_burst(report: BurstReport) -> None:
    summary = report.summary()
    answered = sum(n for outcome, n in report.outcomes.items() if not outcome.startswith("error:"))
    assert answered == report.concurrency, summary
    codes = {o.removeprefix("error:") for o in report.outcomes if o.startswith("error:")}
    assert codes <= DEFINITE_OR_DOCUMENTED, summary
    assert report.outcomes["ok"] > 0, summary
    assert report.recovered_seconds is not None, f"no normal service after the burst: {summary}"
    assert report.problems == [], summary
    assert report.rss_peak_bytes < RSS_BOUND_BYTES, summary


def test_burst_of_300_transfers_on_three_hot_accounts(sidecars: LocalSidecars) -> None:
    report = asyncio.run(
        burst(
            sidecars,
            "bank",
            concurrency=300,
            token=TOKEN,
            recover_deadline=SERVE_DEADLINE_SECONDS,
        )
    )
    _check_burst(report)


def test_a_burst_beyond_what_the_loop_can_read_is_answered_definitely_and_drains(
    sidecars: LocalSidecars,
) -> None:
    """6,000 at once: 2,000 per sidecar, more than the gRPC core let wait by default (its
    refusals came back CANCELLED), and far more than 3 keys can finish within a deadline.
    Every answer must still be definite or a documented unknown, and an ordinary transfer
    must succeed afterwards (hang guard, not a timing)."""
    report = asyncio.run(
        burst(
            sidecars,
            "bank",
            concurrency=6_000,
            token=TOKEN,
            prefix="flood",
            recover_deadline=SERVE_DEADLINE_SECONDS,
        )
    )
    _check_burst(report)
    assert "error:CANCELLED" not in report.outcomes, report.summary()
