"""Shards derived from a Cassandra token ring (pure math; the driver part is integration)."""

from __future__ import annotations

import pytest

from accord import TOKEN_MAX, TOKEN_MIN, Key
from accord_cassandra.topology import TopologyError, shards_from_ring

# The launcher's 3-node ring: i * (2**64 // 3) - 2**63.
RING = [TOKEN_MIN, -3074457345618258603, 3074457345618258602]
OWNERS = {RING[0]: [1, 2, 3], RING[1]: [2, 3, 1], RING[2]: [3, 1, 2]}


def test_ranges_are_owned_like_cassandra_owns_them() -> None:
    topology = shards_from_ring(RING, OWNERS)
    # (t_i, t_i+1] belongs to the replicas of t_i+1; past the last token it wraps to the first.
    assert topology.shard_for(Key(RING[1], "a")).replicas == (2, 3, 1)
    assert topology.shard_for(Key(RING[1] + 1, "b")).replicas == (3, 1, 2)
    assert topology.shard_for(Key(RING[2] + 1, "c")).replicas == (1, 2, 3)
    assert topology.shard_for(Key(TOKEN_MAX, "d")).replicas == (1, 2, 3)
    assert topology.shard_for(Key(TOKEN_MIN + 1, "e")).replicas == (2, 3, 1)


def test_every_shard_lets_all_replicas_vote() -> None:
    for shard in shards_from_ring(RING, OWNERS).shards:
        assert shard.electorate == frozenset(shard.replicas)


def test_an_empty_ring_or_an_unreplicated_token_is_refused() -> None:
    with pytest.raises(TopologyError, match="empty"):
        shards_from_ring([], {})
    with pytest.raises(TopologyError, match="no sidecar replicas"):
        shards_from_ring([5], {5: []})


def test_a_preferred_electorate_applies_to_every_shard_of_the_ring() -> None:
    topology = shards_from_ring(RING, OWNERS, electorate_size=2, electorate_preference=[1, 2])
    for shard in topology.shards:
        assert shard.electorate == frozenset({1, 2})
        assert (shard.fast_quorum, shard.slow_quorum) == (2, 2)
    # The size alone takes each shard's first replicas in Cassandra's order.
    plain = shards_from_ring(RING, OWNERS, electorate_size=2)
    assert {shard.electorate for shard in plain.shards} == {
        frozenset({1, 2}),
        frozenset({2, 3}),
        frozenset({3, 1}),
    }


def test_an_electorate_below_n_minus_f_is_refused_naming_the_token() -> None:
    with pytest.raises(TopologyError, match=r"token -?\d+: electorate of 1 is outside"):
        shards_from_ring(RING, OWNERS, electorate_size=1)
