"""The CI runs: five real node processes under partitions, checked by both checkers.

Each run is what ``python -m maelstrom.harness`` does (spawn, init, workload, nemesis,
drain, check), in process so the test can look at the structured results. The teeth run
goes through the CLI and the ``--bin`` script, starts the nodes with
``--unsafe-local-reads``, and must be flagged by both checkers (exit status 1), which proves
the valid verdicts above are not vacuous.

``MAELSTROM_CI_SECONDS`` changes the length of the valid runs (default 25 s each).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from maelstrom.harness.net import Latency
from maelstrom.harness.report import CheckOptions, analyse, results_mapping, write_results
from maelstrom.harness.runner import RunConfig, Runner, RunRecord

SECONDS = float(os.environ.get("MAELSTROM_CI_SECONDS", "25"))
TEETH_SECONDS = 8.0
NODE_SCRIPT = Path(__file__).resolve().parents[2] / "maelstrom" / "bin" / "accord-node"

pytestmark = pytest.mark.slow


def _children() -> set[int]:
    """Live child processes of this test process (Linux /proc)."""
    pid = os.getpid()
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:
            # The thread ended between the listing and the read; it has no children left.
            continue
        children.update(int(c) for c in text)
    return children


@pytest.fixture(autouse=True)
def no_leaked_nodes() -> Iterator[None]:
    before = _children()
    yield
    leaked = _children() - before
    assert not leaked, f"node processes left running: {sorted(leaked)}"


def _run(
    workload: str, seconds: float, seed: int, results: Path, node_args: tuple[str, ...] = ()
) -> tuple[RunRecord, dict[str, object]]:
    config = RunConfig(
        workload=workload,
        node_count=5,
        time_limit_s=seconds,
        rate=40,
        concurrency=10,
        latency=Latency(5, "exponential"),
        nemesis=("partition",),
        nemesis_interval_s=4,
        seed=seed,
        node_args=node_args,
    )
    record = Runner(config, results).run()
    analysis = analyse(workload, record.events, CheckOptions(), results_dir=results)
    mapping = results_mapping(record, analysis)
    write_results(results, record, mapping, analysis.checks)
    return record, mapping


def _explain(record: RunRecord, mapping: dict[str, object], results: Path) -> str:
    return f"seed={record.config.seed} results in {results}: {mapping['workload']}"


@pytest.mark.parametrize(("workload", "seed"), [("lin-kv", 101), ("txn-list-append", 202)])
def test_five_nodes_under_partitions_are_valid_by_both_checkers(
    workload: str, seed: int, tmp_path: Path
) -> None:
    record, mapping = _run(workload, SECONDS, seed, tmp_path)
    why = _explain(record, mapping, tmp_path)
    assert record.aborted is None and not record.crashed_nodes, why
    assert record.protocol_error_count == 0, record.protocol_errors
    assert all(status == 0 for status in record.exit_statuses.values()), record.exit_statuses
    checkers = mapping["workload"]["checkers"]  # type: ignore[index]
    assert set(checkers) == {
        "linearizable-per-key" if workload == "lin-kv" else "elle-list-append",
        "porcupine",
    }
    assert all(c["valid?"] is True for c in checkers.values()), why
    assert mapping["workload"]["checkers-agree?"] is True  # type: ignore[index]
    assert mapping["valid?"] is True, why
    # The run must have exercised something: partitions happened and work got done.
    assert record.partitions >= 2 and record.net.server_dropped > 0, why
    stats = mapping["stats"]
    assert stats["ok-count"] >= 10 * SECONDS, stats  # type: ignore[index]


def test_unsafe_local_reads_are_caught_by_both_checkers(tmp_path: Path) -> None:
    """Teeth, through the CLI exactly as a user runs it, with the --bin wrapper script."""
    results = tmp_path / "teeth"
    command = [
        sys.executable, "-m", "maelstrom.harness", "-w", "lin-kv", "--bin", str(NODE_SCRIPT),
        "--node-count", "5", "--time-limit", str(TEETH_SECONDS), "--rate", "40",
        "--concurrency", "2n", "--latency", "5", "--latency-dist", "exponential",
        "--nemesis", "partition", "--nemesis-interval", "2", "--seed", "303",
        "--results-dir", str(results), "--", "--unsafe-local-reads",
    ]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=TEETH_SECONDS + 60, check=False
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "linearizable-per-key: valid? false" in run.stdout, run.stdout
    assert "porcupine: valid? false" in run.stdout, run.stdout
    assert (results / "results.edn").read_text().startswith("{:valid? false")
    assert (results / "history.edn").read_text().startswith("{:index 0, :type :invoke")
    assert (results / "porcupine.html").stat().st_size > 0
    assert sorted(p.name for p in (results / "node-logs").iterdir()) == [
        f"n{i}.log" for i in range(5)
    ]
    recheck = subprocess.run(
        [sys.executable, "-m", "maelstrom.harness", "--recheck", str(results / "history.json")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert recheck.returncode == 1, recheck.stdout + recheck.stderr
    assert "valid? false" in recheck.stdout
