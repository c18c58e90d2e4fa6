"""Cassandra's last-write-wins under `USING TIMESTAMP`, as the Accord write path relies on it.

Accord applies a transaction's writes with a timestamp derived from its executeAt, so that
re-applying them (retries, recovery, several replicas) is idempotent and a lower executeAt
never overwrites a higher one. Equal timestamps are NOT resolved by arrival order:

- a tombstone beats a live cell (a DELETE wins over an INSERT at the same timestamp);
- between live cells the greater value wins, comparing serialized bytes unsigned (so the
  int -1, 0xFFFFFFFF, beats 1).

Two conflicting transactions mapped to one timestamp would therefore be resolved by their
values, not by Accord's order: the executeAt -> timestamp mapping must be injective.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.cluster import Session

from accord_cassandra.launcher import CassandraHandle

pytestmark = pytest.mark.cassandra

KEYSPACE = "timestamp_check"


@pytest.fixture(scope="module")
def session(cassandra_node: CassandraHandle) -> Iterator[Session]:
    session = cassandra_node.connect()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.cells (k text PRIMARY KEY, v text)", timeout=120
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.ints (k text PRIMARY KEY, v int)", timeout=120
    )
    session.set_keyspace(KEYSPACE)
    yield session
    cassandra_node.drop_keyspace(session, KEYSPACE)


def _insert(session: Session, key: str, value: Any, ts: int, table: str = "cells") -> None:
    statement = f"INSERT INTO {table} (k, v) VALUES (%s, %s) USING TIMESTAMP {ts}"
    session.execute(statement, (key, value))


def _delete(session: Session, key: str, ts: int) -> None:
    session.execute(f"DELETE FROM cells USING TIMESTAMP {ts} WHERE k = %s", (key,))


def _read(session: Session, key: str, table: str = "cells") -> tuple[Any, int] | None:
    row = session.execute(f"SELECT v, writetime(v) AS wt FROM {table} WHERE k = %s", (key,)).one()
    return None if row is None else (row.v, row.wt)


def test_reapplying_a_write_is_a_no_op(session: Session) -> None:
    _insert(session, "replay", "a", 1000)
    _insert(session, "replay", "a", 1000)
    assert _read(session, "replay") == ("a", 1000)
    _insert(session, "replay", "b", 2000)
    _insert(session, "replay", "a", 1000)
    assert _read(session, "replay") == ("b", 2000)


def test_lower_timestamp_never_overwrites_higher(session: Session) -> None:
    _insert(session, "order", "b", 2000)
    # "z" > "b": had the timestamps tied, "z" would win; a lower timestamp never does.
    _insert(session, "order", "z", 1999)
    assert _read(session, "order") == ("b", 2000)


def test_delete_at_lower_timestamp_does_not_shadow_higher_write(session: Session) -> None:
    _insert(session, "late-delete", "b", 2000)
    _delete(session, "late-delete", 1999)
    assert _read(session, "late-delete") == ("b", 2000)
    # A delete applied first still shadows only what is at or below its own timestamp.
    _delete(session, "early-delete", 1999)
    _insert(session, "early-delete", "c", 2000)
    assert _read(session, "early-delete") == ("c", 2000)


def test_replayed_write_below_a_delete_stays_deleted(session: Session) -> None:
    _insert(session, "gone", "a", 1000)
    _delete(session, "gone", 1001)
    _insert(session, "gone", "a", 1000)
    assert _read(session, "gone") is None


@pytest.mark.parametrize("delete_first", [False, True])
def test_equal_timestamp_tombstone_beats_live_cell(session: Session, delete_first: bool) -> None:
    key = f"tie-delete-{delete_first}"
    if delete_first:
        _delete(session, key, 3000)
        _insert(session, key, "a", 3000)
    else:
        _insert(session, key, "a", 3000)
        _delete(session, key, 3000)
    assert _read(session, key) is None


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_equal_timestamp_greater_value_wins(session: Session, order: tuple[str, str]) -> None:
    key = f"tie-value-{''.join(order)}"
    for value in order:
        _insert(session, key, value, 4000)
    assert _read(session, key) == ("b", 4000)


@pytest.mark.parametrize("order", [(1, -1), (-1, 1)])
def test_equal_timestamp_compares_bytes_unsigned(session: Session, order: tuple[int, int]) -> None:
    key = f"tie-int-{order[0]}"
    for value in order:
        _insert(session, key, value, 5000, table="ints")
    assert _read(session, key, table="ints") == (-1, 5000)
