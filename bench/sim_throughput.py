"""Simulator throughput: simulated transactions per CPU-second.

Method: 5 nodes, rf 3, list-append, no faults, one seeded run per repetition; the figure
is committed-or-decided transactions divided by the process CPU time of the run
(``time.process_time``), so other load on the machine barely moves it. ``--profile``
adds the top entries of a cProfile run (which is slower; the figure comes from the
unprofiled runs). The report's ``build`` says which accord/ this process ran (pure unless
PYTHONPATH points at a compiled copy); when ``make accel`` has built
the mypyc-compiled copy (bench/accel.py) for today's sources, the same runs repeat on it in
a child process and the report carries both figures and their ratio.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
from typing import Any

import accord.node
from accord.sim.burn import BurnConfig, run_seed
from accord.sim.cluster import Faults
from bench import accel


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    txns = 300 if quick else 2000
    repetitions = 1 if quick else 3
    config = BurnConfig(nodes=5, rf=3, txns=txns, workload="list-append", faults=Faults())
    rates = []
    messages = 0
    by_type: dict[str, int] = {}
    issued = 0
    for seed in range(repetitions):
        result = run_seed(seed, config)
        if not result.passed:
            raise RuntimeError(f"seed {seed} failed verification: {result.verdict_text()}")
        rates.append(result.txns / result.cpu_seconds)
        issued += result.txns
        messages += result.messages
        for name, n in result.messages_by_type.items():
            by_type[name] = by_type.get(name, 0) + n
    report: dict[str, Any] = {
        "suite": "sim",
        "method": __doc__,
        "config": {"nodes": 5, "rf": 3, "txns": txns, "workload": "list-append", "faults": "none"},
        "txns_per_cpu_second": round(statistics.median(rates)),
        "runs": [round(r) for r in rates],
        "messages_per_txn": round(messages / issued, 2),
        "messages_per_txn_by_type": {
            name: round(n / issued, 2) for name, n in sorted(by_type.items(), key=lambda kv: -kv[1])
        },
        "target_txns_per_cpu_second": 5000,
        "build": "compiled" if accord.node.__file__.endswith(".so") else "pure",
    }
    compiled = accel.status()
    report["compiled_build"] = compiled
    if compiled == "ready":
        fast = accel.compiled_rates(txns, repetitions)
        report["compiled_txns_per_cpu_second"] = round(statistics.median(fast))
        report["compiled_runs"] = [round(r) for r in fast]
        report["compiled_speedup"] = round(statistics.median(fast) / statistics.median(rates), 2)
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_seed, 0, config)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        report["profile_top"] = out.getvalue()
    return report
