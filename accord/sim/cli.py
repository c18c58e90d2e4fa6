"""``python -m accord.sim``: run seeded burn tests from the shell.

Exit status is 0 only when every seed's history verified, every transaction decided in
the liveness phase and every key's replicas agree; each failing seed is printed so that
``--seed-start N --seeds 1`` reproduces it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from accord.sim import Bugs
from accord.sim.burn import BurnConfig, RunResult, run_seed
from accord.sim.cluster import FAULT_NAMES, OPT_IN_FAULT_NAMES, Faults


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m accord.sim", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rf", type=int, default=3, help="replication factor")
    parser.add_argument("--txns", type=int, default=200, help="transactions per seed")
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds to run")
    parser.add_argument("--seed-start", type=int, default=0, help="first seed")
    parser.add_argument("--clients", type=int, default=6, help="concurrent clients")
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--workload", choices=("list-append", "bank"), default="list-append")
    parser.add_argument(
        "--faults",
        default="all",
        help="all, none, or a comma list of " + ",".join((*FAULT_NAMES, *OPT_IN_FAULT_NAMES)),
    )
    parser.add_argument(
        "--shards-per-node",
        type=int,
        default=1,
        help="token ranges per node; with more nodes than --rf, txns span shards",
    )
    parser.add_argument(
        "--recover-delay-ms",
        type=float,
        default=None,
        help="progress-log recovery delay (small values race recovery against coordinators)",
    )
    parser.add_argument(
        "--fixed-recover-delay",
        action="store_true",
        help="recover after the fixed delay, not one learned from latency (NodeConfig)",
    )
    parser.add_argument(
        "--coordinator-crash-chance",
        type=float,
        default=0.03,
        help="chance that a coordinator crashes after sending only some PreAccepts",
    )
    parser.add_argument(
        "--long-delay-chance",
        type=float,
        default=0.02,
        help="chance that a message takes 20-400 ms instead of 0.5-5 ms",
    )
    parser.add_argument(
        "--bug",
        action="append",
        default=[],
        choices=sorted(f.name for f in dataclasses.fields(Bugs)),
        help="plant a deliberately broken protocol variant (to see the burn test catch it)",
    )
    parser.add_argument(
        "--shared-storage",
        action="store_true",
        help="one data store for every replica and one writer per shard (as on Cassandra)",
    )
    parser.add_argument(
        "--reorder-buffer-ms", type=float, default=0.0, help="reorder buffer delta (0 = off)"
    )
    parser.add_argument(
        "--electorate", type=int, default=None, help="fast-path electorate size per shard"
    )
    parser.add_argument(
        "--electorate-preference",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=(),
        help="comma-separated node ids voting first in every shard (with --electorate)",
    )
    parser.add_argument(
        "--batch-max-parts",
        type=int,
        default=1,
        help="client transactions coordinated as one Accord transaction at most (1 = no batching)",
    )
    parser.add_argument(
        "--batch-window-ms",
        type=float,
        default=10.0,
        help="with batching, how long the simulated host holds a submission at most",
    )
    parser.add_argument(
        "--reconcile", action="store_true", help="run each seed twice and compare trace digests"
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per seed, then a summary"
    )
    return parser


def _line(result: RunResult) -> str:
    p50_ms = result.percentile_micros(0.5) / 1000
    p99_ms = result.percentile_micros(0.99) / 1000
    return (
        f"seed={result.seed} txns={result.txns} ok={result.ok} fail={result.failed} "
        f"unknown={result.unknown} fast-path={result.fast_path_share:.0%} p50={p50_ms:.1f}ms "
        f"p99={p99_ms:.1f}ms recoveries={result.recoveries} invalidations={result.invalidations} "
        f"crashes={result.crashes}{_batches(result)} verdict={result.verdict_text()}"
    )


def _batches(result: RunResult) -> str:
    batches = result.parts_per_batch
    txns = sum(batches.values())
    if not any(parts > 1 for parts in batches):
        return ""
    parts = sum(parts * count for parts, count in batches.items())
    return f" parts/batch={parts / txns:.2f} (max {max(batches)})"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = BurnConfig(
            nodes=args.nodes,
            rf=args.rf,
            txns=args.txns,
            clients=args.clients,
            keys=args.keys,
            workload=args.workload,
            faults=Faults.parse(args.faults),
            reorder_buffer_micros=int(args.reorder_buffer_ms * 1000),
            electorate=args.electorate,
            electorate_preference=args.electorate_preference,
            shards_per_node=args.shards_per_node,
            recover_delay_micros=(
                None if args.recover_delay_ms is None else int(args.recover_delay_ms * 1000)
            ),
            recover_delay_adaptive=not args.fixed_recover_delay,
            coordinator_crash_chance=args.coordinator_crash_chance,
            long_delay_chance=args.long_delay_chance,
            bugs=Bugs(**dict.fromkeys(args.bug, True)),
            shared_storage=args.shared_storage,
            batch_max_parts=args.batch_max_parts,
            batch_window_micros=int(args.batch_window_ms * 1000),
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failures = 0
    total_txns = 0
    cpu = 0.0
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        result = run_seed(seed, config)
        total_txns += result.txns
        cpu += result.cpu_seconds
        if args.reconcile:
            again = run_seed(seed, config)
            if again.digest != result.digest:
                result.error = f"nondeterminism: trace digest {result.digest} then {again.digest}"
        if not result.passed:
            failures += 1
        print(json.dumps(result.to_json()) if args.json else _line(result), flush=True)
    summary = {
        "seeds": args.seeds,
        "failed_seeds": failures,
        "txns": total_txns,
        "cpu_seconds": round(cpu, 2),
        "txns_per_cpu_second": round(total_txns / cpu) if cpu else 0,
    }
    print(json.dumps(summary) if args.json else " ".join(f"{k}={v}" for k, v in summary.items()))
    return 1 if failures else 0
