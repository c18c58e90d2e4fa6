"""``python -m bench <suite> [--quick] [--profile]``: run a benchmark suite, write its JSON
into ``results/`` and print a short Markdown summary.

Suites: ``sim`` (simulated transactions per CPU-second), ``saga`` (saga store on a real
Cassandra node it starts itself).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import saga_store, sim_throughput

SUITES: dict[str, Callable[..., dict[str, Any]]] = {
    "sim": sim_throughput.run,
    "saga": saga_store.run,
}


def _summary(report: dict[str, Any]) -> list[str]:
    rows = ["| figure | value |", "|---|---|"]
    for name, value in report.items():
        if isinstance(value, int | float | str) and name not in ("method", "profile_top", "when"):
            rows.append(f"| {name} | {value} |")
        elif isinstance(value, dict):
            for inner, figure in value.items():
                if isinstance(figure, int | float | str):
                    rows.append(f"| {name}.{inner} | {figure} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument(
        "--quick", action="store_true", help="small run that only checks the suite works"
    )
    parser.add_argument("--profile", action="store_true", help="include the top profile entries")
    parser.add_argument("--results", default="results", help="folder for JSON output")
    args = parser.parse_args()
    report = SUITES[args.suite](quick=args.quick, profile=args.profile)
    report["machine"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.machine(),
    }
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    folder = Path(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{args.suite}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print("\n".join(_summary(report)))
    if "profile_top" in report:
        print(report["profile_top"])
    print(f"written {path}")
    return 0


sys.exit(main())
