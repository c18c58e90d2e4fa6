"""write_timestamp: executeAt -> Cassandra write timestamp, injective and order-preserving.

Cassandra resolves equal write timestamps by cell content, not arrival (a tombstone wins,
then the larger value), so two conflicting transactions must never share one; and a lower
executeAt must never overwrite a higher one, so the mapping must keep Accord's order.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord import Key, RowAt, Timestamp, WriteOp
from accord_cassandra.datastore import (
    HLC_BASE_MICROS,
    MAX_NODE_ID,
    write_timestamp,
)
from accord_cassandra.memory_store import MemoryDataStore

# HLC values are wall-clock microseconds: from the mapping's base (2024) to beyond 2090.
hlcs = st.one_of(
    st.integers(HLC_BASE_MICROS, HLC_BASE_MICROS + 2**51 - 1),
    st.integers(HLC_BASE_MICROS + 1_000_000_000_000, HLC_BASE_MICROS + 1_000_000_001_000),
)


@st.composite
def same_epoch_timestamps(draw: st.DrawFn, epoch: int) -> Timestamp:
    return Timestamp(epoch, draw(hlcs), draw(st.integers(0, 3)), draw(st.integers(0, MAX_NODE_ID)))


@given(
    epoch=st.integers(0, 5),
    data=st.data(),
)
def test_injective_and_order_preserving_within_an_epoch(epoch: int, data: st.DataObject) -> None:
    stamps = data.draw(st.lists(same_epoch_timestamps(epoch), min_size=2, max_size=30))
    for a, b in itertools.combinations(stamps, 2):
        assert (a < b) == (write_timestamp(a) < write_timestamp(b))
        assert (a == b) == (write_timestamp(a) == write_timestamp(b))


@given(same_epoch_timestamps(1))
def test_fits_a_signed_64_bit_cassandra_timestamp(stamp: Timestamp) -> None:
    assert 0 <= write_timestamp(stamp) < 2**63


def test_same_hlc_on_two_nodes_gives_two_timestamps() -> None:
    # The case the tie-break makes dangerous: equal HLCs minted by different coordinators.
    hlc = HLC_BASE_MICROS + 123_456
    stamps = {write_timestamp(Timestamp(1, hlc, 1, node)) for node in range(1, 4)}
    assert len(stamps) == 3


@pytest.mark.parametrize("node", [MAX_NODE_ID + 1, 4096, -1])
def test_node_ids_beyond_ten_bits_are_refused(node: int) -> None:
    with pytest.raises(ValueError, match=rf"node id {node} exceeds {MAX_NODE_ID}"):
        write_timestamp(Timestamp(1, HLC_BASE_MICROS + 1, 0, node))
    assert MAX_NODE_ID == 1023


def test_flags_beyond_two_bits_are_refused() -> None:
    with pytest.raises(ValueError, match="flags 4"):
        write_timestamp(Timestamp(1, HLC_BASE_MICROS + 1, 4, 1))


@given(
    st.lists(
        st.tuples(same_epoch_timestamps(1), st.integers(0, 9), st.booleans()),
        min_size=1,
        max_size=12,
        unique_by=lambda t: t[0],
    ),
    st.randoms(use_true_random=False),
)
def test_memory_store_is_last_write_wins_in_executeat_order(
    writes: list[tuple[Timestamp, int, bool]], rng: object
) -> None:
    # Applied in any order and replayed, the store ends with the highest executeAt's write.
    key = Key(1, "t.t:00")
    store = MemoryDataStore()
    shuffled = writes + writes[: len(writes) // 2]
    rng.shuffle(shuffled)  # type: ignore[attr-defined]

    async def apply() -> object:
        for stamp, value, delete in shuffled:
            await store.write([WriteOp(key, (value,), delete=delete)], stamp)
        return (await store.read([RowAt(key)], max(writes)[0]))[key].get(RowAt(key))

    _, value, delete = max(writes)
    assert asyncio.run(apply()) == (None if delete else (value,))
