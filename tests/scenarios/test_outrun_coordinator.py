"""A coordinator outrun by a recovery: its own attempt is preempted, yet its client hears the
outcome the recovery chose, not "unknown": from its replica, which the outcome reaches, or,
on a node that is no replica of the txn, by asking the replicas (CheckStatus, read-only),
recovering it itself only when none of them knows a final outcome."""

from __future__ import annotations

from accord import ring_topology
from accord.api import ClientReply
from accord.messages import BeginRecovery, CheckStatus, CheckStatusOk, Nack, PreAccept
from accord.primitives import BinOp, Const, Put, ReadOf, Status, Txn, TxnId, Update, sim_key
from tests.scenarios.harness import Net, of_type

A = sim_key("a")
TICK = 100_000


def append(value: int) -> Txn:
    return Txn(
        reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((value,)))),))
    )


def _outrun(
    *, clock_step: int, net: Net | None = None, coordinator: int = 1, recoverer: int = 2
) -> tuple[Net, TxnId, ClientReply, int]:
    """The recoverer appends 1; ``clock_step`` later the coordinator submits an append whose
    PreAccept reaches the other replicas but whose answers are lost. The recoverer recovers
    it and the outcome reaches every replica (the coordinator too, if it is one) while the
    coordinator's own attempt still waits; its re-sent PreAccepts are refused (a higher
    ballot was promised) and it gives up. Returns the net, the txn, its client's reply and
    the time left before the client's deadline."""
    net = net or Net()
    node = net.nodes[coordinator]
    net.nodes[recoverer].submit(9, append(1))
    net.flush(recoverer)
    net.settle()
    assert [(r.request_id, r.outcome) for r in net.replies] == [(9, "ok")]
    net.clock.micros += clock_step
    deadline = net.clock.micros + node.config.client_timeout_micros
    txn_id = node.submit(1, append(2))
    assert txn_id is not None
    net.flush(coordinator)
    net.deliver(of_type(PreAccept))
    net.drop(lambda e: e.dest == coordinator)  # the coordinator hears nothing back
    assert net.nodes[recoverer].recover(txn_id)
    net.flush(recoverer)
    net.settle()
    while len(net.replies) < 2 and net.clock.micros < deadline:
        net.tick(TICK)
        net.settle()
    assert len(net.replies) == 2 and node.pending_clients() == 0
    return net, txn_id, net.replies[-1], deadline - net.clock.micros


def test_a_client_whose_coordinator_a_recovery_outran_hears_the_recovered_result() -> None:
    """Before, the outcome reached node 1 while its coordinator ran, nothing looked again
    once it gave up, and the client was answered "unknown" at its deadline although the
    append had applied."""
    net, txn_id, reply, left = _outrun(clock_step=1_000)
    for node_id in (1, 2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.APPLIED
    assert (reply.request_id, reply.txn_id, reply.outcome) == (1, txn_id, "ok"), reply
    assert reply.result is not None and reply.result.reads == ((A, (1,)),)
    assert net.data[1][A][1] == (1, 2)
    assert left > net.nodes[1].config.client_timeout_micros // 2


def test_a_client_whose_coordinator_a_recovery_outran_hears_the_invalidation() -> None:
    """Submitted at the same instant as the earlier append, the txn's id is below that
    append's executeAt, so the recovery finds the fast path rejected and invalidates it:
    a definite failure for the client (it never executes), not "unknown"."""
    net, txn_id, reply, left = _outrun(clock_step=0)
    for node_id in (1, 2, 3):
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.INVALIDATED
    assert (reply.request_id, reply.txn_id, reply.outcome) == (1, txn_id, "invalidated")
    assert net.data[1][A][1] == (1,)
    assert left > net.nodes[1].config.client_timeout_micros // 2


def test_a_coordinator_that_is_no_replica_asks_for_the_recovered_result() -> None:
    """Node 3 coordinates an append to a key of the shard (4, 1, 2): the recovery's outcome
    never reaches it, so once its attempt gave up it asks the replicas, learns the applied
    outcome and answers "ok" with its result. Before, its client was answered "unknown" at
    the deadline."""
    topology = ring_topology([1, 2, 3, 4], 3)
    replicas = topology.shard_for(A).replicas
    assert 3 not in replicas and 1 in replicas
    net = Net(topology=topology, recover_delay_micros=500_000)
    net, txn_id, reply, left = _outrun(clock_step=1_000, net=net, coordinator=3, recoverer=1)
    assert net.snapshot(3, txn_id) is None
    for node_id in replicas:
        snapshot = net.snapshot(node_id, txn_id)
        assert snapshot is not None and snapshot.status is Status.APPLIED
    assert (reply.request_id, reply.txn_id, reply.outcome) == (1, txn_id, "ok"), reply
    assert reply.result is not None and reply.result.reads == ((A, (1,)),)
    assert net.data[1][A][1] == (1, 2)
    assert left > net.nodes[3].config.client_timeout_micros // 2


def test_a_coordinator_that_is_no_replica_learns_the_outcome_without_a_ballot() -> None:
    """As above, but what node 3 sent: it asked the replicas (CheckStatus, which promises no
    ballot), a replica that applied the append answered with its result, and node 3 never
    began a recovery of its own. Before, it asked by recovering the txn, whose ballot
    preempts any coordinator still driving it (the recoverer here, had it been slower)."""
    topology = ring_topology([1, 2, 3, 4], 3)
    net = Net(topology=topology, recover_delay_micros=500_000)
    net, txn_id, reply, _ = _outrun(clock_step=1_000, net=net, coordinator=3, recoverer=1)
    assert (reply.request_id, reply.txn_id, reply.outcome) == (1, txn_id, "ok"), reply
    from_3 = [e for e in net.sent if e.src == 3 and getattr(e.body, "txn_id", None) == txn_id]
    asked = [e for e in from_3 if isinstance(e.body, CheckStatus)]
    assert {e.dest for e in asked} == set(topology.shard_for(A).replicas)
    assert not [e for e in from_3 if isinstance(e.body, BeginRecovery)]
    answers = [e.body for e in net.sent if e.dest == 3 and isinstance(e.body, CheckStatusOk)]
    assert any(a.txn_id == txn_id and a.result is not None for a in answers)
    stats = net.nodes[3].stats
    assert (stats.status_checks, stats.recoveries) == (1, 0)


def test_a_coordinator_that_is_no_replica_recovers_when_no_replica_knows_the_outcome() -> None:
    """Node 3's append reaches the replicas' PreAccept and nothing more; node 1 begins a
    recovery that reaches no other replica (they hear nothing from each other), so nothing
    decides the append, but its promise makes node 3's re-sent PreAccept be refused and node
    3 gives up. It asks, a quorum answers without a final outcome, and only then does it
    begin a recovery of its own, which, with the network back, commits the append and
    answers its client "ok"."""
    topology = ring_topology([1, 2, 3, 4], 3)
    replicas = set(topology.shard_for(A).replicas)
    net = Net(topology=topology, recover_delay_micros=500_000)
    node = net.nodes[3]
    deadline = net.clock.micros + node.config.client_timeout_micros
    txn_id = node.submit(1, append(2))
    assert txn_id is not None
    net.flush(3)
    net.deliver(of_type(PreAccept))
    net.drop(lambda e: e.dest == 3)
    assert net.nodes[1].recover(txn_id)
    net.flush(1)

    def sent_by_3() -> list[type]:
        return [type(e.body) for e in net.sent if e.src == 3 and e.body.txn_id == txn_id]

    while BeginRecovery not in sent_by_3() and net.clock.micros < deadline:
        net.drop(lambda e: e.src in replicas and e.dest in replicas and e.src != e.dest)
        net.drop(lambda e: e.dest == 3 and not isinstance(e.body, (CheckStatusOk, Nack)))
        net.deliver()
        net.tick(TICK)
    kinds = sent_by_3()
    assert CheckStatus in kinds and BeginRecovery in kinds, kinds
    assert kinds.index(CheckStatus) < kinds.index(BeginRecovery), kinds
    answers = [e.body for e in net.sent if e.dest == 3 and isinstance(e.body, CheckStatusOk)]
    assert answers and all(a.result is None for a in answers)
    while not net.replies and net.clock.micros < deadline:
        net.settle()
        net.tick(TICK)
    assert [(r.request_id, r.txn_id, r.outcome) for r in net.replies] == [(1, txn_id, "ok")]
