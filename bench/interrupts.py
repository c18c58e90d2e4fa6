"""Stopping a suite: its first SIGINT or SIGTERM stops it at once, and what it started (a
Cassandra cluster, sidecars, null sidecars) is stopped before it exits.

Why not Python's defaults. A suite's processes run in sessions of their own (so that a
terminal's Ctrl-C cannot kill them half-way), so only the suite can stop them, and:

* ``asyncio.run``'s SIGINT handler only cancels the main task, which notices at its next
  ``await``. The suites' coroutines start and stop sidecars with blocking waits (up to a
  minute, for one that does not come up), so a first Ctrl-C there did nothing until the
  wait ended, and a second raised KeyboardInterrupt wherever the main thread was, in a
  cleanup too, leaving the rest of what it started running;
* a suite started in the background by a non-interactive shell (``python -m bench floor &``)
  inherits SIGINT ignored, and Python keeps it so: no SIGINT ever reached it (a
  ``python -m bench floor --quick`` started so, sent SIGINT while the sidecars of its Accord
  round were starting, ran on to its end and wrote its report);
* SIGTERM's default ends the process without any cleanup.

Within :func:`stoppable`, the first of these signals raises :class:`Interrupted` where the
main thread is (asyncio.run then installs no handler of its own), unless that is within a
:func:`cleanup` section, which finishes first; later signals are reported and otherwise
ignored, so that they cannot cut the cleanup short (SIGKILL still can).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from bench.report import note

SIGNALS = (signal.SIGINT, signal.SIGTERM)

__all__ = ["SIGNALS", "Interrupted", "cleanup", "stoppable"]


class Interrupted(KeyboardInterrupt):
    """The suite was asked to stop by ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class _State:
    active: bool = False
    # How many cleanup sections the main thread is in; a signal within one waits for its end.
    cleaning: int = 0
    held: int | None = None
    stopping: bool = False


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _state.stopping:
        note(f"{name} again: still stopping what the suite started (SIGKILL leaves it running)")
        return
    _state.stopping = True
    if _state.cleaning:
        _state.held = signum
        note(f"{name}: stopping once the processes being stopped are")
        return
    note(f"{name}: stopping the suite and what it started")
    raise Interrupted(signum)


@contextmanager
def stoppable() -> Iterator[None]:
    """Run a suite so that SIGINT and SIGTERM stop it, and its cleanup, at once (see the
    module's docstring); the previous handlers are back afterwards."""
    if _state.active:
        raise RuntimeError("stoppable() does not nest")
    previous: dict[int, Any] = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _state.active, _state.cleaning, _state.held, _state.stopping = True, 0, None, False
    try:
        for signum in SIGNALS:
            # Also over an inherited SIG_IGN: a suite must stay stoppable in the background.
            signal.signal(signum, _on_signal)
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _state.active = False


@contextmanager
def cleanup() -> Iterator[None]:
    """A section that stops processes: a first signal within it takes effect once it ends,
    so that it stops all of them. Outside :func:`stoppable` it changes nothing."""
    _state.cleaning += 1
    try:
        yield
    finally:
        _state.cleaning -= 1
        if not _state.cleaning and _state.held is not None:
            signum, _state.held = _state.held, None
            raise Interrupted(signum)
