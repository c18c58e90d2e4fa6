"""A local cluster of sidecar processes on loopback (and optionally real Cassandra nodes).

Used by ``accord-cassandra cluster up``, by the demo and by the tests. Each sidecar is a
separate OS process, so SIGKILL in tests is a real crash.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accord_cassandra.datastore import accord_tables_cql

BANK_TABLES = {
    "bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}
}
BANK_SCHEMA_CQL = (
    "CREATE KEYSPACE IF NOT EXISTS bank WITH replication = "
    "{'class': 'SimpleStrategy', 'replication_factor': 3}",
    "CREATE TABLE IF NOT EXISTS bank.accounts (id text PRIMARY KEY, balance bigint)",
    # The sidecars' own tables (see accord_cassandra.datastore). They would create them,
    # but creating them up front spares their start-up wait.
    *accord_tables_cql("bank"),
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass
class SidecarProcess:
    node_id: int
    address: str
    config_path: Path
    log_path: Path
    metrics_address: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accord_cassandra",
                "sidecar",
                "--config",
                str(self.config_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash at an arbitrary instant."""
        if self.process is not None and self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_serving(address: str, deadline: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether the sidecar at ``address`` reports SERVING before ``deadline``; gives up as
    soon as ``alive()`` says its process has exited (a config or startup error)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline and alive():
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


@dataclass
class LocalSidecars:
    """``nodes`` sidecars with configs, journals and logs under ``directory``."""

    directory: Path
    nodes: int = 3
    replication_factor: int = 3
    store: str = "memory"
    cassandra: Mapping[str, Any] | None = None
    tables: Mapping[str, Any] = field(default_factory=lambda: BANK_TABLES)
    client_token: str | None = None
    # Peers authenticate with this shared secret (peer_auth: hmac) unless ``extra`` sets
    # peer_auth itself; tests sign forged batches with it.
    peer_secret: str = field(default_factory=lambda: secrets.token_hex(32))
    extra: Mapping[str, Any] = field(default_factory=dict)
    sidecars: dict[int, SidecarProcess] = field(default_factory=dict)

    def write_configs(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        addresses = {i: f"127.0.0.1:{free_port()}" for i in range(1, self.nodes + 1)}
        for node_id, address in addresses.items():
            config: dict[str, Any] = {
                "node_id": node_id,
                "listen": address,
                "peers": addresses,
                "replication_factor": self.replication_factor,
                "journal_dir": str(self.directory / f"node{node_id}" / "journal"),
                "store": self.store,
                "metrics_listen": f"127.0.0.1:{free_port()}",
                "peer_auth": "hmac",
                "peer_keys": {"current": {"id": "local", "secret": self.peer_secret}},
                **self.extra,
            }
            if self.store == "memory":
                config["tables"] = dict(self.tables)
            if self.cassandra is not None:
                config["cassandra"] = dict(self.cassandra)
            if self.client_token is not None:
                config["client_token"] = self.client_token
            path = self.directory / f"node{node_id}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=True))
            self.sidecars[node_id] = SidecarProcess(
                node_id,
                address,
                path,
                self.directory / f"node{node_id}.log",
                config["metrics_listen"],
            )

    def start(self, timeout: float = 30.0) -> None:
        if not self.sidecars:
            self.write_configs()
        for sidecar in self.sidecars.values():
            if not sidecar.alive():
                sidecar.start()
        self.wait_all(timeout)

    def wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for sidecar in self.sidecars.values():
            if not wait_serving(sidecar.address, deadline, sidecar.alive):
                raise RuntimeError(
                    f"sidecar {sidecar.node_id} at {sidecar.address} did not start; "
                    f"log tail:\n{sidecar.log_tail()}"
                )

    def restart(self, node_id: int, timeout: float = 30.0) -> None:
        sidecar = self.sidecars[node_id]
        sidecar.start()
        if not wait_serving(sidecar.address, time.monotonic() + timeout, sidecar.alive):
            raise RuntimeError(
                f"sidecar {node_id} did not restart; log tail:\n{sidecar.log_tail()}"
            )

    def addresses(self) -> list[str]:
        return [s.address for s in self.sidecars.values()]

    def stop(self) -> None:
        for sidecar in self.sidecars.values():
            sidecar.stop()

    def __enter__(self) -> LocalSidecars:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def metrics_of(address: str) -> dict[str, float]:
    """Scrape one sidecar's /metrics into {name{labels}: value}."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    body = b"".join(chunks).split(b"\r\n\r\n", 1)[-1].decode()
    figures: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            figures[name] = float(value)
    return figures


__all__: Sequence[str] = [
    "BANK_SCHEMA_CQL",
    "BANK_TABLES",
    "LocalSidecars",
    "SidecarProcess",
    "metrics_of",
]
