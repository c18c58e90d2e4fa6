"""What every suite writes: JSON, a Markdown table per figure, PNG plots, machine details.

A suite's report is a JSON-able dict. Suites that declare ``figures`` get them rendered the
same way; each figure is::

    {"id": "commit_latency", "title": "...", "layer": "userspace proxy (bench/wan.py)",
     "method": "what was measured and how", "columns": [...], "rows": [[...], ...],
     "plot": {"kind": "bar" | "line" | "cdf", ...}}

``layer`` says what produced the network conditions (the userspace proxy, netem, or plain
loopback); ``method`` is the note a reader needs to trust or distrust the figure. Older suites
(``sim``, ``saga``) return flat dicts; :func:`legacy_figures` turns those into figures.

Plots use matplotlib's Agg backend (no display); matplotlib is imported only when writing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# At most this many points per CDF series go into the JSON and the plot.
CDF_POINTS_MAX = 400


# ------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Plain progress lines on stderr, at most one every ``every_seconds`` (and the last).

    With ``total`` None (a run bounded by time, not count) the line shows the count only.
    """

    def __init__(self, label: str, total: int | None, *, every_seconds: float = 2.0) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.every_seconds = every_seconds
        self.started = time.monotonic()
        self.printed = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        finished = self.total is not None and self.done >= self.total
        if not finished and now - self.printed < self.every_seconds:
            return
        self.printed = now
        elapsed = f"{now - self.started:.0f}s"
        if self.total is None:
            note(f"{self.label}: {self.done} done, {elapsed}")
            return
        share = min(1.0, self.done / max(1, self.total))
        bar = "#" * int(20 * share)
        note(f"{self.label} [{bar:<20}] {self.done}/{self.total} {elapsed}")


def note(message: str) -> None:
    """One progress line on stderr (stdout carries the summary)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------
# Machine


def machine() -> dict[str, Any]:
    """Where the figures come from; the load average matters on a shared machine."""
    details: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.machine(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "load_average_1_5_15": [round(v, 2) for v in os.getloadavg()],
        "other_cassandra_jvms": _count_processes("CassandraDaemon"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        # Uncommitted changes under the measured code, if any (then the commit alone does not
        # say what ran).
        "git_uncommitted_files": len(
            (
                _git("status", "--porcelain", "--", "accord", "accord_cassandra", "bench") or ""
            ).splitlines()
        ),
    }
    return details


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        return None
    return None


def _count_processes(needle: str) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    count += 1
            except OSError:
                continue
    return count


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


# ------------------------------------------------------------------------------------------
# Figures


def figure(
    figure_id: str,
    title: str,
    *,
    layer: str,
    method: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    plot: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A figure as suites declare it (see the module docstring)."""
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"figure {figure_id}: every row needs {len(columns)} cells")
    return {
        "id": figure_id,
        "title": title,
        "layer": layer,
        "method": " ".join(method.split()),
        "columns": list(columns),
        "rows": [list(row) for row in rows],
        "plot": dict(plot) if plot is not None else None,
    }


def cdf_points(values: Sequence[float]) -> list[float]:
    """Sorted values thinned to at most CDF_POINTS_MAX, keeping the first and last."""
    ordered = sorted(values)
    if len(ordered) <= CDF_POINTS_MAX:
        return [round(v, 3) for v in ordered]
    step = (len(ordered) - 1) / (CDF_POINTS_MAX - 1)
    return [round(ordered[round(i * step)], 3) for i in range(CDF_POINTS_MAX)]


def legacy_figures(suite: str, report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Figures for suites that return flat dicts (``sim``, ``saga``)."""
    if suite == "sim":
        runs = list(report.get("runs", []))
        target = report.get("target_txns_per_cpu_second")
        build = str(report.get("build", "pure"))
        compiled = list(report.get("compiled_runs", []))
        rows = [[i + 1, build, rate, target] for i, rate in enumerate(runs)]
        rows += [[i + 1, "compiled (make accel)", rate, target] for i, rate in enumerate(compiled)]
        series = {f"{build} build": runs}
        if compiled:
            series["compiled build"] = compiled
        return [
            figure(
                "txns_per_cpu_second",
                "Simulated transactions per CPU-second",
                layer="simulator (virtual time; no network)",
                method=str(report.get("method", ""))
                + f" Compiled build: {report.get('compiled_build', 'absent')}.",
                columns=["run", "build", "txns per CPU-second", "target"],
                rows=rows,
                plot={
                    "kind": "bar",
                    "x": [f"run {i + 1}" for i in range(len(runs))],
                    "series": series,
                    "hline": {"value": target, "label": "target"} if target else None,
                    "ylabel": "simulated txns / CPU-second",
                },
            )
        ]
    if suite == "saga":
        return _saga_figures(report)
    return []


def _saga_figures(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    cassandra = str(report.get("cassandra", "Cassandra"))
    method = (
        "Saga store on real Cassandra (" + cassandra + "); 3-step sagas whose steps do "
        "nothing, so the figures are the store's own cost; see bench/saga_store.py."
    )
    runs = dict(report.get("saga_runs_per_second", {}))
    steps = dict(report.get("step_latency_ms", {}))
    modes = sorted(set(runs) | set(steps))
    rows = [
        [
            mode,
            runs.get(mode),
            steps.get(mode, {}).get("p50"),
            steps.get(mode, {}).get("p99"),
        ]
        for mode in modes
    ]
    return [
        figure(
            "saga_runs",
            "Saga store: whole sagas per second and one guarded step's latency",
            layer="none (loopback, no WAN emulation)",
            method=method,
            columns=["mode", "sagas/s", "step p50 ms", "step p99 ms"],
            rows=rows,
            plot={
                "kind": "bar",
                "x": modes,
                "series": {
                    "sagas/s": [runs.get(m) or 0 for m in modes],
                },
                "ylabel": "sagas per second",
            },
        ),
        figure(
            "saga_step_latency",
            "Saga store: one guarded step (deliver), latency",
            layer="none (loopback, no WAN emulation)",
            method=method,
            columns=["mode", "p50 ms", "p99 ms"],
            rows=[[m, steps.get(m, {}).get("p50"), steps.get(m, {}).get("p99")] for m in modes],
            plot={
                "kind": "bar",
                "x": modes,
                "series": {
                    "p50": [steps.get(m, {}).get("p50") or 0 for m in modes],
                    "p99": [steps.get(m, {}).get("p99") or 0 for m in modes],
                },
                "ylabel": "ms",
            },
        ),
    ]


# ------------------------------------------------------------------------------------------
# Writing


def write_outputs(suite: str, report: dict[str, Any], folder: Path) -> list[Path]:
    """``<suite>.json``, ``<suite>.md`` and ``<suite>-<figure>.png`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if not report.get("figures"):
        report["figures"] = legacy_figures(suite, report)
    written = []
    for item in report["figures"]:
        if item.get("plot"):
            path = folder / f"{suite}-{item['id']}.png"
            _plot(item, path)
            item["png"] = path.name
            written.append(path)
    json_path = folder / f"{suite}.json"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    markdown_path = folder / f"{suite}.md"
    markdown_path.write_text(markdown(suite, report))
    return [json_path, markdown_path, *written]


def markdown(suite: str, report: Mapping[str, Any]) -> str:
    lines = [f"# bench `{suite}`", ""]
    if report.get("title"):
        lines += [str(report["title"]), ""]
    details = report.get("machine", {})
    lines.append(
        "Machine: "
        + ", ".join(f"{key} {value}" for key, value in details.items() if value is not None)
    )
    if report.get("when"):
        lines.append(f"When: {report['when']}; wall time {report.get('wall_seconds', '?')} s")
    lines.append("")
    for item in report.get("figures", []):
        lines += [
            f"## {item['title']}",
            "",
            f"*Layer:* {item['layer']}",
            "",
            f"*Method:* {item['method']}",
            "",
            *_table(item["columns"], item["rows"]),
            "",
        ]
        if item.get("png"):
            lines += [f"![{item['title']}]({item['png']})", ""]
    targets = report.get("targets") or []
    if targets:
        lines += ["## Targets", "", *_table(["target", "measured", "met"], _target_rows(targets))]
        lines.append("")
    for extra in report.get("notes") or []:
        lines.append(f"- {extra}")
    if report.get("notes"):
        lines.append("")
    if report.get("profile_top"):
        profile = report["profile_top"]
        text = "\n".join(profile) if isinstance(profile, list) else str(profile)
        lines += ["## Profile (top entries)", "", "```", text.strip(), "```", ""]
    return "\n".join(lines)


def _target_rows(targets: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    rows = []
    for target in targets:
        met = target.get("met")
        rows.append([target.get("target"), target.get("measured"), "n/a" if met is None else met])
    return rows


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(str(c) for c in columns) + " |"]
    out.append("|" + "---|" * len(columns))
    for row in rows:
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value).replace("|", "/")


def _plot(item: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = item["plot"]
    fig, axes = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    try:
        kind = spec.get("kind", "bar")
        if kind == "bar":
            _bar(axes, spec)
        elif kind == "line":
            _line(axes, spec)
        elif kind == "cdf":
            _cdf(axes, spec)
        else:
            raise ValueError(f"figure {item['id']}: unknown plot kind {kind!r}")
        hline = spec.get("hline")
        if hline and hline.get("value") is not None:
            axes.axhline(hline["value"], color="red", linestyle="--", label=hline.get("label"))
        axes.set_title(item["title"], fontsize=10)
        axes.set_ylabel(spec.get("ylabel", ""))
        if spec.get("xlabel"):
            axes.set_xlabel(spec["xlabel"])
        if spec.get("logy"):
            axes.set_yscale("log")
        handles, _ = axes.get_legend_handles_labels()
        if handles:
            axes.legend(fontsize=8)
        fig.text(0.01, 0.01, f"layer: {item['layer']}", fontsize=7, color="dimgray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(path)
    finally:
        plt.close(fig)


def _bar(axes: Any, spec: Mapping[str, Any]) -> None:
    labels = [str(x) for x in spec["x"]]
    series = dict(spec["series"])
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(labels))]
        axes.bar(positions, [v or 0 for v in values], width, label=name)
    axes.set_xticks(range(len(labels)))
    axes.set_xticklabels(labels, fontsize=8)


def _line(axes: Any, spec: Mapping[str, Any]) -> None:
    for name, points in dict(spec["series"]).items():
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        axes.plot(xs, ys, marker="o", label=name)


def _cdf(axes: Any, spec: Mapping[str, Any]) -> None:
    for name, values in dict(spec["series"]).items():
        if not values:
            continue
        count = len(values)
        axes.step(values, [(i + 1) / count for i in range(count)], where="post", label=name)
    for name, value in dict(spec.get("vlines", {})).items():
        axes.axvline(value, linestyle=":", color="gray")
        axes.text(value, 0.02, f" {name}", rotation=90, fontsize=7, color="gray")
    axes.set_ylim(0, 1.02)
    axes.set_xlabel(spec.get("xlabel", "ms"))
