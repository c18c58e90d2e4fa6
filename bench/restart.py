"""``restart``: throughput around SIGKILLs and restarts of different sidecars.

Three sidecars on the embedded store on loopback, 8 clients doing bank transfers
(tests/sidecar/storm.py ``kill_storm``): SIGKILL one sidecar, restart it after a pause,
then another. Reported: ok transfers per second before the first kill, while a sidecar
is down, and after each restart; seconds from each restart until that sidecar served a
two-row read; after the load stopped, seconds until every sidecar served and until no
recovery counter rose for 10 s; peak peer queue depth and journal size.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

from accord_cassandra.cluster import LocalSidecars
from bench.report import figure, note
from tests.sidecar.conftest import EMBEDDED_TABLES
from tests.sidecar.storm import KillReport, kill_storm

LAYER = "loopback (no network emulation)"


def _phases(report: KillReport) -> list[list[Any]]:
    """ok/s per phase, from the event offsets."""
    marks = [(0.0, "before the first kill")]
    for at, what in report.events:
        if what.startswith("kill"):
            marks.append((at, f"node {what.split()[1]} down"))
        elif what.startswith("restart"):
            marks.append((at, f"after node {what.split()[1]} restarted"))
        elif what == "load stopped":
            marks.append((at, "end"))
    rows = []
    for (start, label), (end, _) in itertools.pairwise(marks):
        rows.append([label, round(end - start, 1), round(report.ok_rate(start, end), 1)])
    return rows


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    del profile
    directory = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    cluster = LocalSidecars(directory, tables=EMBEDDED_TABLES, extra={"drain_seconds": 1})
    timing = (
        {"before": 4.0, "down": 2.0, "after": 5.0, "kills": (2,)}
        if quick
        else {"before": 10.0, "down": 5.0, "after": 15.0, "kills": (2, 3)}
    )
    note(f"restart: 3 sidecars, 8 clients, kills {timing['kills']}")
    try:
        cluster.start(timeout=90)
        report = asyncio.run(
            kill_storm(
                cluster,
                "bank",
                kills=timing["kills"],  # type: ignore[arg-type]
                clients=8,
                before=timing["before"],  # type: ignore[arg-type]
                down=timing["down"],  # type: ignore[arg-type]
                after=timing["after"],  # type: ignore[arg-type]
                quiet_for=3.0 if quick else 10.0,
            )
        )
    finally:
        cluster.stop()
    summary = report.summary()
    rejoin_rows = [
        [f"node {n} restart → serves a read", None if s is None else round(s, 2)]
        for n, s in report.rejoin_seconds.items()
    ]
    rejoin_rows += [
        [
            "load stopped → every sidecar serves",
            None if report.all_serving_seconds is None else round(report.all_serving_seconds, 2),
        ],
        [
            "load stopped → recoveries stop rising",
            None if report.quiet_seconds is None else round(report.quiet_seconds, 2),
        ],
    ]
    peaks = summary["peaks"]
    method = (
        "Three sidecar processes (embedded store) on loopback, 8 concurrent bank-transfer "
        "clients that move to another sidecar when theirs is unreachable. SIGKILL, pause, "
        "restart, then the next node. ok/s counts acknowledged transfers per phase. "
        f"Outcomes: {summary['statuses']}; ledger problems: {len(report.problems)}. "
        f"Peaks: peer queue {peaks.get('peer_queue_depth', 0):.0f} messages, active "
        f"coordinations {peaks.get('accord_active_coordinations', 0):.0f}, journal "
        f"{peaks.get('journal_bytes', 0) / 2**20:.1f} MiB."
    )
    phases = _phases(report)
    return {
        "figures": [
            figure(
                "ok_per_second",
                "ok transfers per second around sidecar kills and restarts",
                layer=LAYER,
                method=method,
                columns=["phase", "seconds", "ok transfers/s"],
                rows=phases,
                plot={
                    "kind": "line",
                    "series": {
                        "ok / s": [
                            [round(at, 1), round(n / report.window, 1)] for at, n in report.windows
                        ]
                    },
                    "xlabel": "seconds since load started",
                    "ylabel": "ok transfers / s",
                },
            ),
            figure(
                "time_to_serve",
                "Seconds until service returns",
                layer=LAYER,
                method=method,
                columns=["interval", "seconds"],
                rows=rejoin_rows,
            ),
        ],
        "summary": summary,
    }
