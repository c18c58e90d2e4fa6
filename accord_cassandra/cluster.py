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
from prometheus_client.parser import text_string_to_metric_families

from accord_cassandra.ports import read_json, write_json_atomically

BANK_TABLES = {
    "bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}
}
BANK_SCHEMA_CQL = (
    "CREATE KEYSPACE IF NOT EXISTS bank WITH replication = "
    "{'class': 'SimpleStrategy', 'replication_factor': 3}",
    "CREATE TABLE IF NOT EXISTS bank.accounts (id text PRIMARY KEY, balance bigint)",
)


@dataclass
class SidecarProcess:
    node_id: int
    address: str
    config_path: Path
    log_path: Path
    metrics_address: str
    process: subprocess.Popen[bytes] | None = None
    log_level: str = "info"
    # Where peers deliver to it: its own peer port (peer_listen) if it has one, else address.
    peer_address: str = ""
    # Its CQL native-protocol endpoint (config cql_listen), if it has one.
    cql_address: str = ""
    # Its frame listener (config peer_frames_listen), if it has one.
    frames_address: str = ""

    @property
    def address_file(self) -> Path:
        """Where the sidecar writes the addresses it bound (config ``address_file``)."""
        return self.config_path.with_suffix(".address.json")

    @property
    def cql_peers_file(self) -> Path:
        """Every sidecar's CQL endpoint, for this one's (config ``cql_peers_file``)."""
        return self.config_path.with_suffix(".cql_peers.json")

    @property
    def peers_file(self) -> Path:
        """Where it reads its peers' addresses on first start (config ``peers_file``)."""
        return self.config_path.with_suffix(".peers.json")

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
                "--log-level",
                self.log_level,
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
    """``nodes`` sidecars on ``host`` with configs, journals and logs under ``directory``.

    Ports: every sidecar binds port 0 (gRPC and metrics), so the kernel picks ports no other
    process holds, and writes what it bound to its address file. Peers must know each
    other's addresses, which exist only once all have bound, so a first start has two
    steps: all sidecars bind and report, then each is handed its peers' addresses (its
    peers file, see ``peer_maps``) and only then serves. Each config is then rewritten with
    the bound ports, so a restarted sidecar comes back on the address its peers know (it
    retries that port for a while if the dead process's socket still holds it).
    """

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
    # Settings of one sidecar alone (e.g. the Cassandra node its CQL endpoint fronts).
    node_extra: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    sidecars: dict[int, SidecarProcess] = field(default_factory=dict)
    host: str = "127.0.0.1"
    log_level: str = "info"

    def write_configs(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        any_port = f"{self.host}:0"
        for node_id in range(1, self.nodes + 1):
            path = self.directory / f"node{node_id}.yaml"
            sidecar = SidecarProcess(
                node_id, "", path, self.directory / f"node{node_id}.log", "", None, self.log_level
            )
            config: dict[str, Any] = {
                "node_id": node_id,
                "listen": any_port,
                "peers": dict.fromkeys(range(1, self.nodes + 1), any_port),
                "replication_factor": self.replication_factor,
                "journal_dir": str(self.directory / f"node{node_id}" / "journal"),
                "store": self.store,
                "metrics_listen": any_port,
                "address_file": str(sidecar.address_file),
                "peers_file": str(sidecar.peers_file),
                # Peers reach each other on the framed link (docs/sidecars.md "Peer
                # transport"); peer_frames_listen: null in extra keeps them on gRPC.
                "peer_frames_listen": any_port,
                "peer_auth": "hmac",
                "peer_keys": {"current": {"id": "local", "secret": self.peer_secret}},
                **self.extra,
                **self.node_extra.get(node_id, {}),
            }
            if config.get("cql_listen"):
                config.setdefault("cql_peers_file", str(sidecar.cql_peers_file))
            if self.store == "memory":
                config["tables"] = dict(self.tables)
            if self.cassandra is not None:
                config["cassandra"] = dict(self.cassandra)
            if self.client_token is not None:
                config["client_token"] = self.client_token
            for stale in (sidecar.address_file, sidecar.peers_file, sidecar.cql_peers_file):
                stale.unlink(missing_ok=True)
            path.write_text(yaml.safe_dump(config, sort_keys=True))
            self.sidecars[node_id] = sidecar

    def start(self, timeout: float = 30.0) -> None:
        if not self.sidecars:
            self.write_configs()
        deadline = time.monotonic() + timeout
        for sidecar in self.sidecars.values():
            if not sidecar.alive():
                sidecar.start()
        if any(not sidecar.address for sidecar in self.sidecars.values()):
            self._learn_addresses(deadline)
            # Frame maps after peer maps: a subclass starting proxies for both does so in
            # one go (see bench/clusters.py).
            peer_maps = self.peer_maps()
            self._hand_out_peers(peer_maps, self.frame_maps())
        self.wait_all(max(0.0, deadline - time.monotonic()))

    def _learn_addresses(self, deadline: float) -> None:
        """Wait for every sidecar's address file: the ports the kernel gave it."""
        for sidecar in self.sidecars.values():
            while (bound := read_json(sidecar.address_file)) is None:
                if time.monotonic() >= deadline or not sidecar.alive():
                    raise RuntimeError(
                        f"sidecar {sidecar.node_id} did not bind its ports; "
                        f"log tail:\n{sidecar.log_tail()}"
                    )
                time.sleep(0.05)
            sidecar.address = str(bound["listen"])
            sidecar.metrics_address = str(bound["metrics_listen"])
            sidecar.peer_address = str(bound.get("peer_listen") or bound["listen"])
            sidecar.cql_address = str(bound.get("cql_listen") or "")
            sidecar.frames_address = str(bound.get("peer_frames_listen") or "")

    def peer_maps(self) -> dict[int, dict[int, str]]:
        """Per sidecar, the address it reaches each peer at (by default the peer's own)."""
        direct = {node_id: s.peer_address or s.address for node_id, s in self.sidecars.items()}
        return {node_id: dict(direct) for node_id in self.sidecars}

    def frame_maps(self) -> dict[int, dict[int, str]]:
        """Per sidecar, the address it reaches each peer's frame listener at (the peers
        without one: none)."""
        direct = {n: s.frames_address for n, s in self.sidecars.items() if s.frames_address}
        return {node_id: dict(direct) for node_id in self.sidecars}

    def _hand_out_peers(
        self,
        peer_maps: Mapping[int, Mapping[int, str]],
        frame_maps: Mapping[int, Mapping[int, str]] | None = None,
    ) -> None:
        cql = {node_id: s.cql_address for node_id, s in self.sidecars.items() if s.cql_address}
        for node_id, sidecar in self.sidecars.items():
            peers = {int(peer): str(address) for peer, address in peer_maps[node_id].items()}
            frames = {
                int(peer): str(address)
                for peer, address in (frame_maps or {}).get(node_id, {}).items()
            }
            # The config first, with the bound ports and no peers file: what a restart reads.
            # The running sidecar read its config before it bound, so this cannot confuse it.
            config = yaml.safe_load(sidecar.config_path.read_text())
            config.update(
                listen=sidecar.address, metrics_listen=sidecar.metrics_address, peers=peers
            )
            if config.get("cql_listen"):
                config["cql_listen"] = sidecar.cql_address
                # Before the peers file: the endpoint serves only once that has come.
                write_json_atomically(Path(config["cql_peers_file"]), cql)
            if config.get("peer_listen"):
                config["peer_listen"] = sidecar.peer_address
                config["peer_addresses"] = peers
            if config.get("peer_frames_listen"):
                config["peer_frames_listen"] = sidecar.frames_address
            config["peer_frame_addresses"] = frames
            config.pop("peers_file", None)
            sidecar.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
            write_json_atomically(sidecar.peers_file, {"peers": peers, "peer_frames": frames})

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
    """Scrape one sidecar's /metrics into {name{label="value",...}: value} (labels sorted)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    body = b"".join(chunks).split(b"\r\n\r\n", 1)[-1].decode()
    figures: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            figures[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return figures


__all__: Sequence[str] = [
    "BANK_SCHEMA_CQL",
    "BANK_TABLES",
    "LocalSidecars",
    "SidecarProcess",
    "metrics_of",
]
