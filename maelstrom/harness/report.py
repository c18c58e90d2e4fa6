"""Checking a finished run, Maelstrom-style results, and the files a run leaves behind.

A run's ``:valid?`` is the merge (false beats unknown beats true) of:

* the in-repo checker for the workload (:mod:`maelstrom.checker`);
* Porcupine (:mod:`maelstrom.porcupine_driver`), unless disabled;
* the harness's own findings: any protocol error makes the run invalid; an aborted run or
  a node that exited mid-test makes it unknown (the history is incomplete).

Files written to the results directory (``results/maelstrom/<workload>/<time>/`` by
default, after Maelstrom's ``store/<test>/<time>/``):
``history.edn`` (Jepsen), ``history.json`` (lossless; ``--recheck`` reads it),
``results.edn`` and ``results.json``, ``porcupine-input.json``, ``porcupine.html`` when
Porcupine finds a violation, and ``node-logs/<node>.log`` (each node's stderr).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from maelstrom.checker import CheckResult, Valid, agree, check_in_repo, combine
from maelstrom.edn import Keyword, dumps
from maelstrom.harness.runner import RunRecord
from maelstrom.history import Event, pair, to_edn_lines, to_json
from maelstrom.linearizable import DEFAULT_MAX_STATES
from maelstrom.porcupine_driver import DEFAULT_CHECK_TIMEOUT_SECONDS, DEFAULT_MAX_HEAP_MB
from maelstrom.porcupine_driver import check as porcupine_check

QUANTILES: Final = (0.5, 0.95, 0.99, 1.0)
UNKNOWN: Final = Keyword("unknown")


@dataclass(frozen=True, slots=True)
class CheckOptions:
    porcupine: bool = True
    porcupine_timeout_s: float = DEFAULT_CHECK_TIMEOUT_SECONDS
    porcupine_max_heap_mb: int = DEFAULT_MAX_HEAP_MB
    max_states: int = DEFAULT_MAX_STATES


@dataclass(frozen=True, slots=True)
class Analysis:
    """Every verdict about one history, and the merged ``valid``."""

    valid: Valid
    checks: tuple[CheckResult, ...]
    agree: bool


def analyse(
    workload: str,
    events: Sequence[Event],
    options: CheckOptions,
    *,
    results_dir: Path | None = None,
) -> Analysis:
    """Run the in-repo checker and (unless disabled) Porcupine on a history."""
    checks = [check_in_repo(workload, events, max_states=options.max_states)]
    if options.porcupine:
        outcome = porcupine_check(
            workload,
            list(events),
            timeout_seconds=options.porcupine_timeout_s,
            max_heap_mb=options.porcupine_max_heap_mb,
            input_path=None if results_dir is None else results_dir / "porcupine-input.json",
            html_path=None if results_dir is None else results_dir / "porcupine.html",
        )
        report = outcome.report
        summary = outcome.reason
        if "operations" in report:
            summary += f": {report['operations']} operations"
        if "pruned" in report and report.get("model") != "cas-register":
            summary += f" ({report['pruned']} unobserved :info txns pruned)"
        if "elapsed_ms" in report:
            summary += f" in {report['elapsed_ms']} ms"
        checks.append(CheckResult("porcupine", outcome.valid, summary, dict(report)))
    return Analysis(combine(checks), tuple(checks), agree(checks))


def _run_checks(record: RunRecord) -> list[CheckResult]:
    """The harness's own verdicts about the run itself."""
    checks = []
    if record.protocol_error_count:
        checks.append(
            CheckResult(
                "protocol",
                False,
                f"{record.protocol_error_count} protocol errors; "
                f"first: {record.protocol_errors[0]}",
                {"errors": list(record.protocol_errors)},
            )
        )
    if record.aborted is not None:
        checks.append(CheckResult("run-aborted", None, record.aborted))
    if record.crashed_nodes:
        checks.append(
            CheckResult(
                "node-crashes", None, f"node(s) exited mid-test: {', '.join(record.crashed_nodes)}"
            )
        )
    return checks


def _quantiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    out = {}
    for q in QUANTILES:
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        out[f"p{round(q * 100)}" if q < 1 else "max"] = round(ordered[index], 2)
    out["mean"] = round(sum(ordered) / len(ordered), 2)
    return out


def op_stats(events: Sequence[Event]) -> dict[str, Any]:
    """Jepsen's ``:stats`` and per-``f`` latency (ms) of ``:ok`` operations."""
    operations = pair(events)
    counts: dict[str, Any] = {"count": 0, "ok-count": 0, "fail-count": 0, "info-count": 0}
    by_f: dict[str, dict[str, int]] = {}
    latencies: dict[str, list[float]] = {}
    for op in operations:
        counts["count"] += 1
        counts[f"{op.status}-count"] += 1
        per = by_f.setdefault(op.f, {"count": 0, "ok-count": 0, "fail-count": 0, "info-count": 0})
        per["count"] += 1
        per[f"{op.status}-count"] += 1
        if op.status == "ok" and op.completed is not None:
            latencies.setdefault(op.f, []).append((op.completed - op.invoked) / 1e6)
    everything = [v for values in latencies.values() for v in values]
    counts["by-f"] = by_f
    return {
        "stats": counts,
        "latency-ms": {"ok": _quantiles(everything)}
        | {f: _quantiles(v) for f, v in sorted(latencies.items())},
        "availability": {
            "ok-fraction": round(counts["ok-count"] / counts["count"], 4) if counts["count"] else 0
        },
    }


def _valid(valid: Valid) -> bool | Keyword:
    # A Keyword is a str: JSON gets "unknown", EDN gets Jepsen's :unknown.
    return UNKNOWN if valid is None else valid


def results_mapping(record: RunRecord, analysis: Analysis) -> dict[str, Any]:
    """``results.edn`` content as a mapping (string keys become EDN keywords)."""
    config, net = record.config, record.net
    checks = list(analysis.checks) + _run_checks(record)
    valid = combine(checks)
    stats = op_stats(record.events)
    operations = stats["stats"]["count"]
    return {
        "valid?": _valid(valid),
        "workload": {
            "name": config.workload,
            "checkers": {
                c.checker: {"valid?": _valid(c.valid), "summary": c.summary} for c in checks
            },
            "checkers-agree?": analysis.agree,
        },
        **stats,
        "net": {
            "servers": {
                "send-count": net.server_sent,
                "recv-count": net.server_delivered,
                "dropped-count": net.server_dropped,
                "msgs-per-op": round(net.server_sent / operations, 2) if operations else 0,
            },
            "clients": {"send-count": net.client_sent},
            "all": {"send-count": net.server_sent + net.client_sent},
            "late-replies": record.late_replies,
        },
        "test": {
            "nodes": list(config.nodes),
            "time-limit-s": config.time_limit_s,
            "rate": config.rate,
            "concurrency": config.effective_concurrency,
            "latency-ms": config.latency.mean_ms,
            "latency-dist": config.latency.distribution,
            "nemesis": list(config.nemesis),
            "nemesis-interval-s": config.nemesis_interval_s,
            "partitions": record.partitions,
            "timeout-ms": config.effective_timeout_ms,
            "seed": config.seed,
            "keys-used": record.keys_used,
            "duration-s": round(record.duration_s, 2),
            "node-command": list(config.node_command) + list(config.node_args),
        },
    }


def write_results(
    results_dir: Path, record: RunRecord, mapping: dict[str, Any], details: Sequence[CheckResult]
) -> None:
    """Every result file of a run (see the module docstring)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    workload = record.config.workload
    (results_dir / "history.edn").write_text(
        "\n".join(to_edn_lines(workload, record.events)) + "\n", encoding="utf-8"
    )
    (results_dir / "history.json").write_text(
        json.dumps(to_json(workload, record.events)), encoding="utf-8"
    )
    full = dict(mapping)
    full["checker-details"] = {c.checker: c.details for c in details}
    (results_dir / "results.json").write_text(
        json.dumps(full, indent=1, default=str), encoding="utf-8"
    )
    (results_dir / "results.edn").write_text(dumps(mapping) + "\n", encoding="utf-8")


def exit_code(valid: Valid) -> int:
    """Maelstrom's exit status: 0 valid, 1 invalid, 2 unknown."""
    return 0 if valid is True else 1 if valid is False else 2


__all__ = [
    "Analysis",
    "CheckOptions",
    "analyse",
    "exit_code",
    "op_stats",
    "results_mapping",
    "write_results",
]
