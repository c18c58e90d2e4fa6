"""Clusters: nodes this process launches (or attaches to) and clusters someone else runs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.maven import fetch
from accord_cassandra.launcher.node_config import node_command, node_dir, write_node_files
from accord_cassandra.launcher.probes import (
    driver_cluster,
    query_release_version,
    ring_view,
    tcp_open,
)
from accord_cassandra.launcher.process import (
    POLL_INTERVAL,
    check_ports_free,
    pid_is_node,
    proc_cmdline,
    tail_file,
    wait_until,
)
from accord_cassandra.launcher.spec import (
    LOOPBACK,
    ClusterSpec,
    LauncherError,
    NodeStartError,
    is_loopback,
)

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session

log = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT = 180.0
DEFAULT_STOP_TIMEOUT = 30.0
ENV_START_TIMEOUT = "ACCORD_CASSANDRA_START_TIMEOUT"
STATE_FILE = "cluster.json"


def default_start_timeout() -> float:
    return float(os.environ.get(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT))


class _CqlClients:
    """Driver sessions handed to tests, closed before the nodes go away."""

    contact_points: list[str]
    native_port: int
    credentials: tuple[str, str] | None = None

    def __init__(self) -> None:
        self._drivers: list[Cluster] = []
        # Set by whoever will delete the nodes' data afterwards (the test fixtures): dropping
        # keyspaces then only costs time (2-4 s per DROP KEYSPACE measured here).
        self.disposable = False

    def connect(self, keyspace: str | None = None) -> Session:
        cluster = driver_cluster(
            self.contact_points, self.native_port, credentials=self.credentials
        )
        self._drivers.append(cluster)
        return cluster.connect(keyspace)

    def drop_keyspace(self, session: Session, keyspace: str) -> None:
        """Clean up after a test, unless the whole cluster is about to be deleted."""
        if not self.disposable:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")

    def close_sessions(self) -> None:
        while self._drivers:
            self._drivers.pop().shutdown()


class ExternalCluster(_CqlClients):
    """A cluster someone else started: CQL only, no node control."""

    def __init__(self, contact_points: Sequence[str], native_port: int = 9042) -> None:
        super().__init__()
        for ip in contact_points:
            if not is_loopback(ip):
                raise LauncherError(f"contact point {ip} is outside {LOOPBACK}")
        self.contact_points = list(contact_points)
        self.native_port = native_port

    @property
    def nodes(self) -> int:
        return len(self.contact_points)

    def node_pid(self, index: int) -> int | None:
        return None

    def stop_node(self, index: int, *, kill: bool = False) -> None:
        raise LauncherError("stopping a node needs a cluster started by this launcher")

    def start_node(self, index: int) -> None:
        raise LauncherError("starting a node needs a cluster started by this launcher")

    def stop(self, *, clean: bool = False, kill: bool | None = None) -> None:
        """Only closes our driver sessions: the nodes are not ours to stop."""
        self.close_sessions()


class LocalCluster(_CqlClients):
    """Nodes launched by this process (or attached to from a state file written by one)."""

    def __init__(
        self,
        spec: ClusterSpec,
        base_dir: Path,
        *,
        start_timeout: float | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.credentials = spec.credentials
        self.base_dir = Path(base_dir).resolve()
        self.start_timeout = start_timeout or default_start_timeout()
        self.stop_timeout = stop_timeout
        self.contact_points = spec.ips
        self.native_port = spec.native_port
        self.start_seconds: dict[int, float] = {}
        self._pids: dict[int, int] = {}
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._java: tuple[str, int] | None = None
        self._lib_dir: Path | None = None

    # -- state file ---------------------------------------------------------------------------

    @classmethod
    def attach(cls, base_dir: Path) -> LocalCluster:
        """Control a cluster that `up` (possibly another process) started in base_dir."""
        state_path = Path(base_dir) / STATE_FILE
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError) as exc:
            raise LauncherError(f"no launcher state in {base_dir} ({exc})") from exc
        try:
            cluster = cls(ClusterSpec.from_state(state["spec"]), Path(base_dir))
            cluster._pids = {int(i): int(pid) for i, pid in state["pids"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LauncherError(f"unreadable launcher state in {state_path} ({exc!r})") from exc
        return cluster

    def _save_state(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        state = {"spec": self.spec.to_state(), "pids": {str(i): p for i, p in self._pids.items()}}
        (self.base_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")

    # -- queries ------------------------------------------------------------------------------

    @property
    def nodes(self) -> int:
        return self.spec.nodes

    def node_pid(self, index: int) -> int | None:
        self.spec.ip(index)
        return self._pids.get(index)

    def is_running(self, index: int) -> bool:
        pid = self._pids.get(index)
        if pid is None:
            return False
        child = self._children.get(index)
        if child is not None:
            # Our own child: waitpid is exact, whereas /proc/<pid>/cmdline reads empty for a
            # moment right after exec (seen here: a starting node taken for a dead one).
            return child.poll() is None
        return pid_is_node(pid, node_dir(self.base_dir, index))

    def running(self) -> list[int]:
        return [i for i in self.spec.indexes if self.is_running(i)]

    def log_file(self, index: int) -> Path:
        return node_dir(self.base_dir, index) / "logs" / "system.log"

    # -- start --------------------------------------------------------------------------------

    def start(self, *, clean: bool = False) -> None:
        """Start every node in order, each reachable over CQL before the next one starts."""
        if self.running():
            raise LauncherError(f"nodes {self.running()} already run from {self.base_dir}")
        check_ports_free(self.spec)
        self._prepare()
        if clean:
            self._remove_node_dirs()
        try:
            for index in self.spec.indexes:
                self._launch(index)
            self.wait_until_all_up()
        except BaseException:
            self.stop()
            raise

    def start_node(self, index: int) -> None:
        """Restart one stopped node and wait until every node sees it up again."""
        if self.is_running(index):
            raise LauncherError(f"node{index} is already running")
        check_ports_free(self.spec, [index])
        self._prepare()
        self._launch(index)
        self.wait_until_all_up()

    def _prepare(self) -> None:
        if self._java is None:
            self._java = check_java()
        if self._lib_dir is None:
            self._lib_dir = fetch(self.spec.version)

    def _launch(self, index: int) -> None:
        if self._java is None or self._lib_dir is None:
            raise LauncherError("_prepare() must run before a node is launched")
        java, major = self._java
        directory = write_node_files(self.spec, index, self.base_dir, self._lib_dir, major)
        started = time.monotonic()
        with (directory / "out.log").open("ab") as out:
            # Own session: `up` returns while the nodes keep running, and a Ctrl-C aimed at
            # the CLI must not reach them.
            child = subprocess.Popen(
                node_command(java, directory, self._lib_dir),
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[index] = child
        self._pids[index] = child.pid
        self._save_state()
        self._wait_for_cql(index, started + self.start_timeout)
        self.start_seconds[index] = time.monotonic() - started
        log.info("node%d (%s) up in %.1f s", index, self.spec.ip(index), self.start_seconds[index])

    def _wait_for_cql(self, index: int, deadline: float) -> None:
        ip, port = self.spec.ip(index), self.spec.native_port
        while True:
            if not self.is_running(index):
                raise self._start_error(index, self._exit_reason(index))
            if tcp_open(ip, port) and self._answers_cql(ip, port):
                return
            if time.monotonic() >= deadline:
                raise self._start_error(index, f"no CQL answer within {self.start_timeout:.0f} s")
            time.sleep(POLL_INTERVAL)

    def _exit_reason(self, index: int) -> str:
        child = self._children.get(index)
        code = child.poll() if child is not None else None
        if code is not None:
            return f"the JVM exited with code {code}"
        pid = self._pids.get(index, 0)
        return f"pid {pid} is gone (cmdline {proc_cmdline(pid)[:80]!r})"

    def _answers_cql(self, ip: str, port: int) -> bool:
        try:
            version = query_release_version(ip, port, credentials=self.spec.credentials)
            return version.startswith("5.0")
        except Exception:  # noqa: BLE001 - not ready yet; the caller polls until its deadline
            return False

    def _start_error(self, index: int, reason: str) -> NodeStartError:
        directory = node_dir(self.base_dir, index)
        return NodeStartError(
            f"node{index} ({self.spec.ip(index)}) failed to start: {reason}.\n"
            f"--- last lines of {directory / 'logs' / 'system.log'} ---\n"
            f"{tail_file(directory / 'logs' / 'system.log')}\n"
            f"--- last lines of {directory / 'out.log'} ---\n{tail_file(directory / 'out.log', 20)}"
        )

    def wait_until_all_up(self, timeout: float | None = None) -> None:
        """Poll until every node's failure detector sees every node up (no-op for one node)."""
        self._wait_ring_view(self.spec.indexes, True, timeout)

    def wait_until_seen_down(self, timeout: float | None = None) -> None:
        """Poll until every running node reports some replica down (after stop_node)."""
        self._wait_ring_view(self.running(), False, timeout)

    def _wait_ring_view(self, indexes: Sequence[int], all_up: bool, timeout: float | None) -> None:
        if self.spec.nodes == 1:
            return
        started = time.monotonic()
        deadline = started + (timeout or self.start_timeout)
        wanted = "every node up" if all_up else "a node down"
        for index in indexes:
            ip = self.spec.ip(index)
            if not wait_until(self._ring_view_is(ip, all_up), deadline):
                raise LauncherError(f"node{index} ({ip}) did not see {wanted} in time; see its log")
        log.info("every running node saw %s after %.1f s", wanted, time.monotonic() - started)

    def _ring_view_is(self, ip: str, all_up: bool) -> Callable[[], bool]:
        return lambda: (
            ring_view(ip, self.native_port, self.spec.nodes, self.spec.credentials) is all_up
        )

    # -- stop ---------------------------------------------------------------------------------

    def stop_node(self, index: int, *, kill: bool = False) -> None:
        """Stop one node (SIGTERM: it announces shutdown to its peers) and wait until it exits."""
        if not self.is_running(index):
            raise LauncherError(f"node{index} is not running")
        self._terminate([index], kill=kill)
        self.wait_until_seen_down()

    def stop(self, *, clean: bool = False, kill: bool | None = None) -> None:
        """Stop every node this launcher started; with clean, also delete their folders.

        kill (default: same as clean) skips the graceful SIGTERM: that spends 3-11 s per
        cluster (shutdown announcement, messaging quiesce, memtable flush) on data that a
        throwaway test cluster never reads again.
        """
        self.close_sessions()
        self._terminate(self.running(), kill=clean if kill is None else kill)
        self._pids.clear()
        self._children.clear()
        if clean:
            (self.base_dir / STATE_FILE).unlink(missing_ok=True)
            self._remove_node_dirs()
            with contextlib.suppress(OSError):
                self.base_dir.rmdir()

    def _terminate(self, indexes: Sequence[int], *, kill: bool) -> None:
        for index in indexes:
            self._signal(index, signal.SIGKILL if kill else signal.SIGTERM)
        timeout = self.stop_timeout
        if not wait_until(self._all_exited(indexes), time.monotonic() + timeout):
            for index in self.running():
                log.warning("node%d ignored SIGTERM for %.0f s; killing it", index, timeout)
                self._signal(index, signal.SIGKILL)
            wait_until(self._all_exited(indexes), time.monotonic() + 10)
        for index in indexes:
            self._forget(index)

    def _all_exited(self, indexes: Sequence[int]) -> Callable[[], bool]:
        return lambda: not any(self.is_running(i) for i in indexes)

    def _signal(self, index: int, sig: signal.Signals) -> None:
        if self.is_running(index):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pids[index], sig)

    def _forget(self, index: int) -> None:
        child = self._children.pop(index, None)
        if child is not None:
            child.wait(timeout=10)
        self._pids.pop(index, None)
        if self.base_dir.exists():
            self._save_state()

    def detach(self) -> None:
        """Leave the running nodes behind when this object goes away (`up`, attached fixtures).

        Dropping a running Popen raises a ResourceWarning, an error under the tests' warning
        filter; the nodes are meant to outlive us, and the state file still records them.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            self._children.clear()

    def _remove_node_dirs(self) -> None:
        for index in self.spec.indexes:
            shutil.rmtree(node_dir(self.base_dir, index), ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


CassandraHandle = LocalCluster | ExternalCluster


def parse_contact_points(text: str, default_port: int = 9042) -> tuple[list[str], int]:
    """ "127.0.0.1,127.0.0.2" or "127.0.0.1:19042,..." -> (ips, port); one port for all."""
    ips: list[str] = []
    ports: set[int] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        ip, _, port = item.partition(":")
        ips.append(str(IPv4Address(ip)))
        ports.add(int(port) if port else default_port)
    if not ips:
        raise LauncherError(f"no contact points in {text!r}")
    if len(ports) > 1:
        raise LauncherError(f"contact points must share one native port, got {sorted(ports)}")
    return ips, ports.pop()
