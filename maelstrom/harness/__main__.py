"""``python -m maelstrom.harness``: run a Maelstrom-style test, or re-check a history.

Examples::

    python -m maelstrom.harness --workload lin-kv --node-count 5 --time-limit 30 \\
        --rate 50 --concurrency 2n --latency 5 --latency-dist exponential \\
        --nemesis partition --nemesis-interval 5 --seed 1
    python -m maelstrom.harness --workload txn-list-append --node-count 5 --time-limit 30 \\
        --rate 50 --nemesis partition --seed 2 -- --replication-factor 3
    python -m maelstrom.harness --recheck results/maelstrom/lin-kv/latest/history.json

Arguments after ``--`` are passed to every node. Exit status: 0 valid, 1 invalid,
2 unknown (including an aborted run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import random
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from maelstrom.harness.net import LATENCY_DISTRIBUTIONS, PARTITION_SHAPES, Latency
from maelstrom.harness.report import (
    Analysis,
    CheckOptions,
    analyse,
    exit_code,
    results_mapping,
    write_results,
)
from maelstrom.harness.runner import RunConfig, Runner
from maelstrom.history import WORKLOADS, load
from maelstrom.linearizable import DEFAULT_MAX_STATES
from maelstrom.porcupine_driver import DEFAULT_CHECK_TIMEOUT_SECONDS, DEFAULT_MAX_HEAP_MB

logger = logging.getLogger("maelstrom.harness")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m maelstrom.harness",
        description="Run Maelstrom-protocol nodes under a workload and a partition nemesis, "
        "then check the history in-repo and with Porcupine. Arguments after -- go to nodes.",
    )
    parser.add_argument("-w", "--workload", choices=sorted(WORKLOADS))
    parser.add_argument("--node-count", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds (30)")
    parser.add_argument("--rate", type=float, default=5.0, help="invocations per second (5)")
    parser.add_argument(
        "--concurrency", default="", help="threads: an integer or Maelstrom's 'Nn' (e.g. 2n)"
    )
    parser.add_argument("--latency", type=float, default=0.0, help="mean node latency, ms")
    parser.add_argument("--latency-dist", choices=LATENCY_DISTRIBUTIONS, default="constant")
    parser.add_argument("--nemesis", default="", help="'partition' or empty for none")
    parser.add_argument("--nemesis-interval", type=float, default=10.0, help="seconds (10)")
    parser.add_argument(
        "--partition-shapes",
        default=",".join(PARTITION_SHAPES),
        help=f"comma-separated subset of {','.join(PARTITION_SHAPES)}",
    )
    parser.add_argument("--seed", type=int, default=None, help="random if omitted (printed)")
    parser.add_argument("--bin", default=None, help="node executable (python -m maelstrom.node)")
    # Maelstrom writes to store/; here the default sits under results/, which git ignores.
    parser.add_argument(
        "--store",
        default="results/maelstrom",
        help="results go to STORE/<workload>/<time> (results/maelstrom)",
    )
    parser.add_argument("--results-dir", default=None, help="exact results directory")
    parser.add_argument("--timeout-ms", type=float, default=0.0, help="client timeout override")
    parser.add_argument("--per-key-limit", type=int, default=100, help="lin-kv ops per key")
    parser.add_argument("--key-count", type=int, default=10, help="txn active keys")
    parser.add_argument("--max-txn-length", type=int, default=4)
    parser.add_argument("--max-writes-per-key", type=int, default=16)
    parser.add_argument("--no-porcupine", action="store_true", help="skip the Porcupine check")
    parser.add_argument(
        "--porcupine-timeout", type=float, default=float(DEFAULT_CHECK_TIMEOUT_SECONDS)
    )
    parser.add_argument(
        "--porcupine-max-heap-mb", type=int, default=DEFAULT_MAX_HEAP_MB, help="(2048)"
    )
    parser.add_argument("--max-states", type=int, default=DEFAULT_MAX_STATES)
    parser.add_argument("--recheck", default=None, help="check a history.json; run nothing")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def _concurrency(text: str, node_count: int) -> int:
    if not text:
        return 0
    if text.endswith("n"):
        return int(text[:-1] or "1") * node_count
    return int(text)


def _config(args: argparse.Namespace, node_args: Sequence[str]) -> RunConfig:
    command: tuple[str, ...] = (sys.executable, "-m", "maelstrom.node")
    if args.bin:
        command = tuple(shlex.split(args.bin))
    return RunConfig(
        workload=args.workload,
        node_count=args.node_count,
        time_limit_s=args.time_limit,
        rate=args.rate,
        concurrency=_concurrency(args.concurrency, args.node_count),
        latency=Latency(args.latency, args.latency_dist),
        nemesis=tuple(n for n in args.nemesis.split(",") if n and n != "none"),
        nemesis_interval_s=args.nemesis_interval,
        partition_shapes=tuple(s for s in args.partition_shapes.split(",") if s),
        seed=args.seed,
        node_command=command,
        node_args=tuple(node_args),
        timeout_ms=args.timeout_ms,
        per_key_limit=args.per_key_limit,
        key_count=args.key_count,
        max_txn_length=args.max_txn_length,
        max_writes_per_key=args.max_writes_per_key,
    )


def _print_checks(analysis: Analysis) -> None:
    for check in analysis.checks:
        print(f"  {check.checker}: valid? {_word(check.valid)} - {check.summary}")
    if not analysis.agree:
        print("  CHECKERS DISAGREE: in-repo and Porcupine reached different verdicts")


def _word(valid: bool | None) -> str:
    return "unknown" if valid is None else str(valid).lower()


def _recheck(path: str, options: CheckOptions) -> int:
    try:
        workload, events = load(path)
        analysis = analyse(workload, events, options)
    except (OSError, ValueError, KeyError, TypeError) as error:
        # A history this tool did not write, or a damaged one: say which, exit unknown.
        print(f"cannot check {path}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(f"{workload} history {path}: {len(events)} events")
    _print_checks(analysis)
    print(f"valid? {_word(analysis.valid)}")
    return exit_code(analysis.valid)


def _results_dir(args: argparse.Namespace) -> Path:
    if args.results_dir:
        return Path(args.results_dir)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%f")[:-3]
    return Path(str(args.store)) / str(args.workload) / stamp


def _link_latest(results_dir: Path) -> None:
    latest = results_dir.parent / "latest"
    try:
        if latest.is_symlink():
            latest.unlink()
        if not latest.exists():
            latest.symlink_to(results_dir.name)
    except OSError as error:
        # A convenience only; a filesystem without symlinks loses nothing else.
        logger.info("could not link %s: %s", latest, error)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    node_args: list[str] = []
    if "--" in raw:
        split = raw.index("--")
        raw, node_args = raw[:split], raw[split + 1 :]
    parser = _parser()
    args = parser.parse_args(raw)
    logging.basicConfig(
        level=str(args.log_level).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = CheckOptions(
        porcupine=not args.no_porcupine,
        porcupine_timeout_s=args.porcupine_timeout,
        porcupine_max_heap_mb=args.porcupine_max_heap_mb,
        max_states=args.max_states,
    )
    if args.recheck:
        return _recheck(args.recheck, options)
    if not args.workload:
        parser.error("--workload is required (or --recheck)")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    try:
        config = _config(args, node_args)
    except ValueError as error:
        parser.error(str(error))
    results_dir = _results_dir(args)
    results_dir.mkdir(parents=True, exist_ok=True)
    if not args.results_dir:
        _link_latest(results_dir)
    print(f"{config.workload}: {config.node_count} nodes, seed={config.seed}, -> {results_dir}")
    record = Runner(config, results_dir).run()
    analysis = analyse(config.workload, record.events, options, results_dir=results_dir)
    mapping = results_mapping(record, analysis)
    write_results(results_dir, record, mapping, analysis.checks)
    valid = mapping["valid?"]
    verdict = valid if isinstance(valid, bool) else None
    stats, net = mapping["stats"], mapping["net"]["servers"]
    print(
        f"ops: {stats['count']} ({stats['ok-count']} ok, {stats['fail-count']} fail, "
        f"{stats['info-count']} info); availability {mapping['availability']['ok-fraction']}"
    )
    print(f"latency ms (ok): {json.dumps(mapping['latency-ms']['ok'])}")
    print(
        f"net: {net['send-count']} server msgs ({net['msgs-per-op']}/op), "
        f"{net['dropped-count']} dropped by {record.partitions} partitions; "
        f"{mapping['net']['clients']['send-count']} client msgs"
    )
    for name, check in mapping["workload"]["checkers"].items():
        print(f"  {name}: valid? {_word(verdict_of(check['valid?']))} - {check['summary']}")
    if not analysis.agree:
        print("  CHECKERS DISAGREE: in-repo and Porcupine reached different verdicts")
    print(f"valid? {_word(verdict)}  (seed={config.seed}, results in {results_dir})")
    if verdict is True:
        print("Everything looks good!")
    elif verdict is False:
        print("Analysis invalid!")
    else:
        print("Errors occurred during analysis, but no anomalies found.")
    return exit_code(verdict)


def verdict_of(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
