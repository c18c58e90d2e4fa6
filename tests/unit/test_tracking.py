"""Quorum trackers: slow quorums per shard, fast votes per shard electorate, failures.

Events are written as short words: ``+1`` node 1 succeeded, ``x1`` node 1 failed (timed
out), ``f1`` node 1 voted for the fast path, ``s1`` node 1 replied but voted against it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.coordinate.tracking import AllTracker, FastPathTracker, Progress, QuorumTracker
from accord.primitives import TokenRange
from accord.topology import Shard

PENDING, SUCCESS, FAILED = Progress.PENDING, Progress.SUCCESS, Progress.FAILED


def shard(
    replicas: tuple[int, ...], electorate: tuple[int, ...] | None = None, at: int = 0
) -> Shard:
    return Shard(TokenRange(at, at + 10), replicas, frozenset(electorate or replicas))


# n=3, e=3: slow 2, fq 3, reject 1.   n=5, e=5: slow 3, fq 4, reject 2.
A = shard((1, 2, 3))
B = shard((3, 4, 5), at=10)  # shares node 3 with A
FIVE = shard((1, 2, 3, 4, 5))
FIVE_E4 = shard((1, 2, 3, 4, 5), (1, 2, 3, 4))  # fq 4, reject 1; node 5 never votes fast
FIVE_E3 = shard((1, 2, 3, 4, 5), (1, 2, 3))  # fq 3, reject 1


def replay(tracker: QuorumTracker, events: str) -> Progress:
    progress = tracker.progress()
    for event in events.split():
        kind, node = event[0], int(event[1:])
        if kind == "+":
            progress = tracker.success(node)
        elif kind == "x":
            progress = tracker.failure(node)
        else:
            assert isinstance(tracker, FastPathTracker)
            progress = tracker.vote(node, fast=kind == "f")
    assert progress is tracker.progress()
    return progress


def test_shard_sizes_used_below() -> None:
    sizes = {s: (s.slow_quorum, s.fast_quorum, s.fast_reject) for s in (A, FIVE, FIVE_E4, FIVE_E3)}
    assert sizes == {A: (2, 3, 1), FIVE: (3, 4, 2), FIVE_E4: (3, 4, 1), FIVE_E3: (3, 3, 1)}


@pytest.mark.parametrize(
    ("shards", "events", "expected"),
    [
        ((A,), "", PENDING),
        ((A,), "+1", PENDING),
        ((A,), "+1 +2", SUCCESS),
        ((A,), "+1 +1", PENDING),  # a duplicate reply counts once
        ((A,), "x1", PENDING),  # f = 1 failure is tolerated
        ((A,), "x1 x2", FAILED),  # more than f: a quorum is out of reach
        ((A,), "+1 x1 x2", PENDING),  # a failure after a success is ignored
        ((A,), "x1 +1 x2", PENDING),  # a late success supersedes the failure
        ((A,), "x1 +1 x2 x3", FAILED),
        ((A,), "+9", PENDING),  # a node outside every shard counts nowhere
        ((FIVE,), "+1 +2 x3 x4", PENDING),
        ((FIVE,), "+1 +2 x3 x4 x5", FAILED),
        ((FIVE,), "+1 x2 +3 x4 +5", SUCCESS),
        ((A, B), "+3", PENDING),  # node 3 counts in both shards, but once each
        ((A, B), "+1 +3", PENDING),  # A has its quorum, B does not yet
        ((A, B), "+1 +3 +4", SUCCESS),
        ((A, B), "+1 +2 +4 +5", SUCCESS),  # without the shared node
        ((A, B), "x3 x1", FAILED),  # one failed shard fails the whole
        ((A, B), "+1 +2 x4 x5", FAILED),
    ],
)
def test_quorum_tracker(shards: tuple[Shard, ...], events: str, expected: Progress) -> None:
    assert replay(QuorumTracker(shards), events) is expected


def test_quorum_tracker_records_who_responded_per_shard() -> None:
    tracker = QuorumTracker((A, B))
    replay(tracker, "+3 x4 +1")
    assert tracker.responded() == {1, 3, 4}
    assert tracker.shard_successes(0) == {1, 3}
    assert tracker.shard_successes(1) == {3}


@pytest.mark.parametrize(
    ("shards", "events", "progress", "fast", "impossible"),
    [
        # n = 3, e = 3: fq 3, reject 1.
        ((A,), "f1 f2", SUCCESS, False, False),
        ((A,), "f1 f2 f3", SUCCESS, True, False),
        ((A,), "f1 s2", SUCCESS, False, True),
        ((A,), "f1 x2", PENDING, False, True),  # a timeout counts against the fast path
        ((A,), "x1 x2", FAILED, False, True),
        ((A,), "f1 f2 x3", SUCCESS, False, True),
        ((A,), "f1 x1", PENDING, False, False),  # a failure after a fast vote is not a reject
        # n = 5, e = 5: fq 4, reject 2.
        ((FIVE,), "f1 f2 f3", SUCCESS, False, False),
        ((FIVE,), "f1 f2 f3 f4", SUCCESS, True, False),
        ((FIVE,), "f1 f2 f3 s4", SUCCESS, False, False),
        ((FIVE,), "f1 f2 f3 s4 x5", SUCCESS, False, True),
        ((FIVE,), "s1 s2", PENDING, False, True),
        # Only electorate members vote: e = 4 of 5, fq 4, reject 1.
        ((FIVE_E4,), "f1 f2 f3 f5", SUCCESS, False, False),
        ((FIVE_E4,), "f1 f2 f3 f5 f4", SUCCESS, True, False),
        ((FIVE_E4,), "f1 f2 f3 s5", SUCCESS, False, False),
        ((FIVE_E4,), "f1 f2 f3 x5", SUCCESS, False, False),
        ((FIVE_E4,), "s4", PENDING, False, True),
        ((FIVE_E3,), "f1 f2 f3", SUCCESS, True, False),
        ((FIVE_E3,), "f4 f5 f1 f2", SUCCESS, False, False),
        # Every shard needs its own fast quorum; the shared node 3 votes in both.
        ((A, B), "f1 f2 f3", PENDING, False, False),
        ((A, B), "f1 f2 f3 f4", SUCCESS, False, False),
        ((A, B), "f1 f2 f3 f4 f5", SUCCESS, True, False),
        ((A, B), "s3", PENDING, False, True),  # one vote against, in both shards
        ((A, B), "x3 f1 f2 f4 f5", SUCCESS, False, True),
        ((A, B), "f1 f2 f3 f4 s5", SUCCESS, False, True),  # B alone can sink it
    ],
)
def test_fast_path_tracker(
    shards: tuple[Shard, ...], events: str, progress: Progress, fast: bool, impossible: bool
) -> None:
    tracker = FastPathTracker(shards)
    assert replay(tracker, events) is progress
    assert tracker.fast_path_succeeded() is fast
    assert tracker.fast_path_impossible() is impossible


def test_fast_voters_are_the_electorate_members_that_voted_fast() -> None:
    tracker = FastPathTracker((FIVE_E4,))
    replay(tracker, "f1 s2 f5 f3")
    assert tracker.fast_voters() == {1, 3}


def test_slow_quorum_suffices_is_the_deliberately_broken_variant() -> None:
    tracker = FastPathTracker((FIVE,), slow_quorum_suffices=True)
    replay(tracker, "f1 f2 f3")
    assert tracker.fast_path_succeeded()


electorate_events = st.lists(
    st.tuples(st.sampled_from("fsx"), st.integers(1, 5)), max_size=12, unique_by=lambda e: e[1]
)


@given(st.sampled_from([(A,), (FIVE,), (FIVE_E4,), (FIVE_E3,), (A, B)]), electorate_events)
def test_fast_path_tracker_matches_a_model(
    shards: tuple[Shard, ...], events: list[tuple[str, int]]
) -> None:
    """With one report per node: succeeded iff fq electorate fast votes in every shard,
    impossible iff reject-size electorate votes against or failures in some shard."""
    tracker = FastPathTracker(shards)
    replay(tracker, " ".join(f"{kind}{node}" for kind, node in events))
    by_node = {node: kind for kind, node in events}

    def count(s: Shard, kinds: str) -> int:
        return sum(by_node.get(node, "?") in kinds for node in s.electorate)

    assert tracker.fast_path_succeeded() == all(count(s, "f") >= s.fast_quorum for s in shards)
    assert tracker.fast_path_impossible() == any(count(s, "sx") >= s.fast_reject for s in shards)
    assert not (tracker.fast_path_succeeded() and tracker.fast_path_impossible())
    # Timing out everyone still silent always decides the fast path one way or the other.
    for node in sorted({n for s in shards for n in s.replicas} - set(by_node)):
        tracker.failure(node)
    assert tracker.fast_path_succeeded() != tracker.fast_path_impossible()


def test_a_late_fast_vote_supersedes_its_timeout() -> None:
    tracker = FastPathTracker((FIVE,))  # fq 4, reject 2
    replay(tracker, "f1 f2 x3 f3 s4")  # node 3 timed out, then voted fast after all
    assert not tracker.fast_path_impossible()  # only node 4 is against: 1 < 2
    replay(tracker, "f5")
    assert tracker.fast_path_succeeded()


def test_all_tracker_waits_for_every_node() -> None:
    tracker = AllTracker((1, 2, 3))
    assert [tracker.success(n) for n in (1, 1, 3, 9, 2)] == [False, False, False, False, True]
