"""``overload``: bursts of concurrent transfers on 3 hot accounts.

Three sidecars on the embedded store on loopback. For each burst size, N transfers among
the same 3 accounts are sent at once, spread over the sidecars (tests/sidecar/storm.py
``burst``), on a fresh cluster. Reported per burst: how every request was answered (ok,
declined, RESOURCE_EXHAUSTED, the documented unknowns DEADLINE_EXCEEDED/UNAVAILABLE), the
peak RSS of the largest sidecar process, how long the burst took to be answered, and how
long after it an ordinary transfer succeeded at every sidecar. The receipts check that
every acknowledged transfer applied exactly once.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from accord_cassandra.cluster import LocalSidecars
from bench.report import figure, note
from tests.sidecar.conftest import EMBEDDED_TABLES
from tests.sidecar.storm import BurstReport, burst

LAYER = "loopback (no network emulation)"
SIZES = (300, 2_000, 10_500)
QUICK_SIZES = (100,)
CODES = ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "ABORTED")


def _one(size: int) -> BurstReport:
    directory = Path(tempfile.mkdtemp(prefix=f"bench-overload-{size}-"))
    cluster = LocalSidecars(directory, tables=EMBEDDED_TABLES, extra={"drain_seconds": 1})
    try:
        cluster.start(timeout=90)
        return asyncio.run(burst(cluster, "bank", concurrency=size, recover_deadline=60.0))
    finally:
        cluster.stop()


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    del profile
    rows: list[list[Any]] = []
    reports = []
    for size in QUICK_SIZES if quick else SIZES:
        note(f"overload: burst of {size} transfers on 3 accounts")
        report = _one(size)
        reports.append(report.summary())
        outcomes = report.outcomes
        rows.append(
            [
                size,
                outcomes.get("ok", 0),
                outcomes.get("declined", 0),
                *(outcomes.get(f"error:{code}", 0) for code in CODES),
                sum(n for o, n in outcomes.items() if o.startswith("error:"))
                - sum(outcomes.get(f"error:{code}", 0) for code in CODES),
                round(report.seconds, 1),
                round(report.rss_peak_bytes / 2**20, 1),
                report.recovered_seconds,
                len(report.problems),
                round(os.getloadavg()[0], 1),
            ]
        )
    method = (
        "Three sidecar processes (embedded store) on loopback; each burst on a fresh "
        "cluster: N bank transfers among 3 accounts started at once over 3 client "
        "channels (20 s client deadline). 'other' counts any other gRPC code (CANCELLED "
        "came from the gRPC core's pending-call limit until the sidecar raised it). RSS "
        "is the peak of the largest sidecar process sampled every 0.5 s. 'normal after' "
        "is the time from "
        "the last answer until an ordinary transfer succeeded at each sidecar in turn. "
        "'ledger problems' counts receipts that show a lost or doubled transfer. 'load avg' "
        "is the machine's 1-minute load average when the burst's figures were taken (this "
        "machine is shared: other work competes for its 2 cores)."
    )
    return {
        "figures": [
            figure(
                "burst_outcomes",
                "Bursts on 3 hot accounts: answers, memory, recovery",
                layer=LAYER,
                method=method,
                columns=[
                    "concurrent",
                    "ok",
                    "declined",
                    *CODES,
                    "other",
                    "burst s",
                    "RSS peak MiB",
                    "normal after s",
                    "ledger problems",
                    "load avg",
                ],
                rows=rows,
                plot={
                    "kind": "bar",
                    "x": [str(r[0]) for r in rows],
                    "series": {
                        "ok": [r[1] for r in rows],
                        "RESOURCE_EXHAUSTED": [r[3] for r in rows],
                        "unknown": [r[4] + r[5] for r in rows],
                    },
                    "ylabel": "requests",
                },
            )
        ],
        "bursts": reports,
    }
