"""``python -m bench.sidecar_wrapper [--offset-ms X] [--profile-out F] [--nice N] --config
node.yaml``: one sidecar with its clock shifted by ``X`` ms, under cProfile, and/or at another
scheduling priority.

Clock skew: the sidecar has no skew knob (``accord_cassandra.host.WallClock`` reads
``time.time_ns()``) and all sidecars of a local cluster share one machine clock, so the bench
shifts the one clock the Accord node reads: its HLC, timeouts and reorder buffer all follow
the shifted clock, as on a host whose NTP is off by ``X`` ms. Nothing else changes.

Profile: the sidecar runs under ``cProfile`` and writes its stats to ``F`` when it stops
(SIGTERM ends ``serve`` normally). Profiled figures are slower than unprofiled ones; the
suites say when a figure comes from a profiled run. ``BENCH_PROFILE_CLOCK=cpu`` times the
main thread's CPU (``time.thread_time``) instead of the wall clock: on a machine shared with
other load, wall time lands on whichever call the scheduler preempted (a syscall that wakes
another thread, a hash that drops the GIL), which says little about what a transaction costs.

Priority: ``os.nice(N)`` runs first, before gRPC starts its threads (a thread inherits its
creator's niceness; renicing the process from outside later would miss them).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sidecar_wrapper")
    parser.add_argument("--offset-ms", type=float, default=0.0)
    parser.add_argument("--profile-out")
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--config", required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--trace-dir", help="note stage timestamps there (bench/stage_trace.py)")
    args = parser.parse_args(argv)
    if args.nice:
        # Only root may lower niceness; elsewhere the sidecar keeps the default priority.
        with contextlib.suppress(OSError):
            os.nice(args.nice)

    from accord_cassandra import host
    from accord_cassandra.cli import main as sidecar_main

    if args.trace_dir:
        from bench.stage_trace import install

        install(args.trace_dir)
    if args.offset_ms:
        offset_micros: int = round(args.offset_ms * 1000)
        machine_now = host.WallClock.now_micros

        def shifted_now(self: host.WallClock) -> int:
            return machine_now(self) + offset_micros

        # Patched before the sidecar builds its node, so every reading goes through it.
        host.WallClock.now_micros = shifted_now  # type: ignore[method-assign]
    command = ["sidecar", "--config", args.config, "--log-level", args.log_level]
    if not args.profile_out:
        return sidecar_main(command)
    clock = os.environ.get("BENCH_PROFILE_CLOCK", "wall")
    if clock not in ("wall", "cpu"):
        parser.error(f"BENCH_PROFILE_CLOCK={clock!r}: wall or cpu")
    profiler = cProfile.Profile(time.thread_time) if clock == "cpu" else cProfile.Profile()
    try:
        return int(profiler.runcall(sidecar_main, command))
    finally:
        profiler.dump_stats(args.profile_out)


if __name__ == "__main__":
    sys.exit(main())
