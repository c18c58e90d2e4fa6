"""``python -m bench <suite> [--quick] [--profile] [--results DIR]``: run a benchmark suite and
write ``<suite>.json``, ``<suite>.md`` and ``<suite>-<figure>.png`` into ``DIR`` (default
``results/``), then print the Markdown summary.

Suites:

* ``latency``: Accord commit latency under an emulated 3-region WAN vs the fast-quorum RTT
  (and, outside ``--quick``, Accord on Cassandra vs LWT under the same WAN);
* ``contention``: Zipf-distributed conflicting transfers, clock skew, reorder buffer off/on:
  fast-path share and latency;
* ``throughput``: saturation on a real 3-node Cassandra, Accord vs LWT, same cluster and run;
* ``sim``: simulated transactions per CPU-second;
* ``saga``: saga store on a real Cassandra node;
* ``restart``: ok transfers/s around SIGKILLs and restarts of different sidecars, and the
  time until each restarted sidecar serves again;
* ``overload``: bursts of 300, 2,000 and 10,500 concurrent transfers on 3 hot accounts:
  answers, peak RSS, time until normal service;
* ``kafka``: saga steps through a real Kafka broker vs direct execution (bench/kafka.py);
* ``cql``: the bank transfer through the sidecars' CQL endpoint (cassandra-driver, prepared
  ``BEGIN TRANSACTION``) vs through the gRPC client, same cluster and run (bench/cql.py);
* ``floor``: Accord vs LWT CPU per operation at equal op/s (open loop), at saturation, and a
  null sidecar (the least any Python sidecar does per op) giving the best ratio any design
  could reach (bench/floor.py);
* ``recovery``: the saga recovery engine, when ``bench/recovery_engine.py`` exists.

The first SIGINT or SIGTERM stops a suite and what it started, in the background too
(bench/interrupts.py).

``--quick`` is a small run that checks the suite works and writes well-formed output; its
figures mean little. Each figure states which layer produced its network conditions.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.interrupts import Interrupted, stoppable
from bench.report import machine, markdown, note, write_outputs

# Suite name -> module whose ``run(*, quick, profile) -> dict`` measures it. Modules are
# imported only when chosen, so one suite's optional dependencies never break another.
SUITES: dict[str, str] = {
    "latency": "bench.latency",
    "contention": "bench.contention",
    "throughput": "bench.throughput",
    "sim": "bench.sim_throughput",
    "saga": "bench.saga_store",
    "restart": "bench.restart",
    "overload": "bench.overload",
    "kafka": "bench.kafka",
    "cql": "bench.cql",
    "floor": "bench.floor",
}
if importlib.util.find_spec("bench.recovery_engine") is not None:
    SUITES["recovery"] = "bench.recovery_engine"


def suite(name: str) -> Callable[..., dict[str, Any]]:
    runner: Callable[..., dict[str, Any]] = importlib.import_module(SUITES[name]).run
    return runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument(
        "--quick", action="store_true", help="small run that only checks the suite works"
    )
    parser.add_argument("--profile", action="store_true", help="include the top profile entries")
    parser.add_argument("--results", default="results", help="folder for the output files")
    args = parser.parse_args(argv)
    details = machine()
    started = time.monotonic()
    mode = " (quick)" if args.quick else ""
    note(f"suite {args.suite}{mode}; load average {details['load_average_1_5_15']}")
    try:
        with stoppable():
            report = suite(args.suite)(quick=args.quick, profile=args.profile)
    except Interrupted as interrupted:
        note(f"stopped by {interrupted}: nothing written")
        return 128 + interrupted.signum
    report.setdefault("suite", args.suite)
    report["quick"] = args.quick
    details["load_average_at_end"] = machine()["load_average_1_5_15"]
    report["machine"] = details
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    written = write_outputs(args.suite, report, Path(args.results))
    print(markdown(args.suite, report))
    for path in written:
        print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
