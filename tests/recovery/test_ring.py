"""The coordinator's state machine, pure: splits, rebalancing, adoption, and the safety rule
that no range is granted to a node while another node may still hold it.

Also checks that the committed gRPC code matches ring.proto (regenerate with
``proto/stacksaga_store/generate.sh``).

Reference: stacksaga_store/ring/leases.py (timing and epoch rules); seed 000 Part 4, "How
Retry-Nodes Find Work: Spatial Isolation via Murmur3"; peers.md section 1 (fencing tokens).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from accord_cassandra.tokens import MAX_TOKEN, MIN_TOKEN
from stacksaga_store.ring.leases import (
    Grant,
    Outbound,
    PersistEpoch,
    Phase,
    Revoke,
    ServiceRing,
    TokenRange,
    covers_ring,
    split_ring,
)

LEASE = 10.0
REPO = Path(__file__).resolve().parents[2]


@given(st.integers(1, 300))
def test_split_covers_the_ring_evenly(count: int) -> None:
    ranges = split_ring(count)
    assert covers_ring(list(ranges))
    assert ranges[0].start == MIN_TOKEN and ranges[-1].end == MAX_TOKEN
    sizes = [r.end - r.start + 1 for r in ranges]
    assert max(sizes) - min(sizes) <= 1


def grants(outs: list[Outbound]) -> dict[str, Grant]:
    return {o.node_id: o for o in outs if isinstance(o, Grant)}


def persist(ring: ServiceRing, outs: list[Outbound], now: float) -> list[Outbound]:
    """The shell's part: make each requested epoch durable, then report it."""
    result = [o for o in outs if not isinstance(o, PersistEpoch)]
    for out in outs:
        if isinstance(out, PersistEpoch):
            result += persist(ring, ring.persisted(out.epoch, now), now)
    return result


def test_first_members_get_epoch_1_and_a_join_rebalances_after_release() -> None:
    ring = ServiceRing("svc", 0, LEASE, 0.0)
    assert ring.phase is Phase.STABLE
    out = persist(ring, ring.hello("b", 1, None, 0.0), 0.0)
    assert grants(out)["b"].range == TokenRange(MIN_TOKEN, MAX_TOKEN) and ring.epoch == 1
    # "a" joins: "b" is told to stop; nothing is granted until "b" released (or expired).
    out = ring.hello("a", 1, None, 1.0)
    assert [type(o) for o in out] == [Revoke] and ring.phase is Phase.DRAINING
    assert ring.renew("b", 2, 1, 2.0) == [Revoke("b", 1, 2, "rebalancing")]
    out = persist(ring, ring.released("b", 3, 1, 2.5), 2.5)
    new = grants(out)
    assert ring.epoch == 2 and set(new) == {"a", "b"}
    # Sorted by node id: "a" gets Node-0's range.
    assert new["a"].ordinal == 0 and new["a"].range.start == MIN_TOKEN
    assert covers_ring([g.range for g in new.values()])


def test_a_silent_holder_is_waited_out_before_its_range_moves() -> None:
    ring = ServiceRing("svc", 0, LEASE, 0.0)
    persist(ring, ring.hello("a", 1, None, 0.0), 0.0)
    persist(ring, ring.hello("b", 1, None, 0.0), 0.0)  # "a" is revoked for the join
    out = persist(ring, ring.released("a", 2, ring.epoch, 0.1), 0.1)
    assert set(grants(out)) == {"a", "b"}
    epoch = ring.epoch
    # "b" disconnects (a broken stream, maybe alive): nothing moves before its lease ends,
    # while "a" keeps renewing.
    ring.disconnect("b", 1.0)
    assert grants(ring.renew("a", 3, epoch, 5.0))["a"].epoch == epoch
    assert ring.tick(0.1 + LEASE - 0.5) == []
    assert ring.phase is Phase.STABLE
    out = persist(ring, ring.tick(0.1 + LEASE + ring.margin + 0.1), 20.0)
    # "a" is revoked first; once it released, "a" alone gets the ring at the next epoch.
    assert [type(o) for o in out] == [Revoke]
    out = persist(ring, ring.released("a", 4, epoch, 21.0), 21.0)
    assert grants(out)["a"].range == TokenRange(MIN_TOKEN, MAX_TOKEN)
    assert ring.epoch == epoch + 1


def test_a_new_master_adopts_presented_leases_without_a_new_epoch() -> None:
    low, high = split_ring(2)
    ring = ServiceRing("svc", 7, LEASE, 100.0)
    assert ring.phase is Phase.ADOPTING
    assert grants(ring.hello("a", 5, (low, 7), 100.5))["a"].range == low
    assert grants(ring.hello("b", 9, (high, 7), 101.0))["b"].range == high
    # A lease of another epoch, or overlapping an adopted one, is not adopted.
    assert ring.hello("c", 1, (low, 7), 101.5) == []
    assert ring.hello("d", 1, (high, 6), 101.5) == []
    ring.disconnect("c", 102.0)
    ring.disconnect("d", 102.0)
    assert ring.tick(100.0 + LEASE + ring.margin) == []
    assert ring.phase is Phase.STABLE and ring.epoch == 7


def test_adoption_with_a_gap_rebalances_after_the_window() -> None:
    low, _ = split_ring(2)
    ring = ServiceRing("svc", 3, LEASE, 0.0)
    ring.hello("a", 1, (low, 3), 0.5)
    ring.hello("b", 1, None, 0.5)  # lost its lease: the high half is uncovered
    out = ring.tick(LEASE + ring.margin)
    assert out == [Revoke("a", 3, 1, "adoption ended with gaps or changes")]
    out = persist(ring, ring.released("a", 2, 3, LEASE + 1), LEASE + 1)
    assert set(grants(out)) == {"a", "b"} and ring.epoch == 4


operations = st.lists(
    st.tuples(
        st.sampled_from(["hello", "renew", "release", "disconnect", "tick", "fail_persist"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(0.0, LEASE),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(0, 3))
def test_no_range_is_granted_while_another_node_may_hold_it(
    ops: list[tuple[str, str, float]], start_epoch: int
) -> None:
    """Random joins, renewals, releases, disconnects, failed epoch writes and time. Whenever
    the ring grants a range, every *other* node's earlier grant overlapping it was either
    released by that node or has expired (plus the margin) on the coordinator's clock."""
    ring = ServiceRing("svc", start_epoch, LEASE, 0.0)
    now = 0.0
    held: dict[str, tuple[TokenRange, int, float]] = {}  # node -> (range, epoch, expiry)

    def observe(outs: list[Outbound]) -> None:
        for out in outs:
            if isinstance(out, PersistEpoch):
                if fail_next[0]:
                    fail_next[0] = False
                    observe(ring.persist_failed(now))
                else:
                    observe(ring.persisted(out.epoch, now))
            elif isinstance(out, Grant):
                for other, (token_range, _, expiry) in held.items():
                    if other != out.node_id and token_range.overlaps(out.range):
                        assert now >= expiry + ring.margin, (other, out)
                held[out.node_id] = (out.range, out.epoch, now + LEASE)

    fail_next = [False]
    for sequence, (op, node, dt) in enumerate(ops, start=1):
        now += dt
        if op == "hello":
            lease = held.get(node)
            presented = (lease[0], lease[1]) if lease and now < lease[2] else None
            observe(ring.hello(node, sequence, presented, now))
        elif op == "renew" and node in held:
            observe(ring.renew(node, sequence, held[node][1], now))
        elif op == "release" and node in held:
            epoch = held.pop(node)[1]  # the node stops using it, then says so
            observe(ring.released(node, sequence, epoch, now))
        elif op == "disconnect":
            observe(ring.disconnect(node, now))
        elif op == "fail_persist":
            fail_next[0] = True
        else:
            observe(ring.tick(now))
    # Liveness: with everyone gone quiet, time alone settles the ring.
    for _ in range(4):
        now += LEASE + ring.margin + 1
        observe(ring.tick(now))
    assert ring.phase in (Phase.STABLE, Phase.DRAINING, Phase.PERSISTING)


def test_committed_grpc_code_matches_the_proto(tmp_path: Path) -> None:
    """proto/stacksaga_store/generate.sh output, regenerated into a scratch copy, is identical."""
    scratch = tmp_path / "repo"
    shutil.copytree(REPO / "proto", scratch / "proto")
    (scratch / "stacksaga_store" / "v1").mkdir(parents=True)
    subprocess.run(
        ["bash", str(scratch / "proto" / "stacksaga_store" / "generate.sh")],
        check=True,
        capture_output=True,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )
    for name in ("ring_pb2.py", "ring_pb2.pyi", "ring_pb2_grpc.py", "ring_pb2_grpc.pyi"):
        generated = (scratch / "stacksaga_store" / "v1" / name).read_text()
        committed = (REPO / "stacksaga_store" / "v1" / name).read_text()
        assert generated == committed, f"{name} is stale: run proto/stacksaga_store/generate.sh"
