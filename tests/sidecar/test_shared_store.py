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
from accord_cassandra.datastore import MemoryDataStore
from accord_cassandra.host import SidecarHost
from accord_cassandra.journal import FileJournal

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
