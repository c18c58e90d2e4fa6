"""The in-memory journal the simulator and the Maelstrom node share."""

from __future__ import annotations

import random

import pytest

from accord import Node, ring_topology, sim_key
from accord.api import Durable, HlcFloor, JournalRecord
from accord.invariants import InvariantViolation
from accord.local.command import CommandSnapshot
from accord.primitives import Const, Put, Status, Txn, Update
from accord.sim.journal import MemoryJournal
from tests.clocks import ManualClock


def _persisted_batch() -> list[JournalRecord]:
    node = Node(1, ring_topology([1, 2, 3], 3), ManualClock(), random.Random(0))
    txn = Txn(reads=(), update=Update(condition=(), writes=(Put(sim_key("k"), Const(1)),)))
    node.submit(1, txn)
    ready = node.ready()
    node.advance(ready)
    return list(ready.persist)


def test_replay_keeps_the_latest_snapshot_the_highest_floor_and_every_durable_txn() -> None:
    records = _persisted_batch()
    snapshots = [r for r in records if isinstance(r, CommandSnapshot)]
    assert snapshots
    older = snapshots[0]
    journal = MemoryJournal()
    journal.append([HlcFloor(7), older, Durable((older.txn_id,))])
    newer = older._replace(status=Status.ACCEPTED)
    assert newer != older
    journal.append([HlcFloor(5), newer])
    replayed = journal.replay()
    assert replayed[0] == HlcFloor(7)
    assert [r for r in replayed if isinstance(r, CommandSnapshot)] == [newer]
    assert replayed[-1] == Durable((older.txn_id,))
    assert journal.snapshot(older.txn_id) is newer
    assert len(journal) == 1


def test_a_node_rebuilt_from_the_replay_knows_what_was_journaled() -> None:
    node = Node(1, ring_topology([1, 2, 3], 3), ManualClock(), random.Random(0))
    txn = Txn(reads=(), update=Update(condition=(), writes=(Put(sim_key("k"), Const(1)),)))
    txn_id = node.submit(1, txn)
    journal = MemoryJournal()
    ready = node.ready()
    journal.append(ready.persist)
    node.advance(ready)
    restarted = Node(
        1, ring_topology([1, 2, 3], 3), ManualClock(), random.Random(1), journal=journal.replay()
    )
    assert txn_id in restarted.store.commands


def test_nothing_is_appended_after_close() -> None:
    journal = MemoryJournal()
    journal.close()
    with pytest.raises(InvariantViolation, match="closed"):
        journal.append([HlcFloor(1)])
