"""One replica's state machine: every transition of every command lives in this file.

Rules (after h11's ``_state.py``: everything that changes replica state is here):

1. Handlers are idempotent and tolerate any arrival order: an Apply may come before the
   Commit, which may come before the PreAccept. Knowledge only grows (``Status`` order);
   within the proposal phase the accepted ballot decides.
2. A handler that changes durable state calls ``_persist``; the node hands the snapshots
   to the journal before it sends any reply (``accord.api.Journal``).
3. A replica promises a ballot by recording it; it never accepts anything under a lower
   ballot afterwards. The original coordinator's ballot is ZERO, so once a recovery
   coordinator has been promised, late PreAccepts and Accepts of the original coordinator
   are refused (reference: accord.md pitfall 2).
4. Execution waits, for every dependency on a key this replica owns, until that dependency
   is committed, and then — if it executes earlier — until it is applied (CEP-15,
   "Execution still waits for earlier conflicting work").
5. Invalidated is terminal and never meets an executeAt: seeing both is a bug.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from accord.invariants import check_state, fail
from accord.local.bugs import NO_BUGS, Bugs
from accord.local.command import Command, CommandSnapshot, KeyState
from accord.local.effects import (
    Accepted,
    DataRead,
    DataWrite,
    InvalidationView,
    NeedsTxn,
    Ok,
    PreAccepted,
    ReadState,
    RecoveryView,
    Refused,
)
from accord.primitives import (
    BALLOT_ZERO,
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
from accord.topology import Topology

logger = logging.getLogger(__name__)

# Enum members looked up once, for the checks that run on every transition.
_APPLIED = Status.APPLIED
_INVALIDATED = Status.INVALIDATED
_ACCEPTED = Status.ACCEPTED
_ACCEPTED_INVALIDATE = Status.ACCEPTED_INVALIDATE
_COMMITTED = Status.COMMITTED
_NOT_DEFINED = Status.NOT_DEFINED
_PRE_ACCEPTED = Status.PRE_ACCEPTED
_PRE_APPLIED = Status.PRE_APPLIED
_STABLE = Status.STABLE


class CommandStore:
    """The commands and per-key indexes of one replica."""

    def __init__(
        self,
        node_id: int,
        topology: Topology,
        *,
        mint: Callable[[Timestamp | None], Timestamp],
        now_micros: Callable[[], int],
        preaccept_timeout_micros: int,
        bugs: Bugs = NO_BUGS,
        shared_storage: bool = False,
    ) -> None:
        self.node_id = node_id
        # Every replica's data store is one and the same (the sidecars' Cassandra): one
        # replica per shard writes, the others learn that it did (see _maybe_execute).
        self.shared_storage = shared_storage
        # Txns this replica wrote under shared storage, for the node to tell the others.
        self.written: list[TxnId] = []
        # Txns that became Applied, for the node to answer Apply waiters; and txns found
        # covered by another replica's writes, applied by settle() (not recursively: a
        # long chain of waiting txns would otherwise nest one call per txn).
        self.applied_ids: list[TxnId] = []
        self.to_apply: list[Command] = []
        self.topology = topology
        self._mint = mint
        self._now = now_micros
        self.preaccept_timeout_micros = preaccept_timeout_micros
        self.bugs = bugs
        self.commands: dict[TxnId, Command] = {}
        self.keys: dict[Key, KeyState] = {}
        self._listeners: dict[TxnId, dict[TxnId, None]] = {}
        # Commands not yet Applied or Invalidated, for the progress log to scan.
        self._active: dict[TxnId, Command] = {}
        # Applied here, home shard here, not yet known to be applied by every replica: the
        # progress log re-sends Apply until it is, so no replica is left behind.
        self._undurable: dict[TxnId, Command] = {}
        self._owned_cache: dict[Key, bool] = {}
        self._owned_keys_cache: dict[tuple[Key, ...], tuple[Key, ...]] = {}
        self.persisted: list[CommandSnapshot] = []
        self.data_reads: list[DataRead] = []
        self.data_writes: list[DataWrite] = []
        # (txn_id, node, cid) read replies that became answerable, for the node to send.
        self.read_replies: list[tuple[TxnId, int, int]] = []
        # Commands whose status changed, for coordinators waiting on local progress.
        self.changed: dict[TxnId, None] = {}

    # ------------------------------------------------------------------ helpers

    def owns(self, key: Key) -> bool:
        owned = self._owned_cache.get(key)
        if owned is None:
            owned = self.topology.owns(self.node_id, key)
            self._owned_cache[key] = owned
        return owned

    def owned_keys(self, keys: tuple[Key, ...]) -> tuple[Key, ...]:
        owned = self._owned_keys_cache.get(keys)
        if owned is None:
            owned = tuple(k for k in keys if self.owns(k))
            if len(self._owned_keys_cache) >= 65_536:
                self._owned_keys_cache.clear()
            self._owned_keys_cache[keys] = owned
        return owned

    def command(self, txn_id: TxnId) -> Command:
        command = self.commands.get(txn_id)
        if command is None:
            command = Command(txn_id, last_progress_micros=self._now())
            self.commands[txn_id] = command
            self._active[txn_id] = command
        return command

    def active(self) -> list[Command]:
        return list(self._active.values())

    def undurable(self) -> list[Command]:
        return list(self._undurable.values())

    def is_blocking(self, txn_id: TxnId) -> bool:
        """Whether some command here waits on ``txn_id``."""
        return bool(self._listeners.get(txn_id))

    def learn(self, txn_id: TxnId, txn: Txn, route: Route) -> None:
        """Adopt a txn's definition learned from a peer, without voting on it."""
        command = self.command(txn_id)
        if command.txn is None:
            self._define(command, txn, route)
            self._persist(command)

    def _persist(self, command: Command) -> None:
        self.persisted.append(command.snapshot())
        status = command.status
        if status is _APPLIED or status is _INVALIDATED:  # terminal
            self._active.pop(command.txn_id, None)
        command.last_progress_micros = self._now()
        self.changed[command.txn_id] = None

    def _define(self, command: Command, txn: Txn | None, route: Route | None) -> None:
        if txn is not None and command.txn is None:
            check_state(txn.kind is command.kind, "txn %s kind differs from its id", command.txn_id)
            command.txn = txn
        if route is not None and command.route is None:
            command.route = route
        self._index(command)

    def _index(self, command: Command) -> None:
        if command.indexed or command.txn is None or command.pruned:
            return
        command.indexed = True
        kind = command.kind
        for key in self.owned_keys(command.txn.keys):
            state = self.keys.get(key)
            if state is None:
                state = self.keys[key] = KeyState()
            (state.writes if kind is Kind.WRITE else state.reads)[command.txn_id] = command

    def _deps(self, txn_id: TxnId, txn: Txn, below: Timestamp) -> Deps:
        """Every known, not invalidated, conflicting txn on our keys with an id < ``below``."""
        by_key: dict[Key, tuple[TxnId, ...]] = {}
        kind = txn_id.kind
        omit_uncommitted = self.bugs.deps_omit_uncommitted
        for key in self.owned_keys(txn.keys):
            state = self.keys.get(key)
            if state is None:
                continue
            found = [
                other
                for index in state.conflicting(kind)
                for other, command in index.items()
                if other < below
                and other != txn_id
                and command.status is not _INVALIDATED
                and (not omit_uncommitted or command.status.is_decided)
            ]
            if found:
                # Unique already (a txn sits in one index of a key): sorted is normal form.
                found.sort()
                by_key[key] = tuple(found)
        # Keys come in txn.keys order, which is sorted; Deps.of checks and falls back.
        return Deps.of(by_key)

    # ------------------------------------------------------------------ PreAccept

    def preaccept(self, txn_id: TxnId, txn: Txn, route: Route) -> PreAccepted | Refused:
        command = self.command(txn_id)
        if command.promised > BALLOT_ZERO:
            return Refused(command.promised, command.status)
        if command.status >= _PRE_ACCEPTED:
            if command.status is _PRE_ACCEPTED:
                # A duplicate: the same witnessedAt, deps and fast vote as the first time.
                # "Expired" can only have become true since (time moves on), and a replica
                # that refuses late is as safe as one that refused at once: it only makes
                # the coordinator invalidate, through a ballot-checked round.
                witnessed = command.execute_at
                if witnessed is None:
                    fail("pre-accepted %s lacks executeAt", txn_id)
                expired = self._now() - txn_id.hlc >= self.preaccept_timeout_micros
                return PreAccepted(witnessed, command.deps, expired and not command.fast_vote)
            return Refused(command.promised, command.status)
        self._define(command, txn, route)
        witnessed, rejected = self._witnessed_at(txn_id, txn, permit_fast_path=True)
        deps = self._deps(txn_id, txn, txn_id)
        command.status = _PRE_ACCEPTED
        command.execute_at = witnessed
        command.deps = deps
        command.fast_vote = witnessed == txn_id
        self._persist(command)
        return PreAccepted(witnessed, deps, rejected)

    def _witnessed_at(
        self, txn_id: TxnId, txn: Txn, *, permit_fast_path: bool
    ) -> tuple[Timestamp, bool]:
        # The replica's own id was indexed by _define, so compare against what others did.
        expired = self._now() - txn_id.hlc >= self.preaccept_timeout_micros
        conflict = self._max_conflict_excluding(txn_id, txn)
        no_conflict = conflict is None or txn_id > conflict or self.bugs.fast_vote_ignores_conflicts
        if permit_fast_path and not expired and no_conflict:
            return txn_id, False
        floor = txn_id if conflict is None or txn_id > conflict else conflict
        return self._mint(floor), expired

    def _max_conflict_excluding(self, txn_id: TxnId, txn: Txn) -> Timestamp | None:
        best: Timestamp | None = None
        kind = txn_id.kind
        for key in self.owned_keys(txn.keys):
            state = self.keys.get(key)
            if state is None:
                continue
            for index in state.conflicting(kind):
                for other, command in index.items():
                    if other == txn_id:
                        continue
                    at = command.execute_at if command.execute_at is not None else other
                    top = at if at > other else other
                    if best is None or top > best:
                        best = top
            pruned = state.pruned_conflict(kind)
            if best is None or pruned > best:
                best = pruned
        return best

    # ------------------------------------------------------------------ Accept

    def accept(
        self,
        txn_id: TxnId,
        txn: Txn,
        route: Route,
        ballot: Ballot,
        execute_at: Timestamp,
        deps: Deps,
    ) -> Accepted | Refused:
        check_state(execute_at >= txn_id, "executeAt %s below txnId %s", execute_at, txn_id)
        command = self.command(txn_id)
        if command.promised > ballot:
            return Refused(command.promised, command.status)
        if command.status.is_decided:
            return Refused(command.promised, command.status)
        self._define(command, txn, route)
        command.promised = ballot
        command.accepted = ballot
        command.status = _ACCEPTED
        command.execute_at = execute_at
        command.deps = deps
        self._persist(command)
        return Accepted(self._deps(txn_id, txn, execute_at))

    def accept_invalidate(
        self, txn_id: TxnId, ballot: Ballot, route: Route | None = None
    ) -> Ok | Refused:
        command = self.command(txn_id)
        if command.promised > ballot or command.status.is_decided:
            return Refused(command.promised, command.status)
        command.promised = ballot
        command.accepted = ballot
        command.status = _ACCEPTED_INVALIDATE
        if command.txn is None and command.key_hint is None and route is not None:
            # Durable with the proposal: if the CommitInvalidate is lost, the progress log
            # asks this key's shard (which we are part of) for the decision.
            owned = self.owned_keys(route.keys)
            command.key_hint = owned[0] if owned else None
        self._persist(command)
        return Ok()

    # ------------------------------------------------------------------ Commit / Stable

    def commit(
        self,
        txn_id: TxnId,
        execute_at: Timestamp,
        deps: Deps,
        *,
        stable: bool,
        txn: Txn | None,
        route: Route | None,
    ) -> Ok | NeedsTxn:
        command = self.command(txn_id)
        check_state(
            command.status is not _INVALIDATED,
            "node %d: commit of invalidated txn %s",
            self.node_id,
            txn_id,
        )
        if command.status.is_decided:
            check_state(
                command.execute_at == execute_at,
                "node %d: txn %s committed at %s and at %s",
                self.node_id,
                txn_id,
                command.execute_at,
                execute_at,
            )
            if stable and command.status is _COMMITTED:
                self._make_stable(command, deps)
            return Ok()
        if command.txn is None and txn is None:
            return NeedsTxn()
        self._define(command, txn, route)
        command.execute_at = execute_at
        command.deps = deps
        if stable:
            self._make_stable(command, deps)
        else:
            command.status = _COMMITTED
            self._persist(command)
            self._notify(command)
        return Ok()

    def _make_stable(self, command: Command, deps: Deps) -> None:
        command.status = _STABLE
        command.deps = deps
        self._persist(command)
        self._notify(command)
        self._start_waiting(command)

    # ------------------------------------------------------------------ Apply

    def apply(
        self,
        txn_id: TxnId,
        txn: Txn,
        route: Route,
        execute_at: Timestamp,
        deps: Deps,
        writes: tuple[WriteOp, ...],
        result: TxnResult,
        *,
        ballot: Ballot = BALLOT_ZERO,
        chosen: bool = False,
    ) -> Ok | Refused:
        """Journal the outcome proposed under ``ballot``, or learn the ``chosen`` one.

        The outcome is a Paxos value of its own (docs/accord.md, "Writes wait for a durable
        outcome"): a proposal is refused under a higher promise and replaces one accepted
        under a lower ballot; a chosen outcome is taken whatever was promised. Writes wait
        until the outcome held here is known chosen.
        """
        command = self.command(txn_id)
        check_state(
            command.status is not _INVALIDATED,
            "node %d: apply of invalidated txn %s",
            self.node_id,
            txn_id,
        )
        if command.status.is_decided:
            check_state(
                command.execute_at == execute_at,
                "node %d: txn %s applied at %s but committed at %s",
                self.node_id,
                txn_id,
                execute_at,
                command.execute_at,
            )
        if command.status is _APPLIED:
            # Applied means chosen. A proposal under a lower ballot than our promise may carry
            # another outcome (over shared storage, a coordinator that read after the chosen
            # one was written reads the txn's own writes): an ack would count us toward
            # choosing it, so it gets one only if it carries what we applied.
            if (
                chosen
                or self.bugs.applied_acks_any_proposal
                or ballot >= command.promised
                or (writes == command.writes and result == command.result)
            ):
                return Ok()
            return Refused(command.promised, command.status)
        if not chosen and command.promised > ballot:
            return Refused(command.promised, command.status)
        if command.status is _PRE_APPLIED:
            if command.chosen or (not chosen and ballot < command.accepted):
                # Ours is chosen (any later proposal carries the same outcome), or newer.
                return Ok()
            check_state(
                not command.writing or command.writes == writes,
                "node %d: txn %s is writing one outcome and was told another",
                self.node_id,
                txn_id,
            )
            command.writes = writes
            command.result = result
            if ballot > command.accepted:
                command.accepted = ballot
            if ballot > command.promised:
                command.promised = ballot
            command.chosen = command.chosen or chosen
            self._persist(command)
            self._maybe_execute(command)
            return Ok()
        self._define(command, txn, route)
        was_stable = command.status is _STABLE
        command.status = _PRE_APPLIED
        command.execute_at = execute_at
        if not was_stable:
            command.deps = deps
        command.writes = writes
        command.result = result
        if ballot > command.accepted:
            command.accepted = ballot
        if ballot > command.promised:
            command.promised = ballot
        command.chosen = chosen
        self._persist(command)
        self._notify(command)
        if was_stable and command.waiting_on is not None:
            self._maybe_execute(command)
        else:
            self._start_waiting(command)
        self._answer_readers(command)
        return Ok()

    def outcome_durable(self, txn_id: TxnId, ballot: Ballot) -> None:
        """The outcome proposed under ``ballot`` is chosen. An outcome held here under that
        ballot or a higher one is the same outcome (Paxos: every proposal above the chosen
        ballot carries the chosen value), so it may be written."""
        command = self.commands.get(txn_id)
        if (
            command is None
            or command.status is not _PRE_APPLIED
            or command.chosen
            or command.accepted < ballot
        ):
            return
        self._mark_chosen(command)

    def _mark_chosen(self, command: Command) -> None:
        command.chosen = True
        command.last_progress_micros = self._now()
        self.changed[command.txn_id] = None
        self._maybe_execute(command)

    def commit_invalidate(self, txn_id: TxnId) -> Ok:
        command = self.command(txn_id)
        if command.status is _INVALIDATED:
            return Ok()
        check_state(
            not command.status.is_decided,
            "node %d: invalidation of txn %s, already %s at %s",
            self.node_id,
            txn_id,
            command.status.name,
            command.execute_at,
        )
        command.status = _INVALIDATED
        command.waiting_on = None
        self._persist(command)
        self._notify(command)
        return Ok()

    # ------------------------------------------------------------------ Recovery

    def begin_recovery(
        self, txn_id: TxnId, txn: Txn, route: Route, ballot: Ballot
    ) -> RecoveryView | Refused:
        command = self.command(txn_id)
        if command.promised > ballot:
            return Refused(command.promised, command.status)
        before = command.snapshot()
        self._define(command, txn, route)
        command.promised = ballot
        if command.status is _NOT_DEFINED:
            # A replica that had not seen the txn votes against the fast path.
            witnessed, _ = self._witnessed_at(txn_id, txn, permit_fast_path=False)
            command.status = _PRE_ACCEPTED
            command.execute_at = witnessed
            command.deps = self._deps(txn_id, txn, txn_id)
            command.fast_vote = False
        if command.snapshot() != before:
            self._persist(command)
        else:
            # A retry under a ballot already promised: that promise is durable, so a second
            # identical snapshot (with all its deps) only grew journals in recovery storms.
            # The coordinator is still driving the txn, which counts as progress here.
            command.last_progress_micros = self._now()
        rejects = False
        committed_witness: list[TxnId] = []
        accepted_no_witness: list[TxnId] = []
        deps = command.deps
        if command.status is _PRE_ACCEPTED:
            deps = self._deps(txn_id, txn, txn_id)
            rejects, committed_witness, accepted_no_witness = self._recovery_evidence(command, txn)
        return RecoveryView(
            command.status,
            command.accepted,
            command.execute_at,
            deps,
            command.fast_vote,
            rejects,
            tuple(committed_witness),
            tuple(accepted_no_witness),
            command.writes,
            command.result,
        )

    def _recovery_evidence(
        self, command: Command, txn: Txn
    ) -> tuple[bool, list[TxnId], list[TxnId]]:
        """Which conflicting txns prove or might disprove a fast-path decision for ``command``.

        Reference: Accord ``BeginRecovery`` (rejectsFastPath, earlierCommittedWitness,
        earlierAcceptedNoWitness) and accord.md §5.
        """
        txn_id = command.txn_id
        rejects = False
        committed_witness: dict[TxnId, None] = {}
        accepted_no_witness: dict[TxnId, None] = {}
        for key in self.owned_keys(txn.keys):
            state = self.keys.get(key)
            if state is None:
                continue
            if state.pruned_conflict(txn_id.kind) > txn_id:
                # A pruned txn was applied here, so it was committed and did not wait for us
                # (we are not committed here): it executes after us without witnessing us.
                rejects = True
            for index in state.conflicting(txn_id.kind):
                for other_id, other in index.items():
                    if other_id == txn_id or other.status is _INVALIDATED:
                        continue
                    status = other.status
                    if status < _ACCEPTED or status is _ACCEPTED_INVALIDATE:
                        continue
                    # Witnessed on *this* key: the fast-path argument is per key, and a
                    # replica holds the full deps of a multi-shard txn, so our id under
                    # another shard's key says nothing about this shard's fast quorum.
                    witnessed = (
                        other.deps.contains(txn_id)
                        if self.bugs.witness_any_key
                        else txn_id in other.deps.for_key(key)
                    )
                    assert other.execute_at is not None
                    executes_after = other.execute_at > txn_id
                    if other_id > txn_id:
                        rejects = rejects or not witnessed
                    elif status.is_decided:
                        if witnessed:
                            committed_witness[other_id] = None
                        elif executes_after:
                            rejects = True
                    elif executes_after and not witnessed:
                        accepted_no_witness[other_id] = None
        if self.bugs.recovery_ignores_earlier_accepted:
            accepted_no_witness.clear()
        return rejects, sorted(committed_witness), sorted(accepted_no_witness)

    def begin_invalidation(self, txn_id: TxnId, ballot: Ballot) -> InvalidationView | Refused:
        command = self.command(txn_id)
        if command.promised > ballot:
            return Refused(command.promised, command.status)
        command.promised = ballot
        self._persist(command)
        return InvalidationView(
            command.status, command.accepted, command.fast_vote, command.txn, command.route
        )

    # ------------------------------------------------------------------ Reads

    def read(self, txn_id: TxnId, reader_node: int, reader_cid: int) -> ReadState:
        """Queue a read for the coordinator ``(reader_node, reader_cid)``.

        Returns the recorded outcome at once when the txn was already applied here, since
        the data no longer reflects the state at its executeAt.
        """
        command = self.command(txn_id)
        if command.status >= _PRE_APPLIED and command.status is not _INVALIDATED:
            chosen = command.chosen or command.status is _APPLIED
            return ReadState(command.writes, command.result, command.accepted, chosen)
        if (reader_node, reader_cid) not in command.readers:
            command.readers.append((reader_node, reader_cid))
        self._maybe_execute(command)
        return ReadState(None, None)

    def read_done(self, txn_id: TxnId) -> list[tuple[int, int]]:
        command = self.commands[txn_id]
        command.reading = False
        readers, command.readers = command.readers, []
        return readers

    def _answer_readers(self, command: Command) -> None:
        for reader_node, reader_cid in command.readers:
            self.read_replies.append((command.txn_id, reader_node, reader_cid))
        command.readers = []

    # ------------------------------------------------------------------ Execution

    def _start_waiting(self, command: Command) -> None:
        assert command.execute_at is not None and command.txn is not None
        waiting: dict[TxnId, None] = {}
        if not self.bugs.execute_without_waiting:
            for key in self.owned_keys(command.txn.keys):
                for dep in command.deps.for_key(key):
                    if dep != command.txn_id and self._blocks(dep, command.execute_at):
                        waiting[dep] = None
                        self._listeners.setdefault(dep, {})[command.txn_id] = None
                        blocker = self.commands[dep]
                        if blocker.txn is None and blocker.key_hint is None:
                            blocker.key_hint = key
        command.waiting_on = waiting
        self._maybe_execute(command)

    def _blocks(self, dep_id: TxnId, execute_at: Timestamp) -> bool:
        dep = self.commands.get(dep_id)
        if dep is None:
            # Known only as someone's dependency: remember it so the progress log can chase it.
            dep = self.command(dep_id)
        status = dep.status
        if status is _INVALIDATED or status is _APPLIED:
            return False
        if not status.is_decided:
            return True
        assert dep.execute_at is not None
        return dep.execute_at < execute_at

    def _notify(self, dep: Command) -> None:
        listeners = self._listeners.get(dep.txn_id)
        if not listeners:
            return
        if dep.status.is_terminal:
            del self._listeners[dep.txn_id]
        for waiter_id in list(listeners):
            waiter = self.commands[waiter_id]
            if waiter.waiting_on is None or dep.txn_id not in waiter.waiting_on:
                listeners.pop(waiter_id, None)
                continue
            assert waiter.execute_at is not None
            if not self._blocks(dep.txn_id, waiter.execute_at):
                del waiter.waiting_on[dep.txn_id]
                listeners.pop(waiter_id, None)
                self._maybe_execute(waiter)

    def _maybe_execute(self, command: Command) -> None:
        if command.waiting_on is None or command.waiting_on:
            return
        assert command.execute_at is not None and command.txn is not None
        if command.status is _STABLE and command.readers and not command.reading:
            keys = self.owned_keys(command.txn.read_keys)
            command.reading = True
            self.data_reads.append(
                DataRead(command.txn_id, command.execute_at, keys, command.txn.selections_of(keys))
            )
        elif (
            command.status is _PRE_APPLIED
            and not command.writing
            and (command.chosen or self.bugs.write_before_durable)
        ):
            assert command.writes is not None
            if self.shared_storage and not self._writes_here(command):
                # Another replica writes: applied here once it says so (_covered).
                if self._covered(command):
                    command.writing = True
                    self.to_apply.append(command)
                return
            writes = tuple(w for w in command.writes if self.owns(w.key))
            command.writing = True
            self.data_writes.append(DataWrite(command.txn_id, command.execute_at, writes))

    def writer_of(self, txn_id: TxnId, replicas: tuple[int, ...]) -> int:
        """The replica of a shard that writes ``txn_id`` under shared storage: its original
        coordinator if that is a replica (it holds the outcome first), else one chosen by
        the id, so that every replica agrees without a message."""
        if txn_id.node in replicas:
            return txn_id.node
        return replicas[txn_id.hlc % len(replicas)]

    def _writes_here(self, command: Command) -> bool:
        if command.take_over:
            return True
        assert command.txn is not None
        return any(
            self.writer_of(command.txn_id, shard.replicas) == self.node_id
            for shard in self.topology.shards_for(self.owned_keys(command.txn.keys))
        )

    def _covered(self, command: Command) -> bool:
        """Whether every shard of ours has had the txn's writes written by one of its
        replicas (a writer writes every key it owns)."""
        assert command.txn is not None
        return all(
            any(n in command.written_from for n in shard.replicas)
            for shard in self.topology.shards_for(self.owned_keys(command.txn.keys))
        )

    def written_by(self, txn_id: TxnId, node: int, ballot: Ballot) -> None:
        """``node`` wrote the chosen outcome of ``txn_id`` (proposed under ``ballot``) for
        every key it owns, at the data store's write consistency."""
        command = self.command(txn_id)
        command.written_from.add(node)
        if command.status is _PRE_APPLIED and not command.chosen:
            self.outcome_durable(txn_id, ballot)
        elif command.status is _PRE_APPLIED:
            self._maybe_execute(command)

    def take_over(self, txn_id: TxnId) -> None:
        """The writer said nothing for a while: write the outcome here (idempotent)."""
        command = self.commands[txn_id]
        command.take_over = True
        self._maybe_execute(command)

    def write_when_chosen(self, txn_id: TxnId) -> None:
        """This replica recovers ``txn_id``: it writes the outcome itself once it is chosen
        and executable here, as a takeover does (idempotent), instead of waiting out the
        other-shard delay for a writer that went silent already once (why it recovers)."""
        self.commands[txn_id].take_over = True

    def write_done(self, txn_id: TxnId) -> None:
        command = self.commands[txn_id]
        if command.status is not _PRE_APPLIED:  # the name only when it fails
            fail("write done for %s at %s", txn_id, command.status.name)
        command.writing = False
        if self.shared_storage:
            command.written_from.add(self.node_id)
            self.written.append(txn_id)
        self._applied(command)

    def settle(self) -> None:
        """Apply the txns whose writes other replicas made (shared storage)."""
        while self.to_apply:
            command = self.to_apply.pop(0)
            if command.status is _PRE_APPLIED:
                command.writing = False
                self._applied(command)

    def _applied(self, command: Command) -> None:
        txn_id = command.txn_id
        self.applied_ids.append(txn_id)
        command.status = _APPLIED
        command.waiting_on = None
        self._persist(command)
        self._notify(command)
        if command.durable:
            self.mark_durable(txn_id)
        elif command.route is not None and self.owns(command.route.home_key):
            self._undurable[txn_id] = command

    # ------------------------------------------------------------------ Durability / GC

    def mark_durable(self, txn_id: TxnId) -> None:
        """Every replica applied ``txn_id``: drop it from the key indexes.

        Deps stop naming it (it is applied everywhere, so nobody needs to wait for it) and
        the key's pruned floor keeps the recovery evidence its presence would have given.
        The command record itself is kept: recovery may still ask about it.
        """
        command = self.commands.get(txn_id)
        if command is None:
            return
        command.durable = True
        self._undurable.pop(txn_id, None)
        if command.status is _PRE_APPLIED and not command.chosen:
            # Every replica journaled the outcome: it is chosen.
            self._mark_chosen(command)
        if command.status is not _APPLIED or command.pruned:
            return
        assert command.txn is not None and command.execute_at is not None
        command.pruned = True
        command.indexed = False
        kind = command.kind
        for key in self.owned_keys(command.txn.keys):
            state = self.keys[key]
            (state.writes if kind is Kind.WRITE else state.reads).pop(txn_id, None)
            if command.execute_at > state.pruned_any:
                state.pruned_any = command.execute_at
            if kind is Kind.WRITE and command.execute_at > state.pruned_write:
                state.pruned_write = command.execute_at

    # ------------------------------------------------------------------ Restart

    def restore(self, snapshots: list[CommandSnapshot]) -> None:
        """Rebuild from the journal: the last snapshot of each txn wins."""
        latest: dict[TxnId, CommandSnapshot] = {}
        for snapshot in snapshots:
            latest[snapshot.txn_id] = snapshot
        now = self._now()
        for txn_id in sorted(latest):
            command = Command.restore(latest[txn_id])
            if self.bugs.forget_promise_on_restart:
                command.promised = command.accepted
            command.last_progress_micros = now
            self.commands[txn_id] = command
            if not command.status.is_terminal:
                self._active[txn_id] = command
            self._index(command)
        for txn_id in sorted(latest):
            command = self.commands[txn_id]
            if command.status in (_STABLE, _PRE_APPLIED):
                self._start_waiting(command)
            elif command.status is _APPLIED and command.route and self.owns(command.route.home_key):
                # Whether every replica applied it was not journaled: find out again.
                self._undurable[txn_id] = command

    def drain(self) -> tuple[list[CommandSnapshot], list[DataRead], list[DataWrite]]:
        persisted, self.persisted = self.persisted, []
        reads, self.data_reads = self.data_reads, []
        writes, self.data_writes = self.data_writes, []
        return persisted, reads, writes
