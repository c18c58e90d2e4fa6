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
