"""Python clients for the sidecars' transaction API, synchronous and asyncio.

Build a transaction declaratively, then run it on any sidecar::

    t = Transaction()
    src = t.let("src", "bank", "accounts", "alice")
    dst = t.let("dst", "bank", "accounts", "bob")
    t.where(src["balance"] >= 10)
    t.update("bank", "accounts", "alice", balance=src["balance"] - 10)
    t.update("bank", "accounts", "bob", balance=dst["balance"] + 10)
    result = Client("127.0.0.1:50051", token="...").transact(t)
    result.applied, result.rows["src"]["balance"]

Errors: :class:`TransactionError` with ``code`` (a gRPC status name) and ``definite``:
INVALID_ARGUMENT/UNAUTHENTICATED/ABORTED are definite (nothing was or will be applied);
DEADLINE_EXCEEDED/UNAVAILABLE are not (the transaction may still commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.translate import value_from_proto, value_to_proto
from accord_cassandra.v1 import client_pb2 as pb
from accord_cassandra.v1 import client_pb2_grpc

DEFINITE_CODES = frozenset(
    {"INVALID_ARGUMENT", "UNAUTHENTICATED", "ABORTED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"}
)


class TransactionError(AccordCassandraError, RuntimeError):
    """A transaction failed or its outcome is unknown; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.definite = code in DEFINITE_CODES


def _expr(value: object) -> pb.Expr:
    if isinstance(value, Expression):
        return value.proto
    return pb.Expr(literal=value_to_proto(value))


class Expression:
    """An expression over LET rows; supports ``+``, ``-`` and comparisons."""

    def __init__(self, proto: pb.Expr) -> None:
        self.proto = proto

    def __add__(self, other: object) -> Expression:
        return Expression(
            pb.Expr(binary=pb.BinaryExpr(op="+", left=self.proto, right=_expr(other)))
        )

    def __sub__(self, other: object) -> Expression:
        return Expression(
            pb.Expr(binary=pb.BinaryExpr(op="-", left=self.proto, right=_expr(other)))
        )

    def _compare(self, op: str, other: object) -> pb.Condition:
        return pb.Condition(op=op, left=self.proto, right=_expr(other))

    def __eq__(self, other: object) -> pb.Condition:  # type: ignore[override]
        return self._compare("=", other)

    def __ne__(self, other: object) -> pb.Condition:  # type: ignore[override]
        return self._compare("!=", other)

    def __lt__(self, other: object) -> pb.Condition:
        return self._compare("<", other)

    def __le__(self, other: object) -> pb.Condition:
        return self._compare("<=", other)

    def __gt__(self, other: object) -> pb.Condition:
        return self._compare(">", other)

    def __ge__(self, other: object) -> pb.Condition:
        return self._compare(">=", other)

    def is_null(self) -> pb.Condition:
        return pb.Condition(op="is_null", left=self.proto)

    def not_null(self) -> pb.Condition:
        return pb.Condition(op="not_null", left=self.proto)

    __hash__ = None  # type: ignore[assignment]


class RowHandle:
    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, column: str) -> Expression:
        return Expression(pb.Expr(column=pb.ColumnRef(let=self.name, column=column)))


def _row(keyspace: str, table: str, key: object | Sequence[object]) -> pb.RowRef:
    values = list(key) if isinstance(key, tuple | list) else [key]
    return pb.RowRef(
        keyspace=keyspace, table=table, partition_key=[value_to_proto(v) for v in values]
    )


@dataclass
class Transaction:
    """A declarative transaction: LET rows, conditions (AND), then upserts and deletes."""

    request: pb.TransactRequest = field(default_factory=pb.TransactRequest)

    def let(
        self, name: str, keyspace: str, table: str, key: object | Sequence[object]
    ) -> RowHandle:
        self.request.lets.append(pb.Let(name=name, row=_row(keyspace, table, key)))
        return RowHandle(name)

    def where(self, *conditions: pb.Condition) -> Transaction:
        self.request.conditions.extend(conditions)
        return self

    def update(
        self, keyspace: str, table: str, key: object | Sequence[object], **columns: object
    ) -> Transaction:
        upsert = pb.Upsert(
            set=[pb.Assignment(column=c, value=_expr(v)) for c, v in columns.items()]
        )
        self.request.mutations.append(pb.Mutation(row=_row(keyspace, table, key), upsert=upsert))
        return self

    insert = update

    def delete(self, keyspace: str, table: str, key: object | Sequence[object]) -> Transaction:
        self.request.mutations.append(pb.Mutation(row=_row(keyspace, table, key), delete=True))
        return self


@dataclass(frozen=True)
class Result:
    txn_id: str
    applied: bool
    rows: dict[str, dict[str, object] | None]
    error: str | None

    @staticmethod
    def from_proto(response: pb.TransactResponse) -> Result:
        rows: dict[str, dict[str, object] | None] = {}
        for row in response.rows:
            rows[row.let] = (
                {c.name: value_from_proto(c.value) for c in row.columns} if row.exists else None
            )
        return Result(response.txn_id, response.applied, rows, response.error or None)


def _metadata(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


# A sidecar that restarts should be reachable again within a second or two, not after
# gRPC's default reconnect backoff (which grows to 120 s while the sidecar is down).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class Client:
    """Blocking client for one sidecar address."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout: float = 15.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.channel = (
            grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
            if credentials
            else grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        )
        self.stub = client_pb2_grpc.TransactionsStub(self.channel)
        self.token = token
        self.timeout = timeout

    def transact(self, transaction: Transaction | pb.TransactRequest) -> Result:
        request = transaction.request if isinstance(transaction, Transaction) else transaction
        try:
            response = self.stub.Transact(
                request, timeout=self.timeout, metadata=_metadata(self.token)
            )
        except grpc.RpcError as error:
            raise TransactionError(error.code().name, error.details() or "") from None
        return Result.from_proto(response)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class AsyncClient:
    """asyncio client for one sidecar address."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout: float = 15.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.channel = (
            grpc.aio.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
            if credentials
            else grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        )
        self.stub = client_pb2_grpc.TransactionsStub(self.channel)
        self.token = token
        self.timeout = timeout

    async def transact(self, transaction: Transaction | pb.TransactRequest) -> Result:
        request = transaction.request if isinstance(transaction, Transaction) else transaction
        try:
            response = await self.stub.Transact(
                request, timeout=self.timeout, metadata=_metadata(self.token)
            )
        except grpc.aio.AioRpcError as error:
            raise TransactionError(error.code().name, error.details() or "") from None
        return Result.from_proto(response)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
