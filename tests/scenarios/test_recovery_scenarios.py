"""Scripted races: each test stages one interleaving the burn test reaches only by luck.

References: accord.md §5 (recovery), §10 pitfalls 2, 4, 7, 8, 9.
"""

from __future__ import annotations

from accord.messages import (
    Accept,
    AcceptOk,
    Apply,
    BeginRecovery,
    Commit,
    Nack,
    PreAccept,
    PreAcceptOk,
    RecoverOk,
)
from accord.primitives import (
    BALLOT_ZERO,
    EMPTY_DEPS,
    BinOp,
    Const,
    Put,
    ReadOf,
    Status,
    Txn,
    Update,
    sim_key,
)
from accord.sim import Bugs
from tests.scenarios.harness import Net, of_type

A, B = sim_key("a"), sim_key("b")


def append(key_value: int) -> Txn:
    return Txn(
        reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((key_value,)))),))
    )


def test_coordinator_crash_after_fast_quorum_recovers_at_txn_id() -> None:
    # Reference: CEP-15 fast path; Accord Recover.java "propose executeAt = txnId".
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    net.deliver(of_type(PreAcceptOk))  # node 1 decides the fast path and sends Stable...
    net.drop(lambda e: e.src == 1)  # ...which is lost: node 1 crashes
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.settle()
    for node_id in (2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None
        assert snapshot.status is Status.APPLIED
        assert snapshot.execute_at == txn_id
    assert net.data[2][A][1] == (1,)


def test_late_preaccept_after_recovery_promise_is_refused() -> None:
    # Reference: accord.md pitfall 2 — ballot-ZERO PreAccepts are refused after a promise.
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    late = net.take(of_type(PreAccept, dest=3))
    net.deliver(of_type(PreAccept, dest=2))
    net.take(of_type(PreAcceptOk))
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.deliver(of_type(BeginRecovery, dest=3))
    net.inflight.extend(late)
    net.deliver(of_type(PreAccept, dest=3))
    answers = net.take(of_type(Nack, src=3, dest=1))
    assert len(answers) == 1


def _promise_then_restart(bugs: Bugs) -> list[type]:
    net = Net(bugs=bugs)
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    oks = net.take(of_type(PreAcceptOk))
    assert oks
    # Recovery on node 2 makes node 3 promise a higher ballot...
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    net.deliver(of_type(BeginRecovery, dest=3))
    net.take(of_type(RecoverOk))
    # ...node 3 restarts from its journal, then the original coordinator's Accept arrives.
    net.restart(3)
    snapshot = net.snapshot(3, txn_id)
    assert snapshot is not None
    accept = Accept(
        999, txn_id, snapshot.txn, snapshot.route, snapshot.accepted, txn_id, snapshot.deps
    )  # type: ignore[arg-type]
    from accord.messages import Envelope

    net.nodes[3].step(Envelope(1, 3, accept))
    net.flush(3)
    return [type(e.body) for e in net.take(lambda e: e.src == 3 and e.dest == 1)]


def test_promise_survives_restart() -> None:
    # Reference: accord.md pitfall 8 — ballots are durable before the reply that promises them.
    assert _promise_then_restart(Bugs()) == [Nack]


def test_promise_scenario_catches_a_replica_that_forgets() -> None:
    assert _promise_then_restart(Bugs(forget_promise_on_restart=True)) == [AcceptOk]


def _earlier_accepted_without_witness(bugs: Bugs) -> tuple[Status, bool]:
    """E (earlier id) is accepted at node 3 to execute after T, without T in its deps.

    Recovery of T must not propose executeAt = T: E might still commit after T without
    waiting for it. It has to wait for E to commit and retry (accord.md §5, pitfall 4).
    """
    net = Net(bugs=bugs)
    earlier = net.nodes[3].submit(1, append(1))
    net.flush(3)
    net.drop(of_type(PreAccept))
    net.clock.micros += 1_000
    later = net.nodes[1].submit(2, append(2))
    assert earlier < later
    net.flush(1)
    net.deliver(of_type(PreAccept))
    net.take(of_type(PreAcceptOk))
    # The earlier txn is proposed (by its coordinator, node 3) to execute after the later
    # txn, with deps that do not include it.
    store3 = net.nodes[3].store
    earlier_txn = store3.commands[earlier].txn
    assert earlier_txn is not None
    from accord.primitives import EMPTY_DEPS, Route

    execute_at = later._replace(hlc=later.hlc + 1, node=3, flags=0)
    store3.accept(
        earlier,
        earlier_txn,
        Route(A, (A,)),
        store3.commands[earlier].promised,
        execute_at,
        EMPTY_DEPS,
    )
    assert net.nodes[2].recover(later)
    net.flush(2)  # node 2 answers itself at once: one reply of the quorum of two
    net.deliver(of_type(BeginRecovery, dest=3))
    # The quorum is {2, 3}: node 3 is the one that knows the earlier proposal.
    assert net.deliver(of_type(RecoverOk, src=3)) == 1
    proposed = any(isinstance(e.body, Accept) and e.body.txn_id == later for e in net.inflight)
    return net.nodes[2].store.commands[later].status, proposed


def test_recovery_waits_for_earlier_accepted_without_witness() -> None:
    _, proposed = _earlier_accepted_without_witness(Bugs())
    assert not proposed


def test_recovery_scenario_catches_ignoring_earlier_accepted() -> None:
    _, proposed = _earlier_accepted_without_witness(Bugs(recovery_ignores_earlier_accepted=True))
    assert proposed


def test_messages_in_any_order_apply_once() -> None:
    # Reference: accord.md pitfall 9 — Apply before Commit before PreAccept.
    net = Net()
    txn_id = net.nodes[1].submit(1, append(7))
    net.flush(1)
    held: list = []
    for _ in range(20):  # node 3 hears nothing while the others decide (slow path) and apply
        held += net.take(lambda e: e.dest == 3)
        net.settle()
        held += net.take(lambda e: e.dest == 3)
        if net.replies:
            break
        net.tick(250_000)
    assert net.replies and net.replies[0].outcome == "ok"
    late: list = []
    for kind in (Apply, Commit, Accept, PreAccept):
        for envelope in [*late, *held]:
            if isinstance(envelope.body, kind):
                net.nodes[3].step(envelope)
                net.flush(3)
                net.nodes[3].step(envelope)  # and a duplicate
                net.flush(3)
    snapshot = net.snapshot(3, txn_id)
    assert snapshot is not None
    assert snapshot.status is Status.APPLIED
    assert net.data[3][A][1] == (7,)


def test_duplicate_preaccept_gets_the_same_answer() -> None:
    net = Net()
    net.nodes[1].submit(1, append(1))
    net.flush(1)
    (envelope,) = net.take(of_type(PreAccept, dest=2))
    for _ in range(2):
        net.nodes[2].step(envelope)
        net.flush(2)
    first, second = (e.body for e in net.take(of_type(PreAcceptOk, src=2)))
    assert first == second


def test_txn_ids_are_never_reused_after_restart_with_a_clock_behind() -> None:
    # Reference: accord.md §1 — persist a clock floor.
    net = Net()
    issued = [net.nodes[1].submit(i, append(i)) for i in range(5)]
    net.flush(1)
    net.clock.micros -= 500_000  # the clock steps backwards across the restart
    net.restart(1)
    after = net.nodes[1].submit(9, append(9))
    assert after > max(issued)
    assert net.floors(1), "a floor was persisted before the ids were used"


def test_a_stale_preaccept_nack_does_not_abort_the_accept_round() -> None:
    # Recovery issue, bug 2: only a higher ballot preempts a coordinator.
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    late = net.take(of_type(PreAccept, dest=3))
    net.deliver(of_type(PreAccept, dest=2))
    net.deliver(of_type(PreAcceptOk, src=2))
    net.tick(250_000)  # node 3 is silent: the fast path times out, Accept goes out
    net.drop(of_type(PreAccept, dest=3))  # the retry of the PreAccept
    net.deliver(of_type(Accept, dest=3))
    # The first PreAccept reaches node 3 only now: refused (already accepted, no promise).
    net.inflight.extend(late)
    net.deliver(of_type(PreAccept, dest=3))
    nacks = net.take(of_type(Nack, src=3, dest=1))
    assert len(nacks) == 1 and nacks[0].body.promised == BALLOT_ZERO
    net.nodes[1].step(nacks[0])  # the stale Nack arrives before the AcceptOks
    net.flush(1)
    net.settle()
    assert [r.outcome for r in net.replies] == ["ok"]
    for node_id in (1, 2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.APPLIED


def test_a_restarted_node_never_reuses_a_coordination_id() -> None:
    # Found by the burn test's racing profile: coordination ids restarted at 1 after a
    # crash, so a late RecoverOk for another txn (recorded as Applied) reached a new
    # recovery coordinator with the same id, which then persisted that txn's outcome.
    net = Net()
    net.nodes[1].submit(1, append(1))
    net.flush(1)
    before = {e.body.cid for e in net.take(of_type(PreAccept, src=1))}
    net.restart(1)
    net.nodes[1].submit(2, append(2))
    net.flush(1)
    after = {e.body.cid for e in net.take(of_type(PreAccept, src=1))}
    assert before and after and min(after) > max(before)


def test_a_reply_for_another_txn_is_not_counted() -> None:
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    (request,) = net.take(of_type(PreAccept, dest=2))
    net.drop(of_type(PreAccept))
    other = txn_id._replace(hlc=txn_id.hlc - 1)
    from accord.messages import Envelope

    forged = PreAcceptOk(request.body.cid, other, other, EMPTY_DEPS, False)
    net.nodes[1].step(Envelope(2, 1, forged))
    net.nodes[1].step(Envelope(3, 1, forged))
    net.flush(1)
    coordinator = net.nodes[1]._coordinators[request.body.cid]
    assert set(coordinator.preaccepts) == {1}  # only its own replica's answer


def test_a_retried_begin_recovery_journals_nothing_new() -> None:
    # Recovery storms re-sent BeginRecovery under one ballot; each copy journaled the whole
    # command again (journals reached 100-220 MB in a storm test).
    net = Net()
    txn_id = net.nodes[1].submit(1, append(1))
    net.flush(1)
    net.deliver(of_type(PreAccept))
    net.drop(of_type(PreAcceptOk))
    assert net.nodes[2].recover(txn_id)
    net.flush(2)
    (request,) = net.take(of_type(BeginRecovery, dest=3))
    net.inflight.append(request)
    net.deliver(of_type(BeginRecovery, dest=3))
    first = len(net.journals[3])
    for _ in range(3):
        net.nodes[3].step(request)
        net.flush(3)
    assert len(net.journals[3]) == first
    assert len(net.take(of_type(RecoverOk, src=3))) == 4  # every copy is still answered
    snapshot = net.snapshot(3, txn_id)
    assert snapshot is not None and snapshot.promised == request.body.ballot
