"""A hand-driven cluster for scripted protocol scenarios (after etcd raft's interaction
tests): nothing moves unless the test delivers it, so races can be staged exactly."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from accord import Node, NodeConfig, ring_topology
from accord.api import ClientReply, HlcFloor, JournalRecord
from accord.local.command import CommandSnapshot
from accord.messages import Envelope, Message
from accord.primitives import Key, Timestamp, TxnId, Value
from accord.sim import NO_BUGS, Bugs
from accord.topology import Topology
from tests.clocks import ManualClock


@dataclass
class Net:
    """Nodes 1..n over one shard (or over ``topology``); in-flight messages wait in
    ``inflight`` until delivered."""

    size: int = 3
    bugs: Bugs = NO_BUGS
    topology: Topology | None = None
    # The progress log stays quiet unless a test wants it (recovery then starts by itself).
    recover_delay_micros: int = 10**12
    # Other shards' replicas (and a takeover of a silent writer) wait this; None: the same.
    recover_delay_other_micros: int | None = None
    recover_delay_adaptive: bool = NodeConfig().recover_delay_adaptive
    max_progress_coordinators: int = NodeConfig().max_progress_coordinators
    shared_storage: bool = False
    batch_max_parts: int = 1
    # Nodes whose data writes never finish (a writer that died mid-write), and how many
    # data writes each node's store executed.
    hold_writes: set[int] = field(default_factory=set)
    writes_done: dict[int, int] = field(default_factory=dict)
    # (node, txn) of every data read a node's store served.
    reads_done: list[tuple[int, TxnId]] = field(default_factory=list)
    clock: ManualClock = field(default_factory=ManualClock)
    nodes: dict[int, Node] = field(default_factory=dict)
    journals: dict[int, list[JournalRecord]] = field(default_factory=dict)
    data: dict[int, dict[Key, tuple[Timestamp, Value]]] = field(default_factory=dict)
    inflight: list[Envelope] = field(default_factory=list)
    # Every message any node sent, delivered or not, in order.
    sent: list[Envelope] = field(default_factory=list)
    replies: list[ClientReply] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.topology is None:
            self.topology = ring_topology(list(range(1, self.size + 1)), self.size)
        for node_id in self.topology.nodes():
            self.journals[node_id] = []
            self.data[node_id] = {}
            self.start(node_id)

    def start(self, node_id: int) -> None:
        config = NodeConfig(
            recover_delay_micros=self.recover_delay_micros,
            recover_delay_other_micros=(
                self.recover_delay_micros
                if self.recover_delay_other_micros is None
                else self.recover_delay_other_micros
            ),
            recover_delay_adaptive=self.recover_delay_adaptive,
            max_progress_coordinators=self.max_progress_coordinators,
            shared_storage=self.shared_storage,
            batch_max_parts=self.batch_max_parts,
        )
        assert self.topology is not None
        self.nodes[node_id] = Node(
            node_id,
            self.topology,
            self.clock,
            random.Random(node_id),
            config=config,
            bugs=self.bugs,
            journal=list(self.journals[node_id]),
        )
        self.flush(node_id)

    def restart(self, node_id: int) -> None:
        """Crash (losing nothing journaled, and every message in flight to it) and restart."""
        self.inflight = [e for e in self.inflight if e.dest != node_id]
        self.start(node_id)

    def flush(self, node_id: int) -> None:
        node = self.nodes[node_id]
        while node.has_ready():
            ready = node.ready()
            self.journals[node_id].extend(ready.persist)
            node.advance(ready)
            self.inflight.extend(ready.messages)
            self.sent.extend(ready.messages)
            self.replies.extend(ready.replies)
            # What the data work below sends belongs to the next batch.
            for read in ready.reads:
                self.reads_done.append((node_id, read.txn_id))
                cells = self.data[node_id]
                node.read_done(
                    read.txn_id, {k: cells[k][1] if k in cells else None for k in read.keys}
                )
            for write in ready.writes:
                if node_id in self.hold_writes:
                    continue
                self.writes_done[node_id] = self.writes_done.get(node_id, 0) + len(write.writes)
                cells = self.data[node_id]
                for op in write.writes:
                    if op.key not in cells or cells[op.key][0] < write.execute_at:
                        cells[op.key] = (write.execute_at, None if op.delete else op.value)
                node.write_done(write.txn_id)

    def take(self, match: Callable[[Envelope], bool]) -> list[Envelope]:
        taken = [e for e in self.inflight if match(e)]
        self.inflight = [e for e in self.inflight if not match(e)]
        return taken

    def deliver(self, match: Callable[[Envelope], bool] = lambda _e: True) -> int:
        count = 0
        for envelope in self.take(match):
            self.nodes[envelope.dest].step(envelope)
            self.flush(envelope.dest)
            count += 1
        return count

    def drop(self, match: Callable[[Envelope], bool]) -> int:
        return len(self.take(match))

    def settle(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.deliver():
                return
        raise AssertionError("messages kept flowing")

    def tick(self, micros: int) -> None:
        self.clock.micros += micros
        for node_id, node in self.nodes.items():
            node.tick()
            self.flush(node_id)

    def snapshot(self, node_id: int, txn_id: TxnId) -> CommandSnapshot | None:
        command = self.nodes[node_id].store.commands.get(txn_id)
        return None if command is None else command.snapshot()

    def floors(self, node_id: int) -> list[int]:
        return [r.value for r in self.journals[node_id] if isinstance(r, HlcFloor)]


def of_type(
    kind: type, *, src: int | None = None, dest: int | None = None
) -> Callable[[Envelope], bool]:
    def match(envelope: Envelope) -> bool:
        return (
            isinstance(envelope.body, kind)
            and (src is None or envelope.src == src)
            and (dest is None or envelope.dest == dest)
        )

    return match


def body(envelope: Envelope) -> Message:
    return envelope.body
