"""Ports, processes and files: whether a node's ports are free, whether a pid is still our JVM."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from accord_cassandra.launcher.node_config import MAIN_CLASS
from accord_cassandra.launcher.spec import ClusterSpec, PortBusyError

POLL_INTERVAL = 0.25


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tail_file(path: Path, lines: int = 40) -> str:
    try:
        return tail_text(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def busy_ports(endpoints: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(ip, port) for ip, port in endpoints if not _port_free(ip, port)]


def _port_free(ip: str, port: int) -> bool:
    # SO_REUSEADDR as the JVM sets it: a TIME_WAIT left by a stopped node is not "busy",
    # a listener (on this IP or on 0.0.0.0) is.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
        except OSError:
            return False
    return True


def check_ports_free(spec: ClusterSpec, indexes: Sequence[int] | None = None) -> None:
    wanted = [
        (spec.ip(i), port)
        for i in (indexes or spec.indexes)
        for port in (spec.storage_port, spec.native_port)
    ]
    busy = busy_ports(wanted)
    if busy:
        where = ", ".join(f"{ip}:{port}" for ip, port in busy)
        raise PortBusyError(
            f"port already in use: {where}. Another Cassandra or test session holds it "
            f"(`ss -ltnp` shows the owner); stop it, or point the tests at it with the "
            f"contact-point variables (docs/cassandra-launch.md)"
        )


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _proc_is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def pid_is_node(pid: int, directory: Path) -> bool:
    """The pid is alive and still the JVM started for this node folder (pids get reused)."""
    cmdline = proc_cmdline(pid)
    owns = MAIN_CLASS in cmdline and str(directory / "conf" / "jvm.args") in cmdline
    return owns and not _proc_is_zombie(pid)


def wait_until(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll condition until it holds (True) or the monotonic deadline passes (False)."""
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process, as `ps -o rss` reports it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
