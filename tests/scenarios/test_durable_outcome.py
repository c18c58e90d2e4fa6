"""A transaction's writes reach the data store only once its outcome is durable.

The sidecars share one copy of the data (Cassandra). If a replica wrote a transaction's
writes as soon as it journaled the outcome, and its coordinator died before the Apply
reached a quorum, a recovery coordinator would find no outcome, re-execute, and read the
transaction's own writes: a transfer applied twice. These scenarios stage exactly that,
over a store every replica shares (docs/accord.md, "Writes wait for a durable outcome").
"""

from __future__ import annotations

from typing import Any

from accord.local.commands import NO_BUGS, Bugs
from accord.messages import Apply, ApplyOk, PreAccept, PreAcceptOk
from accord.primitives import (
    BALLOT_ZERO,
    BinOp,
    Const,
    Put,
    ReadOf,
    Status,
    Txn,
    TxnId,
    Update,
    sim_key,
)
from tests.scenarios.harness import Net, of_type

A = sim_key("a")


def add(amount: int) -> Txn:
    """``A = A + amount`` (A starts absent, read as 0 through concat of an empty list)."""
    return Txn(
        reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((amount,)))),))
    )


def shared_net(bugs: Bugs = NO_BUGS, **options: Any) -> Net:
    net = Net(bugs=bugs, **options)
    shared = net.data[1]
    for node_id in net.nodes:
        net.data[node_id] = shared
    return net


def _coordinator_dies_after_journaling(net: Net) -> None:
    txn_id = net.nodes[1].submit(1, add(7))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    # Node 1 takes the fast path, reads from itself, computes the writes and journals the
    # outcome through its own Apply; the Commits and Applies to the others are in flight.
    net.deliver(of_type(PreAcceptOk))
    journaled = [
        r
        for r in net.journals[1]
        if getattr(r, "txn_id", None) == txn_id and getattr(r, "status", None) is Status.PRE_APPLIED
    ]
    assert journaled, "the coordinator's replica should hold the outcome"
    net.coordinator_txn = txn_id  # type: ignore[attr-defined]


def test_no_write_before_a_quorum_journaled_the_outcome() -> None:
    from accord.messages import OutcomeDurable

    net = shared_net()
    _coordinator_dies_after_journaling(net)
    # One replica of three journaled the outcome: nothing may be visible yet.
    assert A not in net.data[1]
    assert not net.inflight or all(e.src == 1 for e in net.inflight)
    # Node 2 journals it too: a quorum (2 of 3) holds it, and only now may anyone write.
    net.deliver(of_type(Apply, dest=2))
    assert A not in net.data[1]
    net.deliver(of_type(ApplyOk, dest=1))
    # Node 3 has not journaled it yet: it hears the outcome is chosen after its own ack.
    assert net.take(of_type(OutcomeDurable, dest=3)) == []
    net.deliver(of_type(OutcomeDurable))
    assert net.data[1][A][1] == (7,)


def _crash_then_recover(net: Net) -> None:
    _coordinator_dies_after_journaling(net)
    txn_id = net.coordinator_txn  # type: ignore[attr-defined]
    # Node 1 dies: whatever it sent is lost, and it hears nothing until it restarts.
    net.drop(lambda e: e.src == 1 or e.dest == 1)
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    for _ in range(100):
        net.drop(lambda e: e.dest == 1)
        if not net.deliver(lambda e: e.dest != 1):
            break
    net.restart(1)
    net.settle()
    # Node 2's coordinator re-sends the chosen outcome to the restarted node 1, which
    # replaces the outcome it journaled (the same here: nothing was written before).
    for _ in range(5):
        net.tick(1_000_000)
        net.settle()


def test_recovery_after_the_coordinator_died_applies_the_transfer_once() -> None:
    net = shared_net()
    _crash_then_recover(net)
    txn_id = net.coordinator_txn  # type: ignore[attr-defined]
    # Every replica records one outcome, and the shared store holds the amount once.
    outcomes = {net.nodes[n].store.commands[txn_id].writes for n in net.nodes}
    assert len(outcomes) == 1, outcomes
    assert net.data[1][A][1] == (7,)
    for node_id in net.nodes:
        assert net.nodes[node_id].store.commands[txn_id].status is Status.APPLIED


def test_planted_write_before_durable_is_a_double_apply() -> None:
    # The planted variant writes at once: recovery re-executes over its own write and the
    # replicas disagree on the transfer's outcome (on Cassandra, one of them wins a tie).
    net = shared_net(Bugs(write_before_durable=True))
    _coordinator_dies_after_journaling(net)
    assert net.data[1][A][1] == (7,)  # visible with one journal holding the outcome
    txn_id = net.coordinator_txn  # type: ignore[attr-defined]
    net.drop(lambda e: e.src == 1 or e.dest == 1)
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    for _ in range(100):
        net.drop(lambda e: e.dest == 1)
        if not net.deliver(lambda e: e.dest != 1):
            break
    recovered = net.nodes[2].store.commands[txn_id].writes
    original = net.nodes[1].store.commands[txn_id].writes
    assert recovered != original


# ---------------------------------------------------------------------------- one writer


def test_shared_storage_writes_each_row_once() -> None:
    # Every replica shares the store, so one of them writes (the coordinator's own) and
    # the others apply once it says it did: one store write per row, not one per replica.
    net = shared_net(shared_storage=True)
    txn_ids = [net.nodes[n].submit(n, add(n)) for n in (1, 2, 3)]
    for node_id in net.nodes:
        net.flush(node_id)
    net.settle()
    for _ in range(3):
        net.tick(300_000)
        net.settle()
    assert sum(net.writes_done.values()) == 3
    assert {n for n, count in net.writes_done.items() if count} == {1, 2, 3}
    for txn_id in txn_ids:
        for node_id in net.nodes:
            assert net.nodes[node_id].store.commands[txn_id].status is Status.APPLIED
    assert sorted(net.data[1][A][1]) == [1, 2, 3]


def test_a_silent_writer_is_taken_over() -> None:
    # The coordinator, the designated writer, never finishes its write: after the progress
    # log's delay the others write the chosen outcome themselves (idempotent by executeAt).
    net = shared_net(shared_storage=True, hold_writes={1}, recover_delay_micros=1_000_000)
    txn_id = net.nodes[1].submit(1, add(5))
    net.flush(1)
    net.settle()
    assert A not in net.data[1]
    for node_id in (2, 3):
        command = net.nodes[node_id].store.commands[txn_id]
        assert command.status is Status.PRE_APPLIED and command.chosen
    for _ in range(10):
        net.tick(1_000_000)
        net.settle()
    assert net.data[1][A][1] == (5,)
    for node_id in (2, 3):
        assert net.nodes[node_id].store.commands[txn_id].status is Status.APPLIED


def test_the_replica_that_recovers_a_dead_writers_txn_writes_it_without_a_takeover_delay() -> None:
    # Node 1, coordinator and so writer, dies once its PreAccepts reached the others. A
    # replica's progress log recovers the txn after the recover delay (1 s) and the outcome
    # is chosen, but the writer is still node 1: before, the others applied it only after
    # the takeover delay (here 100 s; in the sidecars 3-10 s, and every later txn on the
    # key waited behind it: 12-26 s without an answer after one SIGKILL). The recovering
    # replica now writes it itself, idempotent like any takeover.
    net = shared_net(
        shared_storage=True,
        recover_delay_micros=1_000_000,
        recover_delay_other_micros=100_000_000,
        recover_delay_adaptive=False,
    )
    txn_id = net.nodes[1].submit(1, add(5))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    dead = net.nodes.pop(1)
    for _ in range(5):
        net.drop(lambda e: e.src == 1 or e.dest == 1)
        net.tick(1_000_000)
        net.drop(lambda e: e.dest == 1)
        for _ in range(100):
            net.drop(lambda e: e.dest == 1)
            if not net.deliver(lambda e: e.dest != 1):
                break
    assert dead.store.commands[txn_id].status is not Status.APPLIED
    cell = net.data[2].get(A)
    assert cell is not None and cell[1] == (5,), "the chosen outcome was not written within 5 s"
    for node_id in (2, 3):
        assert net.nodes[node_id].store.commands[txn_id].status is Status.APPLIED
    # Each replica that recovered it wrote once (here both started a recovery).
    assert set(net.writes_done) <= {2, 3} and set(net.writes_done.values()) == {1}


def test_recovery_re_proposes_a_journaled_outcome_and_fences_the_old_one() -> None:
    # Node 1 journaled the outcome; its Applies to 2 and 3 are late. A recovery that hears
    # from node 1 adopts that outcome under its own ballot (no second execution), and the
    # original coordinator's late Apply is refused where the recovery was promised.
    from accord.messages import BeginRecovery, Nack

    net = shared_net()
    _coordinator_dies_after_journaling(net)
    txn_id = net.coordinator_txn  # type: ignore[attr-defined]
    late = net.take(of_type(Apply, src=1))
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.deliver(of_type(BeginRecovery))
    net.settle()
    # The only read of the txn was the original coordinator's own.
    assert [n for n, t in net.reads_done if t == txn_id] == [1]
    for node_id in net.nodes:
        command = net.nodes[node_id].store.commands[txn_id]
        assert command.status is Status.APPLIED
        assert command.accepted > BALLOT_ZERO  # re-proposed under the recovery's ballot
    assert net.data[1][A][1] == (7,)
    net.inflight.extend(e for e in late if e.dest == 3)
    net.deliver(of_type(Apply, dest=3))
    # Already applied there: acknowledged, nothing changes.
    assert not net.take(of_type(Nack, src=3))
    assert net.data[1][A][1] == (7,)


def test_a_proposal_under_a_lower_ballot_is_refused_after_a_promise() -> None:
    from accord.messages import BeginRecovery, Nack

    net = shared_net()
    _coordinator_dies_after_journaling(net)
    txn_id = net.coordinator_txn  # type: ignore[attr-defined]
    late = net.take(of_type(Apply, src=1, dest=3))
    net.drop(lambda e: e.src == 1 or e.dest == 1)
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.deliver(of_type(BeginRecovery, dest=3))  # node 3 promises the recovery's ballot
    net.inflight.extend(late)
    net.deliver(of_type(Apply, src=1, dest=3))
    assert len(net.take(of_type(Nack, src=3, dest=1))) == 1
    assert net.nodes[3].store.commands[txn_id].status is not Status.PRE_APPLIED


def _stale_execution_after_the_write(bugs: Bugs = NO_BUGS) -> tuple[Net, TxnId]:
    from accord import ring_topology
    from accord.messages import Commit

    net = shared_net(bugs, shared_storage=True, topology=ring_topology([1, 2, 3, 4], 3))
    assert net.topology is not None
    replicas = net.topology.shard_for(A).replicas
    assert 3 not in replicas  # node 3 coordinates and reads from a replica
    txn_id = net.nodes[3].submit(1, add(7))
    net.flush(3)
    net.deliver(lambda e: e.dest != 3)  # PreAccepts
    net.deliver(lambda e: e.dest == 3)  # the fast quorum: Commits out, one asking to read
    (held,) = net.take(lambda e: isinstance(e.body, Commit) and e.body.read)
    reader = held.dest
    net.deliver(of_type(Commit))
    # Another replica recovers while the reader hears nothing: the outcome (7,) is chosen
    # by the other two and written.
    recoverer = next(n for n in replicas if n != reader)
    assert net.nodes[recoverer].recover(txn_id)
    net.flush(recoverer)
    for _ in range(100):
        if not net.deliver(lambda e: e.dest not in (reader, 3)):
            break
    assert net.data[1][A][1] == (7,)
    # The original read reaches the reader now: it reads (7,), its own write, and the
    # coordinator proposes (7, 7) under ballot zero.
    net.inflight.append(held)
    for _ in range(100):
        if not net.deliver(lambda e: e.src == 3 or e.dest == 3):
            break
    return net, txn_id


def test_a_stale_execution_after_the_write_is_not_chosen() -> None:
    """A coordinator whose read comes after another's chosen outcome was written reads the
    txn's own write: its second outcome must be refused by the replicas that applied the
    first, not counted as chosen (seen in the shared-storage burn as duplicate elements)."""
    net, txn_id = _stale_execution_after_the_write()
    assert net.topology is not None
    replicas = net.topology.shard_for(A).replicas
    # Refused by the two that applied (7,): the client is not told it read its own write.
    assert all(r.outcome != "ok" for r in net.replies), net.replies
    net.settle()
    for _ in range(10):
        net.tick(1_000_000)
        net.settle()
    outcomes = {net.nodes[n].store.commands[txn_id].writes for n in replicas}
    assert len(outcomes) == 1, outcomes
    for node_id in replicas:
        assert net.nodes[node_id].store.commands[txn_id].status is Status.APPLIED
    assert net.data[1][A][1] == (7,)


def test_planted_applied_acks_any_proposal_chooses_a_second_outcome() -> None:
    net, txn_id = _stale_execution_after_the_write(Bugs(applied_acks_any_proposal=True))
    (reply,) = net.replies
    assert reply.txn_id == txn_id and reply.outcome == "ok" and reply.result is not None
    assert reply.result.read(A) == (7,)  # the client read its own write


def test_a_late_replica_hears_the_outcome_is_chosen_after_its_ack() -> None:
    """A replica that had not journaled the proposal when a quorum had gets no second full
    Apply: its own ack brings an OutcomeDurable, and it writes then."""
    from accord.messages import OutcomeDurable

    net = Net()
    net.nodes[1].submit(1, add(7))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    net.deliver(of_type(PreAcceptOk))
    net.deliver(of_type(Apply, dest=2))
    net.deliver(of_type(ApplyOk, dest=1))  # nodes 1 and 2 journaled it: chosen
    assert [e.body.chosen for e in net.inflight if isinstance(e.body, Apply) and e.dest == 3] == [
        False
    ]
    assert A not in net.data[3]
    net.deliver(lambda e: e.dest == 3)  # the proposal: journaled, not yet written
    assert A not in net.data[3]
    assert net.take(of_type(OutcomeDurable, dest=3)) == []
    net.deliver(of_type(ApplyOk, dest=1))
    assert net.deliver(of_type(OutcomeDurable, dest=3)) == 1
    assert net.data[3][A][1] == (7,)
