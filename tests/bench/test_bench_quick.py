"""Every bench suite runs in ``--quick`` mode and writes well-formed output.

This keeps the benchmarks from rotting; it asserts nothing about their figures (no timing
assertions: quick figures mean little, and this machine is shared).

Each suite runs as ``python -m bench <suite> --quick --results <tmp>``, as a user would run
it. To keep the wall time small the suites run concurrently: those without Cassandra start
at once, and the Cassandra-backed ones start as soon as the session's shared 3-node cluster
(``cassandra_cluster`` of tests/conftest.py) is up, reusing it instead of launching their own;
when the fixtures launched it (and so delete it) they leave their keyspaces in it rather than
drop them (``BENCH_CASSANDRA_DISPOSABLE``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAIN_SUITES = ("sim", "latency", "contention", "restart", "overload")
CASSANDRA_SUITES = ("throughput", "saga", "cql", "floor")
OPTIONAL_SUITES = {"recovery": REPO / "bench" / "recovery_engine.py"}
# A hang guard, not a timing assertion: a quick suite that has not finished by then is stuck.
SUITE_TIMEOUT_SECONDS = 900
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cassandra_suites() -> tuple[str, ...]:
    extra = tuple(name for name, path in OPTIONAL_SUITES.items() if path.exists())
    return (*CASSANDRA_SUITES, *extra)


@dataclass
class SuiteRun:
    suite: str
    results: Path
    process: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=SUITE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            pytest.fail(f"{self.suite} --quick still ran after {SUITE_TIMEOUT_SECONDS} s")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _start(suite: str, base: Path, env: dict[str, str]) -> SuiteRun:
    results = base / suite
    results.mkdir(parents=True)
    log = base / f"{suite}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench", suite, "--quick", "--results", str(results)],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return SuiteRun(suite, results, process, log)


def _selected(request: pytest.FixtureRequest) -> set[str]:
    """Suites whose tests this session will run (so deselected ones cost nothing)."""
    chosen = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None:
            chosen.add(callspec.params["suite"])
    return chosen


@pytest.fixture(scope="module")
def quick_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SuiteRun]]:
    base = tmp_path_factory.mktemp("bench-quick")
    wanted = _selected(request)
    runs: dict[str, SuiteRun] = {}
    try:
        for suite in PLAIN_SUITES:
            if suite in wanted:
                runs[suite] = _start(suite, base, {})
        cassandra_wanted = [s for s in _cassandra_suites() if s in wanted]
        if cassandra_wanted:
            # Starting (or attaching to) the cluster overlaps with the suites above.
            cluster = request.getfixturevalue("cassandra_cluster")
            port = cluster.native_port
            env = {
                "BENCH_CASSANDRA_CONTACT_POINTS": ",".join(
                    f"{ip}:{port}" for ip in cluster.contact_points
                ),
                "STACKSAGA_BENCH_CONTACT_POINT": f"{cluster.contact_points[0]}:{port}",
                # The fixtures delete a cluster they launched, keyspaces and all.
                "BENCH_CASSANDRA_DISPOSABLE": "1" if getattr(cluster, "disposable", False) else "0",
            }
            for suite in cassandra_wanted:
                runs[suite] = _start(suite, base, env)
        yield runs
    finally:
        for run in runs.values():
            if run.process.poll() is None:
                run.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.process.wait(timeout=30)


def _check_figure(item: dict[str, Any], folder: Path) -> None:
    for key in ("id", "title", "layer", "method"):
        assert isinstance(item.get(key), str) and item[key].strip(), f"figure lacks {key}: {item}"
    columns = item["columns"]
    assert columns, f"figure {item['id']} has no columns"
    for row in item["rows"]:
        assert len(row) == len(columns), f"figure {item['id']}: row {row} vs columns {columns}"
    if item.get("plot"):
        png = folder / item["png"]
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, f"{png} is not a PNG plot"


def _check_output(run: SuiteRun) -> None:
    report = json.loads((run.results / f"{run.suite}.json").read_text())
    assert report["quick"] is True
    assert report["machine"]["logical_cpus"], "machine details missing"
    figures = report["figures"]
    assert figures, f"{run.suite} wrote no figures"
    for item in figures:
        _check_figure(item, run.results)
    referenced = {item["png"] for item in figures if item.get("png")}
    on_disk = {path.name for path in run.results.glob("*.png")}
    assert on_disk == referenced, f"PNG files {on_disk} vs figures {referenced}"
    markdown = (run.results / f"{run.suite}.md").read_text()
    assert markdown.startswith(f"# bench `{run.suite}`")
    for target in report.get("targets", []):
        assert {"target", "measured", "met"} <= set(target), f"malformed target {target}"
    if run.suite == "throughput":
        # Every committed Accord op read its partitions through the store once at least
        # (a conditional set one, a transfer two): a count of 0 means reads went uncounted.
        # Several may share one request (an IN read), so requests are at most those reads.
        for item in report["runs"]:
            if item.get("cassandra_reads_per_op") is not None or item["workload"] in (
                "Accord conditional set (1 partition)",
                "Accord transfer (2 partitions)",
            ):
                least = 2 if "transfer" in item["workload"] else 1
                reads = item.get("cassandra_reads_per_op")
                assert reads is not None and reads >= least, f"store reads not counted: {item}"
                requests = item.get("cassandra_read_requests_per_op")
                assert requests is not None and 0 < requests <= reads, item


def _run_and_check(quick_runs: dict[str, SuiteRun], suite: str) -> None:
    run = quick_runs[suite]
    code = run.wait()
    assert code == 0, f"{suite} --quick exited {code}:\n{run.log_tail()}"
    _check_output(run)


@pytest.mark.parametrize("suite", PLAIN_SUITES)
def test_quick_suite(quick_runs: dict[str, SuiteRun], suite: str) -> None:
    _run_and_check(quick_runs, suite)


@pytest.mark.cassandra
@pytest.mark.parametrize("suite", _cassandra_suites())
def test_quick_suite_on_cassandra(quick_runs: dict[str, SuiteRun], suite: str) -> None:
    _run_and_check(quick_runs, suite)
