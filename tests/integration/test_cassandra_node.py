"""A launched node is a real Cassandra 5.0 that stores and returns data."""

from __future__ import annotations

import pytest

from accord_cassandra.launcher import CassandraHandle

pytestmark = pytest.mark.cassandra


def test_node_reports_release_5_0(cassandra_node: CassandraHandle) -> None:
    session = cassandra_node.connect()
    row = session.execute("SELECT release_version FROM system.local").one()
    assert row.release_version.startswith("5.0")


def test_keyspace_and_table_can_be_written_and_read(cassandra_node: CassandraHandle) -> None:
    session = cassandra_node.connect()
    session.execute(
        "CREATE KEYSPACE IF NOT EXISTS smoke WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        session.execute(
            "CREATE TABLE IF NOT EXISTS smoke.kv (k text PRIMARY KEY, v int)", timeout=120
        )
        insert = session.prepare("INSERT INTO smoke.kv (k, v) VALUES (?, ?)")
        for i in range(10):
            session.execute(insert, (f"key-{i}", i))
        rows = {r.k: r.v for r in session.execute("SELECT k, v FROM smoke.kv")}
        assert rows == {f"key-{i}": i for i in range(10)}
    finally:
        cassandra_node.drop_keyspace(session, "smoke")
