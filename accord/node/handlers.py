"""The replica side of a :class:`~accord.node.Node`: one handler per request type.

Each takes the node, the sender and the request, acts on the node's
:class:`~accord.local.commands.CommandStore`, and returns the reply to send back (None: none,
or one that follows later, such as the second ``ApplyOk`` once the writes are done). The node
finds the handler by the request's exact type in :data:`REQUEST_HANDLERS` (one dict lookup,
where an isinstance chain tested up to ten types per message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accord.invariants import check_not_none, check_state
from accord.local.effects import NeedsTxn, Refused
from accord.messages import (
    REQUEST_TYPES,
    Accept,
    AcceptInvalidate,
    AcceptInvalidateOk,
    AcceptOk,
    Apply,
    ApplyOk,
    BeginInvalidation,
    BeginRecovery,
    CheckStatus,
    CheckStatusOk,
    Commit,
    CommitInvalidate,
    CommitOk,
    InformDurable,
    Insufficient,
    InvalidateOk,
    Nack,
    OutcomeDurable,
    PreAccept,
    PreAcceptOk,
    ReadRedundant,
    RecoverOk,
    Reply,
)
from accord.primitives import Status, TxnId

if TYPE_CHECKING:
    from accord.node import Node

__all__ = ["REQUEST_HANDLERS"]

_STATUS_APPLIED = Status.APPLIED
_STATUS_PRE_APPLIED = Status.PRE_APPLIED


def _on_preaccept(node: Node, src: int, body: PreAccept) -> Reply | None:
    node.recover_delay.witnessed(body.txn_id, node.now())
    out = node.store.preaccept(body.txn_id, body.txn, body.route)
    if isinstance(out, Refused):
        return _nack(body.cid, body.txn_id, out)
    return PreAcceptOk(body.cid, body.txn_id, out.witnessed_at, out.deps, out.rejected)


def _on_accept(node: Node, src: int, body: Accept) -> Reply | None:
    accepted = node.store.accept(
        body.txn_id, body.txn, body.route, body.ballot, body.execute_at, body.deps
    )
    if isinstance(accepted, Refused):
        return _nack(body.cid, body.txn_id, accepted)
    return AcceptOk(body.cid, body.txn_id, accepted.deps)


def _on_accept_invalidate(node: Node, src: int, body: AcceptInvalidate) -> Reply | None:
    out_inv = node.store.accept_invalidate(body.txn_id, body.ballot, body.route)
    if isinstance(out_inv, Refused):
        return _nack(body.cid, body.txn_id, out_inv)
    return AcceptInvalidateOk(body.cid, body.txn_id)


def _on_apply(node: Node, src: int, body: Apply) -> Reply | None:
    store = node.store
    applied = store.apply(
        body.txn_id,
        body.txn,
        body.route,
        body.execute_at,
        body.deps,
        body.writes,
        body.result,
        ballot=body.ballot,
        chosen=body.chosen,
    )
    if isinstance(applied, Refused):
        return _nack(body.cid, body.txn_id, applied)
    if store.commands[body.txn_id].status is _STATUS_APPLIED:
        return ApplyOk(body.cid, body.txn_id, applied=True)
    # Journaled (the journal takes it before this reply leaves); a second ApplyOk
    # follows once the writes are in the data store.
    waiters = node._apply_waiters.setdefault(body.txn_id, [])
    if (src, body.cid) not in waiters:
        waiters.append((src, body.cid))
    return ApplyOk(body.cid, body.txn_id, applied=False)


def _on_outcome_durable(node: Node, src: int, body: OutcomeDurable) -> Reply | None:
    if body.written:
        node.store.written_by(body.txn_id, src, body.ballot)
    else:
        node.store.outcome_durable(body.txn_id, body.ballot)
    return None


def _on_commit_invalidate(node: Node, src: int, body: CommitInvalidate) -> Reply | None:
    node.store.commit_invalidate(body.txn_id)
    return None


def _on_inform_durable(node: Node, src: int, body: InformDurable) -> Reply | None:
    known = node.store.commands.get(body.txn_id)
    if known is not None and not known.durable:
        node._durable_pending.append(body.txn_id)
    node.store.mark_durable(body.txn_id)
    return None


def _on_begin_recovery(node: Node, src: int, body: BeginRecovery) -> Reply | None:
    view = node.store.begin_recovery(body.txn_id, body.txn, body.route, body.ballot)
    if isinstance(view, Refused):
        return _nack(body.cid, body.txn_id, view)
    return RecoverOk(body.cid, body.txn_id, *view)


def _on_begin_invalidation(node: Node, src: int, body: BeginInvalidation) -> Reply | None:
    inv = node.store.begin_invalidation(body.txn_id, body.ballot)
    if isinstance(inv, Refused):
        return _nack(body.cid, body.txn_id, inv)
    return InvalidateOk(body.cid, body.txn_id, *inv)


def _on_check_status(node: Node, src: int, body: CheckStatus) -> Reply | None:
    """Read-only: what this replica knows, with the result only when it is final here (the
    test the node answers its own clients by, ``Node._answer_waiting_clients``)."""
    command = node.store.commands.get(body.txn_id)
    if command is None:
        return CheckStatusOk(body.cid, body.txn_id, Status.NOT_DEFINED)
    status = command.status
    final = (status is _STATUS_APPLIED or (status is _STATUS_PRE_APPLIED and command.chosen)) and (
        command.result is not None
    )
    return CheckStatusOk(
        body.cid, body.txn_id, status, command.chosen, command.result if final else None
    )


def _on_commit(node: Node, src: int, body: Commit) -> Reply | None:
    out = node.store.commit(
        body.txn_id,
        body.execute_at,
        body.deps,
        stable=body.stable,
        txn=body.txn,
        route=body.route,
    )
    if isinstance(out, NeedsTxn):
        return Insufficient(body.cid, body.txn_id)
    if body.read:
        state = node.store.read(body.txn_id, src, body.cid)
        if state.writes is not None and state.result is not None:
            ballot = check_not_none(state.ballot, "outcome of %s without a ballot", body.txn_id)
            return ReadRedundant(
                body.cid, body.txn_id, state.writes, state.result, ballot, state.chosen
            )
    return None if body.stable else CommitOk(body.cid, body.txn_id)


def _nack(cid: int, txn_id: TxnId, refused: Refused) -> Nack:
    return Nack(cid, txn_id, refused.promised, refused.status)


REQUEST_HANDLERS: dict[type, Callable[[Node, int, Any], Reply | None]] = {
    PreAccept: _on_preaccept,
    Accept: _on_accept,
    AcceptInvalidate: _on_accept_invalidate,
    Commit: _on_commit,
    Apply: _on_apply,
    OutcomeDurable: _on_outcome_durable,
    CommitInvalidate: _on_commit_invalidate,
    InformDurable: _on_inform_durable,
    BeginRecovery: _on_begin_recovery,
    BeginInvalidation: _on_begin_invalidation,
    CheckStatus: _on_check_status,
}
check_state(
    set(REQUEST_HANDLERS) == set(REQUEST_TYPES), "every request type needs exactly one handler"
)
