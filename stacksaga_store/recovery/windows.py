"""Window math of the recovery directory (seed Part 4, "The Dual-Window Model").

Theory of operation
-------------------
A UTC day is cut into ``1440 / window-interval-minutes`` windows numbered 0, 1, 2, ...
(:class:`WindowId` = the day plus the window's index). The directory stores a window as two
partition-key columns: ``date_of_year`` (ISO text, ``2026-07-22``, so that Tier 1's clustering
order ``date_of_year ASC`` is chronological) and ``minute_of_day``, the window's *first minute*
(``index * interval``). With the default 1-minute windows that is exactly the seed's window
number 0..1439; with 5-minute windows the seed numbers 0..287 and we store 0, 5, ..., 1435.
Storing the minute instead of the index keeps the stored directory meaningful if an operator
changes the interval later (a window index would silently move to another time of day).

The rule that makes readers and writers never meet:

* writers (Standard-Nodes) put a retry pointer into ``W + 1`` and a restore watchdog into
  ``W + delay-windows``, where W is the window of their clock;
* readers (Retry-Nodes) read only windows ``<= W`` of *their* clock, i.e. windows that have
  started (:meth:`WindowMath.readable`), and not before :data:`READ_GRACE_FLOOR` past the
  start (:func:`reader_grace`).

Why a floor. With the seed's rule alone, a reader whose clock runs ahead of a writer's walks
W+1, and drops its buckets, while that writer still puts pointers into W+1 believing it is
early; such a pointer lands in a dropped bucket (its Tier-4 row gone, or its row shadowed by
the newer partition tombstone) and the saga waits for its watchdog. Lagging by more than the
skew, a reader only walks W+1 once every writer's clock is past W+1's start, and a writer
that sees its pointer acknowledged after that start writes it again into a later window
(:mod:`stacksaga_store.recovery.writer`). ``recovery.read-grace`` raises the lag further for
clocks that may disagree by more.

:meth:`WindowMath.shift` moves any number of windows across midnight and year ends (1439 + 1 is
window 0 of the next day). Everything here is pure: the current time always comes in as an
argument, so tests move days in microseconds (:class:`~stacksaga_store.clock.ManualClock`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from stacksaga_store.config.settings import MINUTES_PER_DAY
from stacksaga_store.errors import check_state

__all__ = [
    "READ_GRACE_FLOOR",
    "WindowId",
    "WindowMath",
    "date_text",
    "parse_date_text",
    "reader_grace",
]

# The least a reader lags a window's start (module docstring): more than the clock skew
# between hosts kept by NTP, and small beside a window (1 minute at least).
READ_GRACE_FLOOR = timedelta(seconds=5)


def reader_grace(configured: timedelta) -> timedelta:
    """The lag readers and Node-0's time gate use: ``recovery.read-grace``, at least the floor."""
    return max(configured, READ_GRACE_FLOOR)


@dataclass(frozen=True, slots=True, order=True)
class WindowId:
    """One window: a UTC day and the window's index within it (ordering is chronological)."""

    day: date
    index: int

    @property
    def year(self) -> int:
        return self.day.year

    @property
    def date_of_year(self) -> str:
        return date_text(self.day)

    def __str__(self) -> str:
        return f"{self.date_of_year}#{self.index}"


def date_text(day: date) -> str:
    """The ``date_of_year`` column value: ISO ``YYYY-MM-DD`` (sorts chronologically)."""
    return day.isoformat()


def parse_date_text(text: str) -> date:
    return date.fromisoformat(text)


class WindowMath:
    """Windows of ``interval_minutes`` (which must divide 1440, as the config enforces)."""

    def __init__(self, interval_minutes: int) -> None:
        check_state(
            1 <= interval_minutes <= MINUTES_PER_DAY and MINUTES_PER_DAY % interval_minutes == 0,
            f"window interval {interval_minutes} must divide {MINUTES_PER_DAY}",
        )
        self.interval_minutes = interval_minutes
        self.windows_per_day = MINUTES_PER_DAY // interval_minutes
        self.interval = timedelta(minutes=interval_minutes)

    # -- conversions --------------------------------------------------------------------------

    def window_at(self, instant: datetime) -> WindowId:
        """The window containing ``instant`` (which must be timezone-aware)."""
        check_state(instant.tzinfo is not None, "window math needs timezone-aware instants")
        utc = instant.astimezone(UTC)
        minute = utc.hour * 60 + utc.minute
        return WindowId(utc.date(), minute // self.interval_minutes)

    def start(self, window: WindowId) -> datetime:
        """First instant of the window (inclusive)."""
        self._check(window)
        midnight = datetime.combine(window.day, time(0), tzinfo=UTC)
        return midnight + window.index * self.interval

    def end(self, window: WindowId) -> datetime:
        """First instant after the window (exclusive)."""
        return self.start(window) + self.interval

    def minute_of_day(self, window: WindowId) -> int:
        """The stored ``minute_of_day``: the window's first minute."""
        self._check(window)
        return window.index * self.interval_minutes

    def from_key(self, date_of_year: str, minute_of_day: int) -> WindowId:
        """The window a stored (date_of_year, minute_of_day) pair names."""
        check_state(
            0 <= minute_of_day < MINUTES_PER_DAY and minute_of_day % self.interval_minutes == 0,
            f"minute_of_day {minute_of_day} is not a window start of {self.interval_minutes} min",
        )
        return WindowId(parse_date_text(date_of_year), minute_of_day // self.interval_minutes)

    def shift(self, window: WindowId, count: int) -> WindowId:
        """``count`` windows later (earlier if negative), across days and years."""
        self._check(window)
        absolute = window.index + count
        days, index = divmod(absolute, self.windows_per_day)
        return WindowId(window.day + timedelta(days=days), index)

    def distance(self, earlier: WindowId, later: WindowId) -> int:
        """How many windows ``later`` is after ``earlier`` (negative if before)."""
        days = (later.day - earlier.day).days
        return days * self.windows_per_day + later.index - earlier.index

    # -- the dual-window rule ---------------------------------------------------------------

    def retry_window(self, now: datetime) -> WindowId:
        """Where a writer puts a retry pointer: W + 1."""
        return self.shift(self.window_at(now), 1)

    def restore_window(self, now: datetime, delay_windows: int) -> WindowId:
        """Where a writer puts a restore watchdog: W + delay-windows."""
        check_state(delay_windows >= 1, "delay-windows must be >= 1")
        return self.shift(self.window_at(now), delay_windows)

    def read_limit(self, now: datetime, grace: timedelta = timedelta(0)) -> WindowId:
        """The newest window a reader may read: W of ``now - grace``.

        ``grace`` (extension, default 0 = the seed) absorbs clock skew between a writer whose
        clock is behind and a reader whose clock is ahead.
        """
        return self.window_at(now - grace)

    def readable(self, window: WindowId, now: datetime, grace: timedelta = timedelta(0)) -> bool:
        """Readers read windows <= W: the window has started (plus ``grace``)."""
        return window <= self.read_limit(now, grace)

    def closed(self, window: WindowId, now: datetime, grace: timedelta = timedelta(0)) -> bool:
        """Node-0's Gate 2: the current time is past the end of the window (plus ``grace``)."""
        return now >= self.end(window) + grace

    def day_closed(self, day: date, now: datetime, grace: timedelta = timedelta(0)) -> bool:
        """Every window of ``day`` is closed: no writer can target the day any more."""
        return now >= datetime.combine(day + timedelta(days=1), time(0), tzinfo=UTC) + grace

    def _check(self, window: WindowId) -> None:
        check_state(
            0 <= window.index < self.windows_per_day,
            f"window index {window.index} outside 0..{self.windows_per_day - 1}",
        )
