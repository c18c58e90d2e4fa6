"""Ports: servers bind port 0 and report what they bound; fixed ports are retried, then named.

Also the sidecar's Prometheus histogram (a real one: its count never goes down).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from accord_cassandra.cluster import LocalSidecars, metrics_of, wait_serving
from accord_cassandra.config import ConfigError, load
from accord_cassandra.host import HostMetrics
from accord_cassandra.ports import AddressInUse, bind_retrying, read_json
from bench.wan import Link, ProxyProcess, echo_server

REPO = Path(__file__).resolve().parents[2]
TABLES = {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}}


@pytest.fixture
def held_port() -> Iterator[tuple[socket.socket, int]]:
    """A port some other process (here: this one) listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock, int(sock.getsockname()[1])


def _bind_server(port: int) -> asyncio.Server:
    async def bind() -> asyncio.Server:
        return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)

    async def scenario() -> asyncio.Server:
        server = await bind_retrying(bind, f"127.0.0.1:{port}", retry_seconds=1.0)
        server.close()
        await server.wait_closed()
        return server

    return asyncio.run(scenario())


def test_a_fixed_port_that_stays_taken_is_named(held_port: tuple[socket.socket, int]) -> None:
    _, port = held_port
    started = time.monotonic()
    with pytest.raises(AddressInUse, match=f"127.0.0.1:{port} is still in use after 1 s"):
        _bind_server(port)
    assert time.monotonic() - started >= 1.0, "it retried before giving up"


def test_a_fixed_port_released_during_the_retries_is_bound() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])

    async def scenario() -> int:
        async def bind() -> asyncio.Server:
            return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)

        async def release() -> None:
            await asyncio.sleep(0.3)
            sock.close()

        releaser = asyncio.create_task(release())
        server = await bind_retrying(bind, f"127.0.0.1:{port}", retry_seconds=10.0)
        await releaser
        bound = int(server.sockets[0].getsockname()[1])
        server.close()
        await server.wait_closed()
        return bound

    assert asyncio.run(scenario()) == port


def test_port_zero_is_never_retried() -> None:
    calls = []

    async def bind() -> None:
        calls.append(1)
        raise OSError(98, "Address already in use")

    with pytest.raises(OSError, match="Address already in use"):
        asyncio.run(bind_retrying(bind, "127.0.0.1:0"))
    assert calls == [1]


def _sidecar_config(tmp_path: Path, **fields: object) -> Path:
    config = {
        "node_id": 1,
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "peers": {1: "127.0.0.1:0"},
        "replication_factor": 1,
        "journal_dir": str(tmp_path / "journal"),
        "tables": TABLES,
        "address_file": str(tmp_path / "address.json"),
        "drain_seconds": 0,
        **fields,
    }
    path = tmp_path / "node1.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_sidecar_on_port_zero_reports_the_ports_it_bound(tmp_path: Path) -> None:
    path = _sidecar_config(tmp_path)
    log = tmp_path / "sidecar.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "accord_cassandra", "sidecar", "--config", str(path)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while (bound := read_json(tmp_path / "address.json")) is None:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no address file"
            time.sleep(0.05)
        host, _, port = bound["listen"].rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert wait_serving(bound["listen"], deadline, lambda: process.poll() is None)
        assert metrics_of(bound["metrics_listen"])["accord_commit_latency_seconds_count"] == 0
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_peers_on_port_zero_need_a_peers_file(tmp_path: Path) -> None:
    path = _sidecar_config(tmp_path, peers={1: "127.0.0.1:0", 2: "127.0.0.1:0"})
    with pytest.raises(ConfigError, match=r"peers \[2\] have port 0.*peers_file"):
        load(path)
    config = load(path, peers_file=str(tmp_path / "peers.json"))
    assert config.peers_file == tmp_path / "peers.json"


def test_local_sidecars_use_their_host_and_log_level(tmp_path: Path) -> None:
    """Another loopback address and debug logs, without subclassing; a restarted sidecar
    comes back on the address its peers know (its config now names the bound ports)."""
    cluster = LocalSidecars(tmp_path, tables=TABLES, host="127.0.0.2", log_level="debug")
    try:
        cluster.start(timeout=90)
        addresses = cluster.addresses()
        assert all(a.startswith("127.0.0.2:") and not a.endswith(":0") for a in addresses)
        assert len(set(addresses)) == 3
        for node_id, sidecar in cluster.sidecars.items():
            config = yaml.safe_load(sidecar.config_path.read_text())
            assert config["listen"] == sidecar.address
            assert config["metrics_listen"] == sidecar.metrics_address
            assert config["peers"] == dict(zip(cluster.sidecars, addresses, strict=True))
            assert "peers_file" not in config
            assert json.loads(sidecar.peers_file.read_text()) == {
                "peers": {str(n): a for n, a in config["peers"].items()},
                "peer_frames": {str(n): a for n, a in config["peer_frame_addresses"].items()},
            }
            frames = {n: s.frames_address for n, s in cluster.sidecars.items()}
            assert config["peer_frames_listen"] == sidecar.frames_address
            assert config["peer_frame_addresses"] == frames
            assert all(a.startswith("127.0.0.2:") and not a.endswith(":0") for a in frames.values())
            assert "level=DEBUG" in sidecar.log_path.read_text(), f"node {node_id}"
        victim = cluster.sidecars[2]
        victim.kill()
        cluster.restart(2, timeout=60)
        assert cluster.addresses() == addresses
    finally:
        cluster.stop()


def test_histogram_count_never_goes_down() -> None:
    """The old raw sample list was trimmed from 100k to 50k samples, so _count went down
    and Prometheus saw a counter reset."""
    metrics = HostMetrics()
    commits = 100_001
    for i in range(commits):
        metrics.observe("ok", (i % 100) / 1000)
    metrics.observe("timeout", 10.0)
    registry = CollectorRegistry()
    registry.register(metrics.commit_latency)
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert samples[("accord_commit_latency_seconds_count", None)] == commits
    assert samples[("accord_commit_latency_seconds_bucket", "+Inf")] == commits
    # 0..99 ms: 0, 1 -> the 1 ms bucket, ..., 50 -> the 50 ms bucket.
    assert samples[("accord_commit_latency_seconds_bucket", "0.001")] == 2 * 1000 + 1
    assert samples[("accord_commit_latency_seconds_bucket", "0.05")] == 51 * 1000 + 1
    assert metrics.commits == {"ok": commits, "timeout": 1}


def test_wan_proxies_bind_port_zero_and_report_it(tmp_path: Path) -> None:
    with echo_server() as target:
        links = [Link(f"link{i}", ("127.0.0.1", 0), target, 0.0) for i in range(2)]
        with ProxyProcess(links, tmp_path) as proxies:
            ports = [link.listen[1] for link in proxies.links]
            assert all(port > 0 for port in ports) and len(set(ports)) == 2
            for link in proxies.links:
                with socket.create_connection(link.listen, timeout=10) as connection:
                    connection.sendall(b"ping")
                    assert connection.recv(4) == b"ping"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param({"1": "127.0.0.1:5", "3": "127.0.0.1:6"}, r"names nodes \[1, 3\]", id="ids"),
        pytest.param({"1": "127.0.0.1:5", "2": "127.0.0.1:0"}, "has no port", id="port-0"),
        pytest.param({"1": "127.0.0.1:5", "2": "nowhere"}, "not host:port", id="address"),
        pytest.param(["127.0.0.1:5"], "not a mapping", id="list"),
        pytest.param(
            {"peers": {"1": "127.0.0.1:5", "2": "127.0.0.1:6"}, "peer_frames": {"3": "h:7"}},
            r"peer_frames names nodes \[3\]",
            id="frames-ids",
        ),
        pytest.param(
            {"peers": {"1": "127.0.0.1:5", "2": "127.0.0.1:6"}, "peer_frames": {"2": "h:0"}},
            "has no port",
            id="frames-port-0",
        ),
    ],
)
def test_a_bad_peers_file_is_named(tmp_path: Path, content: object, message: str) -> None:
    from accord_cassandra.server import _peer_addresses

    peers_file = tmp_path / "peers.json"
    peers_file.write_text(json.dumps(content))
    path = _sidecar_config(tmp_path, peers={1: "127.0.0.1:0", 2: "127.0.0.1:0"})
    config = load(path, peers_file=str(peers_file))
    with pytest.raises(ConfigError, match=message) as caught:
        asyncio.run(_peer_addresses(config))
    assert str(peers_file) in str(caught.value)


def test_a_good_peers_file_gives_the_addresses(tmp_path: Path) -> None:
    from accord_cassandra.server import _peer_addresses

    peers_file = tmp_path / "peers.json"
    peers_file.write_text(json.dumps({"1": "127.0.0.1:5", "2": "127.0.0.1:6"}))
    path = _sidecar_config(tmp_path, peers={1: "127.0.0.1:0", 2: "127.0.0.1:0"})
    config = load(path, peers_file=str(peers_file))
    assert asyncio.run(_peer_addresses(config)) == ({1: "127.0.0.1:5", 2: "127.0.0.1:6"}, {})
    # With frame listeners: both maps, the frames' for the peers that have one.
    both = {"peers": {"1": "127.0.0.1:5", "2": "127.0.0.1:6"}, "peer_frames": {"2": "[::1]:7"}}
    peers_file.write_text(json.dumps(both))
    assert asyncio.run(_peer_addresses(config)) == (
        {1: "127.0.0.1:5", 2: "127.0.0.1:6"},
        {2: "[::1]:7"},
    )
