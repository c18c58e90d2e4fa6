"""Every request and reply exchanged between replicas, as immutable values.

Messages are thin: a replica's handling of each one lives in ``accord.local.commands``;
these classes only carry data. ``cid`` (coordination id) is chosen by the sending
coordinator and echoed in the reply so that a node can route replies to the right
coordination attempt and drop replies to attempts it abandoned.

``has_side_effects`` marks requests whose handling changes durable replica state: the
receiving node persists that state before it replies (see ``accord.api.Journal``).

Each is a frozen ``msgspec.Struct``: immutable, hashable and compared field by field like a
frozen dataclass, but built in C (messages are created on every step of the protocol), and
untracked by the garbage collector (``gc=False``: a message holds only immutable values and
can never be part of a reference cycle). Their wire form is :mod:`accord.codec`'s.
"""

from __future__ import annotations

from typing import ClassVar, TypeAlias

import msgspec

from accord.primitives import (
    BALLOT_ZERO,
    Ballot,
    Deps,
    Key,
    Route,
    Status,
    Timestamp,
    Txn,
    TxnId,
    TxnResult,
    WriteOp,
)


class PreAccept(msgspec.Struct, frozen=True, gc=False):
    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    txn: Txn
    route: Route


class PreAcceptOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId
    witnessed_at: Timestamp
    deps: Deps
    # True when the replica refused to order the txn (it arrived too late): the coordinator
    # must invalidate rather than propose.
    rejected: bool = False


class Nack(msgspec.Struct, frozen=True, gc=False):
    """A request refused because the replica promised a higher ballot, or because the
    transaction is already past the phase the request belongs to (``status``)."""

    cid: int
    txn_id: TxnId
    promised: Ballot
    status: Status = Status.NOT_DEFINED


class Accept(msgspec.Struct, frozen=True, gc=False):
    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    txn: Txn
    route: Route
    ballot: Ballot
    execute_at: Timestamp
    deps: Deps


class AcceptOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId
    deps: Deps


class AcceptInvalidate(msgspec.Struct, frozen=True, gc=False):
    """Propose to invalidate ``txn_id``.

    ``route`` names keys of the txn (the whole route, or only the key a route-less
    invalidation goes through) so that a replica which never saw the txn can still chase
    the decision later through a shard it owns: without it, a lost CommitInvalidate
    would leave that replica holding an undecided proposal forever.
    """

    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    ballot: Ballot
    route: Route | None = None


class AcceptInvalidateOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId


class Commit(msgspec.Struct, frozen=True, gc=False):
    """The decided executeAt and deps. ``stable`` means every replica may execute: it is
    sent on the fast path at once, and on the slow path only after a quorum of each shard
    acknowledged the non-stable commit. ``read`` asks this replica to read for the txn
    once it can. ``txn``/``route`` are omitted when the replica is known to have them."""

    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    execute_at: Timestamp
    deps: Deps
    stable: bool
    read: bool = False
    txn: Txn | None = None
    route: Route | None = None


class CommitOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId


class Insufficient(msgspec.Struct, frozen=True, gc=False):
    """The replica lacks the txn definition; the sender must resend it maximally."""

    cid: int
    txn_id: TxnId


class ReadOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId
    values: tuple[tuple[Key, object], ...]


class ReadRedundant(msgspec.Struct, frozen=True, gc=False):
    """The replica already holds the txn's outcome, proposed under ``ballot``; ``chosen``
    says it knows that outcome durable at a quorum of every shard."""

    cid: int
    txn_id: TxnId
    writes: tuple[WriteOp, ...]
    result: TxnResult
    ballot: Ballot = BALLOT_ZERO
    chosen: bool = False


class Apply(msgspec.Struct, frozen=True, gc=False):
    """The outcome, proposed under ``ballot`` (a replica that promised a higher one refuses
    it), or ``chosen``: known durable at a quorum of every shard, so taken whatever the
    replica promised, and written once its deps allow."""

    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    txn: Txn
    route: Route
    execute_at: Timestamp
    deps: Deps
    writes: tuple[WriteOp, ...]
    result: TxnResult
    ballot: Ballot = BALLOT_ZERO
    chosen: bool = False


class ApplyOk(msgspec.Struct, frozen=True, gc=False):
    """The outcome is journaled here; ``applied``: and its writes are in the data store."""

    cid: int
    txn_id: TxnId
    applied: bool = True


class OutcomeDurable(msgspec.Struct, frozen=True, gc=False):
    """The outcome this replica acknowledged under ``ballot`` is journaled by a quorum of
    every shard: it can never change, so its writes may reach the data store. ``written``
    (shared storage): the sender also wrote them, for every key it owns."""

    has_side_effects: ClassVar[bool] = False
    cid: int
    txn_id: TxnId
    ballot: Ballot
    written: bool = False


class CommitInvalidate(msgspec.Struct, frozen=True, gc=False):
    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId


class InformDurable(msgspec.Struct, frozen=True, gc=False):
    """Every replica of every shard applied the txn; replicas may prune it from indexes."""

    has_side_effects: ClassVar[bool] = False
    cid: int
    txn_id: TxnId


class BeginRecovery(msgspec.Struct, frozen=True, gc=False):
    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    txn: Txn
    route: Route
    ballot: Ballot


class RecoverOk(msgspec.Struct, frozen=True, gc=False):
    """One replica's view for recovery (reference: Accord ``BeginRecovery.RecoverOk``).

    ``accepts_fast_path``: this replica voted for executeAt == txnId in PreAccept.
    ``rejects_fast_path``: a conflicting txn this replica knows proves no fast quorum formed.
    ``earlier_accepted_no_witness``: earlier txns proposed to execute after us without
    having witnessed us; ``earlier_committed_witness``: earlier txns committed witnessing us.
    """

    cid: int
    txn_id: TxnId
    status: Status
    accepted: Ballot
    execute_at: Timestamp | None
    deps: Deps
    accepts_fast_path: bool
    rejects_fast_path: bool
    earlier_committed_witness: tuple[TxnId, ...]
    earlier_accepted_no_witness: tuple[TxnId, ...]
    writes: tuple[WriteOp, ...] | None = None
    result: TxnResult | None = None


class CheckStatus(msgspec.Struct, frozen=True, gc=False):
    """What does this replica know of the txn's outcome? Read-only: no ballot is promised and
    nothing is recorded, so asking cannot disturb a coordinator of the txn (a recovery
    would). A node that coordinated a txn it is no replica of asks this way first."""

    has_side_effects: ClassVar[bool] = False
    cid: int
    txn_id: TxnId


class CheckStatusOk(msgspec.Struct, frozen=True, gc=False):
    """The replica's status of the txn (``NOT_DEFINED``: it knows nothing of it);
    ``result`` only with a final outcome: applied, or pre-applied and ``chosen``."""

    cid: int
    txn_id: TxnId
    status: Status
    chosen: bool = False
    result: TxnResult | None = None


class BeginInvalidation(msgspec.Struct, frozen=True, gc=False):
    """Promise ``ballot`` without pre-accepting: used when the route is unknown."""

    has_side_effects: ClassVar[bool] = True
    cid: int
    txn_id: TxnId
    ballot: Ballot


class InvalidateOk(msgspec.Struct, frozen=True, gc=False):
    cid: int
    txn_id: TxnId
    status: Status
    accepted: Ballot
    accepts_fast_path: bool
    txn: Txn | None
    route: Route | None


Request: TypeAlias = (
    PreAccept
    | Accept
    | AcceptInvalidate
    | Commit
    | Apply
    | OutcomeDurable
    | CommitInvalidate
    | InformDurable
    | BeginRecovery
    | BeginInvalidation
    | CheckStatus
)
Reply: TypeAlias = (
    PreAcceptOk
    | Nack
    | AcceptOk
    | AcceptInvalidateOk
    | CommitOk
    | Insufficient
    | ReadOk
    | ReadRedundant
    | ApplyOk
    | RecoverOk
    | InvalidateOk
    | CheckStatusOk
)
Message: TypeAlias = Request | Reply

REPLY_TYPES = (
    PreAcceptOk,
    Nack,
    AcceptOk,
    AcceptInvalidateOk,
    CommitOk,
    Insufficient,
    ReadOk,
    ReadRedundant,
    ApplyOk,
    RecoverOk,
    InvalidateOk,
    CheckStatusOk,
)
REQUEST_TYPES = (
    PreAccept,
    Accept,
    AcceptInvalidate,
    Commit,
    Apply,
    OutcomeDurable,
    CommitInvalidate,
    InformDurable,
    BeginRecovery,
    BeginInvalidation,
    CheckStatus,
)


class Envelope(msgspec.Struct, frozen=True, gc=False):
    """A message in flight from node ``src`` to node ``dest``."""

    src: int
    dest: int
    body: Message


__all__ = [
    "REPLY_TYPES",
    "REQUEST_TYPES",
    "Accept",
    "AcceptInvalidate",
    "AcceptInvalidateOk",
    "AcceptOk",
    "Apply",
    "ApplyOk",
    "BeginInvalidation",
    "BeginRecovery",
    "CheckStatus",
    "CheckStatusOk",
    "Commit",
    "CommitInvalidate",
    "CommitOk",
    "Envelope",
    "InformDurable",
    "Insufficient",
    "InvalidateOk",
    "Message",
    "Nack",
    "OutcomeDurable",
    "PreAccept",
    "PreAcceptOk",
    "ReadOk",
    "ReadRedundant",
    "RecoverOk",
    "Reply",
    "Request",
]
