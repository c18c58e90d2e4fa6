"""The saga store's Accord gateway moves on to the next sidecar when one refuses the
connection. A refused connection is now the client's definite NOT_SENT (it used to be
UNAVAILABLE, an unknown outcome); a definite error must not end the commit when another
sidecar can take the transaction."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from accord_cassandra.client import Transaction
from accord_cassandra.v1 import client_pb2 as pb
from stacksaga_store.recovery.commit_modes import AccordGateway
from tests.sidecar.test_client_errors import fake_sidecar


def _closed_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_refused_connection_fails_over_to_the_next_sidecar() -> None:
    async def applied(request: bytes, context: Any) -> bytes:
        return pb.TransactResponse(txn_id="t1", applied=True).SerializeToString()

    def build() -> Transaction:
        t = Transaction()
        t.update("ks", "t", "k", v=1)
        return t

    async def scenario() -> tuple[bool, int]:
        async with fake_sidecar(applied) as live:
            gateway = AccordGateway([_closed_address(), live], timeout=5)
            outcome = await gateway.transact(build)
            return outcome.applied, gateway.retries

    assert asyncio.run(scenario()) == (True, 1)
