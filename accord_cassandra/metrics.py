"""A Prometheus text endpoint (``GET /metrics``) on a small asyncio HTTP server.

No client library: the exposition format is plain text, and the figures live on the
sidecar's own objects. Buckets of the commit-latency histogram are in seconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accord_cassandra.server import Sidecar

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MAX_REQUEST_BYTES = 8192


def render(sidecar: Sidecar) -> str:
    host = sidecar.host
    node = host.node
    stats = node.stats
    lines = [
        "# TYPE accord_transactions_total counter",
        *(
            f'accord_transactions_total{{outcome="{o}"}} {n}'
            for o, n in sorted(host.metrics.commits.items())
        ),
        "# TYPE accord_fast_path_total counter",
        f"accord_fast_path_total {stats.fast_path}",
        "# TYPE accord_slow_path_total counter",
        f"accord_slow_path_total {stats.slow_path}",
        "# TYPE accord_recoveries_total counter",
        f"accord_recoveries_total {stats.recoveries}",
        "# TYPE accord_invalidations_total counter",
        f"accord_invalidations_total {stats.invalidations}",
        "# TYPE accord_journal_syncs_total counter",
        f"accord_journal_syncs_total {host.journal.syncs}",
        "# TYPE accord_journal_sync_seconds_total counter",
        f"accord_journal_sync_seconds_total {host.journal.sync_seconds:.6f}",
        "# TYPE accord_journal_records_total counter",
        f"accord_journal_records_total {host.journal.appended}",
        "# TYPE accord_data_retries_total counter",
        f"accord_data_retries_total {host.metrics.data_retries}",
        "# TYPE accord_reads_too_late_total counter",
        f"accord_reads_too_late_total {host.metrics.reads_too_late}",
        "# TYPE accord_pending_clients gauge",
        f"accord_pending_clients {host.pending_clients()}",
        "# TYPE accord_pending_data_operations gauge",
        f"accord_pending_data_operations {host.pending_data_ops()}",
        "# TYPE accord_active_coordinations gauge",
        f"accord_active_coordinations {node.coordinator_count()}",
        "# TYPE accord_peer_queue_depth gauge",
        *(
            f'accord_peer_queue_depth{{peer="{p}"}} {d}'
            for p, d in sorted(sidecar.peers.queue_depths().items())
        ),
        "# TYPE accord_peer_messages_dropped_total counter",
        f"accord_peer_messages_dropped_total {sidecar.peers.metrics.dropped}",
        "# TYPE accord_peer_messages_expired_total counter",
        f"accord_peer_messages_expired_total {sidecar.peers.metrics.expired}",
        "# TYPE accord_progress_deferred_total counter",
        f"accord_progress_deferred_total {stats.progress_deferred}",
        "# TYPE accord_admission_refused_total counter",
        f"accord_admission_refused_total {host.metrics.refused}",
        "# TYPE accord_admission_waiting gauge",
        f"accord_admission_waiting {host.admission.waiting}",
        "# TYPE accord_peer_messages_refused_total counter",
        f"accord_peer_messages_refused_total {sidecar.peers.metrics.refused}",
    ]
    samples = host.metrics.commit_seconds
    lines.append("# TYPE accord_commit_latency_seconds histogram")
    for bound in LATENCY_BUCKETS_SECONDS:
        lines.append(
            f'accord_commit_latency_seconds_bucket{{le="{bound}"}} '
            f"{sum(1 for s in samples if s <= bound)}"
        )
    lines.append(f'accord_commit_latency_seconds_bucket{{le="+Inf"}} {len(samples)}')
    lines.append(f"accord_commit_latency_seconds_sum {sum(samples):.6f}")
    lines.append(f"accord_commit_latency_seconds_count {len(samples)}")
    return "\n".join(lines) + "\n"


class MetricsServer:
    def __init__(self, listen: str, sidecar: Sidecar) -> None:
        host, _, port = listen.rpartition(":")
        self.address = (host, int(port))
        self.sidecar = sidecar
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, *self.address)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.read(MAX_REQUEST_BYTES), timeout=5)
            if request.startswith(b"GET /metrics"):
                body = render(self.sidecar).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
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
