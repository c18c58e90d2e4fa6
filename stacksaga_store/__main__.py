"""``python -m stacksaga_store``: schema apply/check/print, show a transaction, run the demo,
show the recovery directory, run a ring coordinator or a Retry-Node.

Exit codes: 0 success; 1 the schema check found errors (or the demo ended wrongly);
2 bad configuration or usage; 3 Cassandra unreachable or a node failed to start.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from stacksaga_store.config.driver import load_driver_config
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.errors import ConfigError, SchemaMismatchError, TransactionNotFoundError
from stacksaga_store.saga.definition import Saga
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.cql import StoreUnavailableError
from stacksaga_store.store.schema import Severity, apply_schema, check_schema, schema_cql

EXIT_OK, EXIT_PROBLEMS, EXIT_CONFIG, EXIT_UNAVAILABLE = 0, 1, 2, 3
# The errors a command ends with, printed, and their exit codes (the module docstring's).
ERROR_EXITS: dict[type[Exception], int] = {
    ConfigError: EXIT_CONFIG,
    SchemaMismatchError: EXIT_PROBLEMS,
    TransactionNotFoundError: EXIT_PROBLEMS,
    StoreUnavailableError: EXIT_UNAVAILABLE,
}
DEMO_NODE_IP = "127.0.2.1"


def _out(line: str) -> None:
    """A long-running command's report line, flushed at once (a supervisor reads it)."""
    print(line, flush=True)


def _settings(args: argparse.Namespace) -> StackSagaSettings:
    return load_settings(args.config)


def cmd_schema(args: argparse.Namespace) -> int:
    settings = _settings(args)
    driver = load_driver_config(settings)
    schema = settings.cassandra.schema_
    if args.action == "print":
        print(schema_cql(driver.keyspace, schema), end="")
        return EXIT_OK
    cluster, session = connect_sync(settings, driver)
    try:
        if args.action == "apply":
            report = apply_schema(session, driver.keyspace, schema)
            _apply_extensions(settings, session, driver.keyspace)
            created = ", ".join(report.created_tables) or "none"
            print(
                f"keyspace {report.keyspace}: created keyspace={report.created_keyspace}, "
                f"created tables: {created}"
            )
            for warning in report.warnings:
                print(warning)
            return EXIT_OK
        problems = check_schema(session, driver.keyspace, schema)
    finally:
        cluster.shutdown()
    for problem in problems:
        print(problem)
    errors = [p for p in problems if p.severity is Severity.ERROR]
    print(f"keyspace {driver.keyspace}: " + (f"{len(errors)} error(s)" if errors else "OK"))
    return EXIT_PROBLEMS if errors else EXIT_OK


def _apply_extensions(settings: StackSagaSettings, session: object, keyspace: str) -> None:
    """The recovery engine's extension table es_ring_state. (The accord commit mode needs
    nothing more: its sidecars serve the seed's tables in this keyspace; start them after
    the schema exists, since a sidecar reads its keyspaces' tables at start-up.)"""
    from stacksaga_store.store.extension_schema import apply_coordination_schema

    apply_coordination_schema(session, keyspace, settings.cassandra.schema_)
    print(f"keyspace {keyspace}: es_ring_state ensured")


def cmd_show(args: argparse.Namespace) -> int:
    from stacksaga_store.demo import describe
    from stacksaga_store.store.model import TransactionKey

    settings = _settings(args)
    try:
        uuid.UUID(args.transaction_id)
    except ValueError:
        print(f"error: {args.transaction_id!r} is not a transaction id (UUID)", file=sys.stderr)
        return EXIT_CONFIG

    async def show() -> list[str]:
        runtime = await open_runtime(settings)
        try:
            key = TransactionKey.of(settings.instance, uuid.UUID(args.transaction_id))
            return describe(await runtime.events.read(key))
        finally:
            await runtime.close()

    for line in asyncio.run(show()):
        print(line)
    return EXIT_OK


def cmd_directory(args: argparse.Namespace) -> int:
    from stacksaga_store.clock import SystemClock
    from stacksaga_store.recovery.directory import DirectoryScope
    from stacksaga_store.recovery.directory_show import render_directory
    from stacksaga_store.recovery.engine import RecoveryEngine

    settings = _settings(args)
    instance = settings.instance
    scope = DirectoryScope(
        args.region or instance.region,
        args.cluster or instance.cluster,
        args.service or instance.service_name,
    )
    recovery = settings.cassandra.recovery

    async def show() -> list[str]:
        runtime = await open_runtime(settings)
        try:
            engine = await RecoveryEngine.open(runtime)
            try:
                return await render_directory(
                    directory=engine.directory,
                    commit=engine.commit,
                    scope=scope,
                    windows=engine.writer.windows,
                    now=SystemClock().now(),
                    lookback_days=recovery.retry.lookback_days,
                    delay_windows=recovery.restore.delay_windows,
                )
            finally:
                await engine.close()
        finally:
            await runtime.close()

    for line in asyncio.run(show()):
        print(line)
    return EXIT_OK


def cmd_coordinator(args: argparse.Namespace) -> int:
    from stacksaga_store.ring.server import serve_coordinator

    settings = _settings(args)
    return asyncio.run(serve_coordinator(settings, listen=args.listen, coordinator_id=args.id))


def load_sagas(spec: str) -> list[Saga]:
    """``module:attribute`` naming a Saga, an iterable of them, or a callable returning either."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError.single("--sagas", f"expected module:attribute, got {spec!r}")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError.single("--sagas", f"cannot load {spec!r}: {exc}") from exc
    if callable(found) and not isinstance(found, Saga):
        found = found()
    sagas = [found] if isinstance(found, Saga) else list(found)
    if not sagas or not all(isinstance(saga, Saga) for saga in sagas):
        raise ConfigError.single("--sagas", f"{spec!r} is not a Saga or a list of Sagas")
    return sagas


def cmd_retry_node(args: argparse.Namespace) -> int:
    from stacksaga_store.recovery.service import serve_retry_node

    settings = _settings(args)
    sagas = load_sagas(args.sagas)

    return asyncio.run(
        serve_retry_node(
            settings,
            sagas,
            node_id=args.node_id,
            metrics_listen=args.metrics_listen,
            out=_out,
        )
    )


def cmd_coordinator_key(args: argparse.Namespace) -> int:
    from stacksaga_store.ring.auth import node_key

    secret = _settings(args).cassandra.recovery.coordinator.secret
    if secret is None:
        raise ConfigError.single(
            "stacksaga.cassandra.recovery.coordinator.secret", "is needed to derive node keys"
        )
    print(node_key(secret.get_secret_value().encode(), args.node_id).hex())
    return EXIT_OK


def _admin_token(args: argparse.Namespace) -> str | None:
    """From --admin-token-file (first line) or STACKSAGA_CONSOLE_ADMIN_TOKEN; never argv."""
    import os

    if args.admin_token_file is not None:
        try:
            token = args.admin_token_file.read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise ConfigError.single("--admin-token-file", f"cannot read a token: {exc}") from exc
    else:
        token = os.environ.get("STACKSAGA_CONSOLE_ADMIN_TOKEN", "").strip()
    if token and len(token) < 16:
        raise ConfigError.single("admin token", "must be at least 16 characters")
    return token or None


def cmd_console(args: argparse.Namespace) -> int:
    from accord_cassandra.ports import split_address
    from stacksaga_store.console.server import serve_console

    try:
        split_address(args.listen)
    except ValueError as exc:
        raise ConfigError.single("--listen", str(exc)) from None
    if args.live_interval < 0.2 or args.live_interval > 60:
        raise ConfigError.single("--live-interval", "must be within 0.2..60 seconds")

    if args.demo:
        return _console_demo(args, _out)
    settings = _settings(args)
    sagas = load_sagas(args.sagas) if args.sagas else []

    return asyncio.run(
        serve_console(
            settings,
            listen=args.listen,
            admin_token=_admin_token(args),
            sagas=sagas,
            sidecars=args.sidecar_metrics or [],
            recovery_metrics=args.recovery_metrics or [],
            live_interval=args.live_interval,
            out=_out,
        )
    )


def _console_demo(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    from stacksaga_store.console.demo import run_console_demo

    def run(points: list[tuple[str, int]]) -> int:
        return asyncio.run(
            run_console_demo(
                points,
                listen=args.listen,
                admin_token=_admin_token(args),
                interval=args.demo_interval,
                out=out,
            )
        )

    return _on_demo_node(args, "stacksaga-console-demo-", out, run)


def cmd_demo(args: argparse.Namespace) -> int:
    from stacksaga_store.demo import run_demo

    return _on_demo_node(
        args, "stacksaga-demo-", print, lambda points: asyncio.run(run_demo(points, print))
    )


def _on_demo_node(
    args: argparse.Namespace,
    prefix: str,
    out: Callable[[str], None],
    run: Callable[[list[tuple[str, int]]], int],
) -> int:
    """``run(contact points)`` on ``--contact-point``, else on a Cassandra node started on
    ``--node-ip`` in a temporary folder (named ``prefix``...) and stopped afterwards."""
    if args.contact_point:
        host, _, port = args.contact_point.partition(":")
        return run([(host, int(port or 9042))])
    from accord_cassandra.launcher import ClusterSpec, LauncherError, LocalCluster

    with tempfile.TemporaryDirectory(prefix=prefix) as base_dir:
        spec = ClusterSpec(nodes=1, first_ip=args.node_ip, cluster_name="stacksaga_demo")
        cluster = LocalCluster(spec, Path(base_dir))
        out(f"starting a Cassandra node on {args.node_ip}:9042 (takes ~10-30 s) ...")
        try:
            cluster.start()
        except LauncherError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        try:
            return run([(args.node_ip, spec.native_port)])
        finally:
            out("stopping the demo node ...")
            cluster.stop(clean=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stacksaga_store", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML with a `stacksaga:` section")
    parser.add_argument("--log-level", default="WARNING", help="e.g. INFO to see each step")
    sub = parser.add_subparsers(dest="command", required=True)
    schema = sub.add_parser("schema", help="create or verify the keyspace and the 9 tables")
    schema.add_argument("action", choices=("apply", "check", "print"))
    schema.set_defaults(handler=cmd_schema)
    show = sub.add_parser("show", help="print a transaction with its tryout history")
    show.add_argument("transaction_id")
    show.set_defaults(handler=cmd_show)
    directory = sub.add_parser("directory", help="the recovery directory (seed Part 4)")
    directory.add_argument("action", choices=("show",))
    directory.add_argument("--service", help="service-name (default: stacksaga.instance's)")
    directory.add_argument("--region", help="region (default: stacksaga.instance's)")
    directory.add_argument("--cluster", help="cluster (default: stacksaga.instance's)")
    directory.set_defaults(handler=cmd_directory)
    coordinator = sub.add_parser(
        "coordinator", help="run a ring coordinator (master or standby) for this cluster"
    )
    coordinator.add_argument("--listen", default="127.0.0.1:7690", help="host:port to serve")
    coordinator.add_argument("--id", help="this coordinator's id (default: host:port)")
    coordinator.set_defaults(handler=cmd_coordinator)
    retry = sub.add_parser(
        "retry-node", help="run a Retry-Node (SIGTERM: finish in-flight dispatches, exit 0)"
    )
    retry.add_argument("--sagas", required=True, help="module:attribute of the saga definitions")
    retry.add_argument("--node-id", help="this node's id (default: host-pid)")
    retry.add_argument("--metrics-listen", help="host:port for GET /metrics (port 0: any)")
    retry.set_defaults(handler=cmd_retry_node)
    key = sub.add_parser(
        "coordinator-key",
        help="print a Retry-Node's node key (coordinator.node-key) derived from the secret",
    )
    key.add_argument("--node-id", required=True, help="the Retry-Node's node id")
    key.set_defaults(handler=cmd_coordinator_key)
    console = sub.add_parser(
        "console", help="the Trace Window: a web console for sagas, recovery and sidecars"
    )
    console.add_argument("--listen", default="127.0.0.1:4545", help="host:port (port 0: any)")
    console.add_argument(
        "--sagas", help="module:attribute of the saga definitions (needed for admin restore)"
    )
    console.add_argument(
        "--admin-token-file",
        type=Path,
        help="file whose first line is the admin token (else $STACKSAGA_CONSOLE_ADMIN_TOKEN; "
        "none: read-only)",
    )
    console.add_argument(
        "--sidecar-metrics", action="append", help="a sidecar's metrics URL (repeatable)"
    )
    console.add_argument(
        "--recovery-metrics", action="append", help="a Retry-Node's metrics URL (repeatable)"
    )
    console.add_argument(
        "--live-interval", type=float, default=2.0, help="seconds between censuses (live page)"
    )
    console.add_argument(
        "--demo",
        action="store_true",
        help="demo: start a Cassandra node (or use --contact-point), seed sagas, add traffic",
    )
    console.add_argument("--node-ip", default=DEMO_NODE_IP, help="--demo: node's loopback address")
    console.add_argument("--contact-point", help="--demo: use a running Cassandra (host[:port])")
    console.add_argument(
        "--demo-interval", type=float, default=1.0, help="--demo: seconds between new orders"
    )
    console.set_defaults(handler=cmd_console)
    demo = sub.add_parser("demo", help="run the 3-step order saga on a Cassandra node it starts")
    demo.add_argument("--node-ip", default=DEMO_NODE_IP, help="loopback address for the node")
    demo.add_argument("--contact-point", help="use a running Cassandra (host[:port]) instead")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # The driver reports every host and reconnection at INFO; the store's own lines matter here.
    logging.getLogger("cassandra").setLevel(max(logging.WARNING, logging.getLogger().level))
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except tuple(ERROR_EXITS) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return next(code for kind, code in ERROR_EXITS.items() if isinstance(exc, kind))


if __name__ == "__main__":
    sys.exit(main())
