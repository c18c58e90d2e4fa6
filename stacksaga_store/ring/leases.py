"""Token-range leases: the values, and the coordinator's state machine (no I/O).

Theory of operation
-------------------
Retry-Nodes of one service share the 64-bit Murmur3 ring (-2^63 .. 2^63-1). The coordinator
splits it into ``n`` contiguous, non-overlapping :class:`TokenRange` s for the ``n`` live nodes,
sorted by node id (:func:`split_ring`); the node holding the range that starts at -2^63 (ordinal 0)
is *Node-0*. Each grant is a :class:`Lease` with a fencing ``epoch``.

Two rules keep two nodes from ever working on the same token at the same time:

1. **Time.** A lease is valid for ``L`` seconds counted, by the *node*, from the moment it sent
   the message the grant answers (its monotonic clock, shortened by a drift allowance). The
   coordinator counts from the moment it sent the grant, which is later, and considers the range
   free only ``margin`` seconds after that validity ends. Only durations cross the network, so
   clock *skew* between machines is irrelevant; clock *rate* drift is covered by the margin.
2. **Epochs.** All leases of one epoch are a partition of the ring. A rebalance (join, leave)
   revokes every lease of epoch ``e`` and waits until each holder released it (it acknowledged,
   after finishing its in-flight work) or it expired; only then is epoch ``e + 1`` persisted
   (an LWT that only the current master can win, :mod:`stacksaga_store.ring.server`) and the new
   leases granted. A node acts only under the lease and epoch it started a pass with
   (:class:`~stacksaga_store.recovery.retry_node.RetryNode` checks before every query and
   dispatch), so a
   paused process that wakes after its lease ended stops at its next check instead of acting.

:class:`ServiceRing` is the coordinator's state machine for one service. Every input (hello,
renew, released, disconnect, tick, epoch persisted) returns the messages to send; the shell
persists an epoch before it sends any grant of that epoch (raft's "persist before send").
Phases::

    ADOPTING --window over, ring covered--> STABLE --join/leave/expiry--> DRAINING
    ADOPTING --window over, gaps/changes--> DRAINING --all released/expired--> PERSISTING
    PERSISTING --epoch e+1 persisted--> STABLE (new leases)      --persist failed--> DRAINING

ADOPTING is how a standby that just became master takes over without a gap: for one lease
duration it renews, unchanged, the leases nodes present from the previous master (same
persisted epoch, no overlap) and grants nothing new; anything not re-presented by then has
expired, and a normal rebalance follows.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from accord_cassandra.tokens import MAX_TOKEN, MIN_TOKEN
from stacksaga_store.errors import StackSagaError, check_state

__all__ = [
    "DRIFT_ALLOWANCE",
    "FULL_RING",
    "Grant",
    "Lease",
    "LeaseSource",
    "Outbound",
    "PersistEpoch",
    "Phase",
    "RangeLeaseLost",
    "Revoke",
    "ServiceRing",
    "StaticLeaseSource",
    "TokenRange",
    "margin_seconds",
    "split_ring",
]

# The node shortens its validity by this fraction (clock rate drift between two machines is
# far below 1%); the coordinator adds margin_seconds() before reusing a range.
DRIFT_ALLOWANCE = 0.02
MEMBERS_MAX = 1024


class RangeLeaseLost(StackSagaError):
    """The Retry-Node's token-range lease expired, was revoked, or changed epoch: it must stop
    querying and dispatching at once (the next holder takes over)."""

    retryable = True


@dataclass(frozen=True, slots=True, order=True)
class TokenRange:
    """Inclusive bounds on the Murmur3 ring."""

    start: int
    end: int

    def __post_init__(self) -> None:
        check_state(MIN_TOKEN <= self.start <= self.end <= MAX_TOKEN, f"bad token range {self}")

    def contains(self, token: int) -> bool:
        return self.start <= token <= self.end

    def overlaps(self, other: TokenRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"


FULL_RING = TokenRange(MIN_TOKEN, MAX_TOKEN)


def split_ring(count: int) -> tuple[TokenRange, ...]:
    """``count`` contiguous ranges covering the ring, the first starting at -2^63."""
    check_state(1 <= count <= MEMBERS_MAX, f"cannot split the ring {count} ways")
    span = MAX_TOKEN - MIN_TOKEN + 1
    bounds = [MIN_TOKEN + span * i // count for i in range(count + 1)]
    return tuple(TokenRange(bounds[i], bounds[i + 1] - 1) for i in range(count))


def covers_ring(ranges: Sequence[TokenRange]) -> bool:
    """Do these ranges partition the ring exactly (no gap, no overlap)?"""
    ordered = sorted(ranges)
    if not ordered or ordered[0].start != MIN_TOKEN or ordered[-1].end != MAX_TOKEN:
        return False
    return all(a.end + 1 == b.start for a, b in itertools.pairwise(ordered))


def margin_seconds(lease_seconds: float) -> float:
    """How much longer than a lease the coordinator waits before reusing its range."""
    return max(0.2, lease_seconds * DRIFT_ALLOWANCE * 2)


@dataclass(frozen=True, slots=True)
class Lease:
    """A token range held by this node, valid until ``valid_until`` (its monotonic clock)."""

    service_name: str
    range: TokenRange
    epoch: int
    ordinal: int
    members: int
    valid_until: float

    @property
    def is_node_zero(self) -> bool:
        """Node-0 is the holder of the lowest range (seed: 'the lowest token lease')."""
        return self.range.start == MIN_TOKEN

    def valid(self, now: float) -> bool:
        return now < self.valid_until


RING_ROW_PREFIX = "ring:"


def ring_row_name(service_name: str) -> str:
    """The ``es_ring_state.name`` of a service ring's fencing-epoch row."""
    return RING_ROW_PREFIX + service_name


class LeaseSource(Protocol):
    """Where a Retry-Node gets its lease from (the coordinator client, or a static one)."""

    def current(self) -> Lease | None:
        """The lease now held, or None. Never returns an expired lease as valid."""
        ...

    def monotonic(self) -> float:
        """The clock ``Lease.valid_until`` is on."""
        ...

    def note_in_flight(self, count: int) -> None:
        """How many dispatches are running (a revoked lease is released only at 0)."""
        ...


class StaticLeaseSource:
    """A fixed range, forever: one Retry-Node without a coordinator (the whole ring), a
    static split configured by hand, and tests."""

    def __init__(
        self,
        service_name: str,
        *,
        token_range: TokenRange | None = None,
        epoch: int = 1,
        members: int = 1,
    ) -> None:
        chosen = token_range or FULL_RING
        ordinal = 0 if chosen.start == MIN_TOKEN else 1
        self._lease: Lease | None = Lease(service_name, chosen, epoch, ordinal, members, math.inf)
        self.in_flight = 0

    def current(self) -> Lease | None:
        return self._lease

    def revoke(self) -> None:
        """Take the lease away (tests: a lease lost mid-pass)."""
        self._lease = None

    def monotonic(self) -> float:
        return time.monotonic()

    def note_in_flight(self, count: int) -> None:
        self.in_flight = count


# -- the coordinator's state machine --------------------------------------------------------


class Phase(StrEnum):
    ADOPTING = "ADOPTING"
    STABLE = "STABLE"
    DRAINING = "DRAINING"
    PERSISTING = "PERSISTING"


@dataclass(frozen=True, slots=True)
class Grant:
    node_id: str
    range: TokenRange
    epoch: int
    ordinal: int
    members: int
    sequence: int


@dataclass(frozen=True, slots=True)
class Revoke:
    node_id: str
    epoch: int
    sequence: int
    reason: str


@dataclass(frozen=True, slots=True)
class PersistEpoch:
    """The shell must make ``epoch`` durable (fenced by leadership), then call
    :meth:`ServiceRing.persisted` (or :meth:`ServiceRing.persist_failed`)."""

    service_name: str
    previous: int
    epoch: int


Outbound = Grant | Revoke | PersistEpoch


@dataclass(slots=True)
class _Holder:
    range: TokenRange
    expires: float  # coordinator monotonic time after which the holder stopped using it


@dataclass(slots=True)
class ServiceRing:
    """One service's ring on the coordinator. Pure: time comes in as ``now`` (seconds)."""

    service_name: str
    epoch: int
    lease_seconds: float
    now: float
    phase: Phase = field(init=False)
    members: dict[str, int] = field(default_factory=dict)  # connected node -> last sequence
    holders: dict[str, _Holder] = field(default_factory=dict)
    adopt_until: float = field(init=False)
    lease_changes: int = 0

    def __post_init__(self) -> None:
        check_state(self.lease_seconds > 0, "lease duration must be positive")
        # A ring this process has no memory of: if an epoch was ever persisted, leases of it
        # may still be out there (granted by a previous master), so adopt before granting.
        self.phase = Phase.ADOPTING if self.epoch > 0 else Phase.STABLE
        self.adopt_until = self.now + self.lease_seconds + self.margin

    @property
    def margin(self) -> float:
        return margin_seconds(self.lease_seconds)

    # -- inputs ----------------------------------------------------------------------------

    def hello(
        self, node_id: str, sequence: int, held: tuple[TokenRange, int] | None, now: float
    ) -> list[Outbound]:
        """A node opened (or re-opened) its session, possibly presenting a lease it holds."""
        self.members[node_id] = sequence
        check_state(len(self.members) <= MEMBERS_MAX, "too many Retry-Nodes in one ring")
        if held is not None and held[1] == self.epoch:
            if self.phase is Phase.ADOPTING and self._adoptable(node_id, held[0]):
                self.holders[node_id] = _Holder(held[0], now + self.lease_seconds)
                return [self._grant(node_id, now)]
            current = self.holders.get(node_id)
            if self.phase is Phase.STABLE and current is not None and current.range == held[0]:
                current.expires = now + self.lease_seconds
                return [self._grant(node_id, now)]  # a reconnect to the same master
        if self.phase is Phase.STABLE:
            return self._start_draining(now, f"{node_id} joined")
        if self.phase is Phase.DRAINING and node_id in self.holders:
            return [Revoke(node_id, self.epoch, sequence, "rebalancing")]
        return []

    def renew(self, node_id: str, sequence: int, epoch: int, now: float) -> list[Outbound]:
        if node_id not in self.members:
            return []
        self.members[node_id] = sequence
        holder = self.holders.get(node_id)
        if holder is None or epoch != self.epoch:
            return []
        if self.phase in (Phase.STABLE, Phase.ADOPTING):
            holder.expires = now + self.lease_seconds
            return [self._grant(node_id, now)]
        return [Revoke(node_id, self.epoch, sequence, "rebalancing")]

    def released(self, node_id: str, sequence: int, epoch: int, now: float) -> list[Outbound]:
        """The node stopped using its lease of ``epoch`` and has nothing in flight."""
        if node_id in self.members:
            self.members[node_id] = sequence
        if epoch != self.epoch or node_id not in self.holders:
            return self.tick(now)
        del self.holders[node_id]
        if self.phase in (Phase.STABLE, Phase.ADOPTING):
            # Unasked: a graceful leave. Its range is free now, so rebalance at once.
            self.members.pop(node_id, None)
            if self.phase is Phase.STABLE:
                return self._start_draining(now, f"{node_id} left")
        return self.tick(now)

    def disconnect(self, node_id: str, now: float) -> list[Outbound]:
        """The session ended without a Released. The holder may still be working (a broken
        stream is not a dead process): its range stays taken until the lease runs out, and
        a reconnect that presents the lease within that time just renews it."""
        self.members.pop(node_id, None)
        return self.tick(now)

    def tick(self, now: float) -> list[Outbound]:
        if self.phase is Phase.ADOPTING and now >= self.adopt_until:
            self.phase = Phase.STABLE
            ranges = [holder.range for holder in self.holders.values()]
            settled = covers_ring(ranges) and set(self.holders) == set(self.members)
            if not settled and (self.members or self.holders):
                return self._start_draining(now, "adoption ended with gaps or changes")
            return []
        if self.phase is Phase.STABLE:
            # A holder that stopped renewing (a paused or wedged process with its stream
            # still open) is evicted; it re-joins with a fresh Hello when it wakes up.
            stale = [n for n, h in self.holders.items() if now >= h.expires + self.margin]
            if not stale:
                return []
            for node_id in stale:
                self.members.pop(node_id, None)
            return self._start_draining(now, f"{', '.join(sorted(stale))} stopped renewing")
        if self.phase is not Phase.DRAINING:
            return []
        for node_id in [n for n, h in self.holders.items() if now >= h.expires + self.margin]:
            del self.holders[node_id]
        if self.holders:
            return []
        if not self.members:
            self.phase = Phase.STABLE  # nobody to grant to; the next join rebalances
            return []
        self.phase = Phase.PERSISTING
        return [PersistEpoch(self.service_name, self.epoch, self.epoch + 1)]

    def persisted(self, epoch: int, now: float) -> list[Outbound]:
        """Epoch ``epoch`` is durable: grant the new partition to the current members."""
        check_state(self.phase is Phase.PERSISTING, f"persisted while {self.phase}")
        check_state(epoch == self.epoch + 1, f"persisted epoch {epoch} after {self.epoch}")
        check_state(not self.holders, "granting while old leases are out")
        self.epoch = epoch
        self.phase = Phase.STABLE
        if not self.members:
            return []
        # Sorted by node id, not join order: the same members get the same ranges back after
        # any rebalance (a master failover, a reconnect), so little work changes hands.
        members = sorted(self.members)
        ranges = split_ring(len(members))
        grants: list[Outbound] = []
        for node_id, token_range in zip(members, ranges, strict=True):
            self.holders[node_id] = _Holder(token_range, now + self.lease_seconds)
            grants.append(self._grant(node_id, now))
        self.lease_changes += len(grants)
        return grants

    def persist_failed(self, now: float) -> list[Outbound]:
        """The epoch LWT failed (lost leadership, Cassandra down): retry on a later tick."""
        if self.phase is Phase.PERSISTING:
            self.phase = Phase.DRAINING
        return []

    # -- helpers ------------------------------------------------------------------------------

    def _adoptable(self, node_id: str, token_range: TokenRange) -> bool:
        return all(
            not token_range.overlaps(holder.range)
            for other, holder in self.holders.items()
            if other != node_id
        )

    def _start_draining(self, now: float, reason: str) -> list[Outbound]:
        self.phase = Phase.DRAINING
        revokes: list[Outbound] = [
            Revoke(node_id, self.epoch, self.members[node_id], reason)
            for node_id in self.holders
            if node_id in self.members
        ]
        return revokes + self.tick(now)

    def _grant(self, node_id: str, now: float) -> Grant:
        holder = self.holders[node_id]
        ordered = sorted(h.range for h in self.holders.values())
        return Grant(
            node_id=node_id,
            range=holder.range,
            epoch=self.epoch,
            ordinal=ordered.index(holder.range),
            members=len(self.holders),
            sequence=self.members.get(node_id, 0),
        )
