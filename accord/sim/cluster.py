"""A deterministic discrete-event cluster of sans-IO nodes.

Everything runs on one virtual timeline in microseconds, driven by a heap of events
ordered by ``(time, sequence)``. All randomness comes from one seeded ``random.Random``,
so a seed reproduces a run exactly; :attr:`Cluster.digest` summarises the trace so two
runs of one seed can be compared (reconcile mode).

Faults: per-link latency with occasional long delays (which reorder messages), drops,
duplicates, symmetric and asymmetric partitions, crash and restart from the journal
(state not yet handed to the journal is lost; the data store, standing in for Cassandra,
survives), coordinators that crash half-way through sending their PreAccepts (so a
transaction is known to only some replicas of some shards, the start of every recovery
race), slow links (some directed links take 150-600 ms for a while: replies that arrive
after a coordinator has decided without them, the race that recovery evidence must
survive), and per-node clock offset and drift.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accord.api import ClientReply, Clock, DataStore, Ready
from accord.invariants import check_not_none
from accord.local.command import CommandSnapshot
from accord.local.effects import DataRead, DataWrite
from accord.messages import (
    REPLY_TYPES,
    REQUEST_TYPES,
    Apply,
    ApplyOk,
    Envelope,
    PreAccept,
    RecoverOk,
)
from accord.node import Node, NodeConfig, NodeStats
from accord.primitives import (
    TIMESTAMP_MIN,
    Key,
    MemoryPartitions,
    RowAt,
    Status,
    TxnId,
    Value,
)
from accord.sim import NO_BUGS, Bugs
from accord.sim.journal import MemoryJournal
from accord.sim.oracle import Oracle
from accord.topology import Topology

TICK_MICROS = 10_000
# With batching on, how long a submission may wait for others to join its batch at most
# (NodeConfig.batch_max_parts); a sidecar waits for its journal fsync meanwhile.
BATCH_WINDOW_MICROS = 10_000
_TYPE_CODES = {
    t: i for i, t in enumerate(sorted((*REQUEST_TYPES, *REPLY_TYPES), key=lambda t: t.__name__))
}
_EVENT_CODES = {"crash": 1, "restart": 2, "partition": 3, "slow": 4}
DATA_OP_MICROS = 50


FAULT_NAMES: tuple[str, ...] = (
    "drops",
    "duplicates",
    "partitions",
    "crashes",
    "skew",
    "coordinator_crashes",
    "slow_links",
)
# Faults "all" leaves out, so the seeds of "all" keep their trajectories.
OPT_IN_FAULT_NAMES: tuple[str, ...] = ("early_crashes", "detector")
# How long a node's transport takes to find a crashed or cut-off peer unreachable.
DETECT_MICROS = 5_000


@dataclass(frozen=True, slots=True)
class Faults:
    drops: bool = False
    duplicates: bool = False
    partitions: bool = False
    crashes: bool = False
    skew: bool = False
    coordinator_crashes: bool = False
    slow_links: bool = False
    # A node crashes after sending some of a batch's early requests (Ready.early), before
    # the batch reached its journal. Opt-in: not part of "all", whose seeds keep their
    # trajectories.
    early_crashes: bool = False
    # Not a fault but a failure detector, as the sidecars' transport is one: nodes are told
    # (Node.peer_reachable) when a peer crashed or their link to it is cut, and when it is
    # back. Partitioned peers are alive, so their txns are recovered early while their
    # coordinators still drive them: more recoveries racing live coordinators. Opt-in.
    detector: bool = False

    @staticmethod
    def parse(spec: str) -> Faults:
        names = set(FAULT_NAMES) | set(OPT_IN_FAULT_NAMES)
        if spec == "none":
            return Faults()
        if spec == "all":
            return Faults(**dict.fromkeys(FAULT_NAMES, True))
        chosen = {part.strip() for part in spec.split(",") if part.strip()}
        if "all" in chosen:  # "all,early_crashes": every fault plus opt-in ones
            chosen = (chosen - {"all"}) | set(FAULT_NAMES)
        unknown = sorted(chosen - names)
        if unknown:
            raise ValueError(
                f"unknown fault(s) {', '.join(unknown)}; "
                f"choose from {', '.join(sorted(names))}, all, none"
            )
        return Faults(**dict.fromkeys(chosen, True))

    def any(self) -> bool:
        return any(getattr(self, name) for name in (*FAULT_NAMES, *OPT_IN_FAULT_NAMES))


class SimClock:
    """A node's physical clock: global virtual time with a fixed offset and a drift."""

    __slots__ = ("cluster", "drift_ppm", "offset_micros")

    def __init__(self, cluster: Cluster, offset_micros: int, drift_ppm: int) -> None:
        self.cluster = cluster
        self.offset_micros = offset_micros
        self.drift_ppm = drift_ppm

    def now_micros(self) -> int:
        now = self.cluster.now
        return now + self.offset_micros + now * self.drift_ppm // 1_000_000


# The simulator's host parts satisfy the accord.api Protocols (checked by mypy).
_CLOCK: type[Clock] = SimClock


class SimDataStore(MemoryPartitions):
    """Last-write-wins by executeAt, like Cassandra with ``USING TIMESTAMP``; survives crashes.

    Partitions of rows with TTLs and tombstones (:class:`accord.primitives.MemoryPartitions`);
    the workloads use only each key's row at ``()``.
    """

    __slots__ = ()


if TYPE_CHECKING:  # the simulator's store is an accord.api.DataStore (checked by mypy)
    _SIM_STORE: DataStore = SimDataStore()


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    # Messages sent by body type (the type object: one dict update per message).
    sent_by_type: dict[type, int] = field(default_factory=dict)
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0


@dataclass(slots=True)
class _NodeSlot:
    node: Node | None
    clock: SimClock
    journal: MemoryJournal = field(default_factory=MemoryJournal)
    incarnation: int = 0
    data_busy_until: int = 0
    crashes: int = 0
    # Submissions the host has not handed to the node yet (batching on; see submit).
    held: list[tuple[int, Any]] = field(default_factory=list)


ReplyHandler = Callable[[int, ClientReply], None]


def _add_batches(into: NodeStats, stats: NodeStats) -> None:
    for parts, count in stats.parts_per_batch.items():
        into.parts_per_batch[parts] = into.parts_per_batch.get(parts, 0) + count


class Cluster:
    """Nodes, the network between them, and the fault schedule."""

    def __init__(
        self,
        topology: Topology,
        seed: int,
        *,
        faults: Faults = Faults(),
        config: NodeConfig | None = None,
        bugs: Bugs = NO_BUGS,
        on_reply: ReplyHandler | None = None,
        max_down: int = 1,
        coordinator_crash_chance: float = 0.03,
        long_delay_chance: float = 0.02,
        down_micros: tuple[int, int] = (100_000, 2_000_000),
        shared_store: bool = False,
        batch_window_micros: int = BATCH_WINDOW_MICROS,
    ) -> None:
        self.topology = topology
        # Crashes of any kind keep at most this many nodes down at once.
        self.max_down = max_down
        self.coordinator_crash_chance = coordinator_crash_chance
        self.long_delay_chance = long_delay_chance
        self.down_micros = down_micros
        self.seed = seed
        self.batch_window_micros = max(1, batch_window_micros)
        self.rng = random.Random(seed)
        self.faults = faults
        self.config = config or NodeConfig()
        self.bugs = bugs
        self.on_reply = on_reply
        self.now = 0
        self._seq = 0
        self._queue: list[tuple[int, int, str, Any]] = []
        self.network = NetworkStats()
        self.blocked: set[tuple[int, int]] = set()
        self.slow: set[tuple[int, int]] = set()
        self.stores: dict[int, SimDataStore] = {}
        self.slots: dict[int, _NodeSlot] = {}
        self._trace = 0
        self.faults_active = faults.any()
        self.retired = NodeStats()
        self.oracle = Oracle(topology, self._applied_everywhere)
        # (replica, coordinator, cid, txn) of the Apply being delivered, if the oracle says
        # the replica must refuse it (Oracle.must_refuse): an ApplyOk answering it fails.
        self._must_refuse: set[tuple[int, int, int, TxnId]] = set()
        # One store for every replica, as the sidecars share Cassandra (pair it with
        # NodeConfig.shared_storage, or every replica writes it).
        shared = SimDataStore() if shared_store else None
        for node_id in topology.nodes():
            offset, drift = 0, 0
            if faults.skew:
                offset = self.rng.randrange(-50_000, 50_001)
                drift = self.rng.randrange(-200, 201)
            clock = SimClock(self, offset, drift)
            self.slots[node_id] = _NodeSlot(None, clock)
            self.stores[node_id] = shared or SimDataStore()
            self._start(node_id)
            self._schedule(self.rng.randrange(TICK_MICROS), "tick", (node_id, 0))

    # ------------------------------------------------------------------ events

    def _schedule(self, delay: int, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, kind, payload))

    def schedule_call(self, delay: int, callback: Callable[[], None]) -> None:
        self._schedule(delay, "call", callback)

    def run_until(self, stop: Callable[[], bool], *, deadline_micros: int) -> bool:
        """Process events until ``stop()`` holds (True) or time passes the deadline (False)."""
        queue = self._queue
        heappop = heapq.heappop
        slots = self.slots
        network = self.network
        flush = self._flush
        codes = _TYPE_CODES
        while queue:
            if stop():
                return True
            if queue[0][0] > deadline_micros:
                break
            time, _, kind, payload = heappop(queue)
            self.now = time
            if kind != "deliver":
                self._dispatch(kind, payload)
                continue
            envelope: Envelope = payload
            # Most events are deliveries: _deliver inline, one call fewer per message.
            src, dest = envelope.src, envelope.dest
            if self.blocked and (src, dest) in self.blocked:
                network.dropped += 1
                continue
            node = slots[dest].node
            if node is None:
                network.dropped += 1
                continue
            network.delivered += 1
            body = envelope.body
            self._trace = hash((self._trace, time, src, dest, codes[type(body)], body.txn_id))
            if type(body) is Apply and self.oracle.must_refuse(node.store, body):
                self._must_refuse.add((dest, src, body.cid, body.txn_id))
            node.step(envelope)
            flush(dest)
            if self._must_refuse:
                self._must_refuse.clear()
        return stop()

    def _dispatch(self, kind: str, payload: Any) -> None:
        if kind == "deliver":
            self._deliver(payload)
        elif kind == "tick":
            node_id, incarnation = payload
            slot = self.slots[node_id]
            if slot.node is not None and slot.incarnation == incarnation:
                slot.node.tick()
                self._flush(node_id)
                self._schedule(TICK_MICROS, "tick", payload)
        elif kind == "flush":
            node_id, incarnation = payload
            slot = self.slots[node_id]
            if slot.node is not None and slot.incarnation == incarnation:
                held, slot.held = slot.held, []
                for request_id, txn in held:
                    slot.node.submit(request_id, txn)
                self._flush(node_id)
        elif kind == "data":
            self._data_done(*payload)
        elif kind == "call":
            payload()
        elif kind == "restart":
            self.restart(payload)
        elif kind == "heal":
            self.blocked.discard(payload)
        elif kind == "speed-up":
            self.slow.discard(payload)
        elif kind == "reach":
            observer, peer, reachable = payload
            node = self.slots[observer].node
            if node is not None:
                node.peer_reachable(peer, reachable)

    # ------------------------------------------------------------------ node lifecycle

    def _start(self, node_id: int) -> None:
        slot = self.slots[node_id]
        records = slot.journal.replay()
        node_rng = random.Random(self.seed * 1_000_003 + node_id * 7919 + slot.incarnation)
        slot.node = Node(
            node_id,
            self.topology,
            slot.clock,
            node_rng,
            config=self.config,
            bugs=self.bugs,
            journal=records,
        )
        if self.faults.detector:
            for peer, other in self.slots.items():
                if peer != node_id and other.node is None:
                    slot.node.peer_reachable(peer, False)
            for source, dest in self.blocked:
                if source == node_id:
                    slot.node.peer_reachable(dest, False)
        self._flush(node_id)

    def _retire(self, stats: NodeStats) -> None:
        retired = self.retired
        retired.submitted += stats.submitted
        retired.fast_path += stats.fast_path
        retired.slow_path += stats.slow_path
        retired.recoveries += stats.recoveries
        retired.invalidations += stats.invalidations
        _add_batches(retired, stats)

    def total_stats(self) -> NodeStats:
        """Counters summed over every node and every incarnation of it."""
        total = NodeStats()
        for stats in [
            self.retired,
            *(s.node.stats for s in self.slots.values() if s.node is not None),
        ]:
            total.submitted += stats.submitted
            total.fast_path += stats.fast_path
            total.slow_path += stats.slow_path
            total.recoveries += stats.recoveries
            total.invalidations += stats.invalidations
            _add_batches(total, stats)
        return total

    def node(self, node_id: int) -> Node | None:
        return self.slots[node_id].node

    def live_nodes(self) -> list[int]:
        return [n for n, s in self.slots.items() if s.node is not None]

    def crash(self, node_id: int, *, down_micros: int) -> None:
        """Lose everything not yet in the journal; come back after ``down_micros``."""
        slot = self.slots[node_id]
        if slot.node is None:
            return
        self._retire(slot.node.stats)
        slot.node = None
        slot.incarnation += 1
        slot.held = []
        slot.crashes += 1
        self._note("crash", node_id)
        self._schedule(down_micros, "restart", node_id)
        self._tell_reach(node_id, False)

    def restart(self, node_id: int) -> None:
        slot = self.slots[node_id]
        if slot.node is not None:
            return
        self._note("restart", node_id)
        self._start(node_id)
        self._tell_reach(node_id, True)
        self._schedule(self.rng.randrange(TICK_MICROS), "tick", (node_id, slot.incarnation))

    # ------------------------------------------------------------------ clients

    def submit(self, node_id: int, request_id: int, txn: Any) -> bool:
        node = self.slots[node_id].node
        if node is None:
            return False
        if self.config.batch_max_parts == 1:
            node.submit(request_id, txn)
            self._flush(node_id)
            return True
        # A sidecar takes submissions while it awaits its journal fsync and the node
        # coordinates them together at its next ready(). Here the host holds them for up to
        # batch_window_micros, then submits them all and flushes: enough arrive together
        # for the burn test to see batches. A crash meanwhile loses them unsubmitted.
        slot = self.slots[node_id]
        if not slot.held:
            self._schedule(
                self.rng.randrange(self.batch_window_micros), "flush", (node_id, slot.incarnation)
            )
        slot.held.append((request_id, txn))
        return True

    # ------------------------------------------------------------------ the shell loop

    def _flush(self, node_id: int) -> None:
        slot = self.slots[node_id]
        node = slot.node
        if node is None or not node.has_ready():
            return
        ready = node.ready()
        if ready.early and self.faults_active and self._crash_before_journal(node_id, ready):
            return
        persist = ready.persist
        if persist:
            slot.journal.append(persist)
            on_persist = self.oracle.on_persist
            for record in persist:
                if type(record) is CommandSnapshot:
                    on_persist(node_id, record)
        node.advance(ready)
        if self.faults_active:
            if self._crash_mid_preaccept(node_id, ready):
                return
            for envelope in ready.messages:
                if type(envelope.body) is RecoverOk:
                    self.oracle.on_recover_ok(node_id, node.store, envelope.body)
                elif self._must_refuse and type(envelope.body) is ApplyOk:
                    self._check_refused(envelope)
                self._send(envelope)
        elif ready.messages:
            self._send_fault_free(node_id, node, ready.messages)
        if ready.replies and self.on_reply is not None:
            for reply in ready.replies:
                self.on_reply(node_id, reply)
        if ready.writes:
            for write in ready.writes:
                txn = check_not_none(
                    node.store.commands[write.txn_id].txn,
                    "write of %s without its txn",
                    write.txn_id,
                )
                self.oracle.on_write_issued(node_id, write, txn.keys)
        if ready.reads or ready.writes:
            for op in (*ready.reads, *ready.writes):
                start = max(self.now, slot.data_busy_until) + DATA_OP_MICROS
                slot.data_busy_until = start
                self._schedule(start - self.now, "data", (node_id, slot.incarnation, op))

    def _check_refused(self, envelope: Envelope) -> None:
        body = envelope.body
        if (envelope.src, envelope.dest, body.cid, body.txn_id) in self._must_refuse:
            self.oracle.on_vote_for_another_outcome(envelope.src, body.txn_id)

    def _send_fault_free(self, node_id: int, node: Node, messages: list[Envelope]) -> None:
        """:meth:`_send` of every message with no faults active: the same random draws and
        the same events in the same order, without a call per message."""
        queue = self._queue
        heappush = heapq.heappush
        slow = self.slow
        rng = self.rng
        roll = rng.random
        getrandbits = rng.getrandbits
        now = self.now
        seq = self._seq
        self.network.sent += len(messages)
        by_type = self.network.sent_by_type
        for envelope in messages:
            body = envelope.body
            kind = type(body)
            by_type[kind] = by_type.get(kind, 0) + 1
            if type(body) is RecoverOk:
                self.oracle.on_recover_ok(node_id, node.store, body)
            elif self._must_refuse and type(body) is ApplyOk:
                self._check_refused(envelope)
            src, dest = envelope.src, envelope.dest
            if src == dest:
                delay = 0
            elif slow and (src, dest) in slow:
                delay = rng.randrange(150_000, 600_000)
            else:
                roll()  # _latency's long-delay roll, drawn even when it cannot apply
                r = getrandbits(13)
                while r >= 4_500:
                    r = getrandbits(13)
                delay = 500 + r
            seq += 1
            heappush(queue, (now + delay, seq, "deliver", envelope))
        self._seq = seq

    def _crash_before_journal(self, node_id: int, ready: Ready) -> bool:
        """Maybe crash ``node_id`` after it sent some of ``ready``'s early requests, before
        anything of ``ready`` reached its journal: what a host that sends them during the
        fsync risks (accord.api, Ready.early)."""
        if not self.faults.early_crashes or self.rng.random() >= self.coordinator_crash_chance:
            return False
        if len(self.slots) - len(self.live_nodes()) >= self.max_down:
            return False
        early = ready.early
        for envelope in self.rng.sample(early, self.rng.randrange(len(early) + 1)):
            self._send(envelope)
        self.crash(node_id, down_micros=self.rng.randrange(*self.down_micros))
        return True

    def _crash_mid_preaccept(self, node_id: int, ready: Ready) -> bool:
        """Maybe crash ``node_id`` after it sent only some of the PreAccepts in ``ready``.

        What it journaled survives and its own replica already pre-accepted (a node
        answers itself without the network); everything else in ``ready`` is lost.
        """
        if not (self.faults_active and self.faults.coordinator_crashes):
            return False
        preaccepts = [e for e in ready.messages if isinstance(e.body, PreAccept)]
        if not preaccepts or self.rng.random() >= self.coordinator_crash_chance:
            return False
        if len(self.slots) - len(self.live_nodes()) >= self.max_down:
            return False
        kept = self.rng.sample(preaccepts, self.rng.randrange(len(preaccepts)))
        for envelope in kept:
            self._send(envelope)
        self.crash(node_id, down_micros=self.rng.randrange(*self.down_micros))
        return True

    def _persist(self, node_id: int, slot: _NodeSlot, ready: Ready) -> None:
        if not ready.persist:
            return
        slot.journal.append(ready.persist)
        on_persist = self.oracle.on_persist
        for record in ready.persist:
            if type(record) is CommandSnapshot:
                on_persist(node_id, record)

    def _data_done(self, node_id: int, incarnation: int, op: DataRead | DataWrite) -> None:
        slot = self.slots[node_id]
        store = self.stores[node_id]
        if isinstance(op, DataWrite):
            # The write reaches the store even if the node crashed meanwhile: it was issued.
            self.oracle.on_data(node_id, op)
            store.write(op.writes, op.execute_at)
        if slot.node is None or slot.incarnation != incarnation:
            return
        if isinstance(op, DataRead):
            self.oracle.on_data(node_id, op)
            selections = op.selections or tuple(RowAt(k) for k in op.keys)
            slot.node.read_done(op.txn_id, store.read(selections, op.execute_at))
        else:
            slot.node.write_done(op.txn_id)
        self._flush(node_id)

    def _applied_everywhere(self, txn_id: TxnId, key: Key) -> bool:
        for node_id in self.topology.shard_for(key).replicas:
            slot = self.slots[node_id]
            if slot.node is not None:
                command = slot.node.store.commands.get(txn_id)
                status = None if command is None else command.status
            else:
                snapshot = slot.journal.snapshot(txn_id)
                status = None if snapshot is None else snapshot.status
            if status is not Status.APPLIED:
                return False
        return True

    # ------------------------------------------------------------------ network

    def _latency(self, link: tuple[int, int]) -> int:
        if link in self.slow:
            return self.rng.randrange(150_000, 600_000)
        roll = self.rng.random()
        if self.faults_active and roll < self.long_delay_chance:
            return self.rng.randrange(20_000, 400_000)
        # randrange(500, 5_000) as random.Random computes it (the same draws, so a seed
        # still reproduces its trace), without its argument checks: once per message.
        getrandbits = self.rng.getrandbits
        r = getrandbits(13)
        while r >= 4_500:
            r = getrandbits(13)
        return 500 + r

    def _send(self, envelope: Envelope) -> None:
        self.network.sent += 1
        by_type = self.network.sent_by_type
        kind = type(envelope.body)
        by_type[kind] = by_type.get(kind, 0) + 1
        src, dest = envelope.src, envelope.dest
        if src == dest:
            self._schedule(0, "deliver", envelope)
            return
        link = (src, dest)
        if self.faults_active:
            if self.faults.drops and self.rng.random() < 0.02:
                self.network.dropped += 1
                return
            if self.faults.duplicates and self.rng.random() < 0.01:
                self.network.duplicated += 1
                self._schedule(self._latency(link), "deliver", envelope)
        self._seq += 1
        heapq.heappush(
            self._queue, (self.now + self._latency(link), self._seq, "deliver", envelope)
        )

    def _deliver(self, envelope: Envelope) -> None:
        if self.blocked and (envelope.src, envelope.dest) in self.blocked:
            self.network.dropped += 1
            return
        slot = self.slots[envelope.dest]
        if slot.node is None:
            self.network.dropped += 1
            return
        self.network.delivered += 1
        body = envelope.body
        # Tuples of ints hash the same in every process (only str/bytes hashing is salted),
        # so this rolling hash is a cheap, reproducible trace digest.
        self._trace = hash(
            (
                self._trace,
                self.now,
                envelope.src,
                envelope.dest,
                _TYPE_CODES[type(body)],
                body.txn_id,
            )
        )
        if type(body) is Apply and self.oracle.must_refuse(slot.node.store, body):
            self._must_refuse.add((envelope.dest, envelope.src, body.cid, body.txn_id))
        slot.node.step(envelope)
        self._flush(envelope.dest)
        if self._must_refuse:
            self._must_refuse.clear()

    def _tell_reach(self, peer: int, reachable: bool) -> None:
        """With the detector on: every other node hears soon that ``peer`` went or came."""
        if not self.faults.detector:
            return
        for observer in sorted(self.slots):
            if observer != peer:
                self._schedule(DETECT_MICROS, "reach", (observer, peer, reachable))

    def partition(self, blocked: set[tuple[int, int]], *, heal_after_micros: int) -> None:
        for link in sorted(blocked):
            self.blocked.add(link)
            self._schedule(heal_after_micros, "heal", link)
            if self.faults.detector:
                self._schedule(DETECT_MICROS, "reach", (*link, False))
                self._schedule(heal_after_micros + DETECT_MICROS, "reach", (*link, True))
        self._note("partition", len(blocked))

    def slow_down(self, links: set[tuple[int, int]], *, for_micros: int) -> None:
        for link in sorted(links):
            self.slow.add(link)
            self._schedule(for_micros, "speed-up", link)
        self._note("slow", len(links))

    def heal(self) -> None:
        self.blocked.clear()
        self.slow.clear()
        self.faults_active = False
        for node_id in sorted(self.slots):
            self.restart(node_id)
        if self.faults.detector:
            for _, slot in sorted(self.slots.items()):
                if slot.node is not None:
                    for peer in sorted(slot.node.unreachable):
                        slot.node.peer_reachable(peer, True)

    def _note(self, what: str, detail: int) -> None:
        self._trace = hash((self._trace, self.now, _EVENT_CODES[what], detail))

    @property
    def digest(self) -> str:
        return f"{self._trace & 0xFFFFFFFFFFFFFFFF:016x}"

    # ------------------------------------------------------------------ convergence

    def unfinished(self) -> list[tuple[int, TxnId, Status]]:
        """Commands that some live replica knows and has not finished (Applied/Invalidated)."""
        stuck = []
        for node_id in sorted(self.slots):
            node = self.slots[node_id].node
            if node is None:
                continue
            for command in node.store.active():
                if (
                    command.txn is None
                    and command.status is Status.NOT_DEFINED
                    and not node.store.is_blocking(command.txn_id)
                ):
                    # Only a promise or a stale reference: no replica work depends on it.
                    continue
                stuck.append((node_id, command.txn_id, command.status))
        return stuck

    def undurable(self) -> list[tuple[int, TxnId]]:
        """Txns that a live home-shard replica applied and has not yet learned every replica
        applied (``InformDurable``): its progress log re-sends their Apply until it does. A
        replica the Apply never reached may not know the txn at all, so :meth:`unfinished`
        does not see it; until these are gone, replicas' data may legitimately differ."""
        pending: list[tuple[int, TxnId]] = []
        for node_id in sorted(self.slots):
            node = self.slots[node_id].node
            if node is not None:
                pending.extend((node_id, c.txn_id) for c in node.store.undurable())
        return sorted(pending)

    def divergent_keys(self) -> list[Key]:
        """Keys whose replicas hold different values (meaningful once nothing is
        :meth:`unfinished` or :meth:`undurable`)."""
        bad = []
        keys: set[Key] = set()
        for store in self.stores.values():
            keys.update(store.keys())
        for key in sorted(keys):
            replicas = self.topology.shard_for(key).replicas
            seen = {repr(self.stores[n].state(key)) for n in replicas}
            if len(seen) > 1:
                bad.append(key)
        return bad

    def preload(self, values: Mapping[Key, Value]) -> None:
        """Initial data, present on every replica before any transaction."""
        for key, value in values.items():
            for node_id in self.topology.shard_for(key).replicas:
                self.stores[node_id].preload(key, value, TIMESTAMP_MIN)
