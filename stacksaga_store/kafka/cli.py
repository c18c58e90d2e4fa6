"""``python -m stacksaga_store.kafka {fetch,up,down,status,demo}``: local Kafka brokers (KRaft)
for tests and demos, and the Kafka saga demo."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from accord_cassandra.launcher.maven import read_marker
from accord_cassandra.launcher.probes import tcp_open
from stacksaga_store.errors import StackSagaError
from stacksaga_store.kafka.broker import STATE_FILE, BrokerSpec, LocalKafka, default_first_ip
from stacksaga_store.kafka.jars import cache_root, default_version, fetch


def default_base_dir() -> Path:
    return cache_root() / "brokers"


def _cmd_fetch(args: argparse.Namespace) -> int:
    lib = fetch(args.version)
    marker = read_marker(lib.parent) or {}
    jars, size = len(marker.get("jars", [])), marker.get("bytes", 0) / 1e6
    print(f"kafka_2.13 {args.version or default_version()}: {jars} jars, {size:.1f} MB in {lib}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    if (args.base_dir / STATE_FILE).exists() and LocalKafka.attach(args.base_dir).running():
        print(f"error: brokers already run from {args.base_dir}; run `down` first", file=sys.stderr)
        return 1
    spec = BrokerSpec(
        brokers=args.brokers,
        first_ip=args.first_ip or default_first_ip(),
        **({"heap_mb": args.heap_mb} if args.heap_mb else {}),
        **({"version": args.version} if args.version else {}),
        sasl_users=dict(_user(text) for text in args.sasl_user),
    )
    kafka = LocalKafka(spec, args.base_dir, start_timeout=args.timeout)
    started = time.monotonic()
    kafka.start(clean=True)
    seconds = time.monotonic() - started
    print(f"{spec.brokers} broker(s) up in {seconds:.1f} s: {spec.bootstrap_servers}")
    _print_status(kafka)
    return 0


def _user(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise StackSagaError(f"--sasl-user {user or text!r}: expected USER:PASSWORD")
    return user, password


def _cmd_down(args: argparse.Namespace) -> int:
    if not (args.base_dir / STATE_FILE).exists():
        print(f"nothing recorded in {args.base_dir}; nothing to stop")
        return 0
    kafka = LocalKafka.attach(args.base_dir)
    stopped = kafka.running()
    kafka.stop(clean=args.clean)
    print(f"stopped brokers {stopped or 'none (none was running)'}")
    if args.clean:
        shutil.rmtree(args.base_dir, ignore_errors=True)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    kafka = LocalKafka.attach(args.base_dir)
    _print_status(kafka)
    return 0 if kafka.running() == list(kafka.spec.indexes) else 3


def _print_status(kafka: LocalKafka) -> None:
    for index in kafka.spec.indexes:
        alive = kafka.is_running(index)
        ip = kafka.spec.ip(index)
        port = "port open" if alive and tcp_open(ip, kafka.spec.client_port) else "port closed"
        rss = kafka.rss_mib(index)
        extra = f" rss {rss:.0f} MiB" if rss else ""
        state = "alive" if alive else "stopped"
        pid = kafka.pid(index) or "-"
        print(f"broker{index} {ip}:{kafka.spec.client_port} pid {pid} {state} {port}{extra}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from stacksaga_store.kafka.demo import main as demo_main

    return demo_main(seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stacksaga_store.kafka",
        description="Fetch Kafka 4 jars, run local KRaft brokers on 127.0.73.x, run the demo.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = sub.add_parser("fetch", help="resolve the broker jars into the cache")
    fetch_cmd.add_argument("--version", default=None)

    up = sub.add_parser("up", help="start brokers (their old data is deleted)")
    up.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    up.add_argument("--first-ip", default=None, help="broker i gets first-ip + i - 1")
    up.add_argument("--heap-mb", type=int, default=None)
    up.add_argument("--timeout", type=float, default=None, help="seconds to wait for readiness")
    up.add_argument("--version", default=None)
    up.add_argument(
        "--sasl-user",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="SASL_PLAINTEXT + PLAIN on the client port with these accounts (repeat; the "
        "first is the brokers' own identity)",
    )

    down = sub.add_parser("down", help="stop the brokers recorded in the state file")
    down.add_argument("--clean", action="store_true", help="also delete the broker folders")
    sub.add_parser("status", help="list brokers, pids, ports and RSS")

    demo = sub.add_parser("demo", help="broker + Cassandra node + workers: a saga via Kafka")
    demo.add_argument("--seconds", type=float, default=60.0, help="give up after this long")
    for command in (up, down, sub.choices["status"]):
        command.add_argument("--base-dir", type=Path, default=None)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fetch": _cmd_fetch,
    "up": _cmd_up,
    "down": _cmd_down,
    "status": _cmd_status,
    "demo": _cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    if hasattr(args, "base_dir"):
        args.base_dir = (args.base_dir or default_base_dir()).expanduser()
    try:
        return COMMANDS[args.command](args)
    except StackSagaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
