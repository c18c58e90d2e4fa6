"""The rule for how long a replica waits before recovering a txn (accord/local/recover_delay.py)."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from accord.invariants import InvalidArgument
from accord.local.recover_delay import RecoverDelay, learned_delay
from accord.primitives import Timestamp, TxnId

MS = 1_000


def txn(n: int) -> TxnId:
    return Timestamp(1, n, 0, 1)


def delay(**overrides: object) -> RecoverDelay:
    settings: dict[str, object] = {
        "floor_micros": 1_000 * MS,
        "floor_other_micros": 3_000 * MS,
        "adaptive": True,
        "factor": 2.0,
        "percentile": 99.0,
        "max_micros": 8_000 * MS,
        "window": 100,
    }
    settings.update(overrides)
    return RecoverDelay(**settings)  # type: ignore[arg-type]


def feed(
    rule: RecoverDelay, latencies: list[int], *, first: int = 0, recovered: bool = False
) -> None:
    for offset, latency in enumerate(latencies):
        txn_id = txn(first + offset)
        rule.witnessed(txn_id, 10_000 * MS)
        rule.applied(txn_id, 10_000 * MS + latency, recovered=recovered)


def test_nearest_rank_percentile_times_the_factor() -> None:
    samples = [(i + 1) * MS for i in range(100)]  # 1..100 ms, shuffled order must not matter
    samples.reverse()
    assert learned_delay(samples, factor=2.0, percentile=99.0, max_micros=10**9) == 198 * MS
    assert learned_delay(samples, factor=2.0, percentile=100.0, max_micros=10**9) == 200 * MS
    assert learned_delay(samples, factor=3.0, percentile=50.0, max_micros=10**9) == 150 * MS
    # Nearest rank: of 10 samples the 99th percentile is the largest, the 90th the 9th.
    ten = [(i + 1) * MS for i in range(10)]
    assert learned_delay(ten, factor=1.0, percentile=99.0, max_micros=10**9) == 10 * MS
    assert learned_delay(ten, factor=1.0, percentile=90.0, max_micros=10**9) == 9 * MS
    assert learned_delay([], factor=2.0, percentile=99.0, max_micros=10**9) == 0


def test_a_high_percentile_of_a_full_window_picks_the_nearest_rank() -> None:
    # A high percentile takes the few largest samples, not a sort: the same nearest rank,
    # ties and a deque window included.
    rng = random.Random(15)
    for _ in range(300):
        window = deque((rng.randrange(50) * MS for _ in range(rng.randint(1, 600))), maxlen=512)
        percentile = rng.choice([50.0, 90.0, 95.0, 99.0, 99.9, 100.0])
        ordered = sorted(window)
        rank = min(len(ordered) - 1, max(0, math.ceil(len(ordered) * percentile / 100) - 1))
        expected = ordered[rank]
        assert learned_delay(window, factor=1.0, percentile=percentile, max_micros=10**9) == (
            expected
        )


def test_the_cap_bounds_the_learned_delay() -> None:
    assert learned_delay([5_000 * MS], factor=2.0, percentile=99.0, max_micros=8_000 * MS) == (
        8_000 * MS
    )


def test_floors_hold_until_latency_exceeds_them() -> None:
    rule = delay()
    assert (rule.home(), rule.other()) == (1_000 * MS, 3_000 * MS)
    feed(rule, [100 * MS] * 50)  # fast txns: 2 x 100 ms stays under the floors
    assert rule.sample_count() == 50
    assert (rule.home(), rule.other()) == (1_000 * MS, 3_000 * MS)


def test_the_delay_grows_with_latency_and_others_keep_their_lead() -> None:
    rule = delay()
    feed(rule, [900 * MS] * 98 + [1_400 * MS, 1_500 * MS])
    # p99 of 100 samples is the 99th smallest: 1.4 s; twice that 2.8 s.
    assert rule.home() == 2_800 * MS
    assert rule.other() == 2_800 * MS + 2_000 * MS
    feed(rule, [6_000 * MS] * 100, first=1_000)
    assert rule.home() == 8_000 * MS  # capped
    assert rule.other() == 10_000 * MS


def test_the_window_forgets_old_latencies() -> None:
    rule = delay(window=10)
    feed(rule, [3_000 * MS] * 10)
    assert rule.home() == 6_000 * MS
    feed(rule, [200 * MS] * 10, first=100)
    assert rule.home() == 1_000 * MS


def test_recovered_txns_do_not_count() -> None:
    rule = delay()
    # A crashed coordinator's txns apply after the delay: counting them would double it.
    feed(rule, [1_200 * MS] * 20, recovered=True)
    assert rule.sample_count() == 0
    assert rule.home() == 1_000 * MS


def test_only_the_first_preaccept_starts_the_clock() -> None:
    rule = delay()
    rule.witnessed(txn(1), 0)
    rule.witnessed(txn(1), 2_000 * MS)  # a re-sent PreAccept
    rule.applied(txn(1), 2_500 * MS, recovered=False)
    assert rule.home() == 5_000 * MS
    rule.applied(txn(2), 9_000 * MS, recovered=False)  # never witnessed here: no sample
    assert rule.sample_count() == 1


def test_fixed_mode_ignores_latency() -> None:
    rule = delay(adaptive=False)
    feed(rule, [5_000 * MS] * 50)
    assert rule.sample_count() == 0
    assert (rule.home(), rule.other()) == (1_000 * MS, 3_000 * MS)


def test_tracking_is_bounded_oldest_first() -> None:
    rule = delay(max_tracked=2)
    rule.witnessed(txn(1), 0)
    rule.witnessed(txn(2), 0)
    rule.witnessed(txn(3), 0)  # forgets txn 1
    rule.applied(txn(1), 5_000 * MS, recovered=False)
    assert rule.sample_count() == 0
    rule.applied(txn(3), 700 * MS, recovered=False)
    assert rule.sample_count() == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"factor": 0.5}, "factor"),
        ({"percentile": 0.0}, "percentile"),
        ({"percentile": 101.0}, "percentile"),
        ({"max_micros": 500 * MS}, "recover_delay_max_micros"),
        ({"window": 0}, "window"),
    ],
)
def test_bad_settings_are_refused_by_name(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        delay(**overrides)
