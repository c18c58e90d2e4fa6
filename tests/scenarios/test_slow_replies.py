"""Replies that arrive later than a fixed retry window.

Under a burst of 2,000 transfers on 3 keys (``python -m bench overload``) peer delivery
slowed to several seconds, longer than a coordinator lived (8 sends 200 ms apart): every
recovery gave up just before its replies arrived, and the progress log's next attempt met
the same backlog, which its own re-sends had grown. The head of the chain stayed STABLE
on every replica and the keys stayed locked.
"""

from __future__ import annotations

from accord.messages import BeginRecovery, PreAccept, RecoverOk
from accord.primitives import BinOp, Const, Put, ReadOf, Status, Txn, Update, sim_key
from tests.scenarios.harness import Net, of_type

A = sim_key("a")
TICK = 100_000


def append(value: int) -> Txn:
    return Txn(
        reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((value,)))),))
    )


def test_recovery_counts_replies_slower_than_a_fixed_retry_window() -> None:
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    net.drop(lambda _e: True)  # the coordinator dies with every PreAcceptOk unsent
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    held = []
    sends = 0
    # Every BeginRecovery is answered, but the answers take 3 s to come back.
    for _ in range(30):
        sends += len([e for e in net.inflight if isinstance(e.body, BeginRecovery)])
        net.deliver(of_type(BeginRecovery))
        held += net.take(of_type(RecoverOk, dest=2))
        net.tick(TICK)
    for envelope in held:
        net.nodes[2].step(envelope)
        net.flush(2)
    net.settle()
    for node_id in (1, 2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.APPLIED, (node_id, snapshot)
    assert net.data[2][A][1] == (1,)
    # The re-sends back off: 2 peers, not one re-send per peer every 200 ms.
    assert sends <= 2 * 5, sends


def test_the_progress_log_recovers_what_a_stable_txn_waits_for_first() -> None:
    # T has the older txn id but the later executeAt (slow path), so T waits for D. With
    # one progress-log slot, recovering T (the oldest) first would hold the slot for
    # nothing; under the burst, 32 such slots per node were held by waiting txns while the
    # ACCEPTED txns they waited for were never recovered.
    net = Net(recover_delay_micros=1_000_000, max_progress_coordinators=1)
    t = net.nodes[1].submit(1, append(1))
    net.flush(1)
    net.clock.micros += 1_000
    d = net.nodes[3].submit(2, append(2))
    net.flush(3)
    assert t < d
    net.deliver(of_type(PreAccept, src=3))
    net.restart(3)  # D's coordinator dies: D stays PRE_ACCEPTED everywhere
    net.settle()  # T: slow path (it met D), stable everywhere, its reads wait for D
    for node_id in (1, 2, 3):
        node = net.nodes[node_id]
        assert node.store.commands[t].status is Status.STABLE
        assert node.store.commands[t].waiting_on == {d: None}
        assert node.store.commands[d].status is Status.PRE_ACCEPTED
    net.tick(10_000_000)  # T and D are both overdue at nodes 2 and 3
    for node_id in (2, 3):
        node = net.nodes[node_id]
        recovering = {node._coordinators[cid].txn_id for cid in node._progress_cids}
        assert recovering == {d}, (node_id, recovering)
    for _ in range(300):
        net.settle()
        if all(net.snapshot(n, t).status is Status.APPLIED for n in (1, 2, 3)):  # type: ignore[union-attr]
            break
        net.tick(TICK)
    for node_id in (1, 2, 3):
        for txn_id in (t, d):
            snapshot = net.snapshot(node_id, txn_id)
            assert snapshot is not None and snapshot.status is Status.APPLIED, (node_id, snapshot)
    assert net.data[1][A][1] == (2, 1)
