"""A suite for tests/bench/test_interrupts.py, shaped like bench/floor.py: processes in
sessions of their own, one started around ``asyncio.run`` (floor's Cassandra), one inside
its coroutine (floor's sidecars), then a wait: a blocking one, as a sidecar start's, or an
``await``; or no wait, so that the run goes straight to its cleanup. It reports each step on
stdout for the test to wait on, and the pids it started."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.interrupts import cleanup

WAIT_SECONDS = 120.0
GO_SECONDS = 20.0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Sleeper:
    """A child process that only stops when told to, in a session of its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            # Not the suite's pipes: a child left running would hold the test's reads open.
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        say(f"started {name} {self.process.pid}")

    def __enter__(self) -> Sleeper:
        return self

    def __exit__(self, *_: object) -> None:
        with cleanup():
            say(f"stopping {self.name}")
            go = os.environ.get("STUB_SUITE_GO")
            # The test signals us here, then lets the cleanup go on; bounded, so that a test
            # whose signal went elsewhere fails rather than waits for ever.
            deadline = time.monotonic() + GO_SECONDS
            while go is not None and not Path(go).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.process.terminate()
            self.process.wait(timeout=30)
            say(f"stopped {self.name}")


async def _measure(wait: str) -> None:
    with Sleeper("sidecar"):
        say("measuring")
        if wait == "blocking":
            time.sleep(WAIT_SECONDS)
        elif wait == "awaiting":
            await asyncio.sleep(WAIT_SECONDS)
        await asyncio.sleep(0)


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    wait = os.environ["STUB_SUITE_WAIT"]
    with Sleeper("cassandra"):
        asyncio.run(_measure(wait))
    return {"title": "stub", "figures": []}
