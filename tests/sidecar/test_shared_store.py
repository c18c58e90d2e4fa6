"""Three SidecarHosts over one shared store: the coordinator dies right after journaling its
own Apply, before any other replica hears it.

This is the interleaving behind the double-applied transfer that tests/sidecar's SIGKILL
test once met by chance on Cassandra (the kill must land between the coordinator's write
and the delivery of its Apply, a window of milliseconds). Staged here, over one
MemoryDataStore shared by the three hosts as they share Cassandra, it happens every time:
the correct protocol writes nothing before the outcome is durable, so the recovery reads
the data as it was; the planted early write makes the recovery read the transfer's own
write and apply it twice.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from accord import NodeConfig, Put, ReadOf, Status, Txn, Update, ring_topology, sim_key
from accord.messages import Apply, Envelope, OutcomeDurable
from accord.primitives import BinOp, Const
from accord.testing import Bugs
from accord_cassandra.host import SidecarHost
from accord_cassandra.journal import FileJournal
from accord_cassandra.memory_store import MemoryDataStore

A = sim_key("a")
# A += (7,): re-executed over its own write, it becomes (7, 7).
ADD = Txn(reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((7,)))),)))


def run(tmp_path: Path, bugs: Bugs) -> tuple[object, object, bool]:
    """The shared store's value of A once the survivors applied the transfer, the value
    their recorded outcome writes, and whether anything was written while only the dead
    coordinator held the outcome."""

    async def scenario() -> tuple[object, object, bool]:
        loop = asyncio.get_running_loop()
        topology = ring_topology([1, 2, 3], 3, shards_per_node=1)
        store = MemoryDataStore()
        dead: set[int] = set()
        hosts: dict[int, SidecarHost] = {}

        def send(envelope: Envelope) -> None:
            if envelope.src in dead or envelope.dest in dead:
                return
            if envelope.src == 1 and isinstance(envelope.body, Apply | OutcomeDurable):
                dead.add(1)  # node 1 journaled its own Apply and dies before sending it
                return
            loop.call_soon(hosts[envelope.dest].deliver, envelope)

        config = NodeConfig(
            retry_micros=50_000,
            recover_delay_micros=300_000,
            recover_delay_other_micros=300_000,
            shared_storage=True,
        )
        for node_id in (1, 2, 3):
            hosts[node_id] = SidecarHost(
                node_id,
                topology,
                FileJournal(tmp_path / f"node{node_id}", fsync=False),
                store,
                send=send,
                config=config,
                bugs=bugs,
            )
            hosts[node_id].start()
        submitted = asyncio.create_task(hosts[1].submit(ADD, timeout=60))
        deadline = time.monotonic() + 30
        while 1 not in dead and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert 1 in dead, "the coordinator never sent its Apply"
        await asyncio.sleep(0.3)  # long enough for a write the coordinator issued to land
        early = store.partitions.value(A) is not None
        await hosts[1].stop()
        submitted.cancel()
        txn_id = next(iter(hosts[2].node.store.commands))
        while time.monotonic() < deadline:
            commands = [hosts[n].node.store.commands.get(txn_id) for n in (2, 3)]
            if all(c is not None and c.status is Status.APPLIED for c in commands):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the survivors never applied the transfer")
        for node_id in (2, 3):
            await hosts[node_id].stop()
        outcomes = {hosts[n].node.store.commands[txn_id].writes for n in (2, 3)}
        assert len(outcomes) == 1, outcomes
        (writes,) = outcomes
        assert writes is not None
        return store.partitions.value(A), writes[0].value, early

    return asyncio.run(scenario())


def test_nothing_is_written_before_the_outcome_is_durable(tmp_path: Path) -> None:
    stored, outcome, early = run(tmp_path, Bugs())
    assert not early
    assert stored == outcome == (7,)


def test_the_planted_early_write_applies_the_transfer_twice(tmp_path: Path) -> None:
    # The recovery read the transfer's own write: its outcome adds 7 twice. Written at the
    # same timestamp as the first, which one a store keeps is its tie-break (Cassandra's
    # is by cell content: for a bank transfer, the larger balances, so money appears).
    stored, outcome, early = run(tmp_path, Bugs(write_before_durable=True))
    assert early
    assert stored == (7,) and outcome == (7, 7)


def takeovers(tmp_path: Path, *, silent_writer: bool) -> dict[int, tuple[int, int]]:
    """Per host, (rows it wrote, of those counted as takeover writes) once every host
    applied one transaction coordinated (and so written) by node 1; with
    ``silent_writer``, node 1's word that it wrote never reaches the others."""

    async def scenario() -> dict[int, tuple[int, int]]:
        loop = asyncio.get_running_loop()
        topology = ring_topology([1, 2, 3], 3, shards_per_node=1)
        store = MemoryDataStore()
        hosts: dict[int, SidecarHost] = {}
        config = NodeConfig(
            retry_micros=50_000,
            recover_delay_micros=200_000,
            recover_delay_other_micros=200_000,
            shared_storage=True,
        )

        def send(envelope: Envelope) -> None:
            if silent_writer and envelope.src == 1 and isinstance(envelope.body, OutcomeDurable):
                return
            loop.call_soon(hosts[envelope.dest].deliver, envelope)

        counts: dict[int, int] = {}
        for node_id in (1, 2, 3):
            node_store = CountingStore(store, counts, node_id)
            hosts[node_id] = SidecarHost(
                node_id,
                topology,
                FileJournal(tmp_path / f"t{int(silent_writer)}-{node_id}", fsync=False),
                node_store,  # type: ignore[arg-type]
                send=send,
                config=config,
            )
            hosts[node_id].start()
        await hosts[1].submit(ADD, timeout=60)
        txn_id = next(iter(hosts[1].node.store.commands))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            commands = [hosts[n].node.store.commands.get(txn_id) for n in (1, 2, 3)]
            if all(c is not None and c.status is Status.APPLIED for c in commands):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the hosts never all applied the transaction")
        for host in hosts.values():
            await host.stop()
        return {n: (counts.get(n, 0), hosts[n].metrics.takeover_writes) for n in hosts}

    return asyncio.run(scenario())


class CountingStore:
    """One host's view of the shared store, counting the rows that host wrote."""

    def __init__(self, store: MemoryDataStore, counts: dict[int, int], node_id: int) -> None:
        self.store = store
        self.counts = counts
        self.node_id = node_id
        self.writes_executed = 0

    async def read(self, selections: object, execute_at: object) -> object:
        return await self.store.read(selections, execute_at)  # type: ignore[arg-type]

    async def write(self, writes: tuple[object, ...], execute_at: object) -> None:
        await self.store.write(writes, execute_at)  # type: ignore[arg-type]
        self.counts[self.node_id] = self.counts.get(self.node_id, 0) + len(writes)
        self.writes_executed += len(writes)

    async def close(self) -> None:
        pass


def test_only_the_writer_writes_and_no_write_counts_as_a_takeover(tmp_path: Path) -> None:
    assert takeovers(tmp_path, silent_writer=False) == {1: (1, 0), 2: (0, 0), 3: (0, 0)}


def test_rows_written_for_a_silent_writer_count_as_takeover_writes(tmp_path: Path) -> None:
    counts = takeovers(tmp_path, silent_writer=True)
    assert counts[1] == (1, 0), "the writer's own write is no takeover"
    taken = [n for n in (2, 3) if counts[n][0]]
    assert taken, counts
    for n in (2, 3):
        assert counts[n][0] == counts[n][1], f"node {n}: every row it wrote was a takeover"
