"""How a sidecar cuts one transaction's writes into Cassandra requests
(accord_cassandra.cql_requests.write_chunks): every write exactly once, one partition's writes
together, one now_in_seconds per request, and no batch of several partitions that Cassandra's
default thresholds warn about (over 10 partitions, or over 5 KiB)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from accord import Key, WriteOp
from accord.primitives.keys import sim_key
from accord_cassandra.cql_requests import (
    WRITE_BATCH_BYTES_MAX,
    WRITE_BATCH_PARTITIONS_MAX,
    PlannedWrite,
    write_chunks,
    write_size,
)

CASSANDRA_BATCH_SIZE_WARN_BYTES = 5 * 1024
CASSANDRA_UNLOGGED_PARTITIONS_WARN = 10


@st.composite
def plans(draw: st.DrawFn) -> list[PlannedWrite]:
    keys = [sim_key(f"p{n}") for n in range(draw(st.integers(1, 40)))]
    planned: list[PlannedWrite] = []
    for index in range(draw(st.integers(1, 120))):
        key: Key = draw(st.sampled_from(keys))
        now = draw(st.sampled_from([None, 1_800_000_000]))
        size = draw(st.integers(50, 6_000))
        planned.append(PlannedWrite(key, f"statement-{index}", [index], now, size))
    return planned


@given(plans())
def test_every_write_once_in_requests_cassandra_takes_without_a_warning(
    planned: list[PlannedWrite],
) -> None:
    chunks = write_chunks(planned)
    assert Counter(id(w) for chunk in chunks for w in chunk) == Counter(id(w) for w in planned)
    home: dict[tuple[Key, int | None], int] = {}
    for number, chunk in enumerate(chunks):
        assert chunk
        assert len({w.now for w in chunk}) == 1, "a request has one now_in_seconds"
        partitions = {w.key for w in chunk}
        if len(partitions) > 1:
            assert len(partitions) <= WRITE_BATCH_PARTITIONS_MAX
            assert sum(w.size for w in chunk) <= WRITE_BATCH_BYTES_MAX
        for w in chunk:
            # A partition's writes share a chunk unless together they are over the bytes.
            place = home.setdefault((w.key, w.now), number)
            if place != number:
                together = sum(x.size for x in planned if (x.key, x.now) == (w.key, w.now))
                assert together > WRITE_BATCH_BYTES_MAX
                assert partitions == {w.key}


def test_the_limits_sit_under_cassandras_default_warnings() -> None:
    assert WRITE_BATCH_PARTITIONS_MAX <= CASSANDRA_UNLOGGED_PARTITIONS_WARN
    assert WRITE_BATCH_BYTES_MAX < CASSANDRA_BATCH_SIZE_WARN_BYTES


def test_forty_small_writes_over_thirty_partitions_are_a_handful_of_requests() -> None:
    keys = [sim_key(f"p{n}") for n in range(30)]
    planned = [
        PlannedWrite(keys[n % 30], n, [n], None, write_size(WriteOp(keys[n % 30], (n, "x" * 40))))
        for n in range(40)
    ]
    chunks = write_chunks(planned)
    assert len(chunks) == 3  # 10 partitions each
    assert [len({w.key for w in c}) for c in chunks] == [10, 10, 10]


def test_write_size_counts_values_and_cells() -> None:
    key = sim_key("p")
    small = write_size(WriteOp(key, (1, "a")))
    assert write_size(WriteOp(key, (1, "a" * 1001))) >= small + 1000
    assert write_size(WriteOp(key, (1, "a"), clustering=("c" * 500,))) >= small + 500
    assert write_size(WriteOp(key, (1, "a", 2, "b"))) > small
