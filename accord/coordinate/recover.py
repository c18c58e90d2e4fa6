"""The recovery decision table, as a pure function of a quorum of recovery replies.

Reference: Accord ``coordinate/Recover.java`` and accord.md §5. With a quorum of
``RecoverOk`` replies from every shard, take the most advanced knowledge:

=====================================  ====================================================
highest reply                          decision
=====================================  ====================================================
Invalidated                            commit the invalidation
PreApplied / Applied                   persist the writes (applied, else highest ballot)
Committed / Stable                     stabilise the committed executeAt and deps, execute
Accepted (highest accepted ballot)     re-propose that executeAt (deps merged)
AcceptedInvalidate (highest ballot)    invalidate
nothing accepted, fast path rejected   invalidate (no fast quorum can have formed)
earlier accepted without witness       wait until they commit, then restart recovery
otherwise                              propose executeAt = txnId (the fast path may have won)
=====================================  ====================================================

"Fast path rejected": in some shard, more than ``e - fq`` electorate members that replied
did not vote for it, or some replica holds a committed/accepted conflicting txn that
executes after ours without having witnessed it (``rejects_fast_path``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from accord.invariants import check_not_none
from accord.messages import RecoverOk
from accord.primitives import EMPTY_DEPS, Deps, Status, Timestamp, TxnId, TxnResult, WriteOp
from accord.topology import Shard


class Action(enum.Enum):
    COMMIT_INVALIDATION = "commit-invalidation"
    PERSIST = "persist"
    STABILISE = "stabilise"
    PROPOSE = "propose"
    INVALIDATE = "invalidate"
    RETRY_LATER = "retry-later"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    execute_at: Timestamp | None = None
    deps: Deps = EMPTY_DEPS
    writes: tuple[WriteOp, ...] | None = None
    result: TxnResult | None = None
    wait_for: tuple[TxnId, ...] = ()


def decide(txn_id: TxnId, shards: tuple[Shard, ...], replies: Mapping[int, RecoverOk]) -> Decision:
    """What a recovery coordinator with ``replies`` (a quorum of every shard) must do."""
    oks = [replies[node] for node in sorted(replies)]
    if any(r.status is Status.INVALIDATED for r in oks):
        return Decision(Action.COMMIT_INVALIDATION)
    applied = [r for r in oks if Status.PRE_APPLIED <= r.status <= Status.APPLIED]
    if applied:
        # Applied somewhere means chosen; otherwise the outcome proposed under the highest
        # ballot is the only one that may have been chosen (Paxos phase 1).
        best = max(applied, key=lambda r: (r.status is Status.APPLIED, r.accepted))
        return Decision(Action.PERSIST, best.execute_at, best.deps, best.writes, best.result)
    committed = [r for r in oks if r.status.is_decided]
    if committed:
        best = max(committed, key=lambda r: r.status)
        return Decision(Action.STABILISE, best.execute_at, best.deps)
    proposals = [r for r in oks if r.status.is_proposal]
    if proposals:
        best = max(proposals, key=lambda r: r.accepted)
        if best.status is Status.ACCEPTED_INVALIDATE:
            return Decision(Action.INVALIDATE)
        execute_at = check_not_none(best.execute_at, "accepted proposal without executeAt")
        return Decision(Action.PROPOSE, execute_at, _merged_below(oks, execute_at))
    if _fast_path_rejected(shards, replies):
        return Decision(Action.INVALIDATE)
    witnessed = {t for r in oks for t in r.earlier_committed_witness}
    pending = sorted({t for r in oks for t in r.earlier_accepted_no_witness} - witnessed)
    if pending:
        return Decision(Action.RETRY_LATER, wait_for=tuple(pending))
    return Decision(Action.PROPOSE, txn_id, _merged_below(oks, txn_id))


def _merged_below(oks: list[RecoverOk], bound: Timestamp) -> Deps:
    merged = EMPTY_DEPS.merge(*(r.deps for r in oks))
    return merged.filter(lambda _key, dep: dep < bound)


def _fast_path_rejected(shards: tuple[Shard, ...], replies: Mapping[int, RecoverOk]) -> bool:
    if any(r.rejects_fast_path for r in replies.values()):
        return True
    for shard in shards:
        against = sum(
            1
            for node in shard.electorate
            if node in replies and not replies[node].accepts_fast_path
        )
        if against > len(shard.electorate) - shard.fast_quorum:
            return True
    return False
