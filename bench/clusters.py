"""Clusters for the suites: sidecars and Cassandra nodes behind per-link WAN proxies.

Addresses. Everything is on loopback. Sidecars listen on 127.0.0.1 at ports the kernel picks
(port 0, as ``LocalSidecars`` does); their proxies too, started once the sidecars have bound
and before they learn their peers' (proxied) addresses. Cassandra nodes the bench launches listen on
``127.0.88.1-3`` (``BENCH_CASSANDRA_FIRST_IP`` moves them) and, when their internode links are
delayed, announce ``127.0.89.1-3`` (``BENCH_CASSANDRA_PROXY_FIRST_IP``) where the proxies
listen: the tests use 127.0.0.1-3 and 127.0.1.1, the saga bench 127.0.77.1.

``BENCH_CASSANDRA_CONTACT_POINTS=ip1,ip2,ip3[:port]`` makes the suites that only need *a*
3-node cluster (not a delayed one) use a running cluster instead of launching their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accord_cassandra.cluster import LocalSidecars, SidecarProcess
from bench.interrupts import cleanup
from bench.report import note
from bench.wan import REGIONS, Link, ProxyProcess, RttMatrix

if TYPE_CHECKING:
    from accord_cassandra.launcher import ClusterSpec

FIRST_IP_ENV = "BENCH_CASSANDRA_FIRST_IP"
PROXY_FIRST_IP_ENV = "BENCH_CASSANDRA_PROXY_FIRST_IP"
CONTACT_POINTS_ENV = "BENCH_CASSANDRA_CONTACT_POINTS"
# "1" from whoever runs the cluster named by the contact points (here and in the saga and
# recovery suites' STACKSAGA_BENCH_CONTACT_POINT) and deletes it afterwards, as the quick-suite
# test does: the suites then leave their keyspaces rather than drop them, one schema change
# less each on a cluster that serialises them while other suites run.
DISPOSABLE_ENV = "BENCH_CASSANDRA_DISPOSABLE"
DEFAULT_FIRST_IP = "127.0.88.1"
DEFAULT_PROXY_FIRST_IP = "127.0.89.1"
SIDECAR_HOST = "127.0.0.1"
RACKDC_FILE = "cassandra-rackdc.properties"
# Schema changes wait for every node to agree; on a loaded 2-core machine that took longer
# than the driver's request timeout (a DROP KEYSPACE failed the quick suite at load 50).
DDL_TIMEOUT = 120.0


def existing_cluster_disposable() -> bool:
    """Whether the running cluster the suites were pointed at is deleted after the run."""
    return os.environ.get(DISPOSABLE_ENV) == "1"


def bench_nice() -> int:
    """Niceness for the latency-sensitive suites' own processes (``BENCH_NICE``, default
    -10): this machine is shared, and a sidecar or proxy waiting for a CPU behind other
    tenants' work adds that wait to every emulated hop. 0 turns it off."""
    return int(os.environ.get("BENCH_NICE", "-10"))


def raise_own_priority(nice: int) -> int:
    """Apply ``nice`` to this process (before it starts threads); returns what it got."""
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    return os.getpriority(os.PRIO_PROCESS, 0)


def region_of(node_id: int) -> str:
    """Sidecar / Cassandra node i (1-based) sits in region A, B, C, A, ..."""
    return REGIONS[(node_id - 1) % len(REGIONS)]


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------------------------------
# Sidecars


@dataclass
class WrappedSidecarProcess(SidecarProcess):
    """A sidecar started through :mod:`bench.sidecar_wrapper` (clock shift, profile)."""

    offset_ms: float = 0.0
    profile_out: Path | None = None
    nice: int = 0
    # Where ``accord`` is imported from instead of the source tree (the mypyc-compiled
    # build of bench/accel.py); None: the pure source.
    pythonpath: Path | None = None
    # Where the sidecar notes its stage timestamps (bench/stage_trace.py); None: it does not.
    trace_dir: Path | None = None

    def start(self) -> None:
        import subprocess
        import sys

        command = [sys.executable, "-m", "bench.sidecar_wrapper", "--config", str(self.config_path)]
        command += ["--log-level", self.log_level]
        if self.offset_ms:
            command += ["--offset-ms", str(self.offset_ms)]
        if self.profile_out is not None:
            command += ["--profile-out", str(self.profile_out)]
        if self.nice:
            command += ["--nice", str(self.nice)]
        if self.trace_dir is not None:
            command += ["--trace-dir", str(self.trace_dir)]
        env, cwd = None, None
        if self.pythonpath is not None:
            env = {**os.environ, "PYTHONPATH": str(self.pythonpath)}
            # ``-m`` puts the working directory first on sys.path: run from the sidecar's
            # own folder, or a checkout's accord/ would shadow the compiled copy.
            cwd = self.config_path.parent
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )


@dataclass
class BenchSidecars(LocalSidecars):
    """Sidecars for the suites: optionally behind WAN proxies, skewed, profiled.

    With a ``matrix``, sidecar *i* reaches sidecar *j* through proxy *(i, j)* with
    ``RTT(region i, region j)/2`` each way; clients talk to their local sidecar directly.
    ``clock_offset_ms`` shifts sidecars' clocks, ``profile`` runs them under cProfile and
    ``nice`` sets their priority (see :mod:`bench.sidecar_wrapper`); ``pythonpath`` runs
    them on another copy of ``accord`` (the compiled build, :mod:`bench.accel`).
    """

    matrix: RttMatrix | None = None
    clock_offset_ms: Mapping[int, float] = field(default_factory=dict)
    profile: bool = False
    nice: int = 0
    pythonpath: Path | None = None
    trace_dir: Path | None = None
    links: list[Link] = field(default_factory=list)
    link_stats: dict[str, Any] = field(default_factory=dict)
    proxies: ProxyProcess | None = None
    _frame_maps: dict[int, dict[int, str]] = field(default_factory=dict)

    def write_configs(self) -> None:
        super().write_configs()
        self.links = []
        for node_id, sidecar in sorted(self.sidecars.items()):
            offset = float(self.clock_offset_ms.get(node_id, 0.0))
            wrapped = self.pythonpath is not None or self.trace_dir is not None
            if offset or self.profile or self.nice or wrapped:
                self.sidecars[node_id] = WrappedSidecarProcess(
                    sidecar.node_id,
                    sidecar.address,
                    sidecar.config_path,
                    sidecar.log_path,
                    sidecar.metrics_address,
                    log_level=sidecar.log_level,
                    offset_ms=offset,
                    profile_out=self.profile_path(node_id) if self.profile else None,
                    nice=self.nice,
                    pythonpath=self.pythonpath,
                    trace_dir=self.trace_dir,
                )

    def profile_path(self, node_id: int) -> Path:
        return self.directory / f"node{node_id}.prof"

    def peer_maps(self) -> dict[int, dict[int, str]]:
        """Without a matrix, peers are direct; with one, sidecar *i* reaches *j* through
        proxy *(i, j)*, started here (all sidecars have bound, none serves yet: a sidecar's
        first messages find its links listening)."""
        maps = super().peer_maps()
        if self.matrix is None:
            return maps
        routes = [
            (node_id, other_id)
            for node_id in sorted(self.sidecars)
            for other_id in sorted(self.sidecars)
            if other_id != node_id
        ]
        # The framed peer link (docs/sidecars.md "Peer transport") gets proxies of its own,
        # with the same delays: a sidecar sends its batches there, gRPC only to a peer
        # without a frame listener.
        framed = [
            (node_id, other_id)
            for node_id, other_id in routes
            if self.sidecars[other_id].frames_address
        ]
        links = [
            Link(
                f"sidecar{node_id}->sidecar{other_id}{suffix}",
                (SIDECAR_HOST, 0),
                _host_port(target),
                self.matrix.one_way_ms(region_of(node_id), region_of(other_id)),
                self.matrix.jitter_ms,
            )
            for suffix, chosen in (("", routes), ("-frames", framed))
            for node_id, other_id in chosen
            for target in (
                self.sidecars[other_id].frames_address
                if suffix
                else self.sidecars[other_id].address,
            )
        ]
        self.proxies = ProxyProcess(links, self.directory / "wan")
        self.proxies.start()
        # The proxy process reports the ports it bound, in the order of the links.
        self.links = self.proxies.links
        frame_maps: dict[int, dict[int, str]] = {node_id: {} for node_id in self.sidecars}
        for (node_id, other_id), link in zip(routes, self.links, strict=False):
            maps[node_id][other_id] = f"{link.listen[0]}:{link.listen[1]}"
        for (node_id, other_id), link in zip(framed, self.links[len(routes) :], strict=True):
            frame_maps[node_id][other_id] = f"{link.listen[0]}:{link.listen[1]}"
        self._frame_maps = frame_maps
        return maps

    def frame_maps(self) -> dict[int, dict[int, str]]:
        """Through the proxies :meth:`peer_maps` started, with a matrix."""
        if self.matrix is None:
            return super().frame_maps()
        return self._frame_maps

    def start(self, timeout: float = 60.0) -> None:
        try:
            super().start(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with cleanup():
            super().stop()
            if self.proxies is not None:
                self.link_stats = self.proxies.stop()
                self.proxies = None

    def __enter__(self) -> BenchSidecars:
        self.start()
        return self


# ------------------------------------------------------------------------------------------
# Cassandra


def bench_ips(nodes: int) -> list[str]:
    first = IPv4Address(os.environ.get(FIRST_IP_ENV, DEFAULT_FIRST_IP))
    return [str(first + i) for i in range(nodes)]


def proxy_ips(nodes: int) -> list[str]:
    first = IPv4Address(os.environ.get(PROXY_FIRST_IP_ENV, DEFAULT_PROXY_FIRST_IP))
    return [str(first + i) for i in range(nodes)]


@dataclass
class CassandraHandle:
    contact_points: list[str]
    native_port: int
    description: str
    layer: str
    # Whether the cluster goes away after the suite (then keyspaces need no dropping).
    disposable: bool = False
    # JVM pids when the bench launched the nodes (for CPU accounting); empty otherwise.
    pids: list[int] = field(default_factory=list)
    internode_link_stats: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def bench_cassandra(nodes: int = 3) -> Iterator[CassandraHandle]:
    """A plain ``nodes``-node cluster: the running one named by ``BENCH_CASSANDRA_CONTACT_
    POINTS``, or one launched on ``127.0.88.x`` for the duration."""
    from bench.wan import LAYER_NONE

    existing = os.environ.get(CONTACT_POINTS_ENV)
    if existing:
        from accord_cassandra.launcher import parse_contact_points

        ips, port = parse_contact_points(existing)
        yield CassandraHandle(
            ips,
            port,
            f"existing cluster {existing}",
            LAYER_NONE,
            disposable=existing_cluster_disposable(),
        )
        return
    from accord_cassandra.launcher import ClusterSpec, LocalCluster

    ips = bench_ips(nodes)
    spec = ClusterSpec(nodes=nodes, first_ip=ips[0], cluster_name="accord_bench")
    with tempfile.TemporaryDirectory(prefix="accord-bench-cassandra-") as folder:
        cluster = LocalCluster(spec, Path(folder))
        cluster.disposable = True
        note(f"starting {nodes} Cassandra node(s) on {', '.join(ips)}")
        cluster.start()
        try:
            yield CassandraHandle(
                ips,
                spec.native_port,
                f"{nodes} local nodes, Cassandra {spec.version}, heap {spec.heap_mb} MiB, "
                f"paxos_variant v2",
                LAYER_NONE,
                disposable=True,
                pids=_pids(cluster),
            )
        finally:
            with cleanup():
                cluster.stop(clean=True)


def _pids(cluster: Any) -> list[int]:
    return [pid for i in cluster.spec.indexes if (pid := cluster.node_pid(i)) is not None]


def announced_spec(ips: Sequence[str], proxies: Sequence[str], folder: Path) -> ClusterSpec:
    """A spec whose node *i* announces ``broadcast_address`` = its proxy IP (seeds likewise)
    and is datacenter ``region_of(i)`` (GossipingPropertyFileSnitch, whose rack/dc files
    are written into ``folder``).

    Datacenters per region let each sidecar's driver use only its own region's node as
    coordinator (``local_datacenter``): otherwise the driver would reach remote nodes' native
    port directly, a path no proxy delays.
    """
    from accord_cassandra.launcher import ClusterSpec

    plain = ClusterSpec(nodes=len(ips), first_ip=ips[0], cluster_name="accord_bench_wan")
    seeds = [
        {
            "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
            "parameters": [{"seeds": f"{proxies[0]}:{plain.storage_port}"}],
        }
    ]
    folder.mkdir(parents=True, exist_ok=True)
    options: dict[int, list[str]] = {}
    for index in plain.indexes:
        rackdc = folder / f"node{index}-{RACKDC_FILE}"
        rackdc.write_text(f"dc={region_of(index)}\nrack=rack1\n")
        options[index] = [f"-D{RACKDC_FILE}={rackdc.as_uri()}"]
    return dataclasses.replace(
        plain,
        extra_config={
            index: {
                "broadcast_address": proxies[index - 1],
                "seed_provider": seeds,
                "endpoint_snitch": "GossipingPropertyFileSnitch",
            }
            for index in plain.indexes
        },
        extra_jvm_options=options,
    )


def internode_links(
    listen_ips: Sequence[str], announced_ips: Sequence[str], matrix: RttMatrix, port: int
) -> list[Link]:
    """One proxy per node on its announced address, delaying by the sniffed sender."""
    links = []
    for target_index, (listen, announced) in enumerate(zip(listen_ips, announced_ips, strict=True)):
        target_region = region_of(target_index + 1)
        by_source = {
            source: matrix.one_way_ms(region_of(source_index + 1), target_region)
            for source_index, source in enumerate(announced_ips)
            if source_index != target_index
        }
        links.append(
            Link(
                f"cassandra->{listen}",
                (announced, port),
                (listen, port),
                0.0,
                matrix.jitter_ms,
                by_source=by_source,
                sniff_source=True,
            )
        )
    return links


@contextlib.contextmanager
def wan_cassandra(matrix: RttMatrix, nodes: int = 3) -> Iterator[CassandraHandle]:
    """A launched cluster whose internode links (storage port) go through delay proxies.

    Each node listens on 127.0.88.i but announces 127.0.89.i (``broadcast_address``), so its
    peers dial the proxy there; the proxy forwards to 127.0.88.i with the delay of the
    sender's region, recognised from the handshake (see :class:`bench.wan.Link`). Node *i* is
    datacenter ``region_of(i)`` (A, B, C). Clients use the native port on 127.0.88.i directly
    and should stay in their datacenter.
    """
    from accord_cassandra.launcher import LocalCluster
    from bench.wan import LAYER_PROXY

    ips, announced = bench_ips(nodes), proxy_ips(nodes)
    with tempfile.TemporaryDirectory(prefix="accord-bench-wan-cassandra-") as folder:
        spec = announced_spec(ips, announced, Path(folder) / "rackdc")
        links = internode_links(ips, announced, matrix, spec.storage_port)
        proxies = ProxyProcess(links, Path(folder) / "wan")
        proxies.start()
        cluster = LocalCluster(spec, Path(folder) / "cassandra")
        cluster.disposable = True
        handle = CassandraHandle(
            ips,
            spec.native_port,
            f"{nodes} local nodes, Cassandra {spec.version}, heap {spec.heap_mb} MiB, "
            f"paxos_variant v2, internode links via proxies on {', '.join(announced)}",
            LAYER_PROXY,
            disposable=True,
        )
        try:
            note(f"starting {nodes} Cassandra nodes on {', '.join(ips)} behind WAN proxies")
            cluster.start()
            handle.pids = _pids(cluster)
            yield handle
        finally:
            with cleanup():
                cluster.stop(clean=True)
            handle.internode_link_stats = proxies.stop()
