"""Child processes for the recovery tests: coordinators and workers that tests SIGKILL.

Every child runs in its own session (``start_new_session``) and is tracked by a
:class:`Children` context manager that kills whatever is still alive on exit, so no test
leaves a process behind, whatever it fails with.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_config(directory: Path, overrides: dict[str, Any], driver_text: str) -> Path:
    """A YAML with a ``stacksaga:`` section and the driver file next to it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stacksaga-cassandra.conf").write_text(driver_text)
    path = directory / "stacksaga.yaml"
    path.write_text(yaml.safe_dump({"stacksaga": overrides}, sort_keys=True))
    return path


class Child:
    """One child process with its output in a file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                list(argv),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if not self.alive():
                raise AssertionError(f"{self.name} exited early:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(
            f"{self.name}: no {text!r} within {timeout} s:\n{self.output()[-3000:]}"
        )

    def wait_for_address(self, timeout: float) -> str:
        """The ``host:port`` a coordinator prints once it has bound its port."""
        self.wait_for_output("serving on ", timeout)
        found = re.search(r"serving on (\S+:\d+)", self.output())
        if found is None:
            raise AssertionError(f"{self.name}: no address in:\n{self.output()[-3000:]}")
        return found.group(1)

    def kill(self) -> None:
        """SIGKILL: a crash at an arbitrary instant."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self, timeout: float = 20.0) -> int:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.process.returncode)


class Children:
    """Starts children and kills every survivor at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.children: list[Child] = []

    def start(self, name: str, argv: Sequence[str]) -> Child:
        child = Child(name, argv, self.directory / f"{name}-{len(self.children)}.log")
        self.children.append(child)
        return child

    def coordinator(self, name: str, config: Path, port: int = 0) -> Child:
        """A ring coordinator process; port 0 (any free port) unless it restarts on the
        address its clients know (``wait_for_address`` says which port it got)."""
        argv = [
            sys.executable,
            "-m",
            "stacksaga_store",
            "--config",
            str(config),
            "--log-level",
            "INFO",
            "coordinator",
            "--listen",
            f"127.0.0.1:{port}",
            "--id",
            name,
        ]
        return self.start(name, argv)

    def worker(self, name: str, job: dict[str, Any]) -> Child:
        job_path = self.directory / f"{name}-job.json"
        job_path.write_text(json.dumps(job))
        argv = [sys.executable, "-m", "tests.recovery._worker", str(job_path)]
        return self.start(name, argv)

    def kill_all(self) -> None:
        for child in self.children:
            if child.alive():
                child.kill()


@contextmanager
def children(directory: Path) -> Iterator[Children]:
    group = Children(directory)
    try:
        yield group
    finally:
        group.kill_all()
