"""The sidecar answers within the client's deadline, so overflow stays definite.

At 10,500 concurrent transfers (``python -m bench overload``) requests waited for a busy
key longer than the client's deadline; the server's own deadline timer then reset their
streams before the client's fired and the client saw CANCELLED, which says nothing about
whether the transfer committed. Given the client's remaining time less a margin, an
admission wait ends in the definite RESOURCE_EXHAUSTED before that.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from accord import Txn
from accord_cassandra.host import Overloaded
from accord_cassandra.schema import Catalog
from accord_cassandra.server import TransactionsServicer
from tests.sidecar.bank import Bank, Transfer
from tests.sidecar.conftest import EMBEDDED_TABLES


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code


class Context:
    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class BusyHost:
    """Every key stays busy: admission waits the whole timeout it is given, then refuses."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    async def submit(self, txn: Txn, *, timeout: float) -> Any:
        self.timeouts.append(timeout)
        await asyncio.sleep(timeout)
        raise Overloaded("no slot freed before the deadline; nothing was submitted")


def _request() -> Any:
    bank = Bank(["127.0.0.1:1"], "bank", ["hot0", "hot1"], timeout=1.0)
    return bank.transfer_txn(Transfer(1, "hot0", "hot1", 5)).request


def _call(remaining: float | None, server_timeout: float = 10.0) -> tuple[BusyHost, Aborted]:
    host = BusyHost()
    servicer = TransactionsServicer(
        host,  # type: ignore[arg-type]
        Catalog.from_mapping(EMBEDDED_TABLES),
        token=None,
        timeout=server_timeout,
    )

    async def run() -> Aborted:
        with pytest.raises(Aborted) as caught:
            await servicer.Transact(_request(), Context(remaining))  # type: ignore[arg-type]
        return caught.value

    return host, asyncio.run(run())


def test_an_admission_wait_ends_before_the_clients_deadline() -> None:
    host, aborted = _call(remaining=1.0)
    assert aborted.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert host.timeouts and host.timeouts[0] < 1.0


def test_without_a_client_deadline_the_server_timeout_applies() -> None:
    host, aborted = _call(remaining=None, server_timeout=0.2)
    assert aborted.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert host.timeouts == [0.2]


def test_a_request_arriving_at_its_deadline_is_refused_unsubmitted() -> None:
    host, aborted = _call(remaining=0.0)
    assert aborted.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "nothing was submitted" in str(aborted)
    assert host.timeouts == []
