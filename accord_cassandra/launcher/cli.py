"""The launcher CLI: `python -m accord_cassandra.launcher {fetch,up,down,status}`, installed
as `accord-cassandra-launcher` too."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from accord_cassandra.launcher.cluster import STATE_FILE, LocalCluster
from accord_cassandra.launcher.maven import cache_root, fetch, read_marker
from accord_cassandra.launcher.probes import tcp_open
from accord_cassandra.launcher.process import rss_kib
from accord_cassandra.launcher.spec import (
    ENV_HEAP,
    ENV_VERSION,
    ClusterSpec,
    LauncherError,
    check_version,
    default_heap_mb,
    default_version,
)


def default_base_dir() -> Path:
    return cache_root() / "cluster"


def _cmd_fetch(args: argparse.Namespace) -> int:
    lib = fetch(args.version)
    marker = read_marker(lib.parent) or {}
    jars, size = len(marker.get("jars", [])), marker.get("bytes", 0) / 1e6
    print(f"cassandra-all {args.version}: {jars} jars, {size:.1f} MB in {lib}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    spec = ClusterSpec(
        nodes=args.nodes, first_ip=args.first_ip, heap_mb=args.heap_mb, version=args.version
    )
    if (args.base_dir / STATE_FILE).exists() and LocalCluster.attach(args.base_dir).running():
        print(
            f"error: a cluster already runs from {args.base_dir}; run `down` first", file=sys.stderr
        )
        return 1
    cluster = LocalCluster(spec, args.base_dir, start_timeout=args.timeout)
    started = time.monotonic()
    cluster.start(clean=args.clean)
    cluster.detach()
    print(f"{spec.nodes} node(s) up in {time.monotonic() - started:.1f} s from {cluster.base_dir}")
    _print_status(cluster)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    if not (args.base_dir / STATE_FILE).exists():
        print(f"nothing recorded in {args.base_dir}; nothing to stop")
        if args.clean:
            shutil.rmtree(args.base_dir, ignore_errors=True)
        return 0
    cluster = LocalCluster.attach(args.base_dir)
    stopped = cluster.running()
    cluster.stop(clean=args.clean)
    print(f"stopped nodes {stopped or 'none (none was running)'}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster.attach(args.base_dir)
    _print_status(cluster)
    return 0 if cluster.running() else 3


def _print_status(cluster: LocalCluster) -> None:
    for index in cluster.spec.indexes:
        pid = cluster.node_pid(index)
        alive = cluster.is_running(index)
        ip = cluster.spec.ip(index)
        cql = "cql up" if alive and tcp_open(ip, cluster.native_port) else "cql down"
        kib = rss_kib(pid) if alive and pid else None
        rss = f"rss {kib // 1024} MiB" if kib else ""
        state = "alive" if alive else "stopped"
        print(f"node{index} {ip} pid {pid or '-'} {state} {cql} {rss}".rstrip())


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", default=None, help=f"cassandra-all 5.0.x (env {ENV_VERSION})")


def _add_base_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-dir", type=Path, default=None, help="node folders and state file (default: cache)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m accord_cassandra.launcher",
        description="Fetch Cassandra 5.0 jars and run local test nodes on 127.0.0.x.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_version(sub.add_parser("fetch", help="resolve the server jars into the cache"))

    up = sub.add_parser("up", help="start nodes one after another")
    up.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    _add_base_dir(up)
    up.add_argument("--clean", action="store_true", help="delete old node data first")
    up.add_argument("--first-ip", default="127.0.0.1", help="node i gets first-ip + i - 1")
    up.add_argument("--heap-mb", type=int, default=None, help=f"per node (env {ENV_HEAP})")
    up.add_argument("--timeout", type=float, default=None, help="seconds per node start")
    _add_version(up)

    down = sub.add_parser("down", help="stop the nodes recorded in the state file")
    _add_base_dir(down)
    down.add_argument("--clean", action="store_true", help="also delete the node folders")

    _add_base_dir(sub.add_parser("status", help="list nodes, pids and whether they are alive"))
    return parser


def _apply_defaults(args: argparse.Namespace) -> None:
    if hasattr(args, "version"):
        args.version = check_version(args.version or default_version())
    if hasattr(args, "base_dir"):
        args.base_dir = (args.base_dir or default_base_dir()).expanduser()
    if hasattr(args, "heap_mb"):
        args.heap_mb = args.heap_mb or default_heap_mb()


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fetch": _cmd_fetch,
    "up": _cmd_up,
    "down": _cmd_down,
    "status": _cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # The driver reports every host it discovers at INFO; only the launcher's progress matters.
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        _apply_defaults(args)
        return COMMANDS[args.command](args)
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
