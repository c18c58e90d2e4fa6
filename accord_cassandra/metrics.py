"""The sidecar's Prometheus metrics (``GET /metrics``), exposed with prometheus-client.

Commit latency is a real :class:`prometheus_client.Histogram`, observed once per committed
transaction: scraping costs the same whatever the traffic, and its ``_count`` only grows.
The other figures live on the sidecar's own objects (the node's stats, the journal, the
transport) and are read at scrape time by a custom collector, so nothing is counted twice.

Served by :class:`accord_cassandra.metrics_http.MetricsServer` on the sidecar's event loop.
Each sidecar has its own registry, so several in one process (tests) do not mix figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from accord_cassandra.metrics_http import MetricsServer

if TYPE_CHECKING:
    from accord_cassandra.server import Sidecar


LATENCY_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def commit_latency_histogram() -> Histogram:
    """The commit-latency histogram of one sidecar (in no registry until served)."""
    return Histogram(
        "accord_commit_latency_seconds",
        "Time from submission to a committed outcome, per successful transaction",
        buckets=LATENCY_BUCKETS_SECONDS,
        registry=None,
    )


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class SidecarCollector(Collector):
    """Reads one sidecar's figures at scrape time; yields nothing while it is starting."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def collect(self) -> Iterator[Metric]:
        sidecar = self.sidecar
        host = getattr(sidecar, "host", None)
        peers = getattr(sidecar, "peers", None)
        if host is None or peers is None:
            return
        node = host.node
        stats = node.stats
        journal = host.journal
        transactions = CounterMetricFamily(
            "accord_transactions", "Client transactions by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(host.metrics.commits.items()):
            transactions.add_metric([outcome], count)
        yield transactions
        yield _parts_per_batch(stats.parts_per_batch)
        yield _counter("accord_fast_path", "Coordinations on the fast path", stats.fast_path)
        yield _counter("accord_slow_path", "Coordinations on the slow path", stats.slow_path)
        yield _counter("accord_recoveries", "Recoveries started", stats.recoveries)
        yield _counter("accord_invalidations", "Transactions invalidated", stats.invalidations)
        yield _counter("accord_journal_syncs", "Journal fsyncs", journal.syncs)
        yield _counter(
            "accord_journal_sync_seconds", "Time spent in journal fsyncs", journal.sync_seconds
        )
        yield _counter("accord_journal_records", "Journal records appended", journal.appended)
        yield _counter(
            "accord_data_retries", "Data-store operations retried", host.metrics.data_retries
        )
        yield _counter(
            "accord_store_writes",
            "Row writes the data store executed (Cassandra statements, or memory cells)",
            host.store.writes_executed,
        )
        yield _counter(
            "accord_store_reads",
            "Read statements the Cassandra store sent (0 for a store that does not count them)",
            getattr(host.store, "reads_executed", 0),
        )
        yield _counter(
            "accord_store_partition_reads",
            "Rows, slices and static rows the Cassandra store read, alone or several in one "
            "IN read (0 for a store that does not count them)",
            getattr(host.store, "partitions_read", 0),
        )
        yield _counter(
            "accord_store_takeover_writes",
            "Of those, rows written because the shared store's writer was silent (a takeover)",
            host.metrics.takeover_writes,
        )
        yield _gauge(
            "accord_pending_clients", "Client transactions in flight", host.pending_clients()
        )
        yield _gauge(
            "accord_pending_data_operations",
            "Data-store operations in flight",
            host.pending_data_ops(),
        )
        yield _gauge(
            "accord_active_coordinations",
            "Coordinations this node runs",
            node.coordinator_count(),
        )
        depths = GaugeMetricFamily(
            "accord_peer_queue_depth", "Messages queued per peer", labels=["peer"]
        )
        for peer, depth in sorted(peers.queue_depths().items()):
            depths.add_metric([str(peer)], depth)
        yield depths
        yield _gauge(
            "accord_peers_unreachable",
            "Peers whose last delivery found nobody listening (their transactions are "
            "recovered after the floor delay)",
            len(peers.unreachable()),
        )
        yield _counter(
            "accord_peer_messages_dropped", "Peer messages dropped", peers.metrics.dropped
        )
        yield _counter("accord_peer_messages_sent", "Peer messages delivered", peers.metrics.sent)
        yield _counter(
            "accord_peer_batches_sent",
            "Peer batches delivered (Deliver calls)",
            peers.metrics.batches_sent,
        )
        yield _counter(
            "accord_peer_messages_received", "Peer messages accepted", peers.metrics.received
        )
        yield _counter(
            "accord_host_batches", "Ready batches the pump carried out", host.metrics.batches
        )
        yield _counter(
            "accord_peer_messages_expired",
            "Peer messages dropped unsent after waiting too long in a queue",
            peers.metrics.expired,
        )
        yield _counter(
            "accord_progress_deferred",
            "Progress-log scans that left work for later (coordinator budget spent)",
            stats.progress_deferred,
        )
        yield _counter(
            "accord_admission_refused",
            "Client transactions refused by admission control (RESOURCE_EXHAUSTED)",
            host.metrics.refused,
        )
        yield _gauge(
            "accord_admission_waiting",
            "Client transactions waiting for a per-key slot",
            host.admission.waiting,
        )
        yield _counter(
            "accord_peer_messages_refused",
            "Incoming peer messages refused (undecodable, misaddressed or invalid)",
            peers.metrics.refused,
        )
        yield _counter(
            "accord_peer_messages_invalid",
            "Incoming peer messages refused as well-formed but never sent by an honest peer",
            peers.metrics.invalid,
        )
        yield _counter(
            "accord_peer_batches_unauthenticated",
            "Incoming peer batches refused for failed authentication",
            peers.metrics.unauthenticated_batches,
        )
        yield _counter(
            "accord_peer_frames_oversize",
            "Framed peer connections closed for a frame length over peer_frame_max_bytes",
            peers.metrics.oversize_frames,
        )
        yield _counter(
            "accord_peer_frame_connections_over_limit",
            "Framed peer connections closed on arrival, peer_frame_max_connections being open",
            peers.metrics.frame_connections_over_limit,
        )
        yield _counter(
            "accord_peer_frame_connections_timed_out",
            "Framed peer connections closed for no whole first frame within "
            "peer_frame_auth_timeout_seconds",
            peers.metrics.frame_connections_timed_out,
        )
        yield _counter(
            "accord_peer_frame_connections_refused",
            "Framed peer connections closed by this sidecar (bad opening, oversize frame, "
            "a batch refused whole, over the connection limit, or timed out)",
            peers.metrics.refused_connections,
        )
        frames = getattr(sidecar, "frames", None)
        if frames is not None:
            yield _gauge(
                "accord_peer_frame_connections",
                "Framed peer connections open (TLS handshakes included)",
                frames.open_connections,
            )
        yield from host.metrics.commit_latency.collect()
        cql = getattr(sidecar, "cql", None)
        if cql is not None:
            requests = CounterMetricFamily(
                "accord_cql_requests", "CQL endpoint requests by opcode", labels=["opcode"]
            )
            for opcode, count in sorted(cql.requests.items()):
                requests.add_metric([opcode], count)
            yield requests
            yield _counter(
                "accord_cql_transactions",
                "BEGIN TRANSACTION run by the CQL endpoint",
                cql.transactions,
            )
            yield _counter(
                "accord_cql_schema_agreement_timeouts",
                "Schema changes relayed before the Cassandra nodes agreed (the wait ran out)",
                cql.agreement_timeouts,
            )
            yield _counter(
                "accord_cql_connections_refused",
                "CQL connections closed on arrival, cql_max_connections being open",
                cql.refused_connections,
            )
            yield _gauge(
                "accord_cql_connections", "CQL client connections open", len(cql.connections)
            )


def registry_of(sidecar: Sidecar) -> CollectorRegistry:
    """A registry of one sidecar's metrics alone."""
    registry = CollectorRegistry()
    registry.register(SidecarCollector(sidecar))
    return registry


def render(sidecar: Sidecar) -> str:
    """The exposition text of one sidecar's metrics."""
    return generate_latest(registry_of(sidecar)).decode()


__all__ = [
    "LATENCY_BUCKETS_SECONDS",
    "MetricsServer",
    "SidecarCollector",
    "commit_latency_histogram",
    "registry_of",
    "render",
]


# Powers of two up to MAX_BATCH_PARTS: a batch of 1 is a transaction coordinated alone.
_PARTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _parts_per_batch(parts_per_batch: dict[int, int]) -> HistogramMetricFamily:
    """Client transactions per Accord transaction this sidecar coordinated (group commit)."""
    buckets = []
    for bound in _PARTS_BUCKETS:
        buckets.append(
            (str(bound), sum(n for parts, n in parts_per_batch.items() if parts <= bound))
        )
    buckets.append(("+Inf", sum(parts_per_batch.values())))
    return HistogramMetricFamily(
        "accord_batch_parts",
        "Client transactions per coordinated Accord transaction (1: alone; more: a batch)",
        buckets=buckets,
        sum_value=sum(parts * n for parts, n in parts_per_batch.items()),
    )
