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

Errors: every failure is a :class:`TransactionError` with ``code`` (a gRPC status name, or
``NOT_SENT``/``CLIENT``) and ``definite``. Definite: nothing was or will be applied, and
retrying is safe (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, FAILED_PRECONDITION,
ABORTED, RESOURCE_EXHAUSTED, and :class:`NotSent`: the request never left this process).
Not definite: the transaction may still commit (DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED,
anything else; :class:`ClientFailure` after sending); read it back before retrying a
non-idempotent one. The table in docs/sidecars.md ("Client errors") is the contract.

Values are ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` or ``uuid.UUID``, and
for a frozen collection, tuple, UDT or duration a list, tuple, set, frozenset or dict of
them; results hold the core's forms (a set as a sorted tuple, a map as a tuple of
``(key, value)`` pairs; docs/sidecars.md, "Data model and limits").

``Result.applied`` is whether the transaction's conditions held (always true without
conditions), so its writes were applied; ``Result.read_only`` says it had none to apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.translate import value_from_proto, value_to_proto
from accord_cassandra.v1 import client_pb2 as pb
from accord_cassandra.v1 import client_pb2_grpc

if TYPE_CHECKING:
    from accord_cassandra.cql import CqlResult, Params
    from accord_cassandra.schema import Catalog

DEFINITE_CODES = frozenset(
    {
        "INVALID_ARGUMENT",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "ABORTED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "NOT_SENT",
    }
)
# What gRPC says when a call failed before any connection took it (nothing was sent):
# every address refused or could not be resolved. A connection lost after the request went
# out says something else ("Socket closed", "Connection reset") and stays unknown.
NEVER_CONNECTED = ("failed to connect to all addresses", "errors resolving", "DNS resolution")


class TransactionError(AccordCassandraError, RuntimeError):
    """A transaction that did not return a result; ``definite`` when it did not and will
    not apply (safe to retry), else its outcome is unknown. ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.definite = code in DEFINITE_CODES


class NotSent(TransactionError):
    """The request never reached a sidecar (connection refused, name not resolved, channel
    closed): definite, safe to retry elsewhere."""

    def __init__(self, message: str) -> None:
        super().__init__("NOT_SENT", message)


class ClientFailure(TransactionError):
    """This process failed in the middle of the call (not a gRPC status): the request may
    have been sent, so the outcome is unknown. The original exception is ``__cause__``."""

    def __init__(self, message: str) -> None:
        super().__init__("CLIENT", message)


def _from_rpc_error(code: grpc.StatusCode | None, details: str | None) -> TransactionError:
    name = code.name if code is not None else "UNKNOWN"
    text = details or ""
    if name == "UNAVAILABLE" and any(m in text for m in NEVER_CONNECTED):
        return NotSent(text)
    return TransactionError(name, text)


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
    """A LET: ``row["column"]`` is a column of its row (of a slice's first row, with LIMIT
    1); ``count()``, ``exists()``, ``not_exists()`` test the row or slice as a whole."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, column: str) -> Expression:
        return Expression(pb.Expr(column=pb.ColumnRef(let=self.name, column=column)))

    def count(self) -> Expression:
        return Expression(pb.Expr(count=self.name))

    def exists(self) -> pb.Condition:
        return pb.Condition(op="exists", left=pb.Expr(row=self.name))

    def not_exists(self) -> pb.Condition:
        return pb.Condition(op="not_exists", left=pb.Expr(row=self.name))

    def is_null(self) -> pb.Condition:
        return pb.Condition(op="is_null", left=pb.Expr(row=self.name))


def _row(
    keyspace: str, table: str, key: object | Sequence[object], clustering: Sequence[object] = ()
) -> pb.RowRef:
    values = list(key) if isinstance(key, tuple | list) else [key]
    return pb.RowRef(
        keyspace=keyspace,
        table=table,
        partition_key=[value_to_proto(v) for v in values],
        clustering=[value_to_proto(v) for v in clustering],
    )


def _slice(
    column: str | None,
    ge: object = None,
    gt: object = None,
    le: object = None,
    lt: object = None,
    reversed: bool = False,
    limit: int | None = None,
) -> pb.Slice:
    if (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise ValueError("give at most one lower bound (ge, gt) and one upper bound (le, lt)")
    spec = pb.Slice(column=column or "", reversed=reversed, limit=limit or 0)
    if ge is not None or gt is not None:
        spec.lower.CopyFrom(
            pb.Bound(value=value_to_proto(ge if gt is None else gt), inclusive=gt is None)
        )
    if le is not None or lt is not None:
        spec.upper.CopyFrom(
            pb.Bound(value=value_to_proto(le if lt is None else lt), inclusive=lt is None)
        )
    return spec


@dataclass
class Transaction:
    """A declarative transaction: LET rows, conditions (AND), then upserts and deletes."""

    request: pb.TransactRequest = field(default_factory=pb.TransactRequest)

    def let(
        self,
        name: str,
        keyspace: str,
        table: str,
        key: object | Sequence[object],
        clustering: Sequence[object] = (),
    ) -> RowHandle:
        """``LET name = (SELECT * FROM keyspace.table WHERE <key> [AND <clustering>])``: one
        row, named by every clustering value of a table that has clustering columns."""
        self.request.lets.append(pb.Let(name=name, row=_row(keyspace, table, key, clustering)))
        return RowHandle(name)

    def let_slice(
        self,
        name: str,
        keyspace: str,
        table: str,
        key: object | Sequence[object],
        prefix: Sequence[object] = (),
        *,
        column: str | None = None,
        ge: object = None,
        gt: object = None,
        le: object = None,
        lt: object = None,
        reversed: bool = False,
        limit: int | None = None,
    ) -> RowHandle:
        """``LET name = (SELECT * ... WHERE <key> AND <prefix> AND column >= ge ... ORDER BY
        ... LIMIT limit)``: rows whose clustering key starts with ``prefix`` and whose next
        clustering ``column`` lies within the bounds, in clustering order or ``reversed``."""
        row = _row(keyspace, table, key, prefix)
        spec = _slice(column, ge, gt, le, lt, reversed, limit)
        self.request.lets.append(pb.Let(name=name, row=row, slice=spec))
        return RowHandle(name)

    def where(self, *conditions: pb.Condition) -> Transaction:
        self.request.conditions.extend(conditions)
        return self

    def update(
        self,
        keyspace: str,
        table: str,
        key: object | Sequence[object],
        clustering: Sequence[object] = (),
        *,
        ttl: int | None = None,
        values: dict[str, object] | None = None,
        **columns: object,
    ) -> Transaction:
        """Upsert the named columns (``values`` and/or keywords) of one row; the others keep
        their values. ``ttl``: seconds until the row stops being visible."""
        assigned = {**(values or {}), **columns}
        upsert = pb.Upsert(
            set=[pb.Assignment(column=c, value=_expr(v)) for c, v in assigned.items()]
        )
        row = _row(keyspace, table, key, clustering)
        self.request.mutations.append(pb.Mutation(row=row, upsert=upsert, ttl=ttl or 0))
        return self

    insert = update

    def delete(
        self,
        keyspace: str,
        table: str,
        key: object | Sequence[object],
        clustering: Sequence[object] = (),
    ) -> Transaction:
        """Delete one row (every clustering value), the rows starting with a clustering
        prefix, or (no clustering value) the whole partition."""
        row = _row(keyspace, table, key, clustering)
        self.request.mutations.append(pb.Mutation(row=row, delete=True))
        return self

    def delete_range(
        self,
        keyspace: str,
        table: str,
        key: object | Sequence[object],
        prefix: Sequence[object] = (),
        *,
        column: str,
        ge: object = None,
        gt: object = None,
        le: object = None,
        lt: object = None,
    ) -> Transaction:
        """Delete the rows starting with ``prefix`` whose ``column`` lies within the bounds."""
        row = _row(keyspace, table, key, prefix)
        spec = _slice(column, ge, gt, le, lt)
        self.request.mutations.append(pb.Mutation(row=row, delete_range=spec))
        return self

    def delete_partition(
        self, keyspace: str, table: str, key: object | Sequence[object]
    ) -> Transaction:
        row = _row(keyspace, table, key)
        self.request.mutations.append(pb.Mutation(row=row, delete_partition=True))
        return self


@dataclass(frozen=True)
class Result:
    """``applied``: the conditions held (true when there are none) and the writes, if any,
    were applied; ``read_only``: the transaction had no writes, so ``applied`` says only
    that its conditions held over a consistent snapshot (``rows``)."""

    txn_id: str
    applied: bool
    rows: dict[str, dict[str, object] | None]
    error: str | None
    read_only: bool = False
    # Each slice LET's rows in order (clustering then regular columns); its static columns
    # are in ``rows`` (None when it found no row).
    slices: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    @staticmethod
    def from_proto(response: pb.TransactResponse, *, read_only: bool = False) -> Result:
        rows: dict[str, dict[str, object] | None] = {}
        slices: dict[str, list[dict[str, object]]] = {}
        for row in response.rows:
            rows[row.let] = (
                {c.name: value_from_proto(c.value) for c in row.columns} if row.exists else None
            )
            if row.is_slice:
                slices[row.let] = [
                    {c.name: value_from_proto(c.value) for c in entry.columns}
                    for entry in row.slice
                ]
        return Result(
            response.txn_id, response.applied, rows, response.error or None, read_only, slices
        )


def _result(response: pb.TransactResponse, request: pb.TransactRequest) -> Result:
    try:
        return Result.from_proto(response, read_only=not request.mutations)
    except Exception as error:
        raise ClientFailure(
            f"the transaction committed but its response could not be read: {error!r}"
        ) from error


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
            code, details = getattr(error, "code", None), getattr(error, "details", None)
            raise _from_rpc_error(
                code() if callable(code) else None, details() if callable(details) else str(error)
            ) from None
        except ValueError as error:  # "Cannot invoke RPC on closed channel!"
            raise NotSent(str(error)) from error
        except Exception as error:
            raise ClientFailure(repr(error)) from error
        return _result(response, request)

    def execute_cql(
        self,
        text: str,
        params: Params | None = None,
        *,
        schema: Catalog | Mapping[str, Any],
    ) -> CqlResult:
        """Run one ``BEGIN TRANSACTION … COMMIT TRANSACTION`` text (accord_cassandra.cql)
        with ``params`` bound to its markers; ``schema``: the tables (a Catalog, or the
        sidecars' ``tables:`` mapping). :class:`~accord_cassandra.cql.CqlError` when the
        text does not parse or bind (nothing was sent), else as :meth:`transact`."""
        from accord_cassandra.cql import bind

        bound = bind(text, params, schema)
        return bound.result(self.transact(bound.transaction))

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
            call = self.stub.Transact(request, timeout=self.timeout, metadata=_metadata(self.token))
        except grpc.aio.UsageError as error:  # the channel is closed
            raise NotSent(str(error)) from error
        except Exception as error:
            raise NotSent(f"the call could not be started: {error!r}") from error
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            raise _from_rpc_error(error.code(), error.details()) from None
        except asyncio.CancelledError:
            raise  # the caller's own cancellation: not ours to translate
        except Exception as error:
            raise ClientFailure(repr(error)) from error
        return _result(response, request)

    async def execute_cql(
        self,
        text: str,
        params: Params | None = None,
        *,
        schema: Catalog | Mapping[str, Any],
    ) -> CqlResult:
        """As :meth:`Client.execute_cql`."""
        from accord_cassandra.cql import bind

        bound = bind(text, params, schema)
        return bound.result(await self.transact(bound.transaction))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
