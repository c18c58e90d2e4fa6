"""bench.stage_trace's merge of the sidecars' event files into per-stage figures."""

from __future__ import annotations

import json
from pathlib import Path

from bench.stage_trace import report


def _write(path: Path, events: list[tuple[str, str, float]]) -> None:
    path.write_text("".join(json.dumps(list(event)) + "\n" for event in events))


def test_stages_are_measured_per_transaction_across_the_sidecars_files(tmp_path: Path) -> None:
    txn = "T1"
    _write(
        tmp_path / "trace-1-100.jsonl",
        [
            (txn, "client submitted", 10.000),
            (txn, "out PreAccept to 2", 10.001),
            (txn, "in PreAcceptOk from 2", 10.010),
            (txn, "DataRead scheduled (0 before it)", 10.012),
            (txn, "DataRead done", 10.020),
            (txn, "client answered ok", 10.030),
            ("cql SELECT", "settled", 0.004),
        ],
    )
    _write(
        tmp_path / "trace-2-200.jsonl",
        [
            (txn, "in PreAccept from 1", 10.003),
            (txn, "journal PRE_ACCEPTED queued (batch of 1)", 10.004),
            (txn, "journal PRE_ACCEPTED durable", 10.007),
            (txn, "out PreAcceptOk to 1", 10.008),
        ],
    )
    figures = {line[:42].strip(): line[42:].split() for line in report(tmp_path)[1:]}
    assert figures["02 R PreAccept hop"][:2] == ["1", "2.00"]
    assert figures["04 R journal PRE_ACCEPTED"][1] == "3.00"
    assert figures["05 R PreAcceptOk hop"][1] == "2.00"
    assert figures["06 C submit -> last PreAcceptOk"][1] == "10.00"
    assert figures["09 C DataRead"][1] == "8.00"
    assert figures["14 C submit -> answered (total)"][1] == "30.00"
    assert any(line.startswith("driver cql SELECT settled: p50 4.00") for line in report(tmp_path))


def test_transactions_submitted_in_the_skipped_seconds_are_left_out(tmp_path: Path) -> None:
    _write(
        tmp_path / "trace-1-100.jsonl",
        [
            ("early", "client submitted", 1.0),
            ("early", "client answered ok", 1.5),
            ("late", "client submitted", 9.0),
            ("late", "client answered ok", 9.25),
        ],
    )
    totals = [line for line in report(tmp_path, skip_seconds=5.0) if line.startswith("14 ")]
    assert totals and totals[0].split()[-4:] == ["1", "250.00", "250.00", "250.00"]
