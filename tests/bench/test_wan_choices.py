"""The latency suite's configuration choices: nearest electorate and coordinate_via."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from accord.topology import fast_quorum_size
from bench import latency_cassandra
from bench.wan import RttMatrix, fast_quorum_rtt_ms, nearest_electorate

REGIONS = ["A", "B", "C"]


def test_default_matrix_picks_a_and_b_and_c_coordinates_via_a() -> None:
    matrix = RttMatrix()
    assert nearest_electorate(matrix, REGIONS, 2, 2) == (0, 1)
    wan = next(v for v in latency_cassandra.variants(matrix) if v.name == "WAN")
    assert wan.electorate == (1, 2)
    # A and B: 10 + 10 ms at home; C: 80 + 40 at home against 40 to A + 20 there.
    assert [wan.own_ms(matrix, r) for r in REGIONS] == [20.0, 20.0, 120.0]
    assert latency_cassandra.delegates(matrix, wan) == {3: 1}
    via = next(v for v in latency_cassandra.variants(matrix) if v.name == "WAN + via")
    assert via.via == {3: 1} and via.floor_ms(matrix, "C")[0] == 60.0
    assert via.floor_ms(matrix, "A") == wan.floor_ms(matrix, "A")


@given(st.lists(st.integers(1, 200), min_size=3, max_size=3), st.integers(2, 3))
def test_the_chosen_electorate_is_no_worse_than_any_other(rtts: list[int], size: int) -> None:
    matrix = RttMatrix.parse(",".join(map(str, rtts)))
    fq = fast_quorum_size(3, size)

    def cost(members: tuple[int, ...]) -> float:
        voters = [REGIONS[i] for i in members]
        return sum(fast_quorum_rtt_ms(matrix, r, voters, fq) for r in REGIONS)

    chosen = nearest_electorate(matrix, REGIONS, size, fq)
    assert len(chosen) == size
    assert all(cost(chosen) <= cost(c) for c in itertools.combinations(range(3), size))
