"""The project's token function equals Cassandra's `token(pk)` for every key type we route.

Random keys are seeded (seed printed in the assertion messages) and cover every tail length
and bytes >= 0x80 in the tail, the case where mmh3 and Cassandra disagree.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

from accord_cassandra.launcher import CassandraHandle
from accord_cassandra.tokens import (
    bigint_key,
    blob_key,
    composite_key,
    int_key,
    murmur3_token,
    text_key,
    uuid_key,
)

pytestmark = pytest.mark.cassandra

SEED = 20261129
KEYSPACE = "token_check"
KEYS_PER_TYPE = 1000
# Code points from ASCII, Latin-1, Cyrillic, CJK and the astral plane (4-byte UTF-8).
ALPHABETS = [(0x20, 0x7E), (0xA0, 0xFF), (0x400, 0x4FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F5FF)]

TABLES = {
    "t_text": "pk text PRIMARY KEY",
    "t_blob": "pk blob PRIMARY KEY",
    "t_int": "pk int PRIMARY KEY",
    "t_bigint": "pk bigint PRIMARY KEY",
    "t_uuid": "pk uuid PRIMARY KEY",
}


@pytest.fixture(scope="module")
def session(cassandra_node: CassandraHandle) -> Iterator[Session]:
    session = cassandra_node.connect()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    for table, columns in TABLES.items():
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.{table} ({columns})", timeout=120)
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.t_composite (a text, b int, PRIMARY KEY ((a, b)))"
    )
    yield session
    cassandra_node.drop_keyspace(session, KEYSPACE)


def _random_text(rng: random.Random) -> str:
    length = rng.randint(1, 40)
    return "".join(chr(rng.randint(*rng.choice(ALPHABETS))) for _ in range(length))


def _random_blob(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randint(1, 48))


def _distinct(make: Callable[[random.Random], Any], count: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    values: set[Any] = set()
    while len(values) < count:
        values.add(make(rng))
    return sorted(values)


def _cassandra_tokens(session: Session, table: str, rows: Sequence[tuple[Any, ...]]) -> dict:
    columns = "a, b" if table == "t_composite" else "pk"
    marks = ", ".join("?" for _ in columns.split(","))
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{table} ({columns}) VALUES ({marks})")
    results = execute_concurrent_with_args(session, insert, rows, concurrency=64)
    assert all(ok for ok, _ in results)
    query = f"SELECT {columns}, token({columns}) AS t FROM {KEYSPACE}.{table}"
    return {tuple(row[:-1]): row.t for row in session.execute(query)}


def _assert_tokens_match(
    session: Session, table: str, keys: Sequence[Any], routing_key: Callable[[Any], bytes]
) -> None:
    expected = {(k,): murmur3_token(routing_key(k)) for k in keys}
    actual = _cassandra_tokens(session, table, list(expected))
    assert len(actual) == len(keys)
    wrong = {k: (expected[k], actual[k]) for k in expected if expected[k] != actual[k]}
    assert not wrong, f"seed {SEED}: {len(wrong)} mismatches, e.g. {list(wrong.items())[:3]}"


def _high_tail(data: bytes) -> bool:
    tail = data[len(data) - len(data) % 16 :]
    return any(b >= 0x80 for b in tail)


def test_text_tokens_match_cassandra(session: Session) -> None:
    keys = [*_distinct(_random_text, KEYS_PER_TYPE, SEED), "ключ"]
    assert sum(_high_tail(text_key(k)) for k in keys) > KEYS_PER_TYPE // 2
    _assert_tokens_match(session, "t_text", keys, text_key)


def test_blob_tokens_match_cassandra(session: Session) -> None:
    edge_cases = [bytes([0x80] * n) for n in range(1, 33)] + [bytes([0xFF] * 15)]
    keys = sorted(set(_distinct(_random_blob, KEYS_PER_TYPE, SEED + 1)) | set(edge_cases))
    assert sum(_high_tail(k) for k in keys) > KEYS_PER_TYPE // 2
    _assert_tokens_match(session, "t_blob", keys, blob_key)


def test_known_vector_matches_cassandra(session: Session) -> None:
    tokens = _cassandra_tokens(session, "t_text", [("ключ",)])
    assert tokens[("ключ",)] == murmur3_token(text_key("ключ")) == 1182936647932017555


def test_int_bigint_uuid_tokens_match_cassandra(session: Session) -> None:
    rng = random.Random(SEED + 2)
    ints = sorted({rng.randint(-(2**31), 2**31 - 1) for _ in range(200)} | {0, -1, 2**31 - 1})
    bigints = sorted({rng.randint(-(2**63), 2**63 - 1) for _ in range(200)} | {-(2**63)})
    uuids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(200)]
    _assert_tokens_match(session, "t_int", ints, int_key)
    _assert_tokens_match(session, "t_bigint", bigints, bigint_key)
    _assert_tokens_match(session, "t_uuid", uuids, uuid_key)


def test_composite_tokens_match_cassandra(session: Session) -> None:
    rng = random.Random(SEED + 3)
    rows = sorted({(_random_text(rng), rng.randint(-(2**31), 2**31 - 1)) for _ in range(300)})
    expected = {(a, b): murmur3_token(composite_key([text_key(a), int_key(b)])) for a, b in rows}
    actual = _cassandra_tokens(session, "t_composite", rows)
    assert actual == expected
