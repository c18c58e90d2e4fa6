"""What a :class:`~accord.node.Node` is configured with (:class:`NodeConfig`) and what it
counts (:class:`NodeStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from accord.invariants import check_argument
from accord.primitives.txn import MAX_BATCH_PARTS

__all__ = ["NodeConfig", "NodeStats"]


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Timing knobs, all in microseconds of the injected clock.

    Correctness never depends on these; they trade latency against wasted work.
    """

    retry_micros: int = 200_000
    # Each re-send waits twice as long as the one before, up to this: a coordinator lives
    # ~11 s by default instead of 1.6 s. With a fixed 200 ms interval, a burst of 2,000
    # transfers on 3 keys slowed peer delivery past the whole retry window; every reply
    # came after its coordinator had given up, every re-send and every new recovery added
    # to the backlog, and the keys stayed locked (docs/sidecars.md, "Overload").
    retry_backoff_max_micros: int = 2_000_000
    max_attempts: int = 8
    preaccept_timeout_micros: int = 10_000_000
    # A home-shard replica recovers a txn idle this long; other replicas wait longer.
    recover_delay_micros: int = 1_000_000
    recover_delay_other_micros: int = 3_000_000
    # Adaptive: those two are floors; the delay grows to factor x the percentile-th
    # PreAccept->Apply time this replica saw over its last window applied txns, up to
    # recover_delay_max_micros (accord/local/recover_delay.py). Off: the fixed delays.
    recover_delay_adaptive: bool = True
    recover_delay_latency_factor: float = 2.0
    recover_delay_percentile: float = 99.0
    recover_delay_max_micros: int = 8_000_000
    recover_delay_window: int = 512
    recover_backoff_max_micros: int = 8_000_000
    progress_scan_micros: int = 100_000
    # At most this many coordinators started by the progress log (recoveries, re-sent
    # outcomes, invalidations) run at once per node, oldest transaction first: after a
    # restart or a burst, unbounded recovery flooded peers' queues until nothing progressed.
    max_progress_coordinators: int = 32
    client_timeout_micros: int = 10_000_000
    reorder_buffer_micros: int = 0
    reorder_buffer_max: int = 10_000
    hlc_reserve_micros: int = 1_000_000
    # Every replica shares one data store (the sidecars' Cassandra): one replica per shard
    # writes each outcome and tells the others, which take over after
    # recover_delay_other_micros if it stays silent. False: every replica writes its own
    # store (the simulator, Maelstrom).
    shared_storage: bool = False
    # Group commit: client transactions submitted while the host works on a batch of
    # ready() (say, awaits its journal fsync) are coordinated as one Accord transaction,
    # a batch (Txn.batch), of at most this many parts and batch_max_keys keys; its messages,
    # journal records and deps are shared by every part. 1: each is coordinated alone,
    # at once in submit() (the protocol as it was).
    batch_max_parts: int = 1
    batch_max_keys: int = 256

    def __post_init__(self) -> None:
        for config_field in fields(self):
            name = config_field.name
            check_argument(getattr(self, name) >= 0, "%s must not be negative", name)
        check_argument(self.max_attempts >= 1, "max_attempts must be at least 1")
        check_argument(
            1 <= self.batch_max_parts <= MAX_BATCH_PARTS,
            "batch_max_parts must be from 1 to %d",
            MAX_BATCH_PARTS,
        )
        check_argument(self.batch_max_keys >= 1, "batch_max_keys must be at least 1")
        check_argument(
            self.max_progress_coordinators >= 1, "max_progress_coordinators must be at least 1"
        )
        # The backoff caps every delay (accord.node.progress): a larger learned one could not act.
        check_argument(
            self.recover_delay_max_micros <= self.recover_backoff_max_micros,
            "recover_delay_max_micros (%d) must not exceed recover_backoff_max_micros (%d)",
            self.recover_delay_max_micros,
            self.recover_backoff_max_micros,
        )


@dataclass(slots=True)
class NodeStats:
    submitted: int = 0
    fast_path: int = 0
    slow_path: int = 0
    recoveries: int = 0
    # Outcomes asked for without a ballot (CheckStatus) by a coordinator that is no replica.
    status_checks: int = 0
    invalidations: int = 0
    # Progress-log work postponed because max_progress_coordinators were already running.
    progress_deferred: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    # Transactions coordinated by this node's submit(), by how many client transactions
    # each carried (1: alone; more: a batch).
    parts_per_batch: dict[int, int] = field(default_factory=dict)
