"""Window math, pure (no Cassandra): the dual-window rule, midnight and year rollover.

Reference: seed 000 Part 4, "The Dual-Window Model" (writers W+1, readers <= W, 1439 + 1 is
window 0 of the next day) and the Properties Reference (window-interval-minutes divides 1440;
restore window = W + delay-windows).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacksaga_store.errors import InvariantViolation
from stacksaga_store.recovery.windows import WindowId, WindowMath

DIVISORS = [d for d in range(1, 1441) if 1440 % d == 0]
instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC)
)


def test_seed_example_14_23() -> None:
    """The seed writes "14:23 UTC -> W = 1423" (the clock time as HHMM). Windows are numbered
    0..1439 by minute of day (seed: "0 through 1439"), so 14:23 is window 863."""
    windows = WindowMath(1)
    now = datetime(2026, 7, 22, 14, 23, 40, tzinfo=UTC)
    current = windows.window_at(now)
    assert (current.index, windows.minute_of_day(current)) == (863, 863)
    assert windows.retry_window(now).index == 864
    assert windows.readable(current, now)
    assert not windows.readable(windows.retry_window(now), now)


def test_midnight_rollover_goes_to_window_0_of_the_next_day() -> None:
    windows = WindowMath(1)
    now = datetime(2026, 7, 22, 23, 59, 5, tzinfo=UTC)
    assert windows.window_at(now) == WindowId(date(2026, 7, 22), 1439)
    assert windows.retry_window(now) == WindowId(date(2026, 7, 23), 0)


def test_year_rollover_and_leap_day() -> None:
    windows = WindowMath(5)
    assert windows.retry_window(datetime(2031, 12, 31, 23, 58, tzinfo=UTC)) == WindowId(
        date(2032, 1, 1), 0
    )
    # 2032 is a leap year: Feb 28 + 1 day of windows is Feb 29.
    start = WindowId(date(2032, 2, 28), 100)
    assert windows.shift(start, windows.windows_per_day) == WindowId(date(2032, 2, 29), 100)


def test_restore_window_crosses_days() -> None:
    windows = WindowMath(1)
    now = datetime(2026, 7, 22, 20, 0, tzinfo=UTC)
    # The seed's default: 600 one-minute windows = 10 hours ahead, i.e. 06:00 next day.
    assert windows.restore_window(now, 600) == WindowId(date(2026, 7, 23), 360)
    # With 2-minute windows the same delay is 1200 minutes ahead.
    two = WindowMath(2)
    assert two.start(two.restore_window(now, 600)) == now + timedelta(minutes=1200)


def test_interval_must_divide_the_day() -> None:
    with pytest.raises(InvariantViolation):
        WindowMath(7)
    assert len(DIVISORS) == 36


@given(instants, st.sampled_from(DIVISORS))
def test_window_contains_its_instant(instant: datetime, interval: int) -> None:
    windows = WindowMath(interval)
    window = windows.window_at(instant)
    assert windows.start(window) <= instant < windows.end(window)
    assert windows.from_key(window.date_of_year, windows.minute_of_day(window)) == window


@given(instants, st.sampled_from(DIVISORS), st.integers(-100_000, 100_000))
def test_shift_is_time_arithmetic(instant: datetime, interval: int, count: int) -> None:
    windows = WindowMath(interval)
    window = windows.window_at(instant)
    moved = windows.shift(window, count)
    assert windows.start(moved) == windows.start(window) + count * windows.interval
    assert windows.distance(window, moved) == count
    assert (moved > window) == (count > 0)


@given(instants, instants, st.sampled_from(DIVISORS))
def test_writers_and_readers_never_share_a_window(
    writer_now: datetime, reader_now: datetime, interval: int
) -> None:
    """The dual-window invariant: a window a reader may read at time r was never a write
    target at any time w <= r... except from a writer whose clock is behind the reader's
    (w < r): then W(w)+1 <= W(r) is possible only once the window started, which is what
    "sealed" means; at equal times they never meet."""
    windows = WindowMath(interval)
    now = max(writer_now, reader_now)
    assert not windows.readable(windows.retry_window(now), now)
    assert windows.readable(windows.window_at(now), now)


@given(instants, st.sampled_from(DIVISORS), st.integers(0, 3600))
def test_read_grace_only_delays_reading(instant: datetime, interval: int, grace: int) -> None:
    windows = WindowMath(interval)
    window = windows.window_at(instant)
    grace_delta = timedelta(seconds=grace)
    if windows.readable(window, instant, grace_delta):
        assert windows.readable(window, instant)
    assert windows.readable(window, instant + grace_delta, grace_delta)


@given(instants, st.sampled_from(DIVISORS))
def test_dates_sort_like_windows(first: datetime, interval: int) -> None:
    windows = WindowMath(interval)
    a = windows.window_at(first)
    b = windows.shift(a, windows.windows_per_day * 400 + 1)
    assert (a.date_of_year < b.date_of_year) and a < b
