"""Injected time for the saga store.

Wall-clock time enters the store in exactly two places: the timestamps written into
es_transaction / es_transaction_tryout / es_frozen_transaction, and the transaction lifetime
check that quarantines old transactions. Both read a :class:`Clock`, so a test can move time by
hours without sleeping (:class:`ManualClock`).

Lease expiry is *not* driven by this clock: a STRICT lease is a Cassandra TTL, which the server
expires on its own clock. Waiting for a lease therefore uses real time (``asyncio.sleep``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from stacksaga_store.errors import check_state

__all__ = ["Clock", "ManualClock", "SystemClock", "to_utc"]


class Clock(Protocol):
    """Source of "now" for the store. Must return timezone-aware UTC datetimes."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start: datetime) -> None:
        check_state(start.tzinfo is not None, "ManualClock needs a timezone-aware start")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by delta (never backward: timestamps in the store only grow)."""
        check_state(delta >= timedelta(0), f"ManualClock cannot go back ({delta})")
        self._now += delta
        return self._now


def to_utc(value: datetime) -> datetime:
    """cassandra-driver returns naive datetimes that are UTC; make them aware.

    Cassandra's ``timestamp`` has millisecond precision, so values read back are truncated.
    """
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
