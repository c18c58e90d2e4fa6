"""The progress log's adaptive recover delay (accord/local/recover_delay.py) on real nodes.

At saturation a healthy txn's replicas can wait longer between PreAccept and Commit than a
fixed 1 s delay: they recovered live txns (42 of 444 in a saturated sidecar run), which
cost CPU and contended for the ballot with the coordinator still driving them. Here every
message takes a fixed hop to arrive: with the fixed delay slow hops start recoveries, with
the adaptive one the replicas learned from earlier txns and start none. A coordinator that
really dies is still recovered, within the learned delay, and its recovered txn does not
teach the survivors a longer one.
"""

from __future__ import annotations

from accord.primitives import BinOp, Const, Put, ReadOf, Status, Txn, TxnId, Update, sim_key
from tests.scenarios.harness import Net

A = sim_key("a")
MS = 1_000
FLOOR = 1_000 * MS


def append(value: int) -> Txn:
    return Txn(
        reads=(A,), update=Update((Put(A, BinOp("concat", ReadOf(A, ()), Const((value,)))),))
    )


def run(net: Net, count: int, hop_micros: int, first: int) -> None:
    """``count`` txns one after another, every message arriving ``hop_micros`` after it left."""
    for i in range(count):
        replied = len(net.replies)
        coordinator = 1 + i % len(net.nodes)
        net.nodes[coordinator].submit(first + i, append(first + i))
        net.flush(coordinator)
        for _ in range(1_000):
            if len(net.replies) > replied:
                break
            net.tick(hop_micros)
            net.deliver()
        else:
            raise AssertionError(f"txn {first + i} got no reply")
        net.settle()


def recoveries(net: Net) -> int:
    return sum(node.stats.recoveries for node in net.nodes.values())


def test_slow_healthy_txns_are_recovered_with_a_fixed_delay_and_not_with_the_adaptive_one() -> None:
    counts = {}
    for adaptive in (False, True):
        net = Net(recover_delay_micros=FLOOR, recover_delay_adaptive=adaptive)
        # Warm-up: 400 ms hops, so a replica waits 800 ms between PreAccept and Commit.
        run(net, 20, 400 * MS, first=0)
        assert recoveries(net) == 0
        # Load: 800 ms hops, 1.6 s between PreAccept and Commit, over the 1-1.5 s delay.
        run(net, 20, 800 * MS, first=100)
        counts[adaptive] = recoveries(net)
        for node in net.nodes.values():
            snapshot = net.snapshot(node.node_id, net.replies[-1].txn_id)
            assert snapshot is not None and snapshot.status is Status.APPLIED
        assert net.data[1][A][1] == (*range(20), *range(100, 120))
        if adaptive:
            # 4 hops PreAccept->Apply: twice the p99 of 3.2 s (under the 8 s cap).
            assert [n.recover_delay.home() for n in net.nodes.values()] == [6_400 * MS] * 3
    assert counts[False] > 0, counts
    assert counts[True] == 0, counts


def test_a_dead_coordinator_is_still_recovered_within_the_learned_delay() -> None:
    net = Net(recover_delay_micros=FLOOR)
    run(net, 20, 400 * MS, first=0)
    learned = {n.node_id: n.recover_delay.home() for n in net.nodes.values()}
    assert set(learned.values()) == {3_200 * MS}, learned
    samples = {n.node_id: n.recover_delay.sample_count() for n in net.nodes.values()}
    recovered_after = _recovery_time_after_death(net, report_unreachable=False)
    # Not before the learned delay, and within it plus its jitter (a half) and a scan.
    assert 3_200 * MS <= recovered_after <= 3_200 * MS * 3 // 2 + 100 * MS, recovered_after
    assert net.data[2][A][1] == (*range(20), 98)
    # The recovered txn's latency holds the delay itself: it is not learned from.
    for node_id in (2, 3):
        assert net.nodes[node_id].recover_delay.sample_count() == samples[node_id]
        assert net.nodes[node_id].recover_delay.home() == learned[node_id]


def _recovery_time_after_death(net: Net, *, report_unreachable: bool) -> int:
    """Node 1 dies once its PreAccepts of a new txn arrived; how long until a survivor
    starts recovering it. With ``report_unreachable`` the survivors' transports tell them
    at once that node 1 cannot be reached (its connections were refused)."""
    txn_id: TxnId = net.nodes[1].submit(98, append(98))
    net.flush(1)
    net.deliver(lambda e: e.src == 1)
    del net.nodes[1]
    net.drop(lambda e: 1 in (e.src, e.dest))
    if report_unreachable:
        for node_id in (2, 3):
            net.nodes[node_id].peer_reachable(1, False)
    died = net.clock.micros
    recovered_after = None
    for _ in range(600):
        net.tick(100 * MS)
        if recovered_after is None and recoveries(net) > 0:
            recovered_after = net.clock.micros - died
        net.deliver(lambda e: e.dest != 1)
        net.drop(lambda e: e.dest == 1)
        if all(
            (s := net.snapshot(n, txn_id)) is not None and s.status is Status.APPLIED
            for n in (2, 3)
        ):
            break
    else:
        raise AssertionError("the survivors never applied the dead coordinator's txn")
    assert recovered_after is not None
    assert net.data[2][A][1][-1] == 98
    return recovered_after


def test_an_unreachable_coordinator_is_recovered_after_the_floor_not_the_learned_delay() -> None:
    # After a slow spell the survivors learned 3.2 s. A coordinator their transports cannot
    # reach (its connections refused: SIGKILLed) will not finish anything, so its txn is
    # recovered after the 1 s floor; without the report, after the learned delay. Before
    # the report reached the progress log, a sidecar killed after a loaded test left the
    # survivors answering nothing for 8-11 s.
    times = {}
    for report in (False, True):
        net = Net(recover_delay_micros=FLOOR)
        run(net, 20, 400 * MS, first=0)
        assert {n.recover_delay.home() for n in net.nodes.values()} == {3_200 * MS}
        times[report] = _recovery_time_after_death(net, report_unreachable=report)
    assert times[False] >= 3_200 * MS, times
    assert FLOOR <= times[True] <= FLOOR * 3 // 2 + 100 * MS, times


def test_a_peer_reachable_again_is_waited_for_as_before() -> None:
    net = Net(recover_delay_micros=FLOOR)
    run(net, 20, 400 * MS, first=0)
    for node_id in (2, 3):
        net.nodes[node_id].peer_reachable(1, False)
        net.nodes[node_id].peer_reachable(1, True)
        assert net.nodes[node_id].unreachable == set()
    assert _recovery_time_after_death(net, report_unreachable=False) >= 3_200 * MS
