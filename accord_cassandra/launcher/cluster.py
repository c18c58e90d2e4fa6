"""Start and stop real Cassandra 5.0 nodes as local JVMs, ccm-style, for tests and CI.

Nothing here ships the Cassandra server, so `fetch` resolves `cassandra-all` and its runtime
dependencies with Maven into a cache outside the repository, and `up` runs one
`CassandraDaemon` JVM per node on 127.0.0.1..N. docs/cassandra-launch.md records the recipe,
where it deviates from the reference and the figures measured on the CI machine.

CLI: ``python -m accord_cassandra.launcher {fetch,up,down,status}``.
Python API: :class:`LocalCluster` (launched here) and :class:`ExternalCluster` (already running).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session

log = logging.getLogger(__name__)

DEFAULT_VERSION = "5.0.6"
# Measured (docs/cassandra-launch.md): 256 MiB ran the whole test suite repeatedly without
# an OOM; the reference's 512 MiB only adds RSS.
DEFAULT_HEAP_MB = 256
DEFAULT_START_TIMEOUT = 180.0
DEFAULT_STOP_TIMEOUT = 30.0

ENV_VERSION = "ACCORD_CASSANDRA_VERSION"
ENV_CACHE = "ACCORD_CASSANDRA_CACHE"
ENV_HEAP = "ACCORD_CASSANDRA_HEAP_MB"
ENV_START_TIMEOUT = "ACCORD_CASSANDRA_START_TIMEOUT"

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
STATE_FILE = "cluster.json"
MARKER_FILE = "fetched.json"
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"
SUPPORTED_JAVA = 17
# The Security Manager Cassandra 5.0 installs is gone from JDK 24 on, so startup fails there.
FIRST_UNSUPPORTED_JAVA = 24
JVM_ROOTS = (Path("/usr/lib/jvm"),)
LOOPBACK = "127.0.0.0/8"
POLL_INTERVAL = 0.25

POM_TEMPLATE = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.accord-cassandra</groupId>
  <artifactId>cassandra-server-deps</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""

# Union of apache/cassandra conf/jvm17-server.options and the list other Java 17 launchers
# use; without java.io / java.nio.charset opens the daemon or jamm fails at run time.
JVM17_MODULE_OPTIONS = (
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports {m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.base/jdk.internal.ref",
            "java.base/sun.nio.ch",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
        )
    ),
    *(
        f"--add-opens {m}=ALL-UNNAMED"
        for m in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "jdk.management/com.sun.management.internal",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.nio",
            "java.base/java.lang",
            "java.base/java.lang.reflect",
            "java.base/java.util",
            "java.base/java.util.concurrent",
            "java.base/java.util.concurrent.atomic",
            "java.base/java.math",
            "java.base/java.net",
            "java.base/java.nio.charset",
        )
    ),
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)

LOGBACK_TEMPLATE = """\
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log_file}</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>WARN</level></filter>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
    <appender-ref ref="CONSOLE"/>
  </root>
</configuration>
"""


class LauncherError(RuntimeError):
    """Anything the launcher cannot do; the message says what to fix."""


class PortBusyError(LauncherError):
    """A port a node needs is already taken on its loopback address."""


class NodeStartError(LauncherError):
    """A node did not come up; the message carries the tail of its log."""


# ---------------------------------------------------------------------------------------------
# Cluster layout


def ring_tokens(nodes: int) -> list[int]:
    """Balanced single tokens, one per node, as ccm assigns them: i*(2^64//n) - 2^63."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    return [i * (2**64 // nodes) - 2**63 for i in range(nodes)]


@dataclass(frozen=True)
class ClusterSpec:
    """What to launch; node i (1-based) listens on first_ip + i - 1."""

    nodes: int = 1
    first_ip: str = "127.0.0.1"
    storage_port: int = 7000
    native_port: int = 9042
    heap_mb: int = field(default_factory=lambda: default_heap_mb())
    cluster_name: str = "accord_test"
    version: str = DEFAULT_VERSION

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise LauncherError("--nodes must be at least 1")
        last = IPv4Address(self.first_ip) + (self.nodes - 1)
        if not (_is_loopback(self.first_ip) and _is_loopback(str(last))):
            raise LauncherError(f"node addresses must stay inside {LOOPBACK}")
        check_version(self.version)

    def ip(self, index: int) -> str:
        self._check_index(index)
        return str(IPv4Address(self.first_ip) + (index - 1))

    @property
    def indexes(self) -> range:
        return range(1, self.nodes + 1)

    @property
    def ips(self) -> list[str]:
        return [self.ip(i) for i in self.indexes]

    def token(self, index: int) -> int:
        self._check_index(index)
        return ring_tokens(self.nodes)[index - 1]

    def _check_index(self, index: int) -> None:
        if index not in self.indexes:
            raise LauncherError(f"no node {index} in a {self.nodes}-node cluster")


def _is_loopback(ip: str) -> bool:
    return IPv4Address(ip).is_loopback


def check_version(version: str) -> str:
    # The generated cassandra.yaml uses 5.0 key names and units.
    if not re.fullmatch(r"5\.0\.\d+", version):
        raise LauncherError(f"Cassandra version {version!r} is not 5.0.x")
    return version


def node_dir(base_dir: Path, index: int) -> Path:
    return base_dir / f"node{index}"


def node_config(spec: ClusterSpec, index: int, directory: Path) -> dict[str, Any]:
    """cassandra.yaml for one node: only the mandatory keys plus what makes tests fast."""
    ip = spec.ip(index)
    seeds = f"{spec.ip(1)}:{spec.storage_port}"
    return {
        "cluster_name": spec.cluster_name,
        # One token per node and no token allocation: the stock num_tokens 16 with
        # allocate_tokens_for_local_replication_factor makes a first boot wait RING_DELAY.
        "num_tokens": 1,
        "initial_token": str(spec.token(index)),
        "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
        "endpoint_snitch": "SimpleSnitch",
        "seed_provider": [
            {
                "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                "parameters": [{"seeds": seeds}],
            }
        ],
        "listen_address": ip,
        "rpc_address": ip,
        "storage_port": spec.storage_port,
        "native_transport_port": spec.native_port,
        "start_native_transport": True,
        "auto_bootstrap": False,
        "data_file_directories": [str(directory / "data")],
        "commitlog_directory": str(directory / "commitlog"),
        "saved_caches_directory": str(directory / "saved_caches"),
        "hints_directory": str(directory / "hints"),
        "commitlog_sync": "periodic",
        "commitlog_sync_period": "10000ms",
        "auto_snapshot": False,
        "concurrent_reads": 4,
        "concurrent_writes": 4,
        "concurrent_counter_writes": 2,
        "concurrent_compactors": 1,
        "memtable_flush_writers": 1,
        "memtable_heap_space": "64MiB",
        "key_cache_size": "16MiB",
        # The sidecars compare Accord against LWT; v2 is the 2-round-trip Paxos.
        "paxos_variant": "v2",
        "write_request_timeout": "5000ms",
        "read_request_timeout": "5000ms",
    }


def yaml_text(config: dict[str, Any]) -> str:
    # JSON values are valid YAML flow nodes, so no YAML library (or its stubs) is needed.
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items())


def logback_config(directory: Path) -> str:
    # Without a logback.xml Cassandra logs everything at DEBUG to the console.
    return LOGBACK_TEMPLATE.format(log_file=directory / "logs" / "system.log")


def find_jamm(lib_dir: Path) -> Path:
    jars = sorted(lib_dir.glob("jamm-*.jar"))
    if not jars:
        raise LauncherError(f"no jamm jar in {lib_dir}; run `fetch` again")
    return jars[-1]


def node_jvm_options(
    spec: ClusterSpec, directory: Path, lib_dir: Path, java_major: int = SUPPORTED_JAVA
) -> list[str]:
    """Every JVM option for one node; they go into an @argfile so the command line stays short."""
    heap = f"{spec.heap_mb}m"
    options = [
        *JVM17_MODULE_OPTIONS,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-Xss256k",
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        "-ea",
        "-da:net.openhft...",
        "-Djava.net.preferIPv4Stack=true",
        "-Dchronicle.analytics.disable=true",
        f"-javaagent:{find_jamm(lib_dir)}",
        f"-Dcassandra.config={(directory / 'conf' / 'cassandra.yaml').as_uri()}",
        f"-Dcassandra.storagedir={directory}",
        f"-Dcassandra.logdir={directory / 'logs'}",
        f"-Dlogback.configurationFile={directory / 'conf' / 'logback.xml'}",
        # Without it the daemon closes stdout/stderr once started, losing late errors.
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.triggers_dir={directory / 'triggers'}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        # No fsync of system tables: test data is thrown away.
        "-Dcassandra.unsafesystem=true",
        f"-Djava.io.tmpdir={directory / 'tmp'}",
        # Peers get the shutdown announcement over loopback in well under a millisecond; the
        # default 2 s wait only slows every stop.
        "-Dcassandra.shutdown_announce_in_ms=500",
    ]
    if java_major > SUPPORTED_JAVA:
        options.append("-Djava.security.manager=allow")
    return options


def argfile_text(options: Sequence[str]) -> str:
    return "".join(_argfile_token(o) + "\n" for o in options)


def _argfile_token(option: str) -> str:
    # Options such as "--add-opens a=b" are two tokens on purpose; only paths may need quoting.
    if option.startswith("--add-") or not re.search(r'[\s"\\]', option):
        return option
    escaped = option.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def write_node_files(
    spec: ClusterSpec, index: int, base_dir: Path, lib_dir: Path, java_major: int
) -> Path:
    """Create the node's folders and config; returns the node folder."""
    directory = node_dir(base_dir, index)
    for sub in ("conf", "logs", "data", "commitlog", "saved_caches", "hints", "triggers", "tmp"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    conf = directory / "conf"
    (conf / "cassandra.yaml").write_text(yaml_text(node_config(spec, index, directory)))
    (conf / "logback.xml").write_text(logback_config(directory))
    options = node_jvm_options(spec, directory, lib_dir, java_major)
    (conf / "jvm.args").write_text(argfile_text(options))
    return directory


def node_command(java: str, directory: Path, lib_dir: Path) -> list[str]:
    return [java, f"@{directory / 'conf' / 'jvm.args'}", "-cp", f"{lib_dir}/*", MAIN_CLASS]


# ---------------------------------------------------------------------------------------------
# Tools and jars


def cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "accord-cassandra"


def default_version() -> str:
    return check_version(os.environ.get(ENV_VERSION, DEFAULT_VERSION))


def default_heap_mb() -> int:
    return int(os.environ.get(ENV_HEAP, DEFAULT_HEAP_MB))


def default_start_timeout() -> float:
    return float(os.environ.get(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT))


def version_home(version: str) -> Path:
    return cache_root() / f"cassandra-{check_version(version)}"


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise LauncherError(f"`java` not found: install a JDK {SUPPORTED_JAVA} (or set JAVA_HOME)")
    return found


def parse_java_major(version_output: str) -> int:
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        raise LauncherError(f"cannot read the Java version from: {version_output.strip()!r}")
    major = int(match[1])
    # Java 8 and older report themselves as "1.x".
    return int(match[2]) if major == 1 and match[2] else major


def check_java_major(major: int) -> None:
    if major >= FIRST_UNSUPPORTED_JAVA:
        raise LauncherError(
            f"Java {major} cannot run Cassandra 5.0 (it needs the Security Manager, removed in "
            f"Java 24); install JDK {SUPPORTED_JAVA} and set JAVA_HOME"
        )
    if major < SUPPORTED_JAVA:
        raise LauncherError(f"Java {major} is too old; install JDK {SUPPORTED_JAVA}")
    if major > SUPPORTED_JAVA:
        log.warning("Java %d is untested here; JDK %d is the supported one", major, SUPPORTED_JAVA)


def java_major(java: str) -> int:
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return parse_java_major(result.stderr + result.stdout)


def _installed_jdk17() -> str | None:
    # Machines here carry a Temurin 25 beside OpenJDK 17: should JAVA_HOME or PATH pick the
    # wrong one, a JDK 17 installed beside it still runs Cassandra.
    for root in JVM_ROOTS:
        for java in sorted(root.glob("*/bin/java")):
            with contextlib.suppress(LauncherError, OSError):
                if java_major(str(java)) == SUPPORTED_JAVA:
                    return str(java)
    return None


def check_java() -> tuple[str, int]:
    """The java binary to use and its major version, or a LauncherError saying what to install."""
    java = java_executable()
    major = java_major(java)
    if major != SUPPORTED_JAVA:
        fallback = _installed_jdk17()
        if fallback:
            log.info("%s is Java %d; using %s instead", java, major, fallback)
            return fallback, SUPPORTED_JAVA
    check_java_major(major)
    return java, major


def read_marker(home: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((home / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched(home: Path, version: str) -> bool:
    """True when a previous fetch of this version completed and none of its jars went missing."""
    marker = read_marker(home)
    if not marker or marker.get("version") != version:
        return False
    lib = home / "lib"
    jars = marker.get("jars") or []
    return bool(jars) and all((lib / name).is_file() for name in jars)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # A test run and `make cassandra-jars` may fetch at the same time.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(version: str | None = None) -> Path:
    """Resolve cassandra-all and its runtime jars into the cache once; returns the lib folder."""
    version = check_version(version or default_version())
    home = version_home(version)
    with _file_lock(home / ".lock"):
        if not is_fetched(home, version):
            _resolve_with_maven(home, version)
    return home / "lib"


def _resolve_with_maven(home: Path, version: str) -> None:
    check_java()
    mvn = shutil.which("mvn")
    if not mvn:
        raise LauncherError("`mvn` not found: install Maven 3 (Debian package `maven`)")
    pom = home / "pom.xml"
    pom.write_text(POM_TEMPLATE.format(version=version))
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    log.info("resolving cassandra-all %s and its runtime dependencies with Maven", version)
    started = time.monotonic()
    result = subprocess.run(
        [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={partial}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LauncherError(
            f"Maven could not resolve cassandra-all {version} (exit {result.returncode}). "
            f"Last lines:\n{tail_text(result.stdout + result.stderr, 30)}"
        )
    _install_jars(home, partial, version, time.monotonic() - started)


def _install_jars(home: Path, partial: Path, version: str, seconds: float) -> None:
    jars = sorted(p.name for p in partial.glob("*.jar"))
    if f"cassandra-all-{version}.jar" not in jars:
        raise LauncherError(f"Maven finished but cassandra-all-{version}.jar is not in {partial}")
    lib = home / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    size = sum((lib / name).stat().st_size for name in jars)
    marker = {"version": version, "jars": jars, "bytes": size, "seconds": round(seconds, 1)}
    # Written last: its presence means the copy is complete.
    (home / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    log.info("fetched %d jars, %.1f MB, in %.1f s", len(jars), size / 1e6, seconds)


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tail_file(path: Path, lines: int = 40) -> str:
    try:
        return tail_text(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


# ---------------------------------------------------------------------------------------------
# Ports, processes, CQL probes


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


def _proc_cmdline(pid: int) -> str:
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
    cmdline = _proc_cmdline(pid)
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


def _tcp_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return True
    except OSError:
        return False


def driver_cluster(
    contact_points: Sequence[str], port: int, *, only: str | None = None, timeout: float = 20.0
) -> Cluster:
    """A cassandra-driver Cluster; `only` pins every request to one node (no failover)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import (
        DCAwareRoundRobinPolicy,
        FallthroughRetryPolicy,
        TokenAwarePolicy,
        WhiteListRoundRobinPolicy,
    )

    if only:
        # Pinned probes must see the node's own answer (e.g. Unavailable), not the driver's
        # NoHostAvailable after it found no other host to retry on.
        profile = ExecutionProfile(
            load_balancing_policy=WhiteListRoundRobinPolicy([only]),
            retry_policy=FallthroughRetryPolicy(),
            request_timeout=timeout,
        )
    else:
        policy = TokenAwarePolicy(DCAwareRoundRobinPolicy())
        profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=timeout)
    return Cluster(
        list(contact_points),
        port=port,
        # v5 is Cassandra 5.0's; pinning it skips the driver's downgrade handshake.
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
    )


def query_release_version(ip: str, port: int, timeout: float = 10.0) -> str:
    cluster = driver_cluster([ip], port, only=ip, timeout=timeout)
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return str(row.release_version)
    finally:
        cluster.shutdown()


def ring_view(ip: str, port: int, nodes: int) -> bool | None:
    """Whether the node at ip, as coordinator, sees every node of the ring up.

    True: all up; False: it reports a replica down (Unavailable); None: no answer yet.
    A CL ALL range read of system_distributed (RF 3) needs every replica alive in the
    coordinator's failure detector; with 2 nodes, QUORUM of RF 3 already means both.
    """
    from cassandra import ConsistencyLevel, Unavailable
    from cassandra.query import SimpleStatement

    level = ConsistencyLevel.ALL if nodes >= 3 else ConsistencyLevel.QUORUM
    query = SimpleStatement(
        "SELECT * FROM system_distributed.repair_history LIMIT 1", consistency_level=level
    )
    cluster = driver_cluster([ip], port, only=ip, timeout=10.0)
    try:
        cluster.connect().execute(query)
    except Unavailable:
        return False
    except Exception:  # noqa: BLE001 - not ready, or timed out: the caller polls again
        return None
    finally:
        cluster.shutdown()
    return True


# ---------------------------------------------------------------------------------------------
# Clusters


class _CqlClients:
    """Driver sessions handed to tests, closed before the nodes go away."""

    contact_points: list[str]
    native_port: int

    def __init__(self) -> None:
        self._drivers: list[Cluster] = []
        # Set by whoever will delete the nodes' data afterwards (the test fixtures): dropping
        # keyspaces then only costs time (2-4 s per DROP KEYSPACE measured here).
        self.disposable = False

    def connect(self, keyspace: str | None = None) -> Session:
        cluster = driver_cluster(self.contact_points, self.native_port)
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
            if not _is_loopback(ip):
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
        cluster = cls(ClusterSpec(**state["spec"]), Path(base_dir))
        cluster._pids = {int(i): int(pid) for i, pid in state["pids"].items()}
        return cluster

    def _save_state(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        state = {"spec": asdict(self.spec), "pids": {str(i): p for i, p in self._pids.items()}}
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
            if _tcp_open(ip, port) and self._answers_cql(ip, port):
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
        return f"pid {pid} is gone (cmdline {_proc_cmdline(pid)[:80]!r})"

    @staticmethod
    def _answers_cql(ip: str, port: int) -> bool:
        try:
            return query_release_version(ip, port).startswith("5.0")
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
        return lambda: ring_view(ip, self.native_port, self.spec.nodes) is all_up

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


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process, as `ps -o rss` reports it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------------------------
# CLI


def default_base_dir() -> Path:
    return cache_root() / "cluster"


def _cmd_fetch(args: argparse.Namespace) -> int:
    lib = fetch(args.version)
    marker = read_marker(lib.parent) or {}
    jars, size = len(marker.get("jars", [])), marker.get("bytes", 0) / 1e6
    print(f"cassandra-all {args.version}: {jars} jars, {size:.1f} MB in {lib}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    spec = ClusterSpec(
        nodes=args.nodes, first_ip=args.first_ip, heap_mb=args.heap_mb, version=args.version
    )
    if (args.base_dir / STATE_FILE).exists() and LocalCluster.attach(args.base_dir).running():
        print(
            f"error: a cluster already runs from {args.base_dir}; run `down` first", file=sys.stderr
        )
        return 1
    cluster = LocalCluster(spec, args.base_dir, start_timeout=args.timeout)
    started = time.monotonic()
    cluster.start(clean=args.clean)
    cluster.detach()
    print(f"{spec.nodes} node(s) up in {time.monotonic() - started:.1f} s from {cluster.base_dir}")
    _print_status(cluster)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    if not (args.base_dir / STATE_FILE).exists():
        print(f"nothing recorded in {args.base_dir}; nothing to stop")
        if args.clean:
            shutil.rmtree(args.base_dir, ignore_errors=True)
        return 0
    cluster = LocalCluster.attach(args.base_dir)
    stopped = cluster.running()
    cluster.stop(clean=args.clean)
    print(f"stopped nodes {stopped or 'none (none was running)'}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster.attach(args.base_dir)
    _print_status(cluster)
    return 0 if cluster.running() else 3


def _print_status(cluster: LocalCluster) -> None:
    for index in cluster.spec.indexes:
        pid = cluster.node_pid(index)
        alive = cluster.is_running(index)
        ip = cluster.spec.ip(index)
        cql = "cql up" if alive and _tcp_open(ip, cluster.native_port) else "cql down"
        kib = rss_kib(pid) if alive and pid else None
        rss = f"rss {kib // 1024} MiB" if kib else ""
        state = "alive" if alive else "stopped"
        print(f"node{index} {ip} pid {pid or '-'} {state} {cql} {rss}".rstrip())


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", default=None, help=f"cassandra-all 5.0.x (env {ENV_VERSION})")


def _add_base_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-dir", type=Path, default=None, help="node folders and state file (default: cache)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m accord_cassandra.launcher",
        description="Fetch Cassandra 5.0 jars and run local test nodes on 127.0.0.x.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_version(sub.add_parser("fetch", help="resolve the server jars into the cache"))

    up = sub.add_parser("up", help="start nodes one after another")
    up.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    _add_base_dir(up)
    up.add_argument("--clean", action="store_true", help="delete old node data first")
    up.add_argument("--first-ip", default="127.0.0.1", help="node i gets first-ip + i - 1")
    up.add_argument("--heap-mb", type=int, default=None, help=f"per node (env {ENV_HEAP})")
    up.add_argument("--timeout", type=float, default=None, help="seconds per node start")
    _add_version(up)

    down = sub.add_parser("down", help="stop the nodes recorded in the state file")
    _add_base_dir(down)
    down.add_argument("--clean", action="store_true", help="also delete the node folders")

    _add_base_dir(sub.add_parser("status", help="list nodes, pids and whether they are alive"))
    return parser


def _apply_defaults(args: argparse.Namespace) -> None:
    if hasattr(args, "version"):
        args.version = check_version(args.version or default_version())
    if hasattr(args, "base_dir"):
        args.base_dir = (args.base_dir or default_base_dir()).expanduser()
    if hasattr(args, "heap_mb"):
        args.heap_mb = args.heap_mb or default_heap_mb()


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fetch": _cmd_fetch,
    "up": _cmd_up,
    "down": _cmd_down,
    "status": _cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # The driver reports every host it discovers at INFO; only the launcher's progress matters.
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        _apply_defaults(args)
        return COMMANDS[args.command](args)
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
