"""CQL probes: whether a node answers, and whether it sees every node of the ring up."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cassandra.cluster import Cluster


def tcp_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return True
    except OSError:
        return False


def driver_cluster(
    contact_points: Sequence[str],
    port: int,
    *,
    only: str | None = None,
    timeout: float = 20.0,
    credentials: tuple[str, str] | None = None,
) -> Cluster:
    """A cassandra-driver Cluster; `only` pins every request to one node (no failover);
    `credentials` (user, password) for nodes that run PasswordAuthenticator."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import (
        DCAwareRoundRobinPolicy,
        FallthroughRetryPolicy,
        TokenAwarePolicy,
        WhiteListRoundRobinPolicy,
    )

    if only:
        # Pinned probes must see the node's own answer (e.g. Unavailable), not the driver's
        # NoHostAvailable after it found no other host to retry on.
        profile = ExecutionProfile(
            load_balancing_policy=WhiteListRoundRobinPolicy([only]),
            retry_policy=FallthroughRetryPolicy(),
            request_timeout=timeout,
        )
    else:
        policy = TokenAwarePolicy(DCAwareRoundRobinPolicy())
        profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=timeout)
    return Cluster(
        list(contact_points),
        port=port,
        # v5 is Cassandra 5.0's; pinning it skips the driver's downgrade handshake.
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
        auth_provider=PlainTextAuthProvider(*credentials) if credentials is not None else None,
    )


def query_release_version(
    ip: str, port: int, timeout: float = 10.0, credentials: tuple[str, str] | None = None
) -> str:
    cluster = driver_cluster([ip], port, only=ip, timeout=timeout, credentials=credentials)
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return str(row.release_version)
    finally:
        cluster.shutdown()


def ring_view(
    ip: str, port: int, nodes: int, credentials: tuple[str, str] | None = None
) -> bool | None:
    """Whether the node at ip, as coordinator, sees every node of the ring up.

    True: all up; False: it reports a replica down (Unavailable); None: no answer yet.
    A CL ALL range read of system_distributed (RF 3) needs every replica alive in the
    coordinator's failure detector; with 2 nodes, QUORUM of RF 3 already means both.
    """
    from cassandra import ConsistencyLevel, Unavailable
    from cassandra.query import SimpleStatement

    level = ConsistencyLevel.ALL if nodes >= 3 else ConsistencyLevel.QUORUM
    query = SimpleStatement(
        "SELECT * FROM system_distributed.repair_history LIMIT 1", consistency_level=level
    )
    cluster = driver_cluster([ip], port, only=ip, timeout=10.0, credentials=credentials)
    try:
        cluster.connect().execute(query)
    except Unavailable:
        return False
    except Exception:  # noqa: BLE001 - not ready, or timed out: the caller polls again
        return None
    finally:
        cluster.shutdown()
    return True
