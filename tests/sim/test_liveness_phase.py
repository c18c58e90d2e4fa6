"""The burn test's liveness phase ends only once replicas may be compared.

A txn can be applied by a quorum of its replicas while another replica was cut off, and its
coordinator can crash before any Apply reached that replica. The replica then does not know
the txn at all, so nothing is unfinished anywhere (Cluster.unfinished), yet its data lacks
the txn's writes until a home-shard replica's progress log re-sends the Apply (the replica's
undurable list, after the home delay). Ending the liveness phase in that window reported a
divergence between replicas that the protocol repairs by itself: seed 6 of
``python -m accord.sim --nodes 5 --rf 3 --txns 400 --seeds 1 --seed-start 6 --faults all,detector``
(and bank seed 44) did.
"""

from __future__ import annotations

from accord.primitives import BinOp, Const, Put, ReadOf, Status, Txn, Update, sim_key
from accord.sim.burn import BurnConfig, _run_liveness
from accord.sim.cluster import Cluster
from accord.topology import ring_topology

K = sim_key("k")


def _applied(cluster: Cluster, node_id: int) -> bool:
    node = cluster.node(node_id)
    return node is not None and any(
        c.status is Status.APPLIED for c in node.store.commands.values()
    )


def test_liveness_waits_for_a_replica_no_apply_reached() -> None:
    cluster = Cluster(ring_topology([1, 2, 3], 3), seed=1)
    cut = {(1, 2), (2, 1), (2, 3), (3, 2)}
    cluster.partition(cut, heal_after_micros=10**9)
    append = Txn(reads=(K,), update=Update((Put(K, BinOp("concat", ReadOf(K, ()), Const((1,)))),)))
    assert cluster.submit(1, 1, append)
    # Nodes 1 and 3 (a slow quorum) decide, execute and apply it; node 2 hears nothing.
    assert cluster.run_until(
        lambda: _applied(cluster, 1) and _applied(cluster, 3), deadline_micros=5_000_000
    )
    assert cluster.node(2).store.commands == {}  # type: ignore[union-attr]
    # The coordinator crashes before it re-sends the Apply; then every fault ends.
    cluster.crash(1, down_micros=10**9)
    cluster.heal()
    assert cluster.unfinished() == []
    assert cluster.divergent_keys() == [K]
    assert cluster.undurable() != []

    _run_liveness(cluster, BurnConfig())

    # The home shard's progress log re-sent the Apply: node 2 applied it, everyone knows.
    assert cluster.divergent_keys() == []
    assert cluster.undurable() == []
    assert _applied(cluster, 2)
