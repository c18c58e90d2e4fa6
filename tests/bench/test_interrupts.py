"""``python -m bench <suite>`` stops at its first SIGINT (or SIGTERM) and stops what it started
(bench/interrupts.py), driven through bench's own main() with a suite shaped like floor's
(tests/bench/stub_suite.py): no Cassandra.

Before, a suite started in the background by a non-interactive shell inherited SIGINT
ignored and never stopped; in the foreground, asyncio.run's handler only cancelled the main
task, so a first SIGINT during a blocking wait (a sidecar start: up to a minute) did
nothing until the wait ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Far longer than any of these runs takes once signalled: exceeding it means the signal was
# not acted on (the stub's waits are 120 s).
HANG_SECONDS = 60

LAUNCH = """
import sys
from bench.__main__ import SUITES, main
SUITES["stub"] = "tests.bench.stub_suite"
sys.exit(main(["stub", "--results", sys.argv[1]]))
"""


def _ignore_sigint() -> None:
    # What a non-interactive shell does to a command it starts with `&`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Suite:
    def __init__(self, tmp_path: Path, wait: str, *, background: bool, go: Path | None) -> None:
        env = {**os.environ, "STUB_SUITE_WAIT": wait, "PYTHONPATH": str(ROOT)}
        if go is not None:
            env["STUB_SUITE_GO"] = str(go)
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(tmp_path / "results")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_ignore_sigint if background else None,
        )
        self.pids: dict[str, int] = {}
        self.lines: list[str] = []
        self.notes = ""

    def until(self, line: str) -> None:
        """Read the suite's steps up to ``line`` (a bound on a hang, not a measurement)."""
        assert self.process.stdout is not None
        while True:
            said = self.process.stdout.readline().strip()
            assert said, f"the suite ended before {line!r}: {self.lines}"
            self.lines.append(said)
            if said.startswith("started "):
                _, name, pid = said.split()
                self.pids[name] = int(pid)
            if said == line:
                return

    def noted(self, text: str) -> None:
        """Read the suite's notes (stderr) up to one containing ``text``."""
        assert self.process.stderr is not None
        while text not in (said := self.process.stderr.readline()):
            assert said, f"the suite ended before noting {text!r}"
            self.notes += said

    def finish(self) -> tuple[int, str]:
        rest, errors = self.process.communicate(timeout=HANG_SECONDS)
        self.lines += rest.splitlines()
        return self.process.returncode, self.notes + errors

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def suites(tmp_path: Path) -> Iterator[list[Suite]]:
    started: list[Suite] = []
    yield started
    for suite in started:
        suite.kill()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
@pytest.mark.parametrize("wait", ["blocking", "awaiting"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_stops_the_suite_and_what_it_started(
    tmp_path: Path, suites: list[Suite], wait: str, background: bool, signum: int
) -> None:
    suite = Suite(tmp_path, wait, background=background, go=None)
    suites.append(suite)
    suite.until("measuring")
    suite.process.send_signal(signum)
    code, errors = suite.finish()
    assert code == 128 + signum, errors
    assert f"stopped by {signal.Signals(signum).name}: nothing written" in errors
    # Inner first, as the with-blocks nest; both stopped before the suite exited.
    assert suite.lines[-4:] == [
        "stopping sidecar",
        "stopped sidecar",
        "stopping cassandra",
        "stopped cassandra",
    ]
    assert all(_gone(pid) for pid in suite.pids.values()), suite.pids
    assert not (tmp_path / "results").exists()


def test_a_signal_during_a_cleanup_waits_for_it_and_a_second_is_ignored(
    tmp_path: Path, suites: list[Suite]
) -> None:
    """SIGINT twice while the sidecars are being stopped at the end of a measurement: that
    stop and the next one (the cluster's) run to their ends, then the suite stops."""
    go = tmp_path / "go"
    suite = Suite(tmp_path, "none", background=False, go=go)
    suites.append(suite)
    suite.until("stopping sidecar")
    suite.process.send_signal(signal.SIGINT)
    suite.noted("SIGINT: stopping once the processes being stopped are")
    suite.process.send_signal(signal.SIGINT)
    suite.noted("SIGINT again: still stopping")
    go.touch()
    code, errors = suite.finish()
    assert code == 130, errors
    assert suite.lines[-3:] == ["stopped sidecar", "stopping cassandra", "stopped cassandra"]
    assert all(_gone(pid) for pid in suite.pids.values()), suite.pids
