"""The client's error contract (docs/sidecars.md, "Client errors"): every failure is a
TransactionError that says whether the outcome is definite.

Before: a refused connection was UNAVAILABLE, the same code as "outcome unknown", so callers
had to count requests that never left as possibly committed; a closed channel or an
unreadable response escaped AsyncClient as grpc's own exceptions; a read-only transaction
answered applied=True with nothing saying it wrote nothing.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from accord_cassandra.client import (
    AsyncClient,
    Client,
    ClientFailure,
    NotSent,
    Transaction,
    TransactionError,
)
from accord_cassandra.v1 import client_pb2 as pb


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _read() -> Transaction:
    t = Transaction()
    t.let("a", "bank", "accounts", "alice")
    return t


def _write() -> Transaction:
    t = _read()
    t.update("bank", "accounts", "alice", balance=1)
    return t


Handler = Callable[[bytes, Any], Awaitable[bytes]]


@asynccontextmanager
async def fake_sidecar(handler: Handler) -> AsyncIterator[str]:
    server = grpc.aio.server()
    method = grpc.unary_unary_rpc_method_handler(handler)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "accord_cassandra.v1.Transactions", {"Transact": method}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


def test_a_refused_connection_is_definite_not_unknown() -> None:
    address = f"127.0.0.1:{_closed_port()}"

    async def scenario() -> TransactionError:
        async with AsyncClient(address, timeout=5) as client:
            with pytest.raises(NotSent) as caught:
                await client.transact(_write())
        return caught.value

    error = asyncio.run(scenario())
    assert error.code == "NOT_SENT" and error.definite, error
    with Client(address, timeout=5) as sync_client, pytest.raises(NotSent) as sync_caught:
        sync_client.transact(_write())
    assert sync_caught.value.definite


def test_an_unresolvable_name_is_definite() -> None:
    async def scenario() -> None:
        async with AsyncClient("no-such-sidecar.invalid:50051", timeout=5) as client:
            with pytest.raises(NotSent):
                await client.transact(_write())

    asyncio.run(scenario())


def test_the_sidecars_own_unavailable_stays_unknown() -> None:
    async def unknown(request: bytes, context: Any) -> bytes:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "outcome unknown: the transaction may still commit"
        )
        return b""

    async def scenario() -> TransactionError:
        async with fake_sidecar(unknown) as address, AsyncClient(address, timeout=5) as client:
            with pytest.raises(TransactionError) as caught:
                await client.transact(_write())
        return caught.value

    error = asyncio.run(scenario())
    assert not isinstance(error, NotSent)
    assert error.code == "UNAVAILABLE" and not error.definite


def test_a_closed_client_raises_not_sent_not_grpcs_usage_error() -> None:
    async def scenario() -> None:
        client = AsyncClient(f"127.0.0.1:{_closed_port()}", timeout=5)
        await client.close()
        with pytest.raises(NotSent, match="closed"):
            await client.transact(_write())

    asyncio.run(scenario())


def test_an_unreadable_response_is_a_client_failure_of_unknown_outcome() -> None:
    async def garbage(request: bytes, context: Any) -> bytes:
        return b"\xff\xff\xff\xff not a TransactResponse"

    async def scenario() -> TransactionError:
        async with fake_sidecar(garbage) as address, AsyncClient(address, timeout=5) as client:
            with pytest.raises(TransactionError) as caught:
                await client.transact(_write())
        return caught.value

    error = asyncio.run(scenario())
    # gRPC hands back None for a response it cannot parse; AttributeError escaped before.
    assert isinstance(error, ClientFailure) and not error.definite, error


def test_read_only_results_say_so() -> None:
    async def applied(request: bytes, context: Any) -> bytes:
        return pb.TransactResponse(txn_id="t1", applied=True).SerializeToString()

    async def scenario() -> tuple[bool, bool]:
        async with fake_sidecar(applied) as address, AsyncClient(address, timeout=5) as client:
            read = await client.transact(_read())
            write = await client.transact(_write())
        assert read.applied and write.applied
        return read.read_only, write.read_only

    assert asyncio.run(scenario()) == (True, False)


def test_a_closed_sync_client_raises_not_sent() -> None:
    client = Client(f"127.0.0.1:{_closed_port()}", timeout=5)
    client.close()
    with pytest.raises(NotSent):
        client.transact(_write())
