"""Shards from Cassandra's own token ring.

Shard = a token range between consecutive ring tokens; its replicas = the sidecars beside
that range's Cassandra replicas (for the keyspace that holds the Accord tables). A range
``(t_i, t_{i+1}]`` is owned like Cassandra owns it: by the replicas of ``t_{i+1}``; the
range after the last token wraps around to the replicas of the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accord import (
    TOKEN_MAX,
    TOKEN_MIN,
    ConfigurationError,
    Shard,
    TokenRange,
    Topology,
    preferred_electorate,
)
from accord_cassandra.errors import AccordCassandraError


class TopologyError(AccordCassandraError, ValueError):
    """The ring cannot be mapped onto the configured sidecars."""


def shards_from_ring(
    ring: Sequence[int],
    replicas_of: Mapping[int, Sequence[int]],
    *,
    epoch: int = 1,
    electorate_size: int | None = None,
    electorate_preference: Sequence[int] = (),
) -> Topology:
    """A topology from sorted ring tokens and, per token, the sidecar ids replicating it.

    Each shard's fast-path electorate is ``electorate_size`` of its replicas (default: all),
    the first in ``electorate_preference``; a size outside [n - f, n] for some shard is
    refused."""
    tokens = sorted(set(ring))
    if not tokens:
        raise TopologyError("the token ring is empty")
    bounds: list[tuple[int, int, int]] = []  # (start, end, owning token)
    previous = TOKEN_MIN
    for token in tokens:
        if token > previous:
            bounds.append((previous, token, token))
        previous = token
    if previous < TOKEN_MAX:
        bounds.append((previous, TOKEN_MAX, tokens[0]))
    shards = []
    for start, end, owner in bounds:
        replicas = tuple(replicas_of[owner])
        if not replicas:
            raise TopologyError(f"token {owner} has no sidecar replicas")
        size = len(replicas) if electorate_size is None else min(electorate_size, len(replicas))
        try:
            electorate = preferred_electorate(replicas, size, electorate_preference)
            shards.append(Shard(TokenRange(start, end), replicas, electorate))
        except ConfigurationError as error:
            raise TopologyError(f"token {owner}: {error}") from None
    return Topology(epoch, tuple(shards))


def topology_from_cassandra(
    metadata: Any,
    keyspace: str,
    sidecar_of_host: Mapping[str, int],
    *,
    electorate_size: int | None = None,
    electorate_preference: Sequence[int] = (),
) -> Topology:
    """Read the ring from cassandra-driver metadata; ``sidecar_of_host`` maps a Cassandra
    node's address to the id of the sidecar beside it."""
    token_map = metadata.token_map
    if token_map is None:
        raise TopologyError("the driver has no token map (token metadata disabled?)")
    replicas_of: dict[int, list[int]] = {}
    for token in token_map.ring:
        hosts = token_map.get_replicas(keyspace, token)
        sidecars = []
        for host in hosts:
            sidecar = sidecar_of_host.get(host.address)
            if sidecar is None:
                raise TopologyError(f"Cassandra node {host.address} has no sidecar in the config")
            sidecars.append(sidecar)
        replicas_of[token.value] = sidecars
    return shards_from_ring(
        list(replicas_of),
        replicas_of,
        electorate_size=electorate_size,
        electorate_preference=electorate_preference,
    )
