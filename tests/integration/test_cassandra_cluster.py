"""RF=3 on three nodes: QUORUM reads and writes survive one node being down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cassandra import ConsistencyLevel, Unavailable
from cassandra.cluster import Session
from cassandra.query import SimpleStatement

from accord_cassandra.launcher import CassandraHandle

pytestmark = pytest.mark.cassandra

KEYSPACE = "quorum_check"
STOPPED = 2


@pytest.fixture
def session(cassandra_cluster: CassandraHandle) -> Iterator[Session]:
    session = cassandra_cluster.connect()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 3}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.kv (k text PRIMARY KEY, v int)", timeout=120
    )
    yield session
    cassandra_cluster.drop_keyspace(session, KEYSPACE)


def _write(session: Session, key: str, value: int, level: int) -> None:
    statement = SimpleStatement(
        f"INSERT INTO {KEYSPACE}.kv (k, v) VALUES (%s, %s)", consistency_level=level
    )
    session.execute(statement, (key, value))


def _read(session: Session, key: str, level: int) -> int | None:
    statement = SimpleStatement(
        f"SELECT v FROM {KEYSPACE}.kv WHERE k = %s", consistency_level=level
    )
    row = session.execute(statement, (key,)).one()
    return None if row is None else int(row.v)


def test_quorum_write_and_read_with_one_node_stopped(
    cassandra_cluster: CassandraHandle, session: Session
) -> None:
    quorum = ConsistencyLevel.QUORUM
    _write(session, "before", 1, quorum)

    cassandra_cluster.stop_node(STOPPED)
    try:
        # ALL needs the stopped replica: proves the node is really down, not just slow.
        with pytest.raises(Unavailable):
            _read(session, "before", ConsistencyLevel.ALL)
        _write(session, "during", 2, quorum)
        assert _read(session, "before", quorum) == 1
        assert _read(session, "during", quorum) == 2
    finally:
        cassandra_cluster.start_node(STOPPED)

    # Back to three replicas: ALL succeeds again and sees the write it missed.
    assert _read(session, "during", ConsistencyLevel.ALL) == 2
