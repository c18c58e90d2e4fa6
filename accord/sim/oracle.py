"""Omniscient checks of what the protocol must guarantee, whether or not a client sees it.

The history checker judges what clients observed; a lost write that nobody read again is
invisible to it. These oracles watch every replica instead:

- **Execution order** (per replica, per key): conflicting work happens in executeAt order.
  A write that lands below a read or write already done at a later executeAt, or a read
  after a later write, means some transaction executed without waiting for one that had
  to come first.
- **Dependencies** (Accord's central invariant): if conflicting transactions A and B are
  both committed on a key and A executes first, every replica of that key that makes B
  stable holds A among B's deps for that key -- otherwise B may execute without waiting
  for A. The only exemption is an A already applied by every replica of the key (it was
  pruned from the indexes, and nothing is left to wait for). Recovery that trusts evidence
  it should not (a witness under another shard's key, a forgotten promise, an ignored
  earlier proposal) breaks this at the moment the bad decision commits, long before any
  read could show it.
- **Promises** (per replica, per txn): a ballot promised durably is never taken back, not
  even by a restart.
- **Durable before written** (per data write): a replica issues a transaction's writes only
  once a quorum of every shard it touches journaled its outcome. The simulated stores are
  private, so an early write would go unnoticed by every other check; over a store the
  replicas share (the sidecars' Cassandra) a recovery coordinator could then miss the
  outcome, re-execute and read the transaction's own writes (docs/accord.md, "Writes wait
  for a durable outcome").
- **One outcome** (per txn and key): every replica that writes a transaction writes the same
  values. Two outcomes of one txn (a coordinator that executed it again, its proposal
  counted as chosen) would otherwise show only if a later read happened to meet both.
- **One outcome per vote** (per Apply delivered): a replica that applied a txn never acks a
  proposal of another outcome under a ballot below its promise. Over a shared store a stale
  coordinator that read the txn's own writes proposes such an outcome; the write check above
  sees it chosen only if some replica goes on to write it, this sees the vote.
- **Recovery evidence** (per reply): the fast-path argument, checked from the replica's raw
  state independently of ``CommandStore``. A replica that holds a conflicting txn with a
  later id, accepted or committed, whose deps for a key the two share lack ours, must report
  that our fast path was rejected; one that holds an earlier txn proposed (not committed)
  to execute after ours without us in its deps for a shared key must list it, or reject.
  Most such wrong answers are harmless in a given run -- other replies outvote them -- so
  the dependency invariant alone meets them only by luck; this meets every one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

from accord.invariants import check_state, fail
from accord.local.command import Command, CommandSnapshot
from accord.local.commands import CommandStore
from accord.local.effects import DataRead, DataWrite
from accord.messages import Apply, RecoverOk
from accord.primitives import (
    BALLOT_ZERO,
    TIMESTAMP_MIN,
    Ballot,
    Deps,
    Key,
    Status,
    Timestamp,
    TxnId,
    WriteOp,
)
from accord.topology import Topology

_AT = itemgetter(0)
# Enum members looked up once: on_persist runs for every journaled snapshot.
_COMMITTED = Status.COMMITTED
_STABLE = Status.STABLE
_PRE_APPLIED = Status.PRE_APPLIED
_APPLIED = Status.APPLIED
_INVALIDATED = Status.INVALIDATED


@dataclass(frozen=True, slots=True)
class _Decided:
    execute_at: Timestamp
    keys: tuple[Key, ...]


class Oracle:
    """Fed every journaled snapshot and every data operation of a simulated cluster."""

    def __init__(
        self, topology: Topology, applied_everywhere: Callable[[TxnId, Key], bool]
    ) -> None:
        self.topology = topology
        self._applied_everywhere = applied_everywhere
        # (node, key) -> [highest executeAt read, highest executeAt written]
        self._executed: dict[tuple[int, Key], list[Timestamp]] = {}
        self._decided: dict[TxnId, _Decided] = {}
        # Decided txns per key, less those every replica of the key journaled as applied:
        # those are exempt for good (journaled status only grows), and without pruning
        # them every stable txn scanned the whole history of its key.
        self._decided_by_key: dict[Key, dict[TxnId, None]] = {}
        # (txn, key) -> the replicas of key that journaled txn as applied
        self._applied_on: dict[tuple[TxnId, Key], set[int]] = {}
        # (node, key) -> txn -> (executeAt, deps) as made stable on that node
        self._stable: dict[tuple[int, Key], dict[TxnId, tuple[Timestamp, Deps]]] = {}
        # (node, key) -> (executeAt, txn) of the same stable txns, in executeAt order: a
        # newly decided txn is checked only against those that execute after it.
        self._stable_order: dict[tuple[int, Key], list[tuple[Timestamp, TxnId]]] = {}
        # (node, txn) -> the highest ballot that node ever journaled as promised
        self._promised: dict[tuple[int, TxnId], Ballot] = {}
        # txn -> the nodes that journaled an outcome for it
        self._outcome_journaled: dict[TxnId, set[int]] = {}
        # (txn, key) -> the writes first issued for it, by any replica
        self._written: dict[tuple[TxnId, Key], tuple[WriteOp, ...]] = {}
        self._owned_cache: dict[tuple[int, tuple[Key, ...]], tuple[Key, ...]] = {}

    # ------------------------------------------------------------------ durable before written

    def on_write_issued(self, node_id: int, op: DataWrite, keys: tuple[Key, ...]) -> None:
        """``node_id`` hands ``op`` to its data store; ``keys``: every key of the txn."""
        journaled = self._outcome_journaled.get(op.txn_id, set())
        for shard in self.topology.shards_for(keys):
            held = 0
            for n in shard.replicas:
                if n in journaled:
                    held += 1
            if held < shard.slow_quorum:
                fail(
                    "node %d wrote %s while only %d of shard %s's replicas had journaled its "
                    "outcome (a quorum is %d)",
                    node_id,
                    op.txn_id,
                    held,
                    shard.range,
                    shard.slow_quorum,
                )
        by_key: dict[Key, list[WriteOp]] = {}
        for write in op.writes:
            listed = by_key.get(write.key)
            if listed is None:
                by_key[write.key] = [write]
            else:
                listed.append(write)
        written = self._written
        for key, writes in by_key.items():
            issued = tuple(writes)
            first = written.get((op.txn_id, key))
            if first is None:
                written[(op.txn_id, key)] = issued
            elif first != issued:
                fail(
                    "node %d wrote %s for %s as %r, another replica as %r: two outcomes of one txn",
                    node_id,
                    key,
                    op.txn_id,
                    writes,
                    first,
                )

    # ------------------------------------------------------------------ execution order

    def on_data(self, node_id: int, op: DataRead | DataWrite) -> None:
        at = op.execute_at
        if isinstance(op, DataRead):
            for key in op.keys:
                marks = self._marks(node_id, key)
                check_state(
                    marks[1] <= at,
                    "node %d read %s for %s at %s after a write at %s",
                    node_id,
                    key,
                    op.txn_id,
                    at,
                    marks[1],
                )
                if at > marks[0]:
                    marks[0] = at
            return
        for write in op.writes:
            marks = self._marks(node_id, write.key)
            check_state(
                marks[0] <= at and marks[1] <= at,
                "node %d wrote %s for %s at %s after a read at %s or a write at %s",
                node_id,
                write.key,
                op.txn_id,
                at,
                marks[0],
                marks[1],
            )
            if at > marks[1]:
                marks[1] = at

    def _marks(self, node_id: int, key: Key) -> list[Timestamp]:
        marks = self._executed.get((node_id, key))
        if marks is None:
            marks = self._executed[(node_id, key)] = [TIMESTAMP_MIN, TIMESTAMP_MIN]
        return marks

    # ------------------------------------------------------------------ dependencies

    def on_persist(self, node_id: int, snapshot: CommandSnapshot) -> None:
        txn_id = snapshot.txn_id
        promised = self._promised.get((node_id, txn_id), BALLOT_ZERO)
        if snapshot.promised < promised:
            fail(
                "node %d journaled promise %s for %s after promising %s",
                node_id,
                snapshot.promised,
                txn_id,
                promised,
            )
        if snapshot.promised != promised:  # most records keep the promise they had
            self._promised[(node_id, txn_id)] = snapshot.promised
        status = snapshot.status
        if status < _COMMITTED or status is _INVALIDATED:
            return
        if status >= _PRE_APPLIED:  # PRE_APPLIED or APPLIED: INVALIDATED left above
            journaled = self._outcome_journaled.get(txn_id)
            if journaled is None:
                self._outcome_journaled[txn_id] = {node_id}
            else:
                journaled.add(node_id)
        at, txn = snapshot.execute_at, snapshot.txn
        if at is None or txn is None:
            return
        if txn_id not in self._decided:
            self._decided[txn_id] = _Decided(at, txn.keys)
            for key in txn.keys:
                self._decided_by_key.setdefault(key, {})[txn_id] = None
                self._check_as_earlier(txn_id, at, key)
        if status >= _STABLE:
            owned = self._owned(node_id, txn.keys)
            for key in owned:
                stable = self._stable.get((node_id, key))
                if stable is None:
                    stable = self._stable[(node_id, key)] = {}
                if txn_id not in stable:
                    stable[txn_id] = (at, snapshot.deps)
                    bisect.insort(self._stable_order.setdefault((node_id, key), []), (at, txn_id))
                    self._check_as_later(node_id, txn_id, at, snapshot.deps, key)
            if status is _APPLIED:
                for key in owned:
                    self._applied_here(node_id, txn_id, key)

    def _owned(self, node_id: int, keys: tuple[Key, ...]) -> tuple[Key, ...]:
        """The keys of ``keys`` that ``node_id`` replicates, from the topology."""
        owned = self._owned_cache.get((node_id, keys))
        if owned is None:
            owned = tuple(k for k in keys if self.topology.owns(node_id, k))
            if len(self._owned_cache) >= 65_536:
                self._owned_cache.clear()
            self._owned_cache[(node_id, keys)] = owned
        return owned

    def _applied_here(self, node_id: int, txn_id: TxnId, key: Key) -> None:
        replicas = self.topology.shard_for(key).replicas
        applied = self._applied_on.setdefault((txn_id, key), set())
        applied.add(node_id)
        if len(applied) == len(replicas):
            del self._applied_on[(txn_id, key)]
            self._decided_by_key[key].pop(txn_id, None)

    def _check_as_later(
        self, node_id: int, txn_id: TxnId, at: Timestamp, deps: Deps, key: Key
    ) -> None:
        waits_for = deps.for_key(key)
        for other in self._decided_by_key.get(key, ()):
            if other == txn_id or not other.kind.conflicts_with(txn_id.kind):
                continue
            if self._decided[other].execute_at < at:
                self._require(node_id, key, earlier=other, later=txn_id, waits_for=waits_for)

    def _check_as_earlier(self, txn_id: TxnId, at: Timestamp, key: Key) -> None:
        for node_id in self.topology.shard_for(key).replicas:
            order = self._stable_order.get((node_id, key))
            if not order:
                continue
            stable = self._stable[(node_id, key)]
            for other_at, other in order[bisect.bisect_right(order, at, key=_AT) :]:
                if other != txn_id and at < other_at and other.kind.conflicts_with(txn_id.kind):
                    deps = stable[other][1]
                    self._require(
                        node_id, key, earlier=txn_id, later=other, waits_for=deps.for_key(key)
                    )

    def _require(
        self,
        node_id: int,
        key: Key,
        *,
        earlier: TxnId,
        later: TxnId,
        waits_for: tuple[TxnId, ...],
    ) -> None:
        if earlier in waits_for or self._applied_everywhere(earlier, key):
            return
        fail(
            "node %d: %s (executeAt %s) is stable without %s (executeAt %s) in its deps "
            "for %s, though both are committed and %s executes first",
            node_id,
            later,
            self._decided[later].execute_at if later in self._decided else "?",
            earlier,
            self._decided[earlier].execute_at,
            key,
            earlier,
        )

    # ------------------------------------------------------------------ one outcome per vote

    @staticmethod
    def must_refuse(store: CommandStore, body: Apply) -> bool:
        """Whether the replica of ``store`` must refuse the proposal ``body``: it applied
        another outcome of the txn and promised a higher ballot than the proposal's. Over a
        shared store a stale coordinator, executing after the chosen outcome was written,
        reads the txn's own writes and proposes a second outcome; an ack would count toward
        choosing it, and the write-time check above sees that only if some replica then
        writes it. Checked from the replica's state as the proposal arrives."""
        command = store.commands.get(body.txn_id)
        return (
            command is not None
            and command.status is _APPLIED
            and not body.chosen
            and body.ballot < command.promised
            and (body.writes != command.writes or body.result != command.result)
        )

    @staticmethod
    def on_vote_for_another_outcome(node_id: int, txn_id: TxnId) -> None:
        fail(
            "node %d applied %s yet acked a proposal of another outcome under a lower ballot "
            "than it promised: a vote toward a second outcome",
            node_id,
            txn_id,
        )

    # ------------------------------------------------------------------ recovery evidence

    def on_recover_ok(self, node_id: int, store: CommandStore, reply: RecoverOk) -> None:
        """Check one replica's recovery evidence against its state as it sent the reply."""
        txn_id = reply.txn_id
        ours = store.commands.get(txn_id)
        if reply.status is not Status.PRE_ACCEPTED or reply.rejects_fast_path:
            return  # no evidence was given, or it already says the most it can
        if ours is None or ours.txn is None:
            return
        listed = set(reply.earlier_accepted_no_witness)
        for key in ours.txn.keys:
            state = store.keys.get(key) if self.topology.owns(node_id, key) else None
            if state is None:
                continue
            # The key's index holds every unpruned, defined txn on it: the raw state, read
            # without the evidence code under test.
            for index in (state.writes, state.reads):
                for other_id, other in index.items():
                    if other_id != txn_id and other.kind.conflicts_with(txn_id.kind):
                        self._check_evidence(node_id, txn_id, key, other_id, other, listed)

    @staticmethod
    def _check_evidence(
        node_id: int,
        txn_id: TxnId,
        key: Key,
        other_id: TxnId,
        other: Command,
        listed: set[TxnId],
    ) -> None:
        status = other.status
        if status < Status.ACCEPTED or status in (Status.ACCEPTED_INVALIDATE, Status.INVALIDATED):
            return
        if txn_id in other.deps.for_key(key):
            return
        at = other.execute_at
        executes_after = at is not None and at > txn_id
        if other_id > txn_id or (status.is_decided and executes_after):
            fail(
                "node %d told recovery of %s that a fast path was possible, yet holds "
                "%s (%s, executeAt %s) without it in its deps for %s",
                node_id,
                txn_id,
                other_id,
                status.name,
                at,
                key,
            )
        check_state(
            not executes_after or other_id in listed,
            "node %d did not tell recovery of %s about %s, proposed at %s "
            "without it in its deps for %s",
            node_id,
            txn_id,
            other_id,
            at,
            key,
        )
