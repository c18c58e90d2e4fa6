"""Local Apache Kafka brokers in KRaft mode (no ZooKeeper), one JVM per broker, for tests,
demos and CI: the Cassandra launcher's recipe (accord_cassandra.launcher) applied to Kafka.

Broker i (1-based) runs as a combined broker+controller on ``first_ip + i - 1``: clients on
``client_port``, the Raft quorum on ``controller_port``. A cluster of 1 or 3 shares one static
voter set (``controller.quorum.voters``), so the storage folders are formatted with the cluster
id and no bootstrap step. Readiness is a metadata round trip through the client listener that
lists every broker and names an active controller: a broker appears in metadata only after it
registered with the quorum's elected leader, so the quorum has a leader and the broker serves.

A state file (``kafka.json``) in the base folder records the spec and the pids so the CLI's
``down``/``status`` can find brokers a previous ``up`` started. Pids are checked against the
command line before any signal (pids get reused).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.probes import tcp_open
from accord_cassandra.launcher.process import busy_ports, proc_cmdline, rss_kib, tail_file
from stacksaga_store.kafka.errors import BrokerStartError, KafkaLauncherError, PortBusyError
from stacksaga_store.kafka.jars import check_version, default_version, fetch

__all__ = ["BrokerSpec", "LocalKafka", "default_first_ip"]

log = logging.getLogger(__name__)

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
STATE_FILE = "kafka.json"
ENV_FIRST_IP = "STACKSAGA_KAFKA_FIRST_IP"
ENV_HEAP = "STACKSAGA_KAFKA_HEAP_MB"
ENV_START_TIMEOUT = "STACKSAGA_KAFKA_START_TIMEOUT"
DEFAULT_FIRST_IP = "127.0.73.1"
# Measured (docs/kafka.md): the test suite's traffic runs in a 192 MiB heap; RSS stays near
# 400 MiB, most of it class metadata and the JIT, not heap.
DEFAULT_HEAP_MB = 192
DEFAULT_START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
POLL = 0.25
_JAAS_SAFE = re.compile(r"^[A-Za-z0-9._\-@+]{1,100}$")


def new_cluster_id() -> str:
    """A Kafka cluster id (a UUID in URL-safe base64). One starting with '-' would be read as
    an option by the storage tool's argument parser, so those are drawn again (as Kafka's own
    ``Uuid.randomUuid`` does)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def default_first_ip() -> str:
    return os.environ.get(ENV_FIRST_IP, DEFAULT_FIRST_IP)


def _default_heap() -> int:
    return int(os.environ.get(ENV_HEAP, DEFAULT_HEAP_MB))


@dataclass(frozen=True)
class BrokerSpec:
    """What to launch. ``partitions`` is the default for topics created without a count."""

    brokers: int = 1
    first_ip: str = field(default_factory=default_first_ip)
    client_port: int = 9092
    controller_port: int = 9093
    heap_mb: int = field(default_factory=_default_heap)
    version: str = field(default_factory=default_version)
    partitions: int = 3
    cluster_id: str = field(default_factory=lambda: new_cluster_id())
    # user -> password. Non-empty: the client listener is SASL_PLAINTEXT with PLAIN, these
    # are its only accounts (written into the listener's JAAS config), and the first one is
    # the brokers' own identity (inter-broker traffic, the launcher's readiness check).
    sasl_users: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.brokers not in (1, 3):
            raise KafkaLauncherError(f"brokers must be 1 or 3, got {self.brokers}")
        last = IPv4Address(self.first_ip) + (self.brokers - 1)
        if not (IPv4Address(self.first_ip).is_loopback and last.is_loopback):
            raise KafkaLauncherError(
                f"broker addresses must stay inside 127.0.0.0/8: {self.first_ip}"
            )
        if self.client_port == self.controller_port:
            raise KafkaLauncherError("client_port and controller_port must differ")
        if self.heap_mb < 64:
            raise KafkaLauncherError(f"heap_mb {self.heap_mb} is below the 64 MiB a broker needs")
        check_version(self.version)
        for user, password in self.sasl_users.items():
            for what, text in (("user", user), ("password", password)):
                if not _JAAS_SAFE.match(text):
                    raise KafkaLauncherError(
                        f"SASL {what} {text if what == 'user' else '(hidden)'!r} of user "
                        f"{user!r}: only letters, digits and . _ - @ + are allowed (it is "
                        "written into a JAAS config line)"
                    )

    @property
    def client_protocol(self) -> str:
        return "SASL_PLAINTEXT" if self.sasl_users else "PLAINTEXT"

    @property
    def broker_credentials(self) -> tuple[str, str] | None:
        """The brokers' own SASL identity (the first user), None without SASL."""
        return next(iter(self.sasl_users.items()), None)

    def jaas_config(self) -> str:
        """PLAIN login module: the brokers' identity plus one ``user_<name>`` per account."""
        credentials = self.broker_credentials
        if credentials is None:
            raise KafkaLauncherError("no SASL users: the client listener is PLAINTEXT")
        accounts = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
        return (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{credentials[0]}" password="{credentials[1]}" {accounts};'
        )

    @property
    def indexes(self) -> range:
        return range(1, self.brokers + 1)

    def ip(self, index: int) -> str:
        if index not in self.indexes:
            raise KafkaLauncherError(f"no broker {index} in a {self.brokers}-broker cluster")
        return str(IPv4Address(self.first_ip) + (index - 1))

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.ip(i)}:{self.client_port}" for i in self.indexes)

    def properties(self, index: int, data_dir: Path) -> str:
        voters = ",".join(f"{i}@{self.ip(i)}:{self.controller_port}" for i in self.indexes)
        replicas = self.brokers
        ip = self.ip(index)
        client = self.client_protocol
        lines = {
            "process.roles": "broker,controller",
            "node.id": str(index),
            "controller.quorum.voters": voters,
            "listeners": f"{client}://{ip}:{self.client_port},CONTROLLER://{ip}:{self.controller_port}",
            "advertised.listeners": f"{client}://{ip}:{self.client_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
            "log.dirs": str(data_dir),
            "num.partitions": str(self.partitions),
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(min(2, replicas)),
            # Topics are created on purpose (stacksaga_store.kafka.topics), never by a typo.
            "auto.create.topics.enable": "false",
            # Small internal topics: 50 offset partitions cost seconds of start time here.
            "offsets.topic.num.partitions": "5",
            "offsets.topic.replication.factor": str(replicas),
            "transaction.state.log.num.partitions": "5",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min(2, replicas)),
            # A test's consumer group starts at once instead of after 3 s of waiting for more.
            "group.initial.rebalance.delay.ms": "0",
            "log.flush.interval.messages": "9223372036854775807",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.retention.hours": "24",
        }
        if self.sasl_users:
            # The JAAS config scoped to the client listener: no JAAS file, no JVM-wide login.
            lines["sasl.enabled.mechanisms"] = "PLAIN"
            lines["sasl.mechanism.inter.broker.protocol"] = "PLAIN"
            lines["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = self.jaas_config()
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def to_state(self) -> dict[str, Any]:
        return asdict(self)


LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="INFO"/>
    <Logger name="org.apache.kafka" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Root level="WARN"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


class LocalKafka:
    """Brokers launched by this process (or attached to through the state file)."""

    def __init__(self, spec: BrokerSpec, base_dir: Path, *, start_timeout: float | None = None):
        self.spec = spec
        self.base_dir = base_dir
        self.start_timeout = start_timeout or float(
            os.environ.get(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT)
        )
        self._pids: dict[int, int] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started_seconds: float | None = None

    # -- files ------------------------------------------------------------------------------

    def broker_dir(self, index: int) -> Path:
        return self.base_dir / f"broker{index}"

    def log_file(self, index: int) -> Path:
        return self.broker_dir(index) / "logs" / "server.log"

    def _write_files(self, index: int) -> Path:
        home = self.broker_dir(index)
        (home / "logs").mkdir(parents=True, exist_ok=True)
        (home / "conf").mkdir(parents=True, exist_ok=True)
        props = home / "conf" / "server.properties"
        props.write_text(self.spec.properties(index, home / "data"))
        (home / "conf" / "log4j2.xml").write_text(LOG4J2.format(log=self.log_file(index)))
        return props

    def _java_command(self, java: str, index: int, main: str, *args: str) -> list[str]:
        lib = fetch(self.spec.version)
        conf = self.broker_dir(index) / "conf"
        heap = self.spec.heap_mb
        return [
            java,
            f"-Xms{heap}m",
            f"-Xmx{heap}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1",
            "-Xss512k",
            "-XX:MaxMetaspaceSize=128m",
            "-XX:ReservedCodeCacheSize=48m",
            "-XX:CICompilerCount=2",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={conf / 'log4j2.xml'}",
            f"-Dstacksaga.kafka.broker={self.broker_dir(index)}",
            "-cp",
            f"{lib}/*",
            main,
            *args,
        ]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, *, clean: bool = False) -> None:
        """Format (first time) and start every broker, then wait until all serve metadata."""
        java, _ = check_java()
        fetch(self.spec.version)
        if self.running():
            raise KafkaLauncherError(f"brokers {self.running()} already run from {self.base_dir}")
        wanted = [
            (self.spec.ip(i), port)
            for i in self.spec.indexes
            for port in (self.spec.client_port, self.spec.controller_port)
        ]
        busy = busy_ports(wanted)
        if busy:
            where = ", ".join(f"{ip}:{port}" for ip, port in busy)
            raise PortBusyError(
                f"port already in use: {where}. Another broker or test session holds it "
                f"(`ss -ltnp` shows the owner); stop it or set {ENV_FIRST_IP} to other addresses"
            )
        if clean:
            for index in self.spec.indexes:
                shutil.rmtree(self.broker_dir(index), ignore_errors=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for index in self.spec.indexes:
            props = self._write_files(index)
            if not (self.broker_dir(index) / "data" / "meta.properties").exists():
                self._format(java, index, props)
        for index in self.spec.indexes:
            self._launch(java, index)
        self._write_state()
        try:
            self._wait_ready(time.monotonic() + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - started
        log.info(
            "%d Kafka broker(s) ready in %.1f s at %s",
            self.spec.brokers,
            self.started_seconds,
            self.spec.bootstrap_servers,
        )

    def _format(self, java: str, index: int, props: Path) -> None:
        command = self._java_command(
            java, index, STORAGE_TOOL, "format", "-t", self.spec.cluster_id, "-c", str(props)
        )
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting broker {index}'s storage failed (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-3000:]}"
            )

    def _launch(self, java: str, index: int) -> None:
        props = self.broker_dir(index) / "conf" / "server.properties"
        command = self._java_command(java, index, MAIN_CLASS, str(props))
        out = (self.broker_dir(index) / "logs" / "stdout.log").open("ab")
        try:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        self._procs[index] = proc
        self._pids[index] = proc.pid

    def _wait_ready(self, deadline: float) -> None:
        ready = False
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for index in self.spec.indexes:
                if not self.is_running(index):
                    raise BrokerStartError(
                        f"broker {index} exited during start; last lines of its logs:\n"
                        f"{tail_file(self.log_file(index), 30)}\n"
                        f"{tail_file(self.broker_dir(index) / 'logs' / 'stdout.log', 20)}"
                    )
            if not all(tcp_open(self.spec.ip(i), self.spec.client_port) for i in self.spec.indexes):
                last_error = "client port not open yet"
                time.sleep(POLL * 2)
                continue
            try:
                brokers, controller = asyncio.run(
                    metadata_round_trip(
                        self.spec.bootstrap_servers,
                        timeout=5.0,
                        sasl=self.spec.broker_credentials,
                    )
                )
            except Exception as exc:  # noqa: BLE001 - any failure before the deadline is "not yet"
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                ready = brokers >= self.spec.brokers and controller is not None
                last_error = f"{brokers} of {self.spec.brokers} brokers, controller {controller}"
            if ready:
                return
            time.sleep(POLL * 2)
        raise BrokerStartError(
            f"Kafka at {self.spec.bootstrap_servers} not ready after {self.start_timeout:.0f} s "
            f"({last_error}); last lines of broker 1's log:\n{tail_file(self.log_file(1), 30)}"
        )

    def stop(self, *, clean: bool = False, kill: bool = False) -> None:
        """SIGTERM every broker at once, then wait (one shared deadline), SIGKILL what is left.

        All at once because every broker is also a controller: stopped one after another,
        the last one (its quorum gone) cannot finish its controlled shutdown and sat out the
        whole timeout before being killed (seen with 3 brokers: 30 s)."""
        signalled: list[int] = []
        for index in self.spec.indexes:
            pid = self._pids.get(index)
            if pid is None or not self.is_running(index):
                self._reap(index)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
            signalled.append(index)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and any(self.is_running(i) for i in signalled):
            for index in signalled:
                self._reap(index, wait=False)
            time.sleep(POLL)
        for index in signalled:
            if self.is_running(index):
                log.warning(
                    "broker %d (pid %s) ignored SIGTERM; killing it", index, self._pids[index]
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pids[index], signal.SIGKILL)
            self._reap(index)
        state = self.base_dir / STATE_FILE
        with contextlib.suppress(FileNotFoundError):
            state.unlink()
        if clean:
            for index in self.spec.indexes:
                shutil.rmtree(self.broker_dir(index), ignore_errors=True)

    def _reap(self, index: int, *, wait: bool = True) -> None:
        proc = self._procs.get(index)
        if proc is None:
            return
        if wait:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)
        else:
            proc.poll()

    # -- state ------------------------------------------------------------------------------

    def pid(self, index: int) -> int | None:
        return self._pids.get(index)

    def is_running(self, index: int) -> bool:
        pid = self._pids.get(index)
        if pid is None:
            return False
        proc = self._procs.get(index)
        if proc is not None:
            # Our own child: right after the fork its cmdline is still this interpreter's.
            return proc.poll() is None
        cmdline = proc_cmdline(pid)
        return (
            MAIN_CLASS in cmdline
            and f"-Dstacksaga.kafka.broker={self.broker_dir(index)}" in cmdline
        )

    def running(self) -> list[int]:
        return [i for i in self.spec.indexes if self.is_running(i)]

    def rss_mib(self, index: int) -> float | None:
        pid = self._pids.get(index)
        kib = rss_kib(pid) if pid is not None and self.is_running(index) else None
        return kib / 1024 if kib else None

    def _write_state(self) -> None:
        state = {"spec": self.spec.to_state(), "pids": {str(i): p for i, p in self._pids.items()}}
        (self.base_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")

    @classmethod
    def attach(cls, base_dir: Path) -> LocalKafka:
        try:
            state = json.loads((base_dir / STATE_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise KafkaLauncherError(f"no broker state in {base_dir}: {exc}") from exc
        kafka = cls(BrokerSpec(**state["spec"]), base_dir)
        kafka._pids = {int(i): int(p) for i, p in state.get("pids", {}).items()}
        return kafka


async def metadata_round_trip(
    bootstrap: str, *, timeout: float, sasl: tuple[str, str] | None = None
) -> tuple[int, int | None]:
    """(brokers listed, active controller id) from one metadata request (SASL PLAIN with
    ``sasl`` = (user, password))."""
    from aiokafka.admin import AIOKafkaAdminClient

    auth: dict[str, Any] = {}
    if sasl is not None:
        auth = {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": sasl[0],
            "sasl_plain_password": sasl[1],
        }
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **auth
    )
    try:
        await asyncio.wait_for(admin.start(), timeout)
        described = await asyncio.wait_for(admin.describe_cluster(), timeout)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    brokers: Sequence[Any] = described.get("brokers", [])
    controller = described.get("controller_id")
    return len(brokers), controller if isinstance(controller, int) and controller >= 0 else None
