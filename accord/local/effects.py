"""What a replica asks its host to do with user data, and the outcomes of its handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from accord.primitives import (
    Ballot,
    Deps,
    Key,
    Route,
    Selection,
    Status,
    Timestamp,
    Txn,
    TxnId,
    TxnResult,
    WriteOp,
)


@dataclass(frozen=True, slots=True)
class DataRead:
    """Read ``selections`` (on ``keys``) as of ``execute_at``; answer with
    ``Node.read_done`` and one :class:`~accord.primitives.PartitionRead` per key."""

    txn_id: TxnId
    execute_at: Timestamp
    keys: tuple[Key, ...]
    selections: tuple[Selection, ...] = ()


@dataclass(frozen=True, slots=True)
class DataWrite:
    """Apply ``writes`` with write timestamp ``execute_at``; answer with ``WriteDone``."""

    txn_id: TxnId
    execute_at: Timestamp
    writes: tuple[WriteOp, ...]


class Refused(NamedTuple):
    """A promise to a higher ballot, or a phase already passed (``status``)."""

    promised: Ballot
    status: Status


class PreAccepted(NamedTuple):
    witnessed_at: Timestamp
    deps: Deps
    rejected: bool


class Accepted(NamedTuple):
    deps: Deps


class RecoveryView(NamedTuple):
    status: Status
    accepted: Ballot
    execute_at: Timestamp | None
    deps: Deps
    accepts_fast_path: bool
    rejects_fast_path: bool
    earlier_committed_witness: tuple[TxnId, ...]
    earlier_accepted_no_witness: tuple[TxnId, ...]
    writes: tuple[WriteOp, ...] | None
    result: TxnResult | None


class InvalidationView(NamedTuple):
    status: Status
    accepted: Ballot
    accepts_fast_path: bool
    txn: Txn | None
    route: Route | None


class Ok(NamedTuple):
    pass


class NeedsTxn(NamedTuple):
    """The handler needs the transaction's definition, which the message omitted."""


class ReadState(NamedTuple):
    """How a read request stands: queued until executable, or already answered by the
    outcome held here (proposed under ``ballot``; ``chosen`` if known durable)."""

    writes: tuple[WriteOp, ...] | None
    result: TxnResult | None
    ballot: Ballot | None = None
    chosen: bool = False
