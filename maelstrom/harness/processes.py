"""Node processes: spawn, line I/O on threads, and a shutdown that always reaps.

Each node runs as a child process with pipes for stdin and stdout and its stderr written
to ``node-logs/<name>.log``, as Maelstrom does. Two threads per node keep the harness's
event loop from ever blocking on a pipe: a reader moves stdout lines into the shared inbox
(tagged with the node's name; ``None`` means the node closed stdout), and a writer drains
a queue of outgoing lines into stdin.

:meth:`NodeProcess.stop` closes stdin (a well-behaved node exits on EOF), then escalates
to SIGTERM and SIGKILL with bounded waits, so no child outlives the harness even when a
run fails. A node also exits by itself if the harness dies, because its stdin closes.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

from accord.invariants import fail
from maelstrom.protocol import MAX_LINE_BYTES

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS: Final = 2.0
"""How long a node may take to exit after its stdin closes, and again after SIGTERM."""
WRITE_BATCH_MAX: Final = 512
"""Queued lines joined into one write to a node's stdin."""

InboxItem = tuple[str, bytes | None]


class NodeProcess:
    """One node child process and its two I/O threads."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        inbox: queue.SimpleQueue[InboxItem],
        *,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.process = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=cwd,
            bufsize=0,
        )
        if self.process.stdin is None or self.process.stdout is None:
            fail("%s started without pipes", name)
        self._reader = threading.Thread(
            target=self._read,
            args=(self.process.stdout, inbox),
            name=f"{name}-reader",
            daemon=True,
        )
        self._writer = threading.Thread(
            target=self._write, args=(self.process.stdin,), name=f"{name}-writer", daemon=True
        )
        self._reader.start()
        self._writer.start()

    def _read(self, stream: IO[bytes], inbox: queue.SimpleQueue[InboxItem]) -> None:
        try:
            while True:
                line = stream.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                inbox.put((self.name, line))
        except (OSError, ValueError) as error:
            # ValueError: the pipe was closed under us during shutdown.
            logger.debug("%s: stdout reader stopped: %s", self.name, error)
        finally:
            inbox.put((self.name, None))

    def _write(self, stream: IO[bytes]) -> None:
        try:
            while True:
                first = self._outbox.get()
                if first is None:
                    break
                batch = [first]
                while len(batch) < WRITE_BATCH_MAX:
                    try:
                        line = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if line is None:
                        self._outbox.put(None)  # seen after this batch is written
                        break
                    batch.append(line)
                stream.write(b"".join(batch))
                stream.flush()
        except (BrokenPipeError, OSError, ValueError) as error:
            logger.debug("%s: stdin writer stopped: %s", self.name, error)
        finally:
            try:
                stream.close()
            except OSError as error:
                logger.debug("%s: closing stdin: %s", self.name, error)

    def send(self, line: bytes) -> None:
        """Queue one newline-terminated line for the node's stdin."""
        self._outbox.put(line)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close_input(self) -> None:
        """Close the node's stdin once queued lines are written: it should then exit.
        Calling this on every node before :meth:`stop` lets them all exit at once."""
        self._outbox.put(None)

    def stop(self) -> int | None:
        """Close stdin, then escalate; returns the exit status (None if it never died)."""
        self.close_input()
        status: int | None = None
        for action in (None, self.process.terminate, self.process.kill):
            if action is not None:
                action()
            try:
                status = self.process.wait(timeout=STOP_GRACE_SECONDS)
                break
            except subprocess.TimeoutExpired:
                logger.warning("%s did not exit; escalating", self.name)
        self._writer.join(timeout=STOP_GRACE_SECONDS)
        self._reader.join(timeout=STOP_GRACE_SECONDS)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return status


__all__ = ["InboxItem", "NodeProcess"]
