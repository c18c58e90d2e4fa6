"""Coordinating one transaction: the original coordinator, recovery and invalidation.

One state machine serves all three roles because they share every phase after the first:

    PREACCEPT ──fast──────────────────────────────┐
        │ slow                                     ▼
        ▼                                      STABILISE ─► EXECUTE (reads) ─► PERSIST
      ACCEPT ─► COMMIT (quorum) ──────────────────┘
    RECOVER ─► (decision table in recover.py) ─► ACCEPT | COMMIT | PERSIST | INVALIDATE
    BEGIN_INVALIDATION ─► INVALIDATE ─► done      (route unknown: one shard only)

Reference: CEP-15 (fast path, slow path, execution), Accord ``CoordinateTransaction``,
``Propose``, ``Stabilise``, ``ExecuteTxn``, ``Persist``, ``Recover``, ``Invalidate``.

Every request is re-sent to the replicas that have not answered, first after
``retry_micros`` and then after twice the previous wait (at most
``retry_backoff_max_micros``), a bounded number of times; afterwards the coordinator gives
up and leaves the transaction to the replicas' progress logs. Replies carry the
coordination id, so late replies to an abandoned attempt are dropped by the node.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from accord.coordinate.recover import Action, Decision, decide
from accord.coordinate.tracking import AllTracker, FastPathTracker, Progress, QuorumTracker
from accord.invariants import check_state
from accord.messages import (
    REPLY_TYPES,
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
    ReadOk,
    ReadRedundant,
    RecoverOk,
    Reply,
    Request,
)
from accord.primitives import (
    BALLOT_ZERO,
    EMPTY_DEPS,
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
    execute,
    merge_max,
)
from accord.topology import Shard, Topology

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    APPLIED = "applied"  # writes and result known; the client may be told
    INVALIDATED = "invalidated"  # definitely never executes
    UNKNOWN = "unknown"  # preempted or gave up; someone else may finish it
    RETRY = "retry"  # recovery must be attempted again later


class Host(Protocol):
    """What a coordinator needs from its node."""

    node_id: int
    topology: Topology
    rng: random.Random
    retry_micros: int
    retry_backoff_max_micros: int
    max_attempts: int
    fast_quorum_is_slow_quorum: bool

    def now(self) -> int: ...

    def send(self, dest: int, body: Request) -> None: ...

    def finished(self, coordinator: TransactionCoordinator, outcome: Outcome) -> None: ...

    def on_fast_path(self, fast: bool) -> None: ...


class Phase(enum.Enum):
    PREACCEPT = 1
    RECOVER = 2
    BEGIN_INVALIDATION = 3
    ACCEPT = 4
    ACCEPT_INVALIDATE = 5
    COMMIT = 6
    EXECUTE = 7
    PERSIST = 8
    DONE = 9
    CHECK_STATUS = 10


# Enum members looked up once: a class attribute costs more than the check using it, and
# these run on every reply.
_OUTCOME_APPLIED = Outcome.APPLIED
_OUTCOME_INVALIDATED = Outcome.INVALIDATED
_OUTCOME_RETRY = Outcome.RETRY
_OUTCOME_UNKNOWN = Outcome.UNKNOWN
_PHASE_ACCEPT = Phase.ACCEPT
_PHASE_ACCEPT_INVALIDATE = Phase.ACCEPT_INVALIDATE
_PHASE_BEGIN_INVALIDATION = Phase.BEGIN_INVALIDATION
_PHASE_COMMIT = Phase.COMMIT
_PHASE_DONE = Phase.DONE
_PHASE_EXECUTE = Phase.EXECUTE
_PHASE_PERSIST = Phase.PERSIST
_PHASE_PREACCEPT = Phase.PREACCEPT
_PHASE_RECOVER = Phase.RECOVER
_PHASE_CHECK_STATUS = Phase.CHECK_STATUS
_PROGRESS_SUCCESS = Progress.SUCCESS
_STATUS_INVALIDATED = Status.INVALIDATED


@dataclass(slots=True)
class _Pending:
    """A request awaiting replies, re-sent to whoever has not answered."""

    body: Request
    waiting: set[int]
    sent_micros: int
    attempts: int = 1
    # sent_micros + the retry interval of attempts, once on_tick computed it (0: not yet).
    # A node ticks every coordinator about every 10 ms and most are not due: comparing one
    # number is most of what a tick costs then.
    due_micros: int = 0


class TransactionCoordinator:
    """Drives one transaction to a decision and, if it commits, to execution."""

    def __init__(
        self,
        host: Host,
        cid: int,
        txn_id: TxnId,
        txn: Txn | None,
        route: Route | None,
        *,
        ballot: Ballot = BALLOT_ZERO,
    ) -> None:
        self.host = host
        self.cid = cid
        self.txn_id = txn_id
        self.txn = txn
        self.route = route
        self.ballot = ballot
        self.phase = _PHASE_PREACCEPT
        self.pending: _Pending | None = None
        self.shards: tuple[Shard, ...] = host.topology.shards_for(route.keys) if route else ()
        self.nodes: tuple[int, ...] = host.topology.replicas_of(route.keys) if route else ()
        self.quorum: QuorumTracker | None = None
        self.fast: FastPathTracker | None = None
        self.preaccepts: dict[int, PreAcceptOk] = {}
        self.recoveries: dict[int, RecoverOk] = {}
        self.invalidations: dict[int, InvalidateOk] = {}
        self.execute_at: Timestamp | None = None
        self.deps: Deps = EMPTY_DEPS
        self.values: dict[Key, object] = {}
        self.readers: dict[int, int] = {}  # shard index -> node asked to read
        self.writes: tuple[WriteOp, ...] | None = None
        self.result: TxnResult | None = None
        self.applied: AllTracker | None = None
        # The outcome's own Paxos round (docs/accord.md, "Writes wait for a durable
        # outcome"): proposed under persist_ballot, chosen once a quorum of every shard
        # journaled it.
        self.journaled: QuorumTracker | None = None
        self.persist_ballot: Ballot = ballot
        self.chosen = False
        # Replicas whose journal ack had not come when the outcome was chosen: each is told
        # with an OutcomeDurable once its ack comes (its proposal is in flight already), not
        # with a second full Apply at once.
        self.chosen_pending_ack: set[int] = set()
        self.invalidation_shard: Shard | None = None
        self.invalidation_key: Key | None = None
        self.outcome: Outcome | None = None
        self.fast_path: bool | None = None
        self.wait_for: tuple[TxnId, ...] = ()

    # ------------------------------------------------------------------ starting

    def start(self) -> None:
        assert self.txn is not None and self.route is not None
        self.fast = FastPathTracker(
            self.shards, slow_quorum_suffices=self.host.fast_quorum_is_slow_quorum
        )
        self._broadcast(
            _PHASE_PREACCEPT, PreAccept(self.cid, self.txn_id, self.txn, self.route), self.nodes
        )

    def start_recovery(self) -> None:
        assert self.txn is not None and self.route is not None
        self.quorum = QuorumTracker(self.shards)
        body = BeginRecovery(self.cid, self.txn_id, self.txn, self.route, self.ballot)
        self._broadcast(_PHASE_RECOVER, body, self.nodes)

    def start_check_status(self) -> None:
        """Ask the replicas what they know of the outcome, taking no ballot (a recovery's
        would preempt a coordinator still driving the txn); recover only if a quorum of
        every shard answered and none knew a final outcome, or none answered in time."""
        assert self.txn is not None and self.route is not None
        self.quorum = QuorumTracker(self.shards)
        self._broadcast(_PHASE_CHECK_STATUS, CheckStatus(self.cid, self.txn_id), self.nodes)

    def start_persist(
        self,
        execute_at: Timestamp,
        deps: Deps,
        writes: tuple[WriteOp, ...],
        result: TxnResult,
        *,
        ballot: Ballot,
        chosen: bool,
    ) -> None:
        """Re-send a known outcome, proposed under ``ballot`` (or ``chosen``), to every
        replica until all have applied it."""
        self.execute_at = execute_at
        self.deps = deps
        self._persist(writes, result, ballot=ballot, chosen=chosen)

    def start_invalidation(self, key: Key) -> None:
        """Invalidate a txn known only by id, through the shard that owns ``key``."""
        shard = self.host.topology.shard_for(key)
        self.invalidation_shard = shard
        self.invalidation_key = key
        self.shards = (shard,)
        self.nodes = shard.replicas
        self.quorum = QuorumTracker(self.shards)
        self._broadcast(
            _PHASE_BEGIN_INVALIDATION,
            BeginInvalidation(self.cid, self.txn_id, self.ballot),
            self.nodes,
        )

    # ------------------------------------------------------------------ plumbing

    def _broadcast(self, phase: Phase, body: Request, nodes: tuple[int, ...]) -> None:
        self.phase = phase
        self.pending = _Pending(body, set(nodes), self.host.now())
        for node in nodes:
            self.host.send(node, body)

    def _answered(self, node: int) -> None:
        if self.pending is not None:
            self.pending.waiting.discard(node)

    def _finish(self, outcome: Outcome) -> None:
        if self.phase is _PHASE_DONE:
            return
        self.phase = _PHASE_DONE
        self.pending = None
        self.outcome = outcome
        self.host.finished(self, outcome)

    def on_tick(self) -> None:
        pending = self.pending
        if pending is None or self.phase is _PHASE_DONE:
            return
        now = self.host.now()
        due = pending.due_micros
        if not due:
            due = pending.due_micros = pending.sent_micros + self._retry_interval(pending.attempts)
        if now < due:
            return
        if self.phase is _PHASE_PREACCEPT and self._preaccept_timed_out():
            return
        if pending.attempts >= self.host.max_attempts:
            if self.phase is _PHASE_CHECK_STATUS:
                self.start_recovery()  # asking got no quorum of answers: recover as before
                return
            # Nothing is lost by giving up: replicas' progress logs recover the txn.
            if self.phase is _PHASE_PERSIST:
                self.phase = _PHASE_DONE
                self.pending = None
            else:
                self._finish(_OUTCOME_UNKNOWN)
            return
        pending.attempts += 1
        pending.sent_micros = now
        pending.due_micros = 0
        if self.phase is _PHASE_EXECUTE:
            self._ask_readers(retry=True)
            return
        for node in sorted(pending.waiting):
            self.host.send(node, pending.body)

    def _retry_interval(self, attempts: int) -> int:
        """How long the ``attempts``-th send waits for replies before the next one.

        Replies slower than the whole retry window were never counted: under a burst the
        re-sends themselves kept peer delivery that slow, so the wait doubles instead.
        """
        first = self.host.retry_micros
        return max(first, min(first << min(attempts - 1, 20), self.host.retry_backoff_max_micros))

    # ------------------------------------------------------------------ replies

    def on_reply(self, src: int, reply: Reply) -> None:
        if self.phase is _PHASE_DONE:
            return
        handler = _REPLY_HANDLERS.get(type(reply))
        if handler is not None:
            handler(self, src, reply)

    def _on_read_redundant(self, src: int, reply: ReadRedundant) -> None:
        if self.phase is _PHASE_EXECUTE:
            # Someone else's proposal (or a chosen outcome): re-sent exactly as it was
            # proposed, never as ours, which would claim a round we did not run.
            self._persist(reply.writes, reply.result, ballot=reply.ballot, chosen=reply.chosen)

    def _on_nack(self, src: int, nack: Nack) -> None:
        """Only a higher ballot preempts us.

        A Nack names no request, so one carrying a ballot we already hold and an undecided
        status is a stale answer to an earlier round (a duplicate PreAccept reaching a
        replica that has since accepted our proposal): the round can still reach its quorum
        through the others. A replica that reports the txn decided ends the round as a
        preemption would: someone else decided it, and the decision reaches every replica
        without us (waiting out our retries instead held coordinator slots for nothing).
        """
        if self.phase is _PHASE_PERSIST:
            if not self.chosen and nack.promised > self.persist_ballot:
                # A recovery coordinator promised a higher ballot before our outcome was
                # chosen: it decides the outcome now (and finds ours if it could matter).
                self._finish(_OUTCOME_RETRY if self.ballot > BALLOT_ZERO else _OUTCOME_UNKNOWN)
            elif self.chosen and src in self.chosen_pending_ack:
                # It refused our proposal, so no ack is coming: the chosen outcome is taken
                # whatever it promised.
                self.chosen_pending_ack.discard(src)
                self.host.send(src, self._apply(chosen=True))
            return
        if self.phase not in (
            _PHASE_PREACCEPT,
            _PHASE_ACCEPT,
            _PHASE_RECOVER,
            _PHASE_ACCEPT_INVALIDATE,
            _PHASE_BEGIN_INVALIDATION,
        ):
            return
        preempted = nack.promised > self.ballot
        decided_elsewhere = nack.status.is_decided
        if not (preempted or decided_elsewhere):
            logger.debug(
                "txn_id=%s cid=%d ignores a stale nack from node=%d status=%s",
                self.txn_id,
                self.cid,
                src,
                nack.status.name,
            )
            return
        logger.debug(
            "txn_id=%s cid=%d preempted by node=%d promised=%s",
            self.txn_id,
            self.cid,
            src,
            nack.promised,
        )
        self._finish(_OUTCOME_RETRY if self.ballot > BALLOT_ZERO else _OUTCOME_UNKNOWN)

    # --- PreAccept

    def _on_preaccept_ok(self, src: int, reply: PreAcceptOk) -> None:
        if self.phase is not _PHASE_PREACCEPT or src in self.preaccepts:
            return
        assert self.fast is not None
        self.preaccepts[src] = reply
        self._answered(src)
        self.fast.vote(src, fast=reply.witnessed_at == self.txn_id and not reply.rejected)
        self._maybe_decide_preaccept()

    def _preaccept_timed_out(self) -> bool:
        """After a retry interval, silent electorate members count against the fast path."""
        assert self.fast is not None and self.pending is not None
        if self.fast.progress() is not _PROGRESS_SUCCESS:
            return False
        for node in sorted(self.pending.waiting):
            self.fast.failure(node)
        return self._maybe_decide_preaccept()

    def _maybe_decide_preaccept(self) -> bool:
        fast = self.fast
        assert fast is not None
        if fast.fast_path_succeeded() and not any(r.rejected for r in self.preaccepts.values()):
            voters = fast.fast_voters()
            deps = EMPTY_DEPS.merge(*(self.preaccepts[n].deps for n in sorted(voters)))
            self.fast_path = True
            self.host.on_fast_path(True)
            self._stabilise(self.txn_id, deps, quorum_first=False)
            return True
        if fast.progress() is _PROGRESS_SUCCESS and any(
            r.rejected for r in self.preaccepts.values()
        ):
            # A replica refused the txn as expired: a fast quorum of the others must not
            # leave the round undecided until it gives up.
            self.fast_path = False
            self.host.on_fast_path(False)
            self._invalidate()
            return True
        if fast.progress() is _PROGRESS_SUCCESS and fast.fast_path_impossible():
            self.fast_path = False
            self.host.on_fast_path(False)
            oks = [self.preaccepts[n] for n in sorted(self.preaccepts)]
            execute_at = self.txn_id
            for r in oks:
                execute_at = merge_max(execute_at, r.witnessed_at)
            self._propose(execute_at, EMPTY_DEPS.merge(*(r.deps for r in oks)))
            return True
        return False

    # --- Accept

    def _propose(self, execute_at: Timestamp, deps: Deps) -> None:
        assert self.txn is not None and self.route is not None
        check_state(
            all(dep < execute_at for dep in deps.txn_ids()),
            "txn %s proposes deps above executeAt",
            self.txn_id,
        )
        self.execute_at = execute_at
        self.deps = deps
        self.quorum = QuorumTracker(self.shards)
        body = Accept(self.cid, self.txn_id, self.txn, self.route, self.ballot, execute_at, deps)
        self._broadcast(_PHASE_ACCEPT, body, self.nodes)

    def _on_accept_ok(self, src: int, reply: AcceptOk) -> None:
        if self.phase is not _PHASE_ACCEPT:
            return
        assert self.quorum is not None and self.execute_at is not None
        self._answered(src)
        self.deps = self.deps.merge(reply.deps)
        if self.quorum.success(src) is _PROGRESS_SUCCESS:
            self._stabilise(self.execute_at, self.deps, quorum_first=True)

    # --- Commit / Stable

    def _stabilise(self, execute_at: Timestamp, deps: Deps, *, quorum_first: bool) -> None:
        """Commit the decision; on the slow path a quorum must hold it before execution."""
        check_state(
            all(dep < execute_at for dep in deps.txn_ids()),
            "txn %s commits deps above executeAt",
            self.txn_id,
        )
        self.execute_at = execute_at
        self.deps = deps
        if quorum_first:
            self.quorum = QuorumTracker(self.shards)
            body = Commit(
                self.cid,
                self.txn_id,
                execute_at,
                deps,
                stable=False,
                txn=self.txn,
                route=self.route,
            )
            self._broadcast(_PHASE_COMMIT, body, self.nodes)
        else:
            self._execute()

    def _on_commit_ok(self, src: int, reply: CommitOk) -> None:
        if self.phase is not _PHASE_COMMIT:
            return
        assert self.quorum is not None
        self._answered(src)
        if self.quorum.success(src) is _PROGRESS_SUCCESS:
            self._execute()

    def _on_insufficient(self, src: int, reply: Insufficient) -> None:
        assert self.execute_at is not None
        body = Commit(
            self.cid,
            self.txn_id,
            self.execute_at,
            self.deps,
            stable=self.phase is not _PHASE_COMMIT,
            read=src in self.readers.values() and self.phase is _PHASE_EXECUTE,
            txn=self.txn,
            route=self.route,
        )
        self.host.send(src, body)

    # --- Execute

    def _execute(self) -> None:
        assert self.txn is not None and self.execute_at is not None
        self.phase = _PHASE_EXECUTE
        self.pending = _Pending(
            Commit(self.cid, self.txn_id, self.execute_at, self.deps, stable=True),
            set(),
            self.host.now(),
        )
        read_shards = {
            i for i, s in enumerate(self.shards) for k in self.txn.read_keys if s.contains(k)
        }
        for i in sorted(read_shards):
            shard = self.shards[i]
            self.readers[i] = (
                self.host.node_id
                if self.host.node_id in shard.replicas
                else self._pick(shard, None)
            )
        answered = set(self.preaccepts) | (self.quorum.responded() if self.quorum else set())
        for node in self.nodes:
            knows = node in answered
            body = Commit(
                self.cid,
                self.txn_id,
                self.execute_at,
                self.deps,
                stable=True,
                read=node in self.readers.values(),
                txn=None if knows else self.txn,
                route=None if knows else self.route,
            )
            self.host.send(node, body)
        if not read_shards:
            self._compute()

    def _pick(self, shard: Shard, avoid: int | None) -> int:
        choices = [n for n in shard.replicas if n != avoid] or list(shard.replicas)
        return self.host.rng.choice(choices)

    def _ask_readers(self, *, retry: bool) -> None:
        assert self.txn is not None and self.execute_at is not None
        for i in sorted(self.readers):
            shard = self.shards[i]
            if all(k in self.values for k in self.txn.read_keys if shard.contains(k)):
                continue
            if retry:
                self.readers[i] = self._pick(shard, self.readers[i])
            body = Commit(
                self.cid,
                self.txn_id,
                self.execute_at,
                self.deps,
                stable=True,
                read=True,
                txn=self.txn,
                route=self.route,
            )
            self.host.send(self.readers[i], body)

    def _on_read_ok(self, src: int, reply: ReadOk) -> None:
        if self.phase is not _PHASE_EXECUTE:
            return
        assert self.txn is not None
        for key, value in reply.values:
            self.values[key] = value
        if all(k in self.values for k in self.txn.read_keys):
            self._compute()

    def _compute(self) -> None:
        assert self.txn is not None
        writes, result = execute(self.txn, self.values)
        self._persist(writes, result, ballot=self.ballot, chosen=False)

    # --- Persist

    def _persist(
        self,
        writes: tuple[WriteOp, ...],
        result: TxnResult,
        *,
        ballot: Ballot,
        chosen: bool,
    ) -> None:
        """Propose the outcome under ``ballot`` until a quorum of every shard journaled it
        (then it is chosen: the client may hear it and replicas may write it), and keep
        sending it until every replica applied it."""
        assert self.txn is not None and self.route is not None and self.execute_at is not None
        self.writes = writes
        self.result = result
        self.persist_ballot = ballot
        self.applied = AllTracker(self.nodes)
        self.journaled = QuorumTracker(self.shards)
        self.chosen = chosen
        self._broadcast(_PHASE_PERSIST, self._apply(chosen=chosen), self.nodes)
        if chosen:
            self._tell_client()

    def _apply(self, *, chosen: bool) -> Apply:
        assert self.txn is not None and self.route is not None and self.execute_at is not None
        assert self.writes is not None and self.result is not None
        return Apply(
            self.cid,
            self.txn_id,
            self.txn,
            self.route,
            self.execute_at,
            self.deps,
            self.writes,
            self.result,
            self.persist_ballot,
            chosen,
        )

    def _on_apply_ok(self, src: int, reply: ApplyOk) -> None:
        if self.phase is not _PHASE_PERSIST:
            return
        assert self.applied is not None and self.journaled is not None
        if not self.chosen:
            self._answered(src)
            if self.journaled.success(src) is _PROGRESS_SUCCESS:
                self._on_chosen(self.journaled.responded())
        elif src in self.chosen_pending_ack:
            self.chosen_pending_ack.discard(src)
            if not reply.applied:
                self.host.send(src, OutcomeDurable(self.cid, self.txn_id, self.persist_ballot))
        if not reply.applied:
            return
        if self.pending is not None:
            self.pending.waiting.discard(src)
        if self.applied.success(src):
            for node in self.nodes:
                self.host.send(node, InformDurable(self.cid, self.txn_id))
            self.phase = _PHASE_DONE
            self.pending = None

    def _on_chosen(self, journaled: set[int]) -> None:
        """The outcome can never change now: tell every replica, then the client.

        Those that journaled it need only the ballot; so do the rest once they journal the
        proposal already sent to them (their ack brings an OutcomeDurable), which saves a
        full Apply and its ack per late replica. Re-sends carry the chosen Apply.
        """
        assert self.applied is not None
        self.chosen = True
        body = self._apply(chosen=True)
        applied = set(self.nodes) - self.applied.pending
        self.pending = _Pending(body, {n for n in self.nodes if n not in applied}, self.host.now())
        for node in self.nodes:
            if node in applied:
                continue
            if node in journaled:
                self.host.send(node, OutcomeDurable(self.cid, self.txn_id, self.persist_ballot))
            else:
                self.chosen_pending_ack.add(node)
        self._tell_client()

    def _tell_client(self) -> None:
        # Reference: Accord StandardTxnAdapter.persist answers once the decision is durable
        # at a quorum; here the outcome itself must be, or it could still be replaced.
        self.outcome = _OUTCOME_APPLIED
        self.host.finished(self, _OUTCOME_APPLIED)

    # --- Status check

    def _on_check_status_ok(self, src: int, reply: CheckStatusOk) -> None:
        if self.phase is not _PHASE_CHECK_STATUS:
            return
        assert self.quorum is not None
        self._answered(src)
        if reply.status is _STATUS_INVALIDATED:
            self._finish(_OUTCOME_INVALIDATED)
        elif reply.result is not None:
            # Final at that replica (applied, or pre-applied and chosen): it can never
            # change, whoever decided it.
            self.result = reply.result
            self._finish(_OUTCOME_APPLIED)
        elif self.quorum.success(src) is _PROGRESS_SUCCESS:
            # None of a quorum of every shard knows a final outcome: maybe none is chosen
            # yet, maybe it is but these replicas have not heard. Only a recovery can tell.
            self.start_recovery()

    # --- Recovery

    def _on_recover_ok(self, src: int, reply: RecoverOk) -> None:
        if self.phase is not _PHASE_RECOVER or src in self.recoveries:
            return
        assert self.quorum is not None
        self.recoveries[src] = reply
        self._answered(src)
        if self.quorum.success(src) is not _PROGRESS_SUCCESS:
            return
        self._act(decide(self.txn_id, self.shards, self.recoveries))

    def _act(self, decision: Decision) -> None:
        logger.debug("txn_id=%s recovery decision=%s", self.txn_id, decision.action.value)
        action = decision.action
        if action is Action.COMMIT_INVALIDATION:
            self._commit_invalidation()
        elif action is Action.PERSIST:
            assert decision.writes is not None and decision.result is not None
            self.execute_at = decision.execute_at
            self.deps = decision.deps
            # Our promises cover a quorum of every shard and this is the outcome proposed
            # under the highest ballot among them: ours to propose (Paxos phase 2).
            self._persist(decision.writes, decision.result, ballot=self.ballot, chosen=False)
        elif action is Action.STABILISE:
            assert decision.execute_at is not None
            self._stabilise(decision.execute_at, decision.deps, quorum_first=True)
        elif action is Action.PROPOSE:
            assert decision.execute_at is not None
            self._propose(decision.execute_at, decision.deps)
        elif action is Action.INVALIDATE:
            self._invalidate()
        else:
            self.wait_for = decision.wait_for
            self._finish(_OUTCOME_RETRY)

    # --- Invalidation

    def _invalidate(self) -> None:
        self.quorum = QuorumTracker(self.shards)
        route = self.route
        if route is None and self.invalidation_key is not None:
            route = Route(self.invalidation_key, (self.invalidation_key,))
        self._broadcast(
            _PHASE_ACCEPT_INVALIDATE,
            AcceptInvalidate(self.cid, self.txn_id, self.ballot, route),
            self.nodes,
        )

    def _on_accept_invalidate_ok(self, src: int, reply: AcceptInvalidateOk) -> None:
        if self.phase is not _PHASE_ACCEPT_INVALIDATE:
            return
        assert self.quorum is not None
        self._answered(src)
        if self.quorum.success(src) is _PROGRESS_SUCCESS:
            self._commit_invalidation()

    def _commit_invalidation(self) -> None:
        for node in self.nodes:
            self.host.send(node, CommitInvalidate(self.cid, self.txn_id))
        self._finish(_OUTCOME_INVALIDATED)

    def _on_invalidate_ok(self, src: int, reply: InvalidateOk) -> None:
        if self.phase is not _PHASE_BEGIN_INVALIDATION or src in self.invalidations:
            return
        assert self.quorum is not None and self.invalidation_shard is not None
        self.invalidations[src] = reply
        self._answered(src)
        if self.quorum.success(src) is not _PROGRESS_SUCCESS:
            return
        replies = [self.invalidations[n] for n in sorted(self.invalidations)]
        if any(r.status is _STATUS_INVALIDATED for r in replies):
            self._commit_invalidation()
            return
        known = [r for r in replies if r.txn is not None and r.route is not None]
        if known:
            # Someone knows the txn: only full recovery (every shard) may decide it.
            self._finish(_OUTCOME_RETRY)
            return
        shard = self.invalidation_shard
        against = sum(
            1
            for n in shard.electorate
            if n in self.invalidations and not self.invalidations[n].accepts_fast_path
        )
        check_state(
            against > len(shard.electorate) - shard.fast_quorum,
            "txn %s: quorum never saw it yet the fast path looks possible",
            self.txn_id,
        )
        self._invalidate()


# One method per reply type, found by the exact type: one dict lookup per reply where an
# isinstance chain tested up to eleven types.
_REPLY_HANDLERS: dict[type, Callable[[TransactionCoordinator, int, Any], None]] = {
    Nack: TransactionCoordinator._on_nack,
    PreAcceptOk: TransactionCoordinator._on_preaccept_ok,
    AcceptOk: TransactionCoordinator._on_accept_ok,
    AcceptInvalidateOk: TransactionCoordinator._on_accept_invalidate_ok,
    CommitOk: TransactionCoordinator._on_commit_ok,
    Insufficient: TransactionCoordinator._on_insufficient,
    ReadOk: TransactionCoordinator._on_read_ok,
    ReadRedundant: TransactionCoordinator._on_read_redundant,
    ApplyOk: TransactionCoordinator._on_apply_ok,
    RecoverOk: TransactionCoordinator._on_recover_ok,
    InvalidateOk: TransactionCoordinator._on_invalidate_ok,
    CheckStatusOk: TransactionCoordinator._on_check_status_ok,
}
check_state(set(_REPLY_HANDLERS) == set(REPLY_TYPES), "every reply type needs exactly one handler")
