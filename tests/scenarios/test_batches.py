"""Group commit: client transactions coordinated as one Accord transaction (a batch).

Each client keeps its own reply, result and deadline; a batch recovered by another replica
answers every part; conflicting submissions never share a batch."""

from __future__ import annotations

import pytest

from accord.invariants import InvalidArgument
from accord.messages import Apply, PreAccept
from accord.primitives import BinOp, Const, Put, ReadOf, Status, Txn, Update, sim_key
from tests.scenarios.harness import Net, of_type

A, B, C = sim_key("a"), sim_key("b"), sim_key("c")
TICK = 100_000


def append(key: object, value: int) -> Txn:
    return Txn(
        reads=(key,),  # type: ignore[arg-type]
        update=Update((Put(key, BinOp("concat", ReadOf(key, ()), Const((value,)))),)),  # type: ignore[arg-type]
    )


def _preaccepted(net: Net) -> list[Txn]:
    return [e.body.txn for e in net.inflight if isinstance(e.body, PreAccept) and e.dest == 2]


def test_disjoint_submissions_share_one_coordination_and_keep_their_own_results() -> None:
    net = Net(batch_max_parts=8)
    node = net.nodes[1]
    assert node.submit(1, append(A, 1)) is None
    node.submit(2, append(B, 2))
    node.submit(3, Txn(reads=(C,)))
    assert node.pending_clients() == 3
    net.flush(1)
    (batch,) = _preaccepted(net)
    assert len(batch.parts) == 3 and batch.keys == tuple(sorted((A, B, C)))
    net.settle()
    replies = {r.request_id: r for r in net.replies}
    assert set(replies) == {1, 2, 3}
    assert {r.outcome for r in replies.values()} == {"ok"}
    assert len({r.txn_id for r in replies.values()}) == 1
    assert replies[1].result is not None and replies[1].result.reads == ((A, None),)
    assert replies[2].result is not None and replies[2].result.reads == ((B, None),)
    assert replies[3].result is not None and replies[3].result.reads == ((C, None),)
    for node_id in (1, 2, 3):
        assert net.data[node_id][A][1] == (1,) and net.data[node_id][B][1] == (2,)
    assert node.stats.parts_per_batch == {3: 1}
    assert node.pending_clients() == 0


def test_conflicting_submissions_go_to_separate_transactions_oldest_first() -> None:
    net = Net(batch_max_parts=8)
    node = net.nodes[1]
    node.submit(1, append(A, 1))
    node.submit(2, append(A, 2))  # writes A, which part 1 writes
    node.submit(3, Txn(reads=(A,)))  # reads A, which part 1 writes
    node.submit(4, append(B, 4))
    net.flush(1)
    preaccepted = _preaccepted(net)
    assert [len(t.parts) or 1 for t in preaccepted] == [2, 1, 1]
    assert preaccepted[0].parts[1].keys == (B,)
    net.settle()
    replies = {r.request_id: r for r in net.replies}
    assert {r.outcome for r in replies.values()} == {"ok"}
    assert len({replies[n].txn_id for n in (1, 2, 3)}) == 3
    assert net.data[1][A][1] == (1, 2)
    read = replies[3].result
    assert read is not None and read.reads[0][1] in ((1,), (1, 2))


def test_batch_max_parts_bounds_a_batch() -> None:
    net = Net(batch_max_parts=2)
    node = net.nodes[1]
    for n, key in enumerate((A, B, C)):
        node.submit(n, append(key, n))
    net.flush(1)
    assert [len(t.parts) or 1 for t in _preaccepted(net)] == [2, 1]
    with pytest.raises(InvalidArgument, match="batch"):
        node.submit(9, Txn.batch((append(A, 1), append(B, 2))))


def test_a_recovered_batch_answers_every_part() -> None:
    net = Net(batch_max_parts=8)
    node = net.nodes[1]
    node.submit(1, append(A, 1))
    node.submit(2, append(B, 2))
    net.flush(1)
    (batch,) = _preaccepted(net)
    txn_id = next(e.body.txn_id for e in net.inflight if isinstance(e.body, PreAccept))
    net.deliver(of_type(PreAccept))
    net.drop(lambda e: e.dest == 1)  # the coordinator hears nothing back
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.settle()
    for node_id in (1, 2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.APPLIED
        assert snapshot.txn == batch
    # The coordinator's own attempt was outrun and gives up; the recovered outcome reached
    # its replica meanwhile, and each part is answered from it with its own result.
    for _ in range(200):
        if len(net.replies) == 2:
            break
        net.tick(TICK)
        net.settle()
    replies = {r.request_id: r for r in net.replies}
    assert {n: (r.txn_id, r.outcome) for n, r in replies.items()} == {
        1: (txn_id, "ok"),
        2: (txn_id, "ok"),
    }
    assert replies[1].result is not None and replies[1].result.reads == ((A, None),)
    assert replies[2].result is not None and replies[2].result.reads == ((B, None),)


def test_each_part_keeps_its_own_deadline() -> None:
    net = Net(batch_max_parts=8)
    node = net.nodes[1]
    timeout = node.config.client_timeout_micros
    start = net.clock.micros
    node.submit(1, append(A, 1))
    net.clock.micros += timeout // 2
    node.submit(2, append(B, 2))
    net.flush(1)
    net.drop(lambda _e: True)  # nothing ever completes
    while net.clock.micros <= start + timeout:
        net.tick(TICK)
        net.drop(lambda _e: True)
    assert [(r.request_id, r.outcome) for r in net.replies] == [(1, "unknown")]
    while net.clock.micros <= start + timeout + timeout // 2:
        net.tick(TICK)
        net.drop(lambda _e: True)
    assert [(r.request_id, r.outcome) for r in net.replies] == [(1, "unknown"), (2, "unknown")]
    assert node.pending_clients() == 0


def test_a_restarted_replica_replays_a_batch_from_its_journal() -> None:
    net = Net(batch_max_parts=8)
    net.nodes[1].submit(1, append(A, 1))
    net.nodes[1].submit(2, append(B, 2))
    net.flush(1)
    txn_id = next(e.body.txn_id for e in net.inflight if isinstance(e.body, PreAccept))
    net.deliver(of_type(PreAccept))
    net.restart(2)
    snapshot = net.snapshot(2, txn_id)
    assert snapshot is not None and len(snapshot.txn.parts) == 2  # type: ignore[union-attr]
    net.settle()
    assert any(isinstance(e.body, Apply) for e in net.inflight) or all(
        net.snapshot(n, txn_id).status is Status.APPLIED  # type: ignore[union-attr]
        for n in (1, 2, 3)
    )
