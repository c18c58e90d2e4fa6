"""Timestamps, transaction ids and ballots.

A :class:`Timestamp` is ``(epoch, hlc, flags, node)``. Its order is the protocol's total
order: epoch first, then the hybrid-logical-clock value, then the identity flags, then the
node id. Tuples compare field by field in C, which keeps the simulator fast, so the
timestamp is a ``NamedTuple``. Only identity flags (the transaction kind) live in ``flags``;
a replica's "rejected" verdict travels as a separate boolean in replies so it can never leak
into the order (reference: Accord ``Timestamp.java``, REJECTED is not part of identity).

Unique: every node mints HLC values that are strictly increasing for that node, and the node
id breaks ties, so two timestamps from different nodes or different mints never compare equal.
"""

from __future__ import annotations

import enum
from typing import Annotated, NamedTuple, TypeAlias

import msgspec

from accord.invariants import check_argument

Int64: TypeAlias = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An ``int`` that crosses the wire: msgspec's typed decoding refuses any outside signed
64 bits (msgpack itself carries unsigned 64-bit integers too)."""


class Kind(enum.IntEnum):
    """What a transaction does, which decides what it conflicts with.

    Reads witness only writes (two reads never conflict); writes witness everything
    (reference: Accord ``Txn.Kind.witnesses``).
    """

    READ = 0
    WRITE = 1

    def conflicts_with(self, other: Kind) -> bool:
        return self is Kind.WRITE or other is Kind.WRITE


class Timestamp(NamedTuple):
    """A point in the protocol's total order; also used as TxnId and Ballot."""

    epoch: Int64
    hlc: Int64
    flags: Int64
    node: Int64

    @property
    def kind(self) -> Kind:
        return _KINDS[self.flags & 1]

    def with_epoch_at_least(self, epoch: int) -> Timestamp:
        return self if self.epoch >= epoch else self._replace(epoch=epoch)

    def __str__(self) -> str:
        return f"{self.epoch}:{self.hlc}:{self.flags}:{self.node}"

    @staticmethod
    def parse(text: str) -> Timestamp:
        parts = text.split(":")
        check_argument(len(parts) == 4, "timestamp %r must be epoch:hlc:flags:node", text)
        epoch, hlc, flags, node = (int(p) for p in parts)
        return Timestamp(epoch, hlc, flags, node)


_KINDS = (Kind.READ, Kind.WRITE)

# A TxnId is the timestamp a coordinator proposes (t0); its flags carry the Kind.
TxnId = Timestamp
# A Ballot orders competing recovery coordinators; the original coordinator uses ZERO.
Ballot = Timestamp

BALLOT_ZERO: Ballot = Timestamp(0, 0, 0, 0)
TIMESTAMP_MIN: Timestamp = Timestamp(0, 0, 0, 0)


def txn_id_of(epoch: int, hlc: int, kind: Kind, node: int) -> TxnId:
    return Timestamp(epoch, hlc, int(kind), node)


def merge_max(a: Timestamp, b: Timestamp) -> Timestamp:
    """The larger whole timestamp compared without epochs, raised to the larger epoch.

    Taking the larger hlc field while keeping the other timestamp's node id would forge a
    timestamp nobody minted and break uniqueness (reference: Accord ``Timestamp.mergeMax``).
    """
    larger = a if (a.hlc, a.flags, a.node) > (b.hlc, b.flags, b.node) else b
    return larger.with_epoch_at_least(max(a.epoch, b.epoch))


class Hlc:
    """A node's hybrid logical clock: physical microseconds, strictly increasing per node.

    ``floor`` is the highest value the node has promised never to re-issue; the node
    persists a new floor before it uses any value above the old one, so a restart can
    never mint a TxnId it minted before (reference: Accord ``Node.uniqueNow`` TODO about
    re-issuing TxnIds after restart).
    """

    __slots__ = ("floor", "last", "node", "reserve_micros")

    def __init__(self, node: int, *, floor: int = 0, reserve_micros: int = 1_000_000) -> None:
        check_argument(reserve_micros > 0, "reserve_micros must be positive")
        self.node = node
        self.last = floor
        self.floor = floor
        self.reserve_micros = reserve_micros

    def next(self, physical_micros: int, at_least: Timestamp | None = None) -> int:
        """The next unique hlc value; at least ``at_least.hlc + 1`` when given."""
        value = max(physical_micros, self.last + 1)
        if at_least is not None and at_least.hlc >= value:
            value = at_least.hlc + 1
        self.last = value
        return value

    def floor_to_persist(self) -> int | None:
        """A new floor the caller must persist before sending what used ``last``, or None."""
        if self.last < self.floor:
            return None
        self.floor = self.last + self.reserve_micros
        return self.floor
