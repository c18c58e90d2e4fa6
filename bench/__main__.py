"""``python -m bench <suite> [--quick] [--profile]``: run a benchmark suite, print a
Markdown table and write JSON into ``results/``."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from bench import sim_throughput

SUITES = {"sim": sim_throughput.run}


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
    path.write_text(json.dumps(report, indent=2))
    figure, target = report["txns_per_cpu_second"], report["target_txns_per_cpu_second"]
    print("| suite | figure | target |\n|---|---|---|")
    print(f"| {args.suite} | {figure} txns/CPU-s | {target} |")
    if "profile_top" in report:
        print(report["profile_top"])
    print(f"written {path}")
    return 0


sys.exit(main())
