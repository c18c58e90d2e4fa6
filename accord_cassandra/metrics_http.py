"""``GET /metrics`` for a prometheus-client registry, on the running asyncio event loop.

Not prometheus-client's own threaded server: collectors here read objects that the event
loop mutates (plain ints and dicts on the sidecar's node, the recovery engine's counters),
and reading them from another thread could catch them mid-update. On the loop, a scrape sees
them between two steps.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from accord_cassandra.ports import BIND_RETRY_SECONDS, bind_retrying, split_address

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_SECONDS = 5.0


class MetricsServer:
    """``GET /metrics`` of ``registry`` on ``listen`` (port 0: any free port; ``bound`` says
    which once started), on the running event loop. The recovery engine serves its metrics
    with it too."""

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        *,
        bind_retry_seconds: float = BIND_RETRY_SECONDS,
    ) -> None:
        self.listen = listen
        self.bind_retry_seconds = bind_retry_seconds
        self.address = split_address(listen)
        self.registry = registry
        self.server: asyncio.Server | None = None
        self.bound = listen

    async def start(self) -> None:
        async def bind() -> asyncio.Server:
            return await asyncio.start_server(self._handle, *self.address)

        self.server = await bind_retrying(bind, self.listen, retry_seconds=self.bind_retry_seconds)
        host, port = self.server.sockets[0].getsockname()[:2]
        self.bound = f"{host}:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(
                reader.read(MAX_REQUEST_BYTES), timeout=REQUEST_TIMEOUT_SECONDS
            )
            if request.startswith(b"GET /metrics"):
                body = generate_latest(self.registry)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: " + CONTENT_TYPE_LATEST.encode() + b"\r\n"
            else:
                body = b"not found\n"
                head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(
                head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            logger.debug("metrics request failed", exc_info=True)
        finally:
            writer.close()


__all__ = ["MetricsServer"]
