"""Quorum sizes, the intersection properties recovery relies on, and ring placement."""

from __future__ import annotations

from functools import cache
from itertools import combinations, pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.invariants import ConfigurationError
from accord.primitives import TOKEN_MAX, TOKEN_MIN, Key, TokenRange
from accord.topology import (
    Shard,
    Topology,
    fast_path_reject_size,
    fast_quorum_size,
    max_failures,
    preferred_electorate,
    ring_topology,
    slow_quorum_size,
)

# Every (n, e) with n replicas and an electorate of e in [n - f, n].
SIZES = [(n, e) for n in range(1, 10) for e in range(n - (n - 1) // 2, n + 1)]
SMALL = [(n, e) for n, e in SIZES if n <= 7]


# ---------------------------------------------------------------------------- sizes


# Reference: Accord Shard.java; accord.md §2 table.
@pytest.mark.parametrize(("n", "e"), SIZES)
def test_quorum_sizes_follow_the_formulas(n: int, e: int) -> None:
    f = (n - 1) // 2
    fq = (f + e) // 2 + 1
    assert max_failures(n) == f
    assert slow_quorum_size(n) == n - f
    assert fast_quorum_size(n, e) == fq
    assert fast_path_reject_size(n, e) == 1 + e - fq
    assert 1 <= fast_path_reject_size(n, e) <= e
    assert slow_quorum_size(n) <= fast_quorum_size(n, e) <= e


# Reference: accord.md §2 table, rows n = 3, 5, 7, copied verbatim:
#   | n (f) | slow quorum | e -> fq / reject size             |
#   | 3 (1) | 2           | 3->3/1; 2->2/1                    |
#   | 5 (2) | 3           | 5->4/2; 4->4/1; 3->3/1            |
#   | 7 (3) | 4           | 7->6/2; 6->5/2; 5->5/1; 4->4/1    |
@pytest.mark.parametrize(
    ("n", "f", "slow", "e", "fq", "reject"),
    [
        (3, 1, 2, 3, 3, 1),
        (3, 1, 2, 2, 2, 1),
        (5, 2, 3, 5, 4, 2),
        (5, 2, 3, 4, 4, 1),
        (5, 2, 3, 3, 3, 1),
        (7, 3, 4, 7, 6, 2),
        (7, 3, 4, 6, 5, 2),
        (7, 3, 4, 5, 5, 1),
        (7, 3, 4, 4, 4, 1),
    ],
)
def test_reference_table(n: int, f: int, slow: int, e: int, fq: int, reject: int) -> None:
    assert (max_failures(n), slow_quorum_size(n)) == (f, slow)
    assert (fast_quorum_size(n, e), fast_path_reject_size(n, e)) == (fq, reject)
    shard = Shard(TokenRange(0, 1), tuple(range(n)), frozenset(range(e)))
    assert (shard.slow_quorum, shard.fast_quorum, shard.fast_reject) == (slow, fq, reject)


@pytest.mark.parametrize("n", range(1, 10))
def test_electorates_outside_n_minus_f_to_n_are_refused(n: int) -> None:
    f = (n - 1) // 2
    for e in (n - f - 1, n + 1):
        with pytest.raises(ConfigurationError, match="outside"):
            fast_quorum_size(n, e)
        with pytest.raises(ConfigurationError, match="outside"):
            fast_path_reject_size(n, e)


# ---------------------------------------------------------------------------- intersections
#
# Let R be any slow (recovery) quorum, n - f replicas, and F any fast quorum, fq members of
# the electorate E (|E| = e). R misses at most f replicas, so |E - R| <= f and
#
#   |F & R| >= fq - |E - R| >= fq - f = floor((e - f) / 2) + 1.
#
# More precisely, with m = |E & R| >= e - f:  |F & R| >= fq - (e - m) > m / 2, because
# fq > (f + e) / 2 >= e - m / 2. So every fast quorum holds a strict majority of the
# electorate members of every recovery quorum. Two consequences recovery relies on:
#
# 1. Any two fast quorums and any slow quorum share a member (both hold majorities of
#    E & R), and two fast quorums share >= 2 fq - e >= f + 1 members. Two conflicting
#    transactions cannot both take the fast path unseen by each other, and a recovery
#    coordinator always hears from a replica that voted for a fast path that happened.
# 2. If F formed, the electorate members of R that did not vote fast lie in E - F, so
#    there are at most e - fq of them. Recovery's rule "more than e - fq non-fast votes
#    in R means no fast quorum" is therefore safe, and it is exact: with at most e - fq
#    non-fast votes, the unheard electorate could have completed a fast quorum.
#
# fq is also the least size with property 1 for every n <= 7, so it is not over-sized.


@cache
def brute(n: int, e: int, fq: int) -> tuple[int, int, bool]:
    """(min |F & R|, min |F1 & F2|, every F1 & F2 & R non-empty) over all quorums."""
    f = (n - 1) // 2
    electorate, replicas = range(e), range(n)
    fasts = [frozenset(c) for c in combinations(electorate, fq)]
    slows = [frozenset(c) for c in combinations(replicas, n - f)]
    min_fast_slow = min(len(a & r) for a in fasts for r in slows)
    min_fast_fast = min(len(a & b) for a in fasts for b in fasts)
    triples = all(a & b & r for a in fasts for b in fasts for r in slows)
    return min_fast_slow, min_fast_fast, triples


@pytest.mark.parametrize(("n", "e"), SMALL)
def test_fast_and_slow_quorums_intersect_in_an_electorate_majority(n: int, e: int) -> None:
    f, fq = max_failures(n), fast_quorum_size(n, e)
    min_fast_slow, min_fast_fast, triples = brute(n, e, fq)
    assert min_fast_slow == fq - f == (e - f) // 2 + 1
    assert min_fast_fast == 2 * fq - e >= f + 1
    assert triples
    # Per recovery quorum: a strict majority of the electorate members it contains.
    for slow in combinations(range(n), n - f):
        members = set(slow) & set(range(e))
        for fast in combinations(range(e), fq):
            assert 2 * len(set(fast) & members) > len(members)


@pytest.mark.parametrize(("n", "e"), [(n, e) for n, e in SMALL if n > 1])
def test_a_smaller_fast_quorum_loses_the_intersection(n: int, e: int) -> None:
    assert not brute(n, e, fast_quorum_size(n, e) - 1)[2]


@pytest.mark.parametrize(("n", "e"), SMALL)
def test_recovery_rejection_rule_is_exact(n: int, e: int) -> None:
    """Non-fast electorate replies in R > e - fq  <=>  no fast quorum agrees with R."""
    f, fq = max_failures(n), fast_quorum_size(n, e)
    electorate = frozenset(range(e))
    for slow in combinations(range(n), n - f):
        heard = electorate & set(slow)
        for voted_fast in range(len(heard) + 1):
            non_fast = len(heard) - voted_fast
            # The best case for a fast quorum: every unheard electorate member voted fast.
            could_have_formed = voted_fast + len(electorate - heard) >= fq
            assert (non_fast > e - fq) == (not could_have_formed), (slow, voted_fast)


@pytest.mark.parametrize(("n", "e"), SIZES)
def test_fast_reject_size_is_exactly_where_a_fast_quorum_becomes_unreachable(
    n: int, e: int
) -> None:
    fq, reject = fast_quorum_size(n, e), fast_path_reject_size(n, e)
    for rejects in range(e + 1):
        assert (e - rejects < fq) == (rejects >= reject)


# ---------------------------------------------------------------------------- placement


@given(
    st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))),
    st.integers(1, 4),
)
def test_ring_topology_covers_the_ring_evenly(sizes: tuple[int, int], per_node: int) -> None:
    count, rf = sizes
    nodes = tuple(range(10, 10 + count))
    topology = ring_topology(nodes, rf, shards_per_node=per_node, epoch=3)
    shards = topology.shards
    assert topology.epoch == 3
    assert len(shards) == count * per_node
    assert shards[0].range.start == TOKEN_MIN and shards[-1].range.end == TOKEN_MAX
    assert all(a.range.end == b.range.start for a, b in pairwise(shards))
    for shard in shards:
        assert len(set(shard.replicas)) == rf
        assert shard.electorate == frozenset(shard.replicas)
    assert topology.nodes() == nodes
    for node in nodes:
        assert sum(node in s.replicas for s in shards) == rf * per_node


@given(st.integers(TOKEN_MIN + 1, TOKEN_MAX), st.integers(1, 7), st.integers(1, 3))
def test_shard_for_agrees_with_token_range_contains(token: int, count: int, per_node: int) -> None:
    topology = ring_topology(list(range(count)), min(3, count), shards_per_node=per_node)
    key = Key(token, "k")
    owners = [s for s in topology.shards if s.range.contains(token)]
    assert owners == [topology.shard_for(key)]
    assert topology.shard_for(key).contains(key)
    assert topology.owns(owners[0].replicas[0], key)


def test_shard_for_at_range_boundaries() -> None:
    topology = ring_topology([1, 2, 3, 4], 3, shards_per_node=2)
    for index, shard in enumerate(topology.shards):
        # Ranges are (start, end]: the end belongs to the shard, the start to the one before.
        assert topology.shard_for(Key(shard.range.end, "end")) is shard
        if index > 0:
            start = Key(shard.range.start, "start")
            assert topology.shard_for(start) is topology.shards[index - 1]


def test_shards_for_and_replicas_of_deduplicate_in_ring_order() -> None:
    topology = ring_topology([1, 2, 3, 4], 2)
    keys = [Key(s.range.end, "k") for s in reversed(topology.shards)] * 2
    assert topology.shards_for(keys) == topology.shards
    assert topology.replicas_of(keys[:1]) == tuple(sorted(topology.shards[-1].replicas))


def test_a_smaller_electorate_takes_the_first_replicas_and_shrinks_fast_quorums() -> None:
    topology = ring_topology([1, 2, 3, 4, 5], 5, electorate_size=3)
    for shard in topology.shards:
        assert shard.electorate == frozenset(shard.replicas[:3])
        assert (shard.fast_quorum, shard.fast_reject) == (3, 1)


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: ring_topology([1, 2, 3], 0), "replication factor"),
        (lambda: ring_topology([1, 2, 3], 4), "replication factor"),
        (lambda: ring_topology([], 1), "replication factor"),
        (lambda: ring_topology([1, 2, 3], 3, electorate_size=1), "outside"),
        (lambda: ring_topology([1, 2, 3, 4, 5], 5, electorate_size=2), "outside"),
        (lambda: ring_topology([1, 2, 3], 3, electorate_size=0), "outside"),
        (lambda: Shard(TokenRange(0, 1), (1, 2, 3), frozenset({1})), "outside"),
        (lambda: Shard(TokenRange(0, 1), (1, 2, 3), frozenset({1, 4})), "not a subset"),
        (lambda: Shard(TokenRange(0, 1), (1, 1, 2), frozenset({1, 2})), "duplicate"),
        (lambda: Shard(TokenRange(0, 1), (), frozenset()), "duplicate or no replicas"),
    ],
)
def test_inconsistent_configurations_are_refused(build: object, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        build()  # type: ignore[operator]


def shard(start: int, end: int) -> Shard:
    return Shard(TokenRange(start, end), (1,), frozenset({1}))


@pytest.mark.parametrize(
    "shards",
    [
        (),
        (shard(TOKEN_MIN, 0),),
        (shard(TOKEN_MIN, 0), shard(1, TOKEN_MAX)),
        (shard(TOKEN_MIN, 5), shard(0, TOKEN_MAX)),
        (shard(TOKEN_MIN + 1, TOKEN_MAX),),
    ],
    ids=["none", "short", "gap", "overlap", "open-start"],
)
def test_topologies_that_leave_gaps_or_overlap_are_refused(shards: tuple[Shard, ...]) -> None:
    with pytest.raises(ConfigurationError):
        Topology(1, shards)


@pytest.mark.parametrize("electorate_size", [4, 10, -1], ids=["rf+1", "rf+7", "negative"])
def test_ring_topology_refuses_an_electorate_outside_bounds(electorate_size: int) -> None:
    with pytest.raises(ConfigurationError):
        ring_topology([1, 2, 3, 4, 5], 3, electorate_size=electorate_size)


# ---------------------------------------------------------------------------- chosen electorates


def _check_intersections(shard: Shard) -> None:
    """The properties above, by brute force over the shard's own node ids."""
    n = len(shard.replicas)
    f = max_failures(n)
    fasts = [frozenset(c) for c in combinations(sorted(shard.electorate), shard.fast_quorum)]
    for slow in combinations(shard.replicas, n - f):
        members = shard.electorate & set(slow)
        for fast in fasts:
            # A strict majority of the electorate members of every recovery quorum ...
            assert 2 * len(fast & members) > len(members), (shard, slow, fast)
            # ... so the non-fast electorate members a recovery quorum can hear are at most
            # e - fq, the bound recovery's "fast path rejected" rule uses.
            assert len(members - fast) <= len(shard.electorate) - shard.fast_quorum
            for other in fasts:
                assert fast & other & set(slow), (shard, slow, fast, other)


@given(
    st.integers(1, 7).flatmap(
        lambda n: st.tuples(
            st.integers(n, 9).flatmap(lambda count: st.permutations(range(1, count + 1))),
            st.just(n),
            st.integers(n - (n - 1) // 2, n),
        )
    ),
    st.integers(0, 9),
    st.integers(1, 3),
)
def test_any_preferred_electorate_keeps_the_quorum_intersections(
    sizes: tuple[list[int], int, int], preferred: int, per_node: int
) -> None:
    order, rf, e = sizes
    nodes = sorted(order)
    # A preference naming some of the nodes, in a random order (the rest rank last).
    preference = order[:preferred]
    topology = ring_topology(
        nodes, rf, shards_per_node=per_node, electorate_size=e, electorate_preference=preference
    )
    rank = {node: i for i, node in enumerate(preference)}
    for shard in topology.shards:
        assert len(shard.electorate) == e and shard.electorate <= set(shard.replicas)
        # The electorate is the replicas ranked first; unnamed ones keep ring order.
        ranked = sorted(
            shard.replicas, key=lambda node: (rank.get(node, len(rank)), shard.replicas.index(node))
        )
        assert shard.electorate == frozenset(ranked[:e])
        _check_intersections(shard)


def test_preferred_electorate_puts_the_named_voters_first() -> None:
    topology = ring_topology([1, 2, 3], 3, electorate_size=2, electorate_preference=[2, 1])
    assert {shard.electorate for shard in topology.shards} == {frozenset({1, 2})}
    # Without a preference: the first replicas in ring order, one electorate per rotation.
    plain = ring_topology([1, 2, 3], 3, shards_per_node=1, electorate_size=2)
    assert [shard.electorate for shard in plain.shards] == [
        frozenset({1, 2}),
        frozenset({2, 3}),
        frozenset({3, 1}),
    ]
    with pytest.raises(ConfigurationError, match="electorate of 4"):
        preferred_electorate((1, 2, 3), 4)
