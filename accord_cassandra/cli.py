"""``accord-cassandra``: run a sidecar, a local cluster, the demo, or one transaction."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from accord_cassandra.config import ConfigError, load


def _log_setup(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )


def _sidecar(args: argparse.Namespace) -> int:
    import os

    from accord_cassandra.config import unknown_environment

    for name in unknown_environment(os.environ):
        _err(f"warning: {name} sets no config field; ignored")
    try:
        config = load(Path(args.config))
    except ConfigError as error:
        _err(str(error))
        return 2
    # Only a config that loaded needs the server: a bad one is refused without its imports
    # (measured: 0.08 of 0.49 s of import CPU).
    from accord_cassandra.server import StartupError, serve

    _log_setup(args.log_level)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        logging.getLogger(__name__).info("uvloop unavailable; using the default event loop")
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(config))
    except (StartupError, ConfigError) as error:
        # A port that cannot be bound, a journal that cannot be opened, a peers_file that
        # is not one: one line naming the setting, not a traceback.
        _err(str(error))
        return 1
    return 0


def _cluster_up(args: argparse.Namespace) -> int:
    from accord_cassandra.cluster import BANK_SCHEMA_CQL, LocalSidecars

    directory = Path(args.dir or tempfile.mkdtemp(prefix="accord-cluster-"))
    cassandra = None
    launched = None
    if args.cassandra:
        from accord_cassandra.launcher import ClusterSpec, LauncherError, LocalCluster

        try:
            launched = LocalCluster(
                ClusterSpec(nodes=args.nodes, first_ip=args.cassandra_first_ip),
                directory / "cassandra",
            )
            launched.start()
        except LauncherError as error:
            _err(f"cannot start Cassandra: {error}")
            if launched is not None:
                launched.stop()
            return 1
        session = launched.connect()
        for statement in BANK_SCHEMA_CQL:
            session.execute(statement)
        cassandra = {"contact_points": launched.contact_points, "keyspaces": ["bank"]}
    cluster = LocalSidecars(
        directory,
        nodes=args.nodes,
        store="cassandra" if args.cassandra else "memory",
        cassandra=cassandra,
        host=args.host,
        log_level=args.log_level,
    )
    try:
        cluster.start()
        for sidecar in cluster.sidecars.values():
            _out(
                f"sidecar {sidecar.node_id}: {sidecar.address} metrics "
                f"http://{sidecar.metrics_address}/metrics log {sidecar.log_path}"
            )
        _out(f"configs and journals in {directory}; Ctrl-C stops the cluster")
        while all(s.alive() for s in cluster.sidecars.values()):
            time.sleep(0.5)
        _err("a sidecar exited; stopping the cluster")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()
        if launched is not None:
            launched.stop()


def _demo(args: argparse.Namespace) -> int:
    from accord_cassandra.demo import run

    report = run(seconds=args.seconds, concurrency=args.concurrency)
    for name, value in report.items():
        _out(f"{name}: {value}")
    conserved = report["total_before"] == report["total_after"]
    _out("total conserved" if conserved else "TOTAL NOT CONSERVED")
    return 0 if conserved else 1


def _txn(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from accord_cassandra.client import Client, TransactionError
    from accord_cassandra.v1 import client_pb2

    if args.cql is not None:
        return _txn_cql(args)
    if args.request is None:
        _err("txn: give a TransactRequest in JSON or --cql FILE")
        return 2
    request = client_pb2.TransactRequest()
    try:
        json_format.Parse(args.request, request)
    except json_format.ParseError as error:
        _err(f"not a TransactRequest in JSON: {error}")
        return 2
    with Client(args.address, token=args.token) as client:
        try:
            result = client.transact(request)
        except TransactionError as error:
            _err(str(error))
            return 1
    _out(json.dumps(dataclasses.asdict(result), default=_json_value, sort_keys=True))
    return 0


def _txn_cql(args: argparse.Namespace) -> int:
    import yaml

    from accord_cassandra.client import Client, TransactionError
    from accord_cassandra.cql import CqlError, bind

    try:
        text = sys.stdin.read() if args.cql == "-" else Path(args.cql).read_text()
        loaded = yaml.safe_load(Path(args.schema).read_text()) if args.schema else None
        params = json.loads(args.params) if args.params else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        _err(f"txn --cql: {error}")
        return 2
    # A sidecar config (its tables:) or the tables mapping itself.
    tables = loaded.get("tables", loaded) if isinstance(loaded, dict) else None
    if not isinstance(tables, dict):
        _err("txn --cql needs --schema FILE: a sidecar config or its tables: mapping (YAML)")
        return 2
    try:
        bound = bind(text, params, tables)
    except CqlError as error:
        _err(str(error))
        return 2
    with Client(args.address, token=args.token) as client:
        try:
            result = bound.result(client.transact(bound.transaction))
        except TransactionError as error:
            _err(str(error))
            return 1
    out = {
        "applied": result.applied,
        "columns": result.columns,
        "rows": [list(row) for row in result.rows],
        "txn_id": result.result.txn_id,
        "error": result.result.error,
    }
    _out(json.dumps(out, default=_json_value, sort_keys=True))
    return 0


def _json_value(value: object) -> object:
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    raise TypeError(f"{type(value).__name__} is not JSON")


# The CLI's output is its interface, so it writes to the streams directly (no print: the
# linter keeps print out of library code).
def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(f"accord-cassandra: {text}\n")


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["cqlsh"]:
        # Everything after the word is cqlsh's own arguments, -h and -f included.
        from accord_cassandra.cqlsh import main as cqlsh_main

        return cqlsh_main(args_in[1:])
    parser = argparse.ArgumentParser(prog="accord-cassandra", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sidecar = commands.add_parser("sidecar", help="run one sidecar")
    sidecar.add_argument("--config", required=True)
    sidecar.add_argument("--log-level", default="info")
    sidecar.set_defaults(run=_sidecar)
    cluster = commands.add_parser("cluster", help="local clusters")
    cluster_commands = cluster.add_subparsers(dest="action", required=True)
    up = cluster_commands.add_parser("up", help="run sidecars (and Cassandra) until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument(
        "--cassandra", action="store_true", help="real Cassandra nodes from the launcher"
    )
    up.add_argument(
        "--cassandra-first-ip",
        default="127.0.0.1",
        help="loopback address of the first Cassandra node (node i listens on first + i - 1)",
    )
    up.add_argument("--dir", help="folder for configs, journals and logs")
    up.add_argument("--host", default="127.0.0.1", help="address the sidecars listen on")
    up.add_argument("--log-level", default="info", help="the sidecars' log level")
    up.set_defaults(run=_cluster_up)
    commands.add_parser(
        "cqlsh", help="cqlsh that can send BEGIN TRANSACTION … COMMIT TRANSACTION", add_help=False
    )
    demo = commands.add_parser("demo", help="bank transfers on a local 3-sidecar cluster")
    demo.add_argument("--seconds", type=float, default=10.0)
    demo.add_argument("--concurrency", type=int, default=16)
    demo.set_defaults(run=_demo)
    txn = commands.add_parser(
        "txn", help="submit one transaction (TransactRequest as JSON, or --cql text)"
    )
    txn.add_argument("--address", default="127.0.0.1:50051")
    txn.add_argument("--token")
    txn.add_argument(
        "--cql", metavar="FILE", help="BEGIN TRANSACTION … text from FILE, - for stdin"
    )
    txn.add_argument("--schema", metavar="FILE", help="with --cql: sidecar config or tables (YAML)")
    txn.add_argument("--params", metavar="JSON", help="with --cql: bind values, a list or object")
    txn.add_argument(
        "request",
        nargs="?",
        help='e.g. {"lets":[{"name":"a","row":{"keyspace":"bank","table":"accounts",'
        '"partitionKey":[{"text":"alice"}]}}]}; a slice: {"lets":[{"name":"s","row":{...},'
        '"slice":{"column":"at","lower":{"value":{"int":"1"},"inclusive":true},"limit":10}}]}',
    )
    txn.set_defaults(run=_txn)
    args = parser.parse_args(argv)
    return int(args.run(args))
