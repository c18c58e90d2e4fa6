"""The contracts between the sans-IO core and whatever hosts it.

A host (the simulator, the Maelstrom adapter, the gRPC sidecar) drives a
:class:`accord.node.Node` in a loop, the way etcd's raft is driven::

    node.step(envelope)          # or node.tick(), node.submit(...), node.read_done(...)
    ready = node.ready()                 # the batch; later inputs go to the next one
    journal.append(ready.persist)        # 1. durable first
    node.advance(ready)                  # 2. acknowledge: ready.persist is durable
    for envelope in ready.messages: send(envelope)      # 3. then talk
    for reply in ready.replies: answer_client(reply)
    for read in ready.reads: schedule(read)     # 4. data work, results fed back via step
    for write in ready.writes: schedule(write)

``advance(ready)`` means exactly one thing: the host has made ``ready.persist`` durable.
Every host calls it right after its journal append returns and before anything in the
batch leaves the process; ``ready()`` refuses to hand out the next batch until it has. A
host that awaits its fsync may keep feeding the node inputs meanwhile: they land in the
next batch, never in the one being persisted.

Ordering and durability contract:

* Everything in ``ready.persist`` must be durable (fsync or equivalent) before any message
  in ``ready.messages`` is sent or any reply in ``ready.replies`` is delivered. Replies
  promise ballots, votes and decisions that a crash must not forget. Two exceptions a host
  may use (or not): the messages in ``ready.early``, requests that vouch for none of the
  batch's records, may be sent before the append; and ``ready.reads`` may start before it
  (a read's result leaves the node only in a later batch).
* Reads and writes of user data for one key must be performed in the order they appear
  across successive ``Ready`` batches. The node never issues a write for a transaction
  before every earlier-ordered read of that key has been issued.
* A write carries ``execute_at``; the data store must make it idempotent and order-agnostic
  by that timestamp (last-write-wins with a timestamp derived injectively and
  monotonically from ``execute_at``). Replaying a write after a crash is then harmless.
* After a restart, build a new node from what the journal replays:
  ``Node(..., journal=journal.replay())``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from accord.local.command import CommandSnapshot
from accord.local.effects import DataRead, DataWrite
from accord.messages import Envelope
from accord.primitives import (
    Key,
    MemoryPartitions,
    PartitionRead,
    Selection,
    Timestamp,
    TxnId,
    TxnResult,
    WriteOp,
)
from accord.primitives.rows import (
    ColumnKey,
    ColumnKeys,
    in_slice,
    order_key,
    partition_too_large,
    slice_too_large,
    value_size,
)


class Clock(Protocol):
    """Physical time in microseconds. Need not be monotonic across nodes; the HLC copes."""

    def now_micros(self) -> int: ...


class HlcFloor(NamedTuple):
    """The node will never mint an HLC value at or below ``value`` after a restart."""

    value: int


class Durable(NamedTuple):
    """Every replica applied these transactions (the node learned it from ``InformDurable``).

    Journaled so that a restarted node neither re-sends their outcome to every replica nor
    re-indexes them as live dependencies: before this was recorded, a restart re-persisted
    every transaction the node had applied and flooded its peers (docs/sidecars.md).
    Losing one (a crash before its batch is written) only costs that re-send.
    """

    txn_ids: tuple[Timestamp, ...]


JournalRecord = CommandSnapshot | HlcFloor | Durable


class Journal(Protocol):
    """Append-only durable log of a node's protocol state.

    ``replay`` may compact: it returns records that restore the same state (the latest
    snapshot of each command, the highest HLC floor, every durable txn) when a new
    :class:`accord.node.Node` is built from them (``journal=``), not necessarily every
    record appended.
    """

    def append(self, records: Sequence[JournalRecord]) -> None:
        """Make ``records`` durable, in order, before returning."""

    def replay(self) -> list[JournalRecord]:
        """What every record appended before restores, in order."""

    def close(self) -> None:
        """Release the log's resources; nothing may be appended afterwards."""


class AsyncJournal(Protocol):
    """:class:`Journal` for a host with an event loop: ``append`` is awaited, so the loop
    keeps serving (and the node keeps batching inputs) while the records are made durable."""

    async def append(self, records: Sequence[JournalRecord]) -> None:
        """Make ``records`` durable, in order, before returning."""

    def replay(self) -> list[JournalRecord]:
        """What every record appended before restores, in order."""

    def close(self) -> None:
        """Release the log's resources; nothing may be appended afterwards."""


class DataStore(Protocol):
    """User data, written only through the protocol: partitions of rows
    (:mod:`accord.primitives.rows`), with :class:`accord.primitives.MemoryPartitions` the
    reference model of their semantics.

    * ``read`` answers every selection as of ``execute_at``, grouped by key, each key's
      :class:`PartitionRead` holding every selection's result or the one error a limit gives
      (:data:`~accord.primitives.MAX_ROWS_PER_SLICE`,
      :data:`~accord.primitives.MAX_PARTITION_READ_BYTES`). A row written with a TTL is
      visible iff ``execute_at.hlc`` precedes its writer's executeAt HLC plus the TTL.
    * ``write`` applies computed writes (rows, static rows, row/range/partition deletes)
      idempotently and order-agnostically with a timestamp derived from ``execute_at``;
      at equal timestamps a deletion wins over a write, as in Cassandra.
    """

    def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> Mapping[Key, PartitionRead]:
        """Every selection's result as of ``execute_at``."""

    def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        """Apply ``writes`` idempotently with a write timestamp derived from ``execute_at``."""


if TYPE_CHECKING:  # the reference model satisfies the Protocol (checked by mypy)
    _MODEL: DataStore = MemoryPartitions()


@dataclass(frozen=True, slots=True)
class ClientReply:
    """The answer to ``Node.submit``: ``ok`` (committed; ``result`` set), ``invalidated``
    (definitely never executes) or ``unknown`` (the outcome could not be learned in time;
    the transaction may still commit)."""

    request_id: int
    txn_id: TxnId
    outcome: str
    result: TxnResult | None = None


@dataclass(slots=True)
class Ready:
    """Everything the node wants done since the last ``advance``."""

    persist: list[JournalRecord] = field(default_factory=list)
    messages: list[Envelope] = field(default_factory=list)
    replies: list[ClientReply] = field(default_factory=list)
    reads: list[DataRead] = field(default_factory=list)
    writes: list[DataWrite] = field(default_factory=list)
    # Those of ``messages`` (the same objects, in the same order) that may leave before
    # ``persist`` is durable (a host may also send them after it, with the rest): requests
    # that rest on none of this batch's records (Node._send says which; docs/accord.md,
    # "Requests that need no fsync"). ``messages`` keeps its order either way.
    early: list[Envelope] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.persist or self.messages or self.replies or self.reads or self.writes)


__all__ = [
    "AsyncJournal",
    "ClientReply",
    "Clock",
    "ColumnKey",
    "ColumnKeys",
    "CommandSnapshot",
    "DataRead",
    "DataStore",
    "DataWrite",
    "Durable",
    "HlcFloor",
    "Journal",
    "JournalRecord",
    "MemoryPartitions",
    "PartitionRead",
    "Ready",
    "Selection",
    "in_slice",
    "order_key",
    "partition_too_large",
    "slice_too_large",
    "value_size",
]
