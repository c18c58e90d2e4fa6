"""Userspace WAN emulation: TCP proxies that hold every byte for a configured one-way delay.

Why a proxy: this machine's kernel has no ``netem`` qdisc (``tc qdisc add dev lo root netem
delay 1ms`` answers "Specified qdisc kind is unknown"; see :func:`netem_available`), so the
bench cannot delay packets in the kernel. Instead every inter-node link gets a proxy of its
own: node *i* dials node *j* through proxy *(i, j)*, which forwards both directions of each
connection with ``RTT(region i, region j) / 2`` added to every chunk. Request and answer then
take one emulated round trip, as on a WAN.

Theory of operation. Per accepted connection the proxy opens one upstream connection and runs
two pipes. A pipe's reader stamps each chunk with ``due = max(previous due, now + delay +
jitter)`` and queues it; its writer sleeps until the head chunk is due and writes it. Taking
the max keeps the byte order of a TCP stream even with jitter (a real path reorders packets,
never stream bytes). The queue is bounded (``QUEUE_CHUNKS``): a full queue stops the reader,
so TCP back-pressure reaches the sender instead of memory growing.

What it does not model: bandwidth limits, loss, and the per-packet spreading of a large write
(a chunk is delayed as a whole). Its own cost (one Python hop each way) is measured by
:func:`calibrate` and reported beside every figure produced through it.

``python -m bench.wan --spec links.json`` runs the links of a JSON list in their own process
(so the load generator's event loop cannot delay the proxies) and prints ``ready`` and the
addresses bound (JSON, by link name) once all listen; SIGTERM stops it. A link whose listen
port is 0 gets whatever free port the kernel picks, so nothing races for ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

LAYER_PROXY = "userspace proxy (bench/wan.py)"
LAYER_NETEM = "netem"
LAYER_NONE = "none (loopback, no WAN emulation)"
CHUNK_BYTES = 64 * 1024
# At most this many chunks wait per direction (<= 16 MiB); then the reader stops reading.
QUEUE_CHUNKS = 256
CONNECT_TIMEOUT_SECONDS = 5.0
# Cassandra's Initiate names the sender within its first 20 bytes; 256 leaves room to spare.
SNIFF_BYTES = 256
SNIFF_TIMEOUT_SECONDS = 10.0
PROXY_NICE = -10
TRACE_ENTRIES_MAX = 200_000
READY_TIMEOUT_SECONDS = 20.0
REGIONS = ("A", "B", "C")
# Default round trips in ms between the three regions. The triangle is deliberately not
# metric (80 > 10 + 40): the matrix is a configuration, not a geography.
DEFAULT_RTT_MS = {("A", "B"): 10.0, ("A", "C"): 40.0, ("B", "C"): 80.0}


def netem_available() -> tuple[bool, str]:
    """Whether ``tc`` can add a netem qdisc on loopback here; removes it again at once.

    Returns the answer and the tool's own words, which the reports quote.
    """
    tc = shutil.which("tc")
    if tc is None:
        return False, "tc not installed"
    probe = subprocess.run(
        [tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    if probe.returncode == 0:
        subprocess.run(
            [tc, "qdisc", "del", "dev", "lo", "root"], capture_output=True, check=False, timeout=10
        )
        return True, "netem qdisc accepted"
    return False, (probe.stderr or probe.stdout).strip() or f"tc exited {probe.returncode}"


# ------------------------------------------------------------------------------------------
# The RTT matrix


@dataclass(frozen=True)
class RttMatrix:
    """Round-trip times in ms between named regions; symmetric, zero inside a region."""

    pairs: Mapping[tuple[str, str], float] = field(default_factory=lambda: dict(DEFAULT_RTT_MS))
    jitter_ms: float = 0.0

    def rtt_ms(self, source: str, target: str) -> float:
        if source == target:
            return 0.0
        value = self.pairs.get((source, target), self.pairs.get((target, source)))
        if value is None:
            raise KeyError(f"no RTT between regions {source} and {target}")
        return float(value)

    def one_way_ms(self, source: str, target: str) -> float:
        return self.rtt_ms(source, target) / 2

    def describe(self) -> dict[str, float]:
        return {f"{a}-{b}": v for (a, b), v in sorted(self.pairs.items())}

    @staticmethod
    def parse(text: str, jitter_ms: float = 0.0) -> RttMatrix:
        """``"10,40,80"`` (A-B, A-C, B-C) into a matrix."""
        values = [float(part) for part in text.split(",")]
        if len(values) != 3 or any(v < 0 for v in values):
            raise ValueError(f"--rtt wants three non-negative ms values (A-B,A-C,B-C): {text!r}")
        return RttMatrix(
            {("A", "B"): values[0], ("A", "C"): values[1], ("B", "C"): values[2]}, jitter_ms
        )


def nearest_quorum_rtt_ms(
    matrix: RttMatrix, coordinator: str, replica_regions: Sequence[str], quorum: int
) -> float:
    """One round trip from ``coordinator`` to the closest ``quorum`` replicas (itself
    counting at 0 ms when it is one): the latency floor of a one-round-trip protocol."""
    if not 1 <= quorum <= len(replica_regions):
        raise ValueError(f"quorum {quorum} of {len(replica_regions)} replicas")
    ordered = sorted(matrix.rtt_ms(coordinator, region) for region in replica_regions)
    return ordered[quorum - 1]


def fast_quorum_rtt_ms(
    matrix: RttMatrix, coordinator: str, electorate_regions: Sequence[str], fast_quorum: int
) -> float:
    """One round trip from ``coordinator`` to the closest ``fast_quorum`` electorate members
    (itself at 0 ms when it votes): the floor of the fast path's PreAccept round."""
    return nearest_quorum_rtt_ms(matrix, coordinator, electorate_regions, fast_quorum)


def nearest_electorate(
    matrix: RttMatrix, replica_regions: Sequence[str], size: int, fast_quorum: int
) -> tuple[int, ...]:
    """The ``size`` replicas (0-based indexes into ``replica_regions``) whose fast quorum is
    nearest summed over every replica's region as coordinator; ties keep the lowest indexes.

    A configuration choice for the suites, not a protocol rule: every electorate of a legal
    size is safe, and this one only puts the fast quorum where the coordinators are.
    """
    if not 1 <= fast_quorum <= size <= len(replica_regions):
        raise ValueError(f"fast quorum {fast_quorum} of {size} of {len(replica_regions)}")
    best: tuple[float, tuple[int, ...]] | None = None
    for members in itertools.combinations(range(len(replica_regions)), size):
        regions = [replica_regions[i] for i in members]
        cost = sum(
            fast_quorum_rtt_ms(matrix, coordinator, regions, fast_quorum)
            for coordinator in replica_regions
        )
        if best is None or cost < best[0]:
            best = (cost, members)
    assert best is not None
    return best[1]


# ------------------------------------------------------------------------------------------
# One proxy


@dataclass(frozen=True)
class Link:
    """Listen on ``listen`` and forward to ``target`` with ``one_way_ms`` each way.

    ``by_source`` overrides the delay by the connecting peer's IP: a proxy in front of one
    node can then serve every source at its own distance (used where the source cannot be
    made to dial a per-source address). With ``sniff_source`` the source is instead the one
    ``by_source`` address whose four bytes appear in the connection's first chunk: Cassandra
    dials its peers from 127.0.0.1 whatever its listen address, but its internode handshake
    (``Initiate``) carries the sender's broadcast address, so that is what tells sources apart.
    """

    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    one_way_ms: float
    jitter_ms: float = 0.0
    by_source: Mapping[str, float] = field(default_factory=dict)
    sniff_source: bool = False

    def delay_ms(self, source_ip: str) -> float:
        return float(self.by_source.get(source_ip, self.one_way_ms))

    def sniffed_source(self, first_chunk: bytes) -> str | None:
        """The single ``by_source`` address named in ``first_chunk``'s head, else None."""
        head = first_chunk[:SNIFF_BYTES]
        found = [ip for ip in sorted(self.by_source) if socket.inet_aton(ip) in head]
        return found[0] if len(found) == 1 else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["by_source"] = dict(self.by_source)
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Link:
        return Link(
            name=str(data["name"]),
            listen=(str(data["listen"][0]), int(data["listen"][1])),
            target=(str(data["target"][0]), int(data["target"][1])),
            one_way_ms=float(data["one_way_ms"]),
            jitter_ms=float(data.get("jitter_ms", 0.0)),
            by_source={str(k): float(v) for k, v in dict(data.get("by_source", {})).items()},
            sniff_source=bool(data.get("sniff_source", False)),
        )


@dataclass
class LinkStats:
    connections: int = 0
    chunks: int = 0
    bytes: int = 0
    # How late the writer woke compared with the chunk's due time: the proxy's own error.
    late_ms_max: float = 0.0
    late_ms_sum: float = 0.0
    sources: set[str] = field(default_factory=set)


class DelayProxy:
    """One :class:`Link`, served on the running event loop."""

    def __init__(self, link: Link, *, seed: int = 0) -> None:
        self.link = link
        # The address listened on: the link's, with the kernel's port when that was 0.
        self.bound = link.listen
        self.stats = LinkStats()
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # (wall time, link, direction, bytes) per delivered chunk, when tracing (debugging
        # where a transaction's time goes); bounded by TRACE_ENTRIES_MAX.
        self.trace: list[tuple[float, str, str, int]] | None = (
            [] if os.environ.get("BENCH_WAN_TRACE") else None
        )

    async def start(self) -> None:
        host, port = self.link.listen
        self._server = await asyncio.start_server(self._accept, host, port, reuse_address=True)
        bound = self._server.sockets[0].getsockname()
        self.bound = (str(bound[0]), int(bound[1]))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        if self._server is not None:
            with contextlib.suppress(OSError):
                await self._server.wait_closed()

    def _spawn(self, coroutine: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        self.stats.connections += 1
        first = b""
        if self.link.sniff_source:
            try:
                first = await asyncio.wait_for(reader.read(CHUNK_BYTES), SNIFF_TIMEOUT_SECONDS)
            except (OSError, TimeoutError):
                writer.close()
                return
            sniffed = self.link.sniffed_source(first)
            # An unrecognised connection still flows, at the link's default delay.
            source = sniffed if sniffed is not None else f"unmatched:{source}"
        self.stats.sources.add(source)
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.link.target), CONNECT_TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError):
            # The target is down: refuse the way the target itself would, by closing.
            writer.close()
            return
        for stream_writer in (writer, upstream_writer):
            sock = stream_writer.get_extra_info("socket")
            if sock is not None:
                # Small RPCs must leave at once; Nagle would add its own delay on top of ours.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        delay = self.link.delay_ms(source) / 1000
        both = asyncio.gather(
            self._pipe(reader, upstream_writer, delay, first, "forward"),
            self._pipe(upstream_reader, writer, delay, b"", "back"),
        )
        try:
            await both
        finally:
            for stream_writer in (writer, upstream_writer):
                stream_writer.close()

    def _jitter(self) -> float:
        jitter = self.link.jitter_ms / 1000
        return self._rng.uniform(-jitter, jitter) if jitter > 0 else 0.0

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        delay: float,
        first: bytes,
        direction: str,
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.create_task(self._deliver(queue, writer, direction))
        due_last = 0.0
        pending = first
        try:
            while True:
                if pending:
                    chunk, pending = pending, b""
                else:
                    try:
                        chunk = await reader.read(CHUNK_BYTES)
                    except OSError:
                        chunk = b""
                due = max(due_last, loop.time() + max(0.0, delay + self._jitter()))
                due_last = due
                # An empty chunk is the end of the stream; it is delivered in order too.
                await queue.put((due, chunk))
                if not chunk:
                    break
            await sender
        finally:
            sender.cancel()

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        loop = asyncio.get_running_loop()
        stats = self.stats
        broken = False
        # Ends at the end-of-stream marker, which the reader always queues last.
        while True:
            due, chunk = await queue.get()
            if broken and chunk:
                continue
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            late_ms = max(0.0, (loop.time() - due) * 1000)
            stats.late_ms_max = max(stats.late_ms_max, late_ms)
            stats.late_ms_sum += late_ms
            if not chunk:
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            stats.chunks += 1
            stats.bytes += len(chunk)
            if self.trace is not None and len(self.trace) < TRACE_ENTRIES_MAX:
                self.trace.append((round(time.time(), 6), self.link.name, direction, len(chunk)))
            try:
                writer.write(chunk)
                await writer.drain()
            except (OSError, RuntimeError):
                # The far side is gone: keep draining (and dropping) until the reader's end
                # marker, so a full queue can never block the reader forever.
                broken = True


class ProxySet:
    """Several proxies on one event loop (in-process use, e.g. tests and calibration)."""

    def __init__(self, links: Sequence[Link]) -> None:
        self.proxies = [DelayProxy(link, seed=index) for index, link in enumerate(links)]

    async def __aenter__(self) -> ProxySet:
        for proxy in self.proxies:
            await proxy.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        for proxy in self.proxies:
            await proxy.stop()

    def stats(self) -> dict[str, dict[str, Any]]:
        return {p.link.name: _stats_json(p.stats) for p in self.proxies}

    def bound(self) -> dict[str, tuple[str, int]]:
        return {p.link.name: p.bound for p in self.proxies}

    def trace(self) -> list[tuple[float, str, str, int]]:
        entries = [entry for p in self.proxies for entry in (p.trace or [])]
        return sorted(entries)


def _stats_json(stats: LinkStats) -> dict[str, Any]:
    mean = stats.late_ms_sum / stats.chunks if stats.chunks else 0.0
    return {
        "connections": stats.connections,
        "chunks": stats.chunks,
        "bytes": stats.bytes,
        "late_ms_mean": round(mean, 3),
        "late_ms_max": round(stats.late_ms_max, 3),
        "sources": sorted(stats.sources),
    }


# ------------------------------------------------------------------------------------------
# The proxies in their own process


class ProxyProcess:
    """``python -m bench.wan`` running ``links``; a context manager that stops it."""

    def __init__(self, links: Sequence[Link], directory: Path) -> None:
        self.links = list(links)
        self.directory = directory
        self.process: subprocess.Popen[str] | None = None
        self.stats_path = directory / "wan-stats.json"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        spec = self.directory / "wan-links.json"
        spec.write_text(json.dumps([link.to_json() for link in self.links], indent=1))
        command = [sys.executable, "-m", "bench.wan", "--spec", str(spec)]
        with (self.directory / "wan.log").open("ab") as log:
            self.process = subprocess.Popen(
                [*command, "--stats", str(self.stats_path)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        # One line is expected; the deadline bounds a proxy that hangs before printing it.
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            word, _, bound = line.strip().partition(" ")
            if word == "ready":
                addresses = json.loads(bound)
                self.links = [
                    replace(link, listen=(str(found[0]), int(found[1])))
                    for link in self.links
                    for found in [addresses[link.name]]
                ]
                return
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise RuntimeError(
            f"WAN proxies did not start; see {self.directory / 'wan.log'}:\n"
            + (self.directory / "wan.log").read_text(errors="replace")[-2000:]
        )

    def stop(self) -> dict[str, Any]:
        """Stop the proxies; returns their per-link statistics (empty if none were written)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None
        try:
            return dict(json.loads(self.stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def __enter__(self) -> ProxyProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


async def _serve(links: Sequence[Link], stats_path: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with ProxySet(links) as proxies:
        sys.stdout.write(f"ready {json.dumps(proxies.bound())}\n")
        sys.stdout.flush()
        await stop.wait()
        if stats_path is not None:
            stats_path.write_text(json.dumps(proxies.stats(), indent=1))
            trace = proxies.trace()
            if trace:
                stats_path.with_suffix(".trace.json").write_text(json.dumps(trace))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wan", description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON list of links")
    parser.add_argument("--stats", help="write per-link statistics here on exit")
    args = parser.parse_args(argv)
    links = [Link.from_json(item) for item in json.loads(Path(args.spec).read_text())]
    # The proxies stand for the network, which does not queue behind the nodes' CPU work; on
    # a loaded machine a higher priority keeps their timer lateness small (root may raise it;
    # anyone else keeps the default and the lateness shows in the link statistics).
    nice = int(os.environ.get("BENCH_NICE", PROXY_NICE))
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    # The default loop on purpose: uvloop's timers round to whole milliseconds, which
    # would add up to 1 ms to every emulated hop.
    asyncio.run(_serve(links, Path(args.stats) if args.stats else None))
    return 0


# ------------------------------------------------------------------------------------------
# Calibration


@contextlib.contextmanager
def echo_server(host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """A blocking echo server in a thread, for calibration."""
    import threading

    listener = socket.create_server((host, 0))
    listener.settimeout(0.2)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                connection.settimeout(5.0)
                with contextlib.suppress(OSError):
                    while data := connection.recv(CHUNK_BYTES):
                        connection.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[0], listener.getsockname()[1]
    finally:
        stopping.set()
        listener.close()
        thread.join(timeout=2)


def calibrate(
    one_way_ms_values: Sequence[float], *, samples: int, host: str = "127.0.0.1"
) -> list[dict[str, float]]:
    """Measured round trip of a 64-byte ping through a proxy process, per configured delay.

    The excess over ``2 * one_way`` is the layer's own cost (a Python hop each way, timer
    lateness, and whatever the machine's load adds) and is reported with the figures.
    """
    rows = []
    with echo_server(host) as target:
        links = [
            Link(f"calibrate-{value}", (host, 0), target, value) for value in one_way_ms_values
        ]
        with _temporary_directory() as directory, ProxyProcess(links, directory) as proxies:
            for link in proxies.links:
                rtts = _ping(link.listen, samples)
                rows.append(
                    {
                        "configured_rtt_ms": 2 * link.one_way_ms,
                        "measured_p50_ms": round(statistics.median(rtts), 3),
                        "measured_p99_ms": round(_percentile(rtts, 0.99), 3),
                        "excess_p50_ms": round(statistics.median(rtts) - 2 * link.one_way_ms, 3),
                    }
                )
    return rows


@contextlib.contextmanager
def _temporary_directory() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-wan-") as name:
        yield Path(name)


def _ping(address: tuple[str, int], samples: int) -> list[float]:
    rtts = []
    with socket.create_connection(address, timeout=5) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 64
        for _ in range(samples):
            started = time.perf_counter()
            connection.sendall(payload)
            received = 0
            # Bounded: 64 bytes come back in at most 64 reads.
            for _ in range(64):
                received += len(connection.recv(64))
                if received >= len(payload):
                    break
            rtts.append((time.perf_counter() - started) * 1000)
    return rtts


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99 and the count, rounded for reports; empty input gives an empty dict."""
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 2),
        "p90": round(_percentile(values, 0.90), 2),
        "p99": round(_percentile(values, 0.99), 2),
        "count": len(values),
    }


if __name__ == "__main__":
    sys.exit(main())
