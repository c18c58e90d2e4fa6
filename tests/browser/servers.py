"""A server under test as a real subprocess: started on port 0, its bound port read from what
it prints, its output kept in a log file, stopped (SIGTERM, then SIGKILL) afterwards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_SECONDS = 120.0
STOP_SECONDS = 20.0


class ServerStartError(RuntimeError):
    pass


@dataclass
class Server:
    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@contextmanager
def server_process(
    args: Sequence[str],
    port_pattern: str,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    start_seconds: float = START_SECONDS,
) -> Iterator[Server]:
    """Run ``args``; yield once a line of its output matches ``port_pattern`` (group 1: port).

    stdout and stderr are merged into ``log_path``. A process that exits, or prints no such
    line within ``start_seconds``, is an error quoting its output.
    """
    pattern = re.compile(port_pattern)
    found = threading.Event()
    port: list[int] = []
    log = log_path.open("w", encoding="utf-8")
    process = subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )

    def pump() -> None:
        stream = process.stdout
        if stream is None:
            return
        for line in stream:
            log.write(line)
            log.flush()
            if not port:
                match = pattern.search(line)
                if match:
                    port.append(int(match.group(1)))
                    found.set()

    reader = threading.Thread(target=pump, name="server-output", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + start_seconds
        while not found.wait(0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                reader.join(5)
                what = (
                    f"exited with {process.returncode}"
                    if process.returncode is not None
                    else f"printed no bound port within {start_seconds:.0f}s"
                )
                raise ServerStartError(
                    f"{' '.join(args)} {what}; its output ({log_path}):\n"
                    + log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
                )
        yield Server(process, port[0], log_path)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_SECONDS)
        reader.join(5)
        if process.stdout is not None:
            process.stdout.close()
        log.close()
