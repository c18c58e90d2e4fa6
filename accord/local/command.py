"""One replica's record of one transaction, and of one key.

Only ``Command`` fields above the line marked *volatile* are durable: they are exactly what
a :class:`CommandSnapshot` carries into the journal. The volatile fields are rebuilt from
the durable ones after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from accord.primitives import (
    BALLOT_ZERO,
    EMPTY_DEPS,
    TIMESTAMP_MIN,
    Ballot,
    Deps,
    Key,
    Kind,
    Route,
    Status,
    Timestamp,
    Txn,
    TxnId,
    TxnResult,
    WriteOp,
)


class CommandSnapshot(NamedTuple):
    """The durable state of a command, as written to the journal."""

    txn_id: TxnId
    status: Status
    txn: Txn | None
    route: Route | None
    promised: Ballot
    accepted: Ballot
    execute_at: Timestamp | None
    deps: Deps
    writes: tuple[WriteOp, ...] | None
    result: TxnResult | None
    fast_vote: bool
    key_hint: Key | None


_new_tuple = tuple.__new__


@dataclass(slots=True, eq=False)
class Command:
    txn_id: TxnId
    status: Status = Status.NOT_DEFINED
    txn: Txn | None = None
    route: Route | None = None
    promised: Ballot = BALLOT_ZERO
    accepted: Ballot = BALLOT_ZERO
    # witnessedAt while PreAccepted, the proposal while Accepted, final once committed.
    execute_at: Timestamp | None = None
    deps: Deps = EMPTY_DEPS
    writes: tuple[WriteOp, ...] | None = None
    result: TxnResult | None = None
    fast_vote: bool = False
    # For a txn whose definition this replica lacks: a key through which it conflicts or
    # was proposed for invalidation here, naming the shard to ask about it.
    key_hint: Key | None = None
    # --- volatile: rebuilt after restart -------------------------------------------------
    waiting_on: dict[TxnId, None] | None = None
    readers: list[tuple[int, int]] = field(default_factory=list)
    reading: bool = False
    writing: bool = False
    indexed: bool = False
    pruned: bool = False
    durable: bool = False
    # The outcome held here is journaled by a quorum of every shard (OutcomeDurable, a
    # chosen Apply, InformDurable): only then may its writes reach the data store. Not
    # journaled: after a restart the progress log finds out again (recovery re-proposes).
    chosen: bool = False
    # Shared storage (NodeConfig.shared_storage): replicas that told us they wrote the
    # chosen outcome's writes for every shard they replicate, and whether this replica
    # writes them itself (it is a designated writer, or took over from a silent one).
    written_from: set[int] = field(default_factory=set)
    take_over: bool = False
    last_progress_micros: int = 0
    recovery_attempts: int = 0

    def snapshot(self) -> CommandSnapshot:
        # tuple.__new__ directly: NamedTuple's own __new__ is a Python frame, once per
        # journaled record.
        return _new_tuple(
            CommandSnapshot,
            (
                self.txn_id,
                self.status,
                self.txn,
                self.route,
                self.promised,
                self.accepted,
                self.execute_at,
                self.deps,
                self.writes,
                self.result,
                self.fast_vote,
                self.key_hint,
            ),
        )

    @staticmethod
    def restore(snapshot: CommandSnapshot) -> Command:
        return Command(*snapshot)

    @property
    def kind(self) -> Kind:
        return self.txn_id.kind


@dataclass(slots=True, eq=False)
class KeyState:
    """What one replica knows about one key: its unpruned transactions by kind, and the
    highest executeAt among those pruned (see ``CommandStore.mark_durable``)."""

    reads: dict[TxnId, Command] = field(default_factory=dict)
    writes: dict[TxnId, Command] = field(default_factory=dict)
    # Pruned transactions were applied everywhere; recovery treats them as proof against a
    # fast path for any undecided transaction below them (see CommandStore.begin_recovery),
    # and PreAccept treats them as conflicts that a fast vote must exceed.
    pruned_write: Timestamp = TIMESTAMP_MIN
    pruned_any: Timestamp = TIMESTAMP_MIN

    def pruned_conflict(self, kind: Kind) -> Timestamp:
        return self.pruned_write if kind is Kind.READ else self.pruned_any

    def conflicting(self, kind: Kind) -> list[dict[TxnId, Command]]:
        return [self.writes] if kind is Kind.READ else [self.writes, self.reads]
