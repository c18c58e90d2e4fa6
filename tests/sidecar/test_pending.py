"""Requests the sidecar's event loop has not reached yet are never answered CANCELLED.

At 10,500 concurrent transfers on 3 sidecars (``python -m bench overload``), 1,000-1,200
requests came back CANCELLED within seconds, long before any deadline; none of them had
reached the Transact handler (counted there). The gRPC core refuses calls the application
has not yet picked up once more than ``grpc.server.max_pending_requests`` wait (1,000 by
default, random early refusal up to 3,000), and reports that as CANCELLED, which says
nothing to a client about whether its transaction ran. Reproduced here with the sidecar's
server options and a handler that keeps the loop busy, as a flooded sidecar does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc

from accord_cassandra.server import SERVER_OPTIONS

REQUESTS = 2_500  # over the core's default soft limit of 1,000 pending calls
BUSY_SECONDS = 0.002  # per request, on the loop: 5 s for all of them


def _flood(address: str, results: Counter[str]) -> None:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/probe.Busy/Call")
        futures = [call.future(b"x" * 200, timeout=60.0) for _ in range(REQUESTS)]
        for future in futures:
            try:
                future.result()
                results["OK"] += 1
            except grpc.RpcError as error:
                results[error.code().name] += 1


def _outcomes(options: Sequence[tuple[str, Any]]) -> Counter[str]:
    results: Counter[str] = Counter()

    async def main() -> None:
        async def busy(request: bytes, context: Any) -> bytes:
            time.sleep(BUSY_SECONDS)  # blocks the loop, like a sidecar at full CPU
            return b""

        server = grpc.aio.server(options=list(options))
        handler = grpc.unary_unary_rpc_method_handler(busy)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("probe.Busy", {"Call": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = threading.Thread(target=_flood, args=(f"127.0.0.1:{port}", results))
        client.start()
        while client.is_alive():
            await asyncio.sleep(0.05)
        await server.stop(grace=None)

    asyncio.run(main())
    return results


def test_a_flood_the_loop_cannot_keep_up_with_is_answered_not_cancelled() -> None:
    results = _outcomes(SERVER_OPTIONS)
    assert results == Counter({"OK": REQUESTS}), results
