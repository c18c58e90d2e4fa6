"""The one hand-driven clock for tests of Accord nodes (``accord.api.Clock``).

Tests move it by assigning or adding to ``micros``, backwards too (a clock that steps back
across a restart is a scenario). The saga store's tests use the datetime-based
:class:`stacksaga_store.clock.ManualClock` instead, which is library code.
"""

from __future__ import annotations

START_MICROS = 1_000_000


class ManualClock:
    """Accord's clock, advanced only by the test."""

    def __init__(self, micros: int = START_MICROS) -> None:
        self.micros = micros

    def now_micros(self) -> int:
        return self.micros


__all__ = ["START_MICROS", "ManualClock"]
