"""``python -m bench.null_sidecar``: the least any Python sidecar must do per conditional set.

NOT a transaction system. It states an upper bound: a design whose client edge is Python
gRPC and whose data path is the Python cassandra-driver cannot be cheaper per operation than
this. Per request it does what every such design must do and nothing more:

* gRPC aio server (the sidecar's grpcio, its server options, uvloop as the sidecar's CLI
  runs it), the request taken as raw bytes and parsed as the client's ``TransactRequest``,
  as the sidecar's Transactions service does;
* one prepared QUORUM read of the row, the same statement shape as the sidecar's store
  (``SELECT "balance", WRITETIME("balance"), TTL("balance") ... WHERE "id" = ?``);
* the condition evaluated; if it holds, one prepared QUORUM write
  (``INSERT ... USING TIMESTAMP ?``), as the store writes;
* a ``TransactResponse`` with the row read and whether it applied.

No ordering, no replication between sidecars, no journal: two concurrent requests on one
key race exactly as two unconditioned read-then-write clients would. It accepts only the
bench's single-partition conditional set (``bench.workload.conditional_set``: one LET of
one row by key, ``row.balance >= <int>``, one upsert of ``balance = <int>``) on tables
``<keyspace>.accounts`` of the keyspaces it was started with, and refuses any other request
with INVALID_ARGUMENT naming what it lacks.

It binds ``--listen`` (default ``127.0.0.1:0``: the kernel picks the port) and writes
``{"address": "host:port"}`` to ``--ready`` once it serves; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from accord_cassandra.ports import write_json_atomically
from accord_cassandra.server import SERVER_OPTIONS
from accord_cassandra.v1 import client_pb2

SERVICE = "accord_cassandra.v1.Transactions"
TABLE = "accounts"
REQUEST_TIMEOUT_SECONDS = 30.0


class NotConditionalSet(ValueError):
    """The request is not the one shape this server answers."""


def parse(raw: bytes, keyspaces: frozenset[str]) -> tuple[str, str, str, int, int]:
    """(let name, keyspace, key, threshold, new value) of a conditional set, or
    :class:`NotConditionalSet` saying what does not match."""
    request = client_pb2.TransactRequest.FromString(raw)
    if len(request.lets) != 1 or len(request.conditions) != 1 or len(request.mutations) != 1:
        raise NotConditionalSet(
            f"needs 1 LET, 1 condition and 1 mutation; got {len(request.lets)}, "
            f"{len(request.conditions)}, {len(request.mutations)}"
        )
    let, condition, mutation = request.lets[0], request.conditions[0], request.mutations[0]
    row = let.row
    if row.keyspace not in keyspaces or row.table != TABLE:
        raise NotConditionalSet(
            f"serves {sorted(keyspaces)}.{TABLE} only, not {row.keyspace}.{row.table}"
        )
    if len(row.partition_key) != 1 or row.partition_key[0].WhichOneof("kind") != "text":
        raise NotConditionalSet("the LET's key must be one text value")
    key = row.partition_key[0].text
    if (
        condition.op != ">="
        or condition.left.WhichOneof("kind") != "column"
        or condition.left.column.let != let.name
        or condition.left.column.column != "balance"
        or condition.right.WhichOneof("kind") != "literal"
        or condition.right.literal.WhichOneof("kind") != "int"
    ):
        raise NotConditionalSet("the condition must be <let>.balance >= <int>")
    if (
        mutation.WhichOneof("kind") != "upsert"
        or mutation.ttl
        or mutation.row.keyspace != row.keyspace
        or mutation.row.table != TABLE
        or list(mutation.row.partition_key) != list(row.partition_key)
        or len(mutation.upsert.set) != 1
        or mutation.upsert.set[0].column != "balance"
        or mutation.upsert.set[0].value.WhichOneof("kind") != "literal"
        or mutation.upsert.set[0].value.literal.WhichOneof("kind") != "int"
    ):
        raise NotConditionalSet("the mutation must set balance = <int> on the LET's row")
    value = mutation.upsert.set[0].value.literal.int
    return let.name, row.keyspace, key, condition.right.literal.int, value


async def execute(session: Any, statement: Any, values: Sequence[object]) -> list[Any]:
    """A prepared statement awaited from the driver's I/O thread, as the sidecar's store
    does it (``accord_cassandra.cql_requests.execute``, without the now_in_seconds payload)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[Any]] = loop.create_future()

    def settle(rows: list[Any] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(rows or [])

    response = session.execute_async(statement, list(values), timeout=REQUEST_TIMEOUT_SECONDS)
    response.add_callbacks(
        lambda rows: loop.call_soon_threadsafe(settle, list(rows or []), None),
        lambda error: loop.call_soon_threadsafe(settle, None, error),
    )
    return await future


class NullServer:
    def __init__(self, session: Any, keyspaces: Sequence[str]) -> None:
        from cassandra import ConsistencyLevel

        self.session = session
        self.keyspaces = frozenset(keyspaces)
        self.reads: dict[str, Any] = {}
        self.writes: dict[str, Any] = {}
        for keyspace in self.keyspaces:
            target = f'"{keyspace}"."{TABLE}"'
            read = session.prepare(
                f'SELECT "balance", WRITETIME("balance"), TTL("balance") FROM {target} '
                f'WHERE "id" = ?'
            )
            write = session.prepare(
                f'INSERT INTO {target} ("id", "balance") VALUES (?, ?) USING TIMESTAMP ?'
            )
            read.consistency_level = write.consistency_level = ConsistencyLevel.QUORUM
            self.reads[keyspace], self.writes[keyspace] = read, write
        self.served = 0

    async def transact(
        self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.TransactResponse:
        try:
            name, keyspace, key, threshold, value = parse(raw, self.keyspaces)
        except (NotConditionalSet, DecodeError) as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"null sidecar: {error}")
            raise  # abort() raises; this keeps the types honest
        rows = await execute(self.session, self.reads[keyspace], [key])
        balance = rows[0][0] if rows and rows[0][0] is not None else None
        applied = balance is not None and balance >= threshold
        if applied:
            await execute(self.session, self.writes[keyspace], [key, value, time.time_ns() // 1000])
        self.served += 1
        found = client_pb2.Row(let=name, exists=balance is not None)
        if balance is not None:
            found.columns.append(
                client_pb2.Column(name="balance", value=client_pb2.Value(int=balance))
            )
        return client_pb2.TransactResponse(
            txn_id=f"null-{self.served}", applied=applied, rows=[found]
        )


def _connect(contact_points: Sequence[str], port: int) -> tuple[Any, Any]:
    """The driver as the sidecar configures it (``accord_cassandra.server._connect_cassandra``)."""
    from cassandra.cluster import Cluster
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    cluster = Cluster(
        list(contact_points),
        port=port,
        protocol_version=5,
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
    )
    session = cluster.connect()
    session.row_factory = tuple_factory
    return cluster, session


async def serve(args: argparse.Namespace) -> None:
    cluster, session = _connect(args.contact_points.split(","), args.port)
    try:
        null = NullServer(session, args.keyspace)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        handler = grpc.unary_unary_rpc_method_handler(
            null.transact,
            request_deserializer=None,
            response_serializer=client_pb2.TransactResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Transact": handler}),)
        )
        host, _, _ = args.listen.rpartition(":")
        bound = server.add_insecure_port(args.listen)
        if bound == 0:
            raise SystemExit(f"null sidecar: could not bind {args.listen}")
        await server.start()
        write_json_atomically(Path(args.ready), {"address": f"{host}:{bound}"})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop(grace=1.0)
    finally:
        cluster.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.null_sidecar", description=__doc__)
    parser.add_argument("--contact-points", required=True, help="ip1,ip2,...")
    parser.add_argument("--port", type=int, default=9042, help="Cassandra's native port")
    parser.add_argument("--keyspace", action="append", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready", required=True, help="file to write the bound address into")
    args = parser.parse_args(argv)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
