"""The bank transfer through the sidecars' CQL endpoint vs through the gRPC client: the
endpoint's overhead, same cluster, same run.

``run(quick=..., profile=...)`` uses a 3-node Cassandra (``bench_cassandra``: the running
cluster named by ``BENCH_CASSANDRA_CONTACT_POINTS``, or one launched on
``BENCH_CASSANDRA_FIRST_IP``), a bank keyspace at RF 3 and three sidecars, each serving the
CQL endpoint in front of a Cassandra node of its own (``cql_upstream``, ``cassandra_hosts``).
At each concurrency, in alternating order:

* ``native``: cassandra-driver (protocol v4, its default load-balancing policy, one sidecar
  as the contact point: it finds the others through the endpoint) runs the prepared
  ``BEGIN TRANSACTION`` transfer with bound values, ``execute_async`` in a closed loop;
* ``grpc``: :class:`accord_cassandra.client.AsyncClient`, one per sidecar, round robin, the
  same transfer built with the client API (bench.workload.transfer).

Both move 1 between two random accounts of ``keys``. Figures: op/s, p50/p99 (client wall
time per transaction), errors, and per concurrency the overhead ratios (native p50 / gRPC
p50, gRPC op/s / native op/s). Nothing here asserts on time.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from accord_cassandra.client import AsyncClient, TransactionError
from bench.clusters import DDL_TIMEOUT, BenchSidecars, CassandraHandle, bench_cassandra
from bench.report import figure, note
from bench.wan import LAYER_NONE
from bench.workload import LoadError, LoadResult, closed_loop_calls, preload, transfer

TRANSFER = """
BEGIN TRANSACTION
  LET src = (SELECT balance FROM {ks}.accounts WHERE id = ?);
  LET dst = (SELECT balance FROM {ks}.accounts WHERE id = ?);
  SELECT src.balance, dst.balance;
  IF src.balance >= ? THEN
    UPDATE {ks}.accounts SET balance = src.balance - ? WHERE id = ?;
    UPDATE {ks}.accounts SET balance = dst.balance + ? WHERE id = ?;
  END IF
COMMIT TRANSACTION"""
PATHS = ("native", "grpc")


def _plan(quick: bool) -> dict[str, Any]:
    return {
        "keys": 100 if quick else 2000,
        "concurrency": [4] if quick else [1, 8, 32],
        "seconds_per_run": 2.0 if quick else 12.0,
        "warmup_seconds": 0.0 if quick else 8.0,
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    plan = _plan(quick)
    report: dict[str, Any] = {
        "suite": "cql",
        "title": "Bank transfer: CQL native endpoint (cassandra-driver) vs gRPC client",
        "layer": LAYER_NONE,
        "plan": plan,
    }
    with bench_cassandra(3) as cassandra:
        report["cassandra"] = cassandra.description
        keyspace = f"accord_cql_{uuid.uuid4().hex[:8]}"
        runs = _on_cluster(cassandra, keyspace, plan, profile)
    report["runs"] = runs
    report["figures"] = _figures(runs, plan, report["cassandra"])
    return report


def _on_cluster(
    cassandra: CassandraHandle, keyspace: str, plan: dict[str, Any], profile: bool
) -> list[dict[str, Any]]:
    from accord_cassandra.launcher import driver_cluster

    admin = driver_cluster(cassandra.contact_points, cassandra.native_port, timeout=30.0)
    session = admin.connect()
    try:
        session.execute(
            f"CREATE KEYSPACE {keyspace} WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            timeout=DDL_TIMEOUT,
        )
        session.execute(
            f"CREATE TABLE {keyspace}.accounts (id text PRIMARY KEY, balance bigint)",
            timeout=DDL_TIMEOUT,
        )
        points = list(cassandra.contact_points)
        hosts = {node: points[(node - 1) % len(points)] for node in (1, 2, 3)}
        with tempfile.TemporaryDirectory(prefix="bench-cql-") as folder:
            sidecars = BenchSidecars(
                Path(folder),
                nodes=3,
                store="cassandra",
                cassandra={
                    "contact_points": points,
                    "port": cassandra.native_port,
                    "keyspaces": [keyspace],
                },
                extra={"cql_listen": "127.0.0.1:0", "cassandra_hosts": hosts},
                node_extra={
                    node: {"cql_upstream": f"{host}:{cassandra.native_port}"}
                    for node, host in hosts.items()
                },
                profile=profile,
            )
            note("starting 3 sidecars with CQL endpoints on Cassandra")
            with sidecars:
                runs = asyncio.run(_measure(sidecars, keyspace, plan))
        if not cassandra.disposable:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=DDL_TIMEOUT)
    finally:
        admin.shutdown()
    return runs


def _native(session: Any, keyspace: str, keys: list[str], rng: random.Random) -> Any:
    prepared = session.prepare(TRANSFER.format(ks=keyspace))
    loop = asyncio.get_running_loop()

    async def call(index: int) -> bool:
        source, target = rng.sample(keys, 2)
        done: asyncio.Future[Any] = loop.create_future()

        def settle(outcome: Any, failed: bool) -> None:
            if done.done():
                return
            if failed:
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

        future = session.execute_async(
            prepared, (source, target, 1, 1, source, 1, target), timeout=30
        )
        future.add_callbacks(
            lambda rows: loop.call_soon_threadsafe(settle, rows, False),
            lambda error: loop.call_soon_threadsafe(settle, error, True),
        )
        try:
            rows = await done
        except Exception as error:  # noqa: BLE001 - any driver failure, counted by its class
            raise LoadError(type(error).__name__) from None
        return bool(rows[0][0])

    return call


def _grpc(
    clients: list[AsyncClient], keyspace: str, keys: list[str], rng: random.Random
) -> Callable[[int], Awaitable[bool]]:
    async def call(index: int) -> bool:
        source, target = rng.sample(keys, 2)
        try:
            answer = await clients[index % len(clients)].transact(
                transfer(source, target, 1, keyspace)
            )
        except TransactionError as error:
            raise LoadError(error.code) from None
        return answer.applied

    return call


def _summary(path: str, concurrency: int, result: LoadResult) -> dict[str, Any]:
    p50 = percentile(result.latencies_ms, 50)
    p99 = percentile(result.latencies_ms, 99)
    return {
        "path": path,
        "concurrency": concurrency,
        "ops": result.committed,
        "applied": result.applied,
        "seconds": round(result.seconds, 2),
        "ops_per_second": round(result.committed / result.seconds, 1) if result.seconds else 0,
        "p50_ms": None if p50 is None else round(p50, 2),
        "p99_ms": None if p99 is None else round(p99, 2),
        "errors": dict(result.errors),
    }


async def _measure(
    sidecars: BenchSidecars, keyspace: str, plan: dict[str, Any]
) -> list[dict[str, Any]]:
    from cassandra import ProtocolVersion
    from cassandra.cluster import Cluster

    clients = [AsyncClient(s.address, timeout=30.0) for s in sidecars.sidecars.values()]
    keys = [f"acct{i:05d}" for i in range(plan["keys"])]
    host, _, port = sidecars.sidecars[1].cql_address.rpartition(":")
    driver = Cluster(
        [host],
        port=int(port),
        protocol_version=ProtocolVersion.V4,
        connect_timeout=30,
        control_connection_timeout=30,
    )
    rng = random.Random(19)
    try:
        await preload(clients[0], keys, keyspace=keyspace, label="preload accounts")
        session = await asyncio.to_thread(driver.connect)
        known = sorted(str(h.endpoint) for h in driver.metadata.all_hosts())
        note(f"the driver found {known} through {host}:{port}")
        calls = {
            "native": _native(session, keyspace, keys, rng),
            "grpc": _grpc(clients, keyspace, keys, rng),
        }
        if plan["warmup_seconds"]:
            for path in PATHS:
                note(f"warm-up: {path} for {plan['warmup_seconds']:g} s")
                await closed_loop_calls(calls[path], inflight=8, seconds=plan["warmup_seconds"])
        runs = []
        for index, concurrency in enumerate(plan["concurrency"]):
            order = PATHS if index % 2 == 0 else PATHS[::-1]
            for path in order:
                note(f"{path}: {concurrency} in flight for {plan['seconds_per_run']:g} s")
                started = time.monotonic()
                result = await closed_loop_calls(
                    calls[path], inflight=concurrency, seconds=plan["seconds_per_run"]
                )
                summary = _summary(path, concurrency, result)
                summary["wall_seconds"] = round(time.monotonic() - started, 2)
                runs.append(summary)
                note(
                    f"  {summary['ops_per_second']} op/s, p50 {summary['p50_ms']} ms, "
                    f"p99 {summary['p99_ms']} ms, errors {summary['errors']}"
                )
        return runs
    finally:
        await asyncio.to_thread(driver.shutdown)
        for client in clients:
            await client.close()


def overhead(runs: list[dict[str, Any]]) -> list[list[Any]]:
    """Per concurrency: native p50 / gRPC p50, native p99 / gRPC p99, gRPC op/s / native op/s."""
    rows = []
    by = {(r["path"], r["concurrency"]): r for r in runs}
    for concurrency in sorted({r["concurrency"] for r in runs}):
        native, grpc = by.get(("native", concurrency)), by.get(("grpc", concurrency))
        if native is None or grpc is None:
            continue

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 2) if a and b else None

        rows.append(
            [
                concurrency,
                ratio(native["p50_ms"], grpc["p50_ms"]),
                ratio(native["p99_ms"], grpc["p99_ms"]),
                ratio(grpc["ops_per_second"], native["ops_per_second"]),
            ]
        )
    return rows


def _figures(runs: list[dict[str, Any]], plan: dict[str, Any], cassandra: str) -> list[Any]:
    method = (
        f"{cassandra}; bank keyspace RF 3; 3 sidecars (store cassandra), each CQL endpoint "
        f"in front of its own node. Closed loop, {plan['seconds_per_run']:g} s per path and "
        f"concurrency, alternating order; transfers of 1 between random accounts of "
        f"{plan['keys']}; latency = client wall time per transaction."
    )
    table = figure(
        "cql-vs-grpc",
        "Bank transfer through the CQL endpoint (cassandra-driver, prepared) vs gRPC client",
        layer=LAYER_NONE,
        method=method,
        columns=["path", "concurrency", "op/s", "p50 ms", "p99 ms", "errors"],
        rows=[
            [
                r["path"],
                r["concurrency"],
                r["ops_per_second"],
                r["p50_ms"],
                r["p99_ms"],
                sum(r["errors"].values()),
            ]
            for r in runs
        ],
        plot={
            "kind": "bar",
            "x": [f"{c} in flight" for c in plan["concurrency"]],
            "series": {
                path: [
                    next(
                        (
                            r["ops_per_second"]
                            for r in runs
                            if r["path"] == path and r["concurrency"] == c
                        ),
                        None,
                    )
                    for c in plan["concurrency"]
                ]
                for path in PATHS
            },
            "ylabel": "op/s",
        },
    )
    ratios = figure(
        "cql-overhead",
        "The CQL endpoint's overhead (ratios; 1.0 = none)",
        layer=LAYER_NONE,
        method=method,
        columns=["concurrency", "p50 native/gRPC", "p99 native/gRPC", "op/s gRPC/native"],
        rows=overhead(runs),
    )
    return [table, ratios]
