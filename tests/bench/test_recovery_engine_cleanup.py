"""bench/recovery_engine.py stops the sidecars it started, also when starting them failed.

LocalSidecars.start raises after some sidecar processes already run (one did not bind, or
did not report SERVING in time); the bench used to start them outside its try/finally, so
those processes outlived it.
"""

from __future__ import annotations

import asyncio

import pytest

from bench.recovery_engine import running


class HalfStarted:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.started = False
        self.stopped = False

    def start(self, timeout: float) -> None:
        self.started = True  # some processes run from here on
        if self.fail:
            raise RuntimeError("sidecar 2 did not start")

    def stop(self) -> None:
        self.stopped = True


def test_a_start_that_raises_still_stops_what_it_started() -> None:
    processes = HalfStarted(fail=True)

    async def use() -> None:
        async with running(processes, 1.0):
            raise AssertionError("the body must not run when start failed")

    with pytest.raises(RuntimeError, match="did not start"):
        asyncio.run(use())
    assert processes.started and processes.stopped


def test_the_processes_are_stopped_after_the_measurement() -> None:
    processes = HalfStarted(fail=False)
    ran = []

    async def use() -> None:
        async with running(processes, 1.0):
            ran.append(processes.stopped)

    asyncio.run(use())
    assert ran == [False] and processes.stopped
