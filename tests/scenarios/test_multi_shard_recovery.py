"""Recovery of transactions that span shards: evidence is judged per key.

The review that found bug 1 of the recovery issue staged it exactly like this. Shard A
(key ``ka``) is replicated on nodes 1-5 with all five in the electorate (fast quorum 4);
shard B (key ``kb``) on nodes 6-8. T and TL both append to ``ka`` and ``kb``:

1. T's PreAccept reaches only 1, 2 (of shard A) and 6, 7, 8; its coordinator dies.
2. TL (a later id) commits on the slow path through 3, 4, 5 and 6, 7, 8. Its deps name T
   under ``kb`` only: no replica of shard A ever saw T.
3. Node 7 recovers T with the quorum {1, 2, 3} in shard A. Node 3 holds TL committed
   without T under ``ka`` -- proof that T never took the fast path. A replica that asks
   "is T anywhere in TL's deps?" finds T under ``kb`` and wrongly allows the fast path:
   T commits at its own id, TL (which executes later) never waited for it on ``ka``, and
   T's append to ``ka`` is lost.
"""

from __future__ import annotations

import pytest

from accord.messages import (
    Accept,
    AcceptInvalidate,
    AcceptInvalidateOk,
    BeginRecovery,
    CommitInvalidate,
    Envelope,
    PreAccept,
    RecoverOk,
)
from accord.primitives import (
    TOKEN_MAX,
    TOKEN_MIN,
    BinOp,
    Const,
    Key,
    Put,
    ReadOf,
    Status,
    TokenRange,
    Txn,
    Update,
    sim_key,
)
from accord.sim import Bugs
from accord.topology import Shard, Topology
from tests.scenarios.harness import Net, of_type

SHARD_A = (1, 2, 3, 4, 5)
SHARD_B = (6, 7, 8)


def _key_with_sign(prefix: str, negative: bool) -> Key:
    for i in range(1000):
        key = sim_key(f"{prefix}{i}")
        if (key.token <= 0) == negative:
            return key
    raise AssertionError("no key found")


KA = _key_with_sign("a", negative=True)
KB = _key_with_sign("b", negative=False)


def two_shards() -> Topology:
    return Topology(
        1,
        (
            Shard(TokenRange(TOKEN_MIN, 0), SHARD_A, frozenset(SHARD_A)),
            Shard(TokenRange(0, TOKEN_MAX), SHARD_B, frozenset(SHARD_B)),
        ),
    )


def append_both(value: int) -> Txn:
    return Txn(
        reads=(KA, KB),
        update=Update(
            tuple(Put(key, BinOp("concat", ReadOf(key, ()), Const((value,)))) for key in (KA, KB))
        ),
    )


def _stage(bugs: Bugs) -> tuple[Net, Envelope | None]:
    net = Net(bugs=bugs, topology=two_shards())
    assert net.topology is not None
    assert net.topology.shard_for(KA).replicas == SHARD_A
    assert net.topology.shard_for(KB).replicas == SHARD_B

    # 1. T reaches 1, 2, 6, 7, 8; its coordinator (node 6) dies before hearing back.
    t = net.nodes[6].submit(1, append_both(1))
    net.flush(6)
    net.drop(of_type(PreAccept, dest=3))
    net.drop(of_type(PreAccept, dest=4))
    net.drop(of_type(PreAccept, dest=5))
    net.deliver(of_type(PreAccept))
    net.drop(lambda e: e.dest == 6 and e.src != 6)
    net.restart(6)

    # 2. TL, coordinated by node 3, never reaches 1 and 2: slow path through 3-5 and 6-8.
    net.clock.micros += 1_000
    tl = net.nodes[3].submit(2, append_both(2))
    assert t < tl
    net.flush(3)

    def exchange() -> None:
        for _ in range(20):
            net.drop(lambda e: e.dest in (1, 2))
            if not net.deliver(lambda e: e.body.txn_id == tl):
                return

    exchange()
    net.tick(250_000)  # the silent electorate members 1 and 2 count against the fast path
    exchange()
    committed = net.snapshot(3, tl)
    assert committed is not None and committed.status >= Status.COMMITTED
    assert t in committed.deps.for_key(KB) and t not in committed.deps.for_key(KA)

    # 3. Node 7 recovers T; shard A answers through {1, 2, 3}.
    assert net.nodes[7].recover(t)
    net.flush(7)
    net.drop(of_type(BeginRecovery, dest=4))
    net.drop(of_type(BeginRecovery, dest=5))
    net.deliver(of_type(BeginRecovery))
    from_3 = [e for e in net.inflight if isinstance(e.body, RecoverOk) and e.src == 3]
    net.deliver(of_type(RecoverOk))
    proposal = next(
        (e for e in net.inflight if isinstance(e.body, Accept) and e.body.txn_id == t), None
    )
    # Let everything finish: every message from now on arrives.
    for _ in range(20):
        net.settle()
        net.tick(1_100_000)
        if not net.inflight:
            break
    return net, (from_3[0] if from_3 else None) if proposal is None else proposal


def test_recovery_rejects_the_fast_path_on_the_shared_key() -> None:
    net, evidence = _stage(Bugs())
    assert evidence is not None and isinstance(evidence.body, RecoverOk)
    assert evidence.body.rejects_fast_path
    # T was invalidated (it can never have committed), TL applied, nothing lost.
    for node in (*SHARD_A, *SHARD_B):
        snapshot = net.snapshot(node, evidence.body.txn_id)
        assert snapshot is None or snapshot.status is Status.INVALIDATED, node
    for node in SHARD_A:
        assert net.data[node][KA][1] == (2,)
    for node in SHARD_B:
        assert net.data[node][KB][1] == (2,)


def test_the_any_key_witness_loses_an_append() -> None:
    net, proposal = _stage(Bugs(witness_any_key=True))
    assert proposal is not None and isinstance(proposal.body, Accept)
    t = proposal.body.txn_id
    assert proposal.body.execute_at == t  # recovery proposed the fast-path outcome
    applied = net.snapshot(7, t)
    assert applied is not None and applied.status is Status.APPLIED
    # T is applied at its own id yet its append to ka is gone: TL never waited for it.
    assert 1 in net.data[6][KB][1]
    assert 1 not in net.data[3][KA][1]


def _invalidation_with_lost_commit(net: Net, *, restart: bool) -> tuple[Status, Status]:
    """Node 1 accepts T's invalidation without ever seeing T, then loses CommitInvalidate."""
    t = net.nodes[6].submit(1, append_a(1))  # node 6 coordinates but replicates shard B
    net.flush(6)
    net.deliver(of_type(PreAccept, dest=2))
    net.drop(of_type(PreAccept))
    net.drop(lambda e: e.dest == 6)
    net.restart(6)
    assert net.nodes[2].recover(t)
    net.flush(2)
    net.drop(of_type(BeginRecovery, dest=1))
    net.deliver(of_type(BeginRecovery))
    net.deliver(of_type(RecoverOk))
    net.deliver(of_type(AcceptInvalidate))
    net.deliver(of_type(AcceptInvalidateOk))
    net.drop(of_type(CommitInvalidate, dest=1))
    net.settle()
    stuck = net.nodes[1].store.commands[t]
    assert stuck.txn is None and stuck.status is Status.ACCEPTED_INVALIDATE
    before = stuck.status
    if restart:
        net.restart(1)
    for _ in range(100):  # 25 s: the progress log has many chances to act
        net.tick(250_000)
        net.settle()
    return before, net.nodes[1].store.commands[t].status


def append_a(value: int) -> Txn:
    return Txn(
        reads=(KA,), update=Update((Put(KA, BinOp("concat", ReadOf(KA, ()), Const((value,)))),))
    )


def small_shards() -> Topology:
    return Topology(
        1,
        (
            Shard(TokenRange(TOKEN_MIN, 0), (1, 2, 3), frozenset((1, 2, 3))),
            Shard(TokenRange(0, TOKEN_MAX), (4, 5, 6), frozenset((4, 5, 6))),
        ),
    )


@pytest.mark.parametrize("restart", [False, True], ids=["running", "after-restart"])
def test_a_replica_left_in_accepted_invalidate_learns_the_invalidation(restart: bool) -> None:
    # Recovery issue, bug 3: CommitInvalidate is sent once; the replica that accepted the
    # invalidation without knowing the txn must still reach a decision by itself, also
    # after a restart (the key it learned with the proposal is journaled).
    net = Net(topology=small_shards(), recover_delay_micros=1_000_000)
    before, after = _invalidation_with_lost_commit(net, restart=restart)
    assert before is Status.ACCEPTED_INVALIDATE
    assert after is Status.INVALIDATED
