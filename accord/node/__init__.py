"""A sans-IO Accord node: one replica plus the coordinators it runs.

Inputs: :meth:`Node.submit` (a client transaction), :meth:`Node.step` (a message from a
peer), :meth:`Node.tick` (time passed), :meth:`Node.read_done` / :meth:`Node.write_done`
(user-data work finished). Output: :meth:`Node.ready` hands out a batch; the host persists
it and acknowledges that with :meth:`Node.advance`. The contract for the host is in
:mod:`accord.api`.

The node owns the replica's :class:`CommandStore`, a table of active coordinators keyed by
coordination id, the hybrid logical clock, the optional reorder buffer, and the progress
log that notices stalled transactions and recovers them. Beside it in this package:
:mod:`accord.node.config` (:class:`NodeConfig`, :class:`NodeStats`),
:mod:`accord.node.handlers` (the replica's handler of each request type) and
:mod:`accord.node.progress` (the progress log's scan).
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accord.api import ClientReply, Clock, Durable, HlcFloor, JournalRecord, Ready
from accord.coordinate.transaction import Outcome, Phase, TransactionCoordinator
from accord.invariants import InvalidArgument, check_argument, check_not_none, check_state, fail
from accord.local.bugs import NO_BUGS, Bugs
from accord.local.command import CommandSnapshot
from accord.local.commands import CommandStore
from accord.local.recover_delay import RecoverDelay
from accord.messages import (
    REQUEST_TYPES,
    ApplyOk,
    Envelope,
    Message,
    OutcomeDurable,
    PreAccept,
    ReadOk,
    ReadRedundant,
    Request,
)
from accord.node.config import NodeConfig, NodeStats
from accord.node.handlers import REQUEST_HANDLERS
from accord.node.progress import scan_progress
from accord.primitives import (
    BALLOT_ZERO,
    Ballot,
    Hlc,
    Key,
    Route,
    Status,
    Timestamp,
    Txn,
    TxnId,
    TxnResult,
    Value,
)
from accord.primitives.txn import disjoint
from accord.topology import Topology

__all__ = ["Node", "NodeConfig", "NodeStats"]

logger = logging.getLogger(__name__)
# Enum members looked up once: a class attribute costs more than the checks using them.
_PHASE_DONE = Phase.DONE
_STATUS_APPLIED = Status.APPLIED


_REQUEST_KINDS = frozenset(REQUEST_TYPES)


@dataclass(slots=True)
class _ClientRequest:
    request_id: int
    txn_id: TxnId
    deadline_micros: int
    # Which part of the batch txn_id is this client's transaction; None: all of it.
    part: int | None = None


@dataclass(slots=True)
class _Asking:
    txn: Txn
    route: Route
    at_micros: int
    attempts: int = 0


@dataclass(slots=True)
class _Queued:
    request_id: int
    txn: Txn
    deadline_micros: int


class Node:
    """One Accord replica and coordinator. Not thread-safe: drive it from one loop."""

    def __init__(
        self,
        node_id: int,
        topology: Topology,
        clock: Clock,
        rng: random.Random,
        *,
        config: NodeConfig | None = None,
        bugs: Bugs = NO_BUGS,
        journal: Iterable[JournalRecord] = (),
    ) -> None:
        check_argument(node_id in topology.nodes(), "node %d is not in the topology", node_id)
        self.node_id = node_id
        self.topology = topology
        self.clock = clock
        self.rng = rng
        self.config = config or NodeConfig()
        self.bugs = bugs
        self.retry_micros = self.config.retry_micros
        self.retry_backoff_max_micros = self.config.retry_backoff_max_micros
        self.max_attempts = self.config.max_attempts
        self.fast_quorum_is_slow_quorum = bugs.fast_quorum_is_slow_quorum
        self.stats = NodeStats()
        records = list(journal)
        floor = max((r.value for r in records if isinstance(r, HlcFloor)), default=0)
        self.hlc = Hlc(node_id, floor=floor, reserve_micros=self.config.hlc_reserve_micros)
        self.store = CommandStore(
            node_id,
            topology,
            mint=self._mint,
            now_micros=clock.now_micros,
            preaccept_timeout_micros=self.config.preaccept_timeout_micros,
            bugs=bugs,
            shared_storage=self.config.shared_storage,
        )
        # Restoring re-derives state, so there is nothing new to persist; the data work it
        # re-issues (writes a crash interrupted; idempotent by executeAt) stays queued.
        self.store.restore([r for r in records if isinstance(r, CommandSnapshot)])
        for record in records:
            if isinstance(record, Durable):
                for durable_id in record.txn_ids:
                    self.store.mark_durable(durable_id)
        self.store.persisted.clear()
        self._ready = Ready()
        # The batch ready() handed out and advance() has not yet acknowledged as persisted.
        self._outstanding: Ready | None = None
        self._local: deque[Message] = deque()
        # Requests that may leave before this batch's records are durable (Ready.early),
        # and whether what is being sent now is caused by this batch's own journal records.
        self._early: list[Envelope] = []
        self._late_cause = False
        self._early_votes = bugs.early_votes
        self._coordinators: dict[int, TransactionCoordinator] = {}
        self._coordinating: dict[TxnId, int] = {}
        # The client requests each coordinated txn answers: one, or one per batch part.
        self._clients: dict[TxnId, list[_ClientRequest]] = {}
        self._client_count = 0
        # Txns this node coordinated for waiting clients without being a replica of any of
        # their keys, whose attempt ended without an outcome: no Apply will reach this node,
        # so it asks the replicas (_ask_outcomes), recovering only if none knows, with the
        # next attempt's time.
        self._asking: dict[TxnId, _Asking] = {}
        # Submissions not yet coordinated (batching on): taken oldest first by ready().
        self._queued: deque[_Queued] = deque()
        self._overlapping_batches = bugs.batch_ignores_disjointness
        self._apply_waiters: dict[TxnId, list[tuple[int, int]]] = {}
        self._reorder: list[tuple[TxnId, int, int, PreAccept]] = []
        self._last_scan_micros = 0
        # Coordinators the progress log started and that still run (see accord.node.progress).
        self._progress_cids: set[int] = set()
        # Txns learned durable since the last ready(), journaled as one Durable record.
        self._durable_pending: list[TxnId] = []
        # Peers the host's transport could not reach (see peer_reachable).
        self.unreachable: set[int] = set()
        config = self.config
        self.recover_delay = RecoverDelay(
            floor_micros=config.recover_delay_micros,
            floor_other_micros=config.recover_delay_other_micros,
            adaptive=config.recover_delay_adaptive,
            factor=config.recover_delay_latency_factor,
            percentile=config.recover_delay_percentile,
            max_micros=max(config.recover_delay_max_micros, config.recover_delay_micros),
            window=config.recover_delay_window,
        )

    # ------------------------------------------------------------------ clock

    def now(self) -> int:
        return self.clock.now_micros()

    def _mint(self, at_least: Timestamp | None) -> Timestamp:
        hlc = self.hlc.next(self.now(), at_least)
        floor = self.hlc.floor_to_persist()
        if floor is not None:
            self._ready.persist.append(HlcFloor(floor))
        return Timestamp(self.topology.epoch, hlc, 0, self.node_id)

    def new_ballot(self) -> Ballot:
        return self._mint(None)

    # ------------------------------------------------------------------ inputs

    def submit(self, request_id: int, txn: Txn) -> TxnId | None:
        """Coordinate ``txn``; its ClientReply (``txn_id`` names the transaction that
        carried it) appears in a later ``ready().replies``.

        With ``batch_max_parts`` 1 coordination starts here and the TxnId is returned.
        Otherwise ``txn`` waits for the next :meth:`ready`, which coordinates everything
        waiting in batches (:meth:`_form_batches`), and None is returned.
        """
        if txn.parts:
            raise InvalidArgument("submit() takes a client transaction, not a batch")
        self.stats.submitted += 1
        deadline = self.now() + self.config.client_timeout_micros
        if self.config.batch_max_parts == 1:
            return self._coordinate(txn, [_Queued(request_id, txn, deadline)])
        self._queued.append(_Queued(request_id, txn, deadline))
        return None

    def _coordinate(self, txn: Txn, requests: list[_Queued]) -> TxnId:
        minted = self._mint(None)
        txn_id = minted._replace(flags=int(txn.kind))
        home = next((k for k in txn.keys if self.topology.owns(self.node_id, k)), txn.keys[0])
        route = Route(home, txn.keys)
        batched = len(requests) > 1
        self._clients[txn_id] = [
            _ClientRequest(r.request_id, txn_id, r.deadline_micros, i if batched else None)
            for i, r in enumerate(requests)
        ]
        self._client_count += len(requests)
        parts = self.stats.parts_per_batch
        parts[len(requests)] = parts.get(len(requests), 0) + 1
        coordinator = self._new_coordinator(txn_id, txn, route)
        coordinator.start()
        return txn_id

    def _form_batches(self) -> None:
        """Coordinate every waiting submission, greedily in arrival order: each batch starts
        with the oldest still waiting and takes every later one that is disjoint from it so
        far (:func:`~accord.primitives.txn.disjoint`) and keeps it within batch_max_parts and
        batch_max_keys; what does not fit starts the next batch, so none waits behind a
        younger one. Minted here, after every part was submitted: each client transaction is
        linearized at its batch's executeAt (docs/accord.md, "Batches")."""
        queue = self._queued
        config = self.config
        while queue:
            first = queue.popleft()
            taken = [first]
            used = set(first.txn.keys)
            written = set(first.txn.write_keys)
            selections = len(first.txn.selections)
            rest: deque[_Queued] = deque()
            while queue:
                entry = queue.popleft()
                txn = entry.txn
                if (
                    len(taken) < config.batch_max_parts
                    and (self._overlapping_batches or disjoint(txn, used, written))
                    and len(used.union(txn.keys)) <= config.batch_max_keys
                    and selections + len(txn.selections) <= config.batch_max_keys
                ):
                    taken.append(entry)
                    used.update(txn.keys)
                    written.update(txn.write_keys)
                    selections += len(txn.selections)
                else:
                    rest.append(entry)
            queue.extend(rest)
            if len(taken) == 1:
                self._coordinate(first.txn, taken)
            elif self._overlapping_batches:
                self._coordinate(Txn._overlapping_batch(tuple(e.txn for e in taken)), taken)
            else:
                self._coordinate(Txn.batch(tuple(e.txn for e in taken)), taken)

    def recover(self, txn_id: TxnId) -> bool:
        """Start recovering ``txn_id`` now rather than when the progress log would.

        False when this replica does not know the transaction's definition or already
        coordinates it.
        """
        command = self.store.commands.get(txn_id)
        if (
            command is None
            or command.txn is None
            or command.route is None
            or txn_id in self._coordinating
        ):
            return False
        self.stats.recoveries += 1
        coordinator = self._new_coordinator(txn_id, command.txn, command.route, self.new_ballot())
        coordinator.start_recovery()
        return True

    def step(self, envelope: Envelope) -> None:
        """Handle one message addressed to this node."""
        if envelope.dest != self.node_id:
            raise InvalidArgument(f"envelope for {envelope.dest} given to {self.node_id}")
        self._dispatch(envelope.src, envelope.body)
        if self._reorder:
            self._release_reorder_buffer()

    def _dispatch(self, src: int, body: Message) -> None:
        kind = type(body)
        handler = REQUEST_HANDLERS.get(kind)
        if handler is not None:
            if kind is PreAccept and self.config.reorder_buffer_micros > 0:
                self._buffer(src, body)  # type: ignore[arg-type]
            else:
                reply = handler(self, src, body)
                if reply is not None:
                    self._send(src, reply)
        else:
            coordinator = self._coordinators.get(body.cid)
            if coordinator is not None and coordinator.txn_id == body.txn_id:
                coordinator.on_reply(src, body)  # type: ignore[arg-type]

    def tick(self) -> None:
        """Let time-driven work happen: retries, the reorder buffer, the progress log."""
        self._release_reorder_buffer()
        for cid in list(self._coordinators):
            coordinator = self._coordinators.get(cid)
            if coordinator is not None:
                coordinator.on_tick()
        self._purge_done()
        now = self.now()
        if now - self._last_scan_micros >= self.config.progress_scan_micros:
            self._last_scan_micros = now
            scan_progress(self, now)
            if self._asking:
                self._ask_outcomes(now)
            self._expire_clients(now)

    def peer_reachable(self, peer: int, reachable: bool) -> None:
        """What the host's transport learned of ``peer``: a connection to it failed
        (``False``: refused, reset) or works again (``True``).

        The progress log recovers a txn whose original coordinator is unreachable after the
        configured floor (``recover_delay_micros``) rather than the delay learned from
        latencies: that one tracks how slow *live* coordinators are, up to
        ``recover_delay_max_micros`` after a loaded spell, while a coordinator that cannot
        be reached will not finish anything. A wrong report costs only an early recovery,
        which is safe, as any recovery that races a live coordinator is.
        """
        check_argument(peer in self.topology.nodes(), "node %d is not in the topology", peer)
        if peer == self.node_id:
            return
        if reachable:
            self.unreachable.discard(peer)
        else:
            self.unreachable.add(peer)

    def read_done(self, txn_id: TxnId, values: Mapping[Key, Value]) -> None:
        """The data read requested by a ``DataRead`` finished."""
        answer = tuple(sorted(values.items()))
        for reader_node, reader_cid in self.store.read_done(txn_id):
            self._send(reader_node, ReadOk(reader_cid, txn_id, answer))

    def write_done(self, txn_id: TxnId) -> None:
        """The data write requested by a ``DataWrite`` is durable."""
        self.store.write_done(txn_id)
        self._after_applied()

    def _after_applied(self) -> None:
        store = self.store
        if store.to_apply:
            store.settle()
        if store.written:
            for txn_id in store.written:
                command = store.commands[txn_id]
                if command.route is None:
                    continue
                for node in self.topology.replicas_of(command.route.keys):
                    if node != self.node_id:
                        self._send(node, OutcomeDurable(0, txn_id, command.accepted, written=True))
            store.written.clear()
        if store.applied_ids:
            self._sample_latencies(store.applied_ids)
            waiters = self._apply_waiters
            for txn_id in store.applied_ids:
                for src, cid in waiters.pop(txn_id, ()):
                    self._send(src, ApplyOk(cid, txn_id))
            store.applied_ids.clear()

    def _sample_latencies(self, applied: list[TxnId]) -> None:
        now = self.now()
        commands = self.store.commands
        for txn_id in applied:
            command = commands.get(txn_id)
            # An outcome accepted under a ballot was proposed or delivered by a recovery:
            # its latency holds the recover delay itself (a crash), not the load's.
            recovered = command is None or command.accepted != BALLOT_ZERO
            self.recover_delay.applied(txn_id, now, recovered=recovered)

    # ------------------------------------------------------------------ outputs

    def has_ready(self) -> bool:
        """Whether ``ready()`` would return anything: lets a host skip empty rounds."""
        store = self.store
        pending = self._ready
        return bool(
            self._local
            or self._queued
            or self._durable_pending
            or pending.persist  # Ready.is_empty, inline: hosts ask after every input
            or pending.messages
            or pending.replies
            or pending.reads
            or pending.writes
            or store.persisted
            or store.data_reads
            or store.data_writes
            or store.read_replies
            or store.changed
            or store.to_apply
            or store.written
            or store.applied_ids
        )

    def ready(self) -> Ready:
        """Hand the host everything to do since the last batch, and start the next batch.

        Inputs that arrive while the host works on this batch (an asyncio host awaits its
        fsync) accumulate in the next one. The host makes ``persist`` durable, then calls
        :meth:`advance` with this batch, and only then sends, replies and schedules data
        work (see :mod:`accord.api`). One batch is outstanding at a time: calling this again
        before :meth:`advance` is a host bug and raises.
        """
        if self._outstanding is not None:
            fail("ready() called before advance() acknowledged the previous batch as persisted")
        store = self.store
        if self._queued:
            self._form_batches()
        # What follows acts on this batch's own records (local replies, applied outcomes):
        # whatever it sends waits for them to be durable (_drain_local makes the exception).
        self._late_cause = True
        while True:
            if self._local:
                self._drain_local()
            if store.to_apply or store.written or store.applied_ids:
                self._after_applied()
            if store.read_replies:
                for txn_id, reader_node, reader_cid in store.read_replies:
                    command = store.commands[txn_id]
                    done = check_not_none(
                        command.writes, "read reply for %s without writes", txn_id
                    )
                    result = check_not_none(
                        command.result, "read reply for %s without result", txn_id
                    )
                    chosen = command.chosen or command.status is _STATUS_APPLIED
                    self._send(
                        reader_node,
                        ReadRedundant(reader_cid, txn_id, done, result, command.accepted, chosen),
                    )
                store.read_replies.clear()
            if not self._local:
                break
        self._late_cause = False
        ready = self._ready
        early = self._early
        if early:
            self._early = []
            # A timestamp above the durable floor could be minted again after a crash.
            if not any(type(record) is HlcFloor for record in ready.persist):
                ready.early = early
        # The store's pending work moves into the batch (what CommandStore.drain hands out),
        # without new lists for the many rounds that have none.
        if store.persisted:
            ready.persist.extend(store.persisted)
            store.persisted = []
        if self._durable_pending:
            ready.persist.append(Durable(tuple(self._durable_pending)))
            self._durable_pending = []
        if store.data_reads:
            ready.reads.extend(store.data_reads)
            store.data_reads = []
        if store.data_writes:
            ready.writes.extend(store.data_writes)
            store.data_writes = []
        if store.changed:
            self._answer_waiting_clients()
        self._ready = Ready([], [], [], [], [])
        self._outstanding = ready
        return ready

    def _drain_local(self) -> None:
        """Deliver messages this node sent itself. They are handled here, after the input
        that caused them, never re-entrantly inside a coordinator's own broadcast; and all
        they persist still reaches the journal before anything they cause is sent."""
        local = self._local
        while local:
            body = local.popleft()
            # A local reply is a vote or an ack journaled in this very batch: what it causes
            # must not leave before the batch is durable. Read results are values, not
            # votes: the outcome computed from them is a proposal, counted only with the
            # acks that journal it (docs/accord.md, "Requests that need no fsync").
            self._late_cause = type(body) is not ReadOk
            self._dispatch(self.node_id, body)
        self._late_cause = True

    def advance(self, ready: Ready) -> None:
        """Acknowledge that ``ready.persist`` is durable: the host appended it to its journal
        (and the append returned, fsync included). Every host calls this after the append
        and before anything in the batch leaves the process; the next :meth:`ready` is
        refused until it does."""
        if ready is not self._outstanding:
            raise InvalidArgument("advance() must be given the batch of the last ready()")
        self._outstanding = None

    # ------------------------------------------------------------------ requests

    def _send(self, dest: int, body: Message) -> None:
        if dest == self.node_id:
            self._local.append(body)
        else:
            envelope = Envelope(self.node_id, dest, body)
            self._ready.messages.append(envelope)
            if self._early_votes or not (self._late_cause or type(body) not in _REQUEST_KINDS):
                self._early.append(envelope)

    def send(self, dest: int, body: Request) -> None:
        self._send(dest, body)

    def _handle(self, src: int, body: Request) -> None:
        handler = check_not_none(
            REQUEST_HANDLERS.get(type(body)), "no handler for %s", type(body).__name__
        )
        reply = handler(self, src, body)
        if reply is not None:
            self._send(src, reply)

    # ------------------------------------------------------------------ reorder buffer

    def _buffer(self, src: int, body: PreAccept) -> None:
        """Hold PreAccepts until local time passes t0 + delta, then take them in t0 order
        (CEP-15, "A reorder buffer trades waiting for timestamp order")."""
        heapq.heappush(self._reorder, (body.txn_id, src, body.cid, body))
        while len(self._reorder) > self.config.reorder_buffer_max:
            _, oldest_src, _, oldest = heapq.heappop(self._reorder)
            self._handle(oldest_src, oldest)

    def _release_reorder_buffer(self) -> None:
        if not self._reorder:
            return
        horizon = self.now() - self.config.reorder_buffer_micros
        while self._reorder and self._reorder[0][0].hlc <= horizon:
            _, src, _, body = heapq.heappop(self._reorder)
            self._handle(src, body)

    # ------------------------------------------------------------------ coordinators

    def _new_coordinator(
        self, txn_id: TxnId, txn: Txn | None, route: Route | None, ballot: Ballot | None = None
    ) -> TransactionCoordinator:
        # Coordination ids come from the HLC, whose floor is journaled, so a restarted node
        # never reuses one: a late reply to the previous incarnation's coordinator (another
        # txn, or this txn under an older ballot) must never count for a new one.
        cid = self._mint(None).hlc
        coordinator = TransactionCoordinator(
            self, cid, txn_id, txn, route, ballot=ballot or Timestamp(0, 0, 0, 0)
        )
        self._coordinators[cid] = coordinator
        self._coordinating[txn_id] = cid
        return coordinator

    def finished(self, coordinator: TransactionCoordinator, outcome: Outcome) -> None:
        if outcome is Outcome.INVALIDATED:
            self.stats.invalidations += 1
        if outcome is Outcome.RETRY:
            # Recovery waits for these earlier proposals to be decided: let the progress log
            # take them up at its next scan instead of after their own idle delay.
            for txn_id in coordinator.wait_for:
                waited = self.store.commands.get(txn_id)
                if waited is not None and txn_id not in self._coordinating:
                    waited.last_progress_micros = 0
        if coordinator.txn_id not in self._clients:
            return
        if outcome is Outcome.APPLIED:
            self._reply(coordinator.txn_id, "ok", coordinator.result)
        elif outcome is Outcome.INVALIDATED:
            self._reply(coordinator.txn_id, "invalidated", None)
        elif coordinator.txn_id not in self.store.commands:
            # UNKNOWN/RETRY with no replica here: ask (_ask_outcomes) once another
            # coordinator (the recovery that preempted this one) had time to finish.
            self._ask_later(coordinator)
        # Otherwise the client waits for the outcome to reach this replica.

    def on_fast_path(self, fast: bool) -> None:
        if fast:
            self.stats.fast_path += 1
        else:
            self.stats.slow_path += 1

    def _purge_done(self) -> None:
        for cid in [c for c, co in self._coordinators.items() if co.phase is _PHASE_DONE]:
            coordinator = self._coordinators.pop(cid)
            self._progress_cids.discard(cid)
            if self._coordinating.get(coordinator.txn_id) == cid:
                del self._coordinating[coordinator.txn_id]
            if coordinator.outcome is Outcome.RETRY and coordinator.invalidations:
                self._learn(coordinator)

    def _learn(self, coordinator: TransactionCoordinator) -> None:
        """An invalidation attempt found replicas that know the txn: adopt its definition
        so the progress log can run a full recovery."""
        for node in sorted(coordinator.invalidations):
            seen = coordinator.invalidations[node]
            if seen.txn is not None and seen.route is not None:
                self.store.learn(coordinator.txn_id, seen.txn, seen.route)
                return

    # ------------------------------------------------------------------ clients

    def _reply(self, txn_id: TxnId, outcome: str, result: object) -> None:
        """Answer every client request ``txn_id`` carries: each batch part gets its own
        part's result; "invalidated" and "unknown" go to every part alike."""
        requests = self._clients.pop(txn_id)
        for request in requests:
            self._answer(request, outcome, result)

    def _answer(self, request: _ClientRequest, outcome: str, result: object) -> None:
        self._client_count -= 1
        self.stats.by_outcome[outcome] = self.stats.by_outcome.get(outcome, 0) + 1
        answer = result if isinstance(result, TxnResult) else None
        if answer is not None and request.part is not None:
            check_state(
                request.part < len(answer.parts),
                "result of batch %s lacks part %d",
                request.txn_id,
                request.part,
            )
            answer = answer.parts[request.part]
        self._ready.replies.append(ClientReply(request.request_id, request.txn_id, outcome, answer))

    def _answer_waiting_clients(self) -> None:
        changed = self.store.changed
        if not changed:
            return
        self.store.changed = {}
        if not self._clients:
            return
        for txn_id in changed:
            # Even while a coordinator of it runs here: a recovery elsewhere may have outrun
            # it (it is preempted and gives up), and this change may be the only time this
            # replica hears the outcome, which is final either way.
            if txn_id not in self._clients:
                continue
            command = self.store.commands[txn_id]
            if command.status is Status.INVALIDATED:
                self._reply(txn_id, "invalidated", None)
            elif (
                command.status is Status.APPLIED
                or (command.status is Status.PRE_APPLIED and command.chosen)
            ) and command.result is not None:
                # Only a chosen outcome: one merely proposed may yet be replaced.
                self._reply(txn_id, "ok", command.result)

    def _expire_clients(self, now: int) -> None:
        """Answer "unknown" to each request past its own deadline; the other parts of its
        batch keep waiting for theirs."""
        for txn_id in list(self._clients):
            requests = self._clients[txn_id]
            if all(r.deadline_micros > now for r in requests):
                continue
            for request in requests:
                if request.deadline_micros <= now:
                    self._answer(request, "unknown", None)
            waiting = [r for r in requests if r.deadline_micros > now]
            if waiting:
                self._clients[txn_id] = waiting
            else:
                del self._clients[txn_id]

    def _ask_later(self, coordinator: TransactionCoordinator) -> None:
        txn, route = coordinator.txn, coordinator.route
        if txn is None or route is None:
            return
        asking = self._asking.get(coordinator.txn_id)
        if asking is None:
            asking = self._asking[coordinator.txn_id] = _Asking(txn, route, 0)
        delay = min(
            self.recover_delay.home() << min(asking.attempts, 6),
            self.config.recover_backoff_max_micros,
        )
        asking.at_micros = self.now() + delay

    def _ask_outcomes(self, now: int) -> None:
        """Ask the replicas of each txn in ``_asking`` whose client still waits, when its time
        came, for its outcome (CheckStatus: read-only, no ballot, so a coordinator still
        driving the txn is not preempted). A final outcome one of them knows answers the
        client through :meth:`finished`; if none of a quorum of every shard knows one, the
        coordinator recovers the txn (an applied outcome is re-proposed and chosen again,
        an invalidation committed), as any coordinator of it would."""
        for txn_id in list(self._asking):
            asking = self._asking[txn_id]
            if txn_id not in self._clients:
                del self._asking[txn_id]
            elif now >= asking.at_micros and txn_id not in self._coordinating:
                asking.attempts += 1
                asking.at_micros = now + self.config.recover_backoff_max_micros
                coordinator = self._new_coordinator(
                    txn_id, asking.txn, asking.route, self.new_ballot()
                )
                self.stats.status_checks += 1
                coordinator.start_check_status()

    # ------------------------------------------------------------------ introspection

    def coordinator_count(self) -> int:
        return len(self._coordinators)

    def pending_clients(self) -> int:
        """Client requests not yet answered (waiting for a batch or in the protocol)."""
        return self._client_count + len(self._queued)
