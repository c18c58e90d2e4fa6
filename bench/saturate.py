"""``python -m bench.saturate``: one saturated workload on 3 sidecars over a running 3-node
Cassandra, for profiling the sidecars (not a suite: it writes no report).

It runs the throughput suite's single-partition conditional set (or ``--hot-keys N`` hot
accounts) in a closed loop, prints op/s, sidecar CPU ms per committed transaction and
Cassandra writes per Accord row write, and with ``--py-spy`` samples every sidecar with
py-spy (``py-spy record --format raw``, if installed) during the measured seconds, then
prints the top frames by own samples and by cumulative samples, merged over the sidecars,
with the share of them inside ``accord/codec.py``.

The cluster is named by ``BENCH_CASSANDRA_CONTACT_POINTS`` (``ip1,ip2,ip3[:port]``).
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from accord_cassandra.client import AsyncClient, TransactionError
from accord_cassandra.cluster import metrics_of
from bench.clusters import DDL_TIMEOUT, BenchSidecars, bench_cassandra
from bench.lwt import schema
from bench.profiling import sidecar_profile, top_lines
from bench.report import note
from bench.throughput import _settled_store_writes
from bench.wan import percentiles
from bench.workload import (
    INITIAL_BALANCE,
    LoadError,
    LoadResult,
    closed_loop_calls,
    conditional_set,
    cpu_seconds,
    delta,
    fast_path_share,
    fsync_ms_mean,
    open_loop_calls,
    preload,
    run_queue_seconds,
)

CODEC_FILE = "accord/codec/"
PER_TXN = (
    "peer_messages_sent",
    "peer_batches_sent",
    "host_batches",
    "journal_syncs",
    "journal_records",
    "store_reads",
    "store_writes",
)


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far per thread name (``/proc/<pid>/task/*/comm``), summed over
    ``pids``: which of the sidecar's threads (the event loop, gRPC's pollers, the Cassandra
    driver's I/O thread) spend a sidecar's CPU, which a main-thread profile cannot show."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    total: Counter[str] = Counter()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total[name] += int(fields[11]) + int(fields[12])
    return {name: count / ticks for name, count in total.items()}


def _frames(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """Own and cumulative samples per frame from py-spy's collapsed (raw) output."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            cumulative[frame] += count
    return own, cumulative, total


def _codec_share(path: Path) -> tuple[int, int]:
    """Samples with any codec frame on the stack (cumulative codec time), and the total."""
    inside = total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        total += int(count_text)
        if CODEC_FILE in stack:
            inside += int(count_text)
    return inside, total


def scrape(addresses: list[str]) -> dict[str, float]:
    """Every counter of the sidecars, summed over them."""
    total: dict[str, float] = {}
    for address in addresses:
        for name, value in metrics_of(address).items():
            total[name] = total.get(name, 0.0) + value
    return total


async def _run(
    args: argparse.Namespace, sidecars: BenchSidecars, keyspace: str, cassandra_pids: list[int]
) -> None:
    clients = [AsyncClient(s.address, timeout=30.0) for s in sidecars.sidecars.values()]
    pids = [s.process.pid for s in sidecars.sidecars.values() if s.process is not None]
    metrics = [s.metrics_address for s in sidecars.sidecars.values()]
    if sidecars.pythonpath is not None:
        from bench.floor import compiled_modules

        mapped = [compiled_modules(pid, sidecars.pythonpath) for pid in pids]
        if not all(mapped):
            raise RuntimeError(f"sidecars did not load the compiled build: {mapped}")
        print(f"compiled build {sidecars.pythonpath}: extension modules mapped {mapped}")
    rng = random.Random(args.seed)
    keys = [f"acct{i:06d}" for i in range(args.keys)]
    try:
        await preload(clients[0], keys, keyspace=keyspace)
        chosen = keys[: args.hot_keys] if args.hot_keys else keys

        async def call(index: int) -> bool:
            txn = conditional_set(
                rng.choice(chosen), INITIAL_BALANCE + rng.randrange(1000), 0, keyspace
            )
            try:
                answer = await clients[index % len(clients)].transact(txn)
            except TransactionError as error:
                raise LoadError(error.code) from None
            return answer.applied

        if args.idle:
            # What the sidecars burn doing nothing (ticks, drivers, gRPC): at low op/s it is
            # a large part of any CPU-per-transaction figure.
            idle_before = cpu_seconds(pids), cpu_seconds(cassandra_pids)
            await asyncio.sleep(args.idle)
            idle = cpu_seconds(pids) - idle_before[0]
            idle_cassandra = cpu_seconds(cassandra_pids) - idle_before[1]
            print(
                f"idle: {1000 * idle / args.idle:.1f} ms CPU per second, 3 sidecars together; "
                f"Cassandra {1000 * idle_cassandra / args.idle:.1f} ms per second"
                + ("" if cassandra_pids else " (not launched here: unknown)")
            )
        note(f"warm-up {args.warmup:g} s")
        await closed_loop_calls(call, inflight=args.inflight, seconds=args.warmup)
        writes_before = await _settled_store_writes(metrics)
        spies: list[tuple[subprocess.Popen[bytes], Path]] = []
        if args.py_spy:
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            for pid in pids:
                out = Path(args.py_spy) / f"sidecar-{pid}.txt"
                command = [spy, "record", "--format", "raw", "--rate", str(args.rate), "--gil"]
                command += ["--duration", str(int(args.seconds)), "--nonblocking"]
                command += ["--output", str(out), "--pid", str(pid)]
                spies.append((subprocess.Popen(command, stdout=subprocess.DEVNULL), out))
        cpu_before = cpu_seconds(pids)
        cassandra_before = cpu_seconds(cassandra_pids)
        threads_before = thread_cpu(pids)
        waited_before = run_queue_seconds(pids), run_queue_seconds(cassandra_pids)
        counters_before = await asyncio.to_thread(scrape, metrics)
        result: LoadResult
        if args.open_rate:
            result = await open_loop_calls(call, rate=args.open_rate, seconds=args.seconds)
        else:
            result = await closed_loop_calls(call, inflight=args.inflight, seconds=args.seconds)
        cpu = cpu_seconds(pids) - cpu_before
        cassandra_cpu = cpu_seconds(cassandra_pids) - cassandra_before
        threads = {n: t - threads_before.get(n, 0.0) for n, t in thread_cpu(pids).items()}
        waited = (
            run_queue_seconds(pids) - waited_before[0],
            run_queue_seconds(cassandra_pids) - waited_before[1],
        )
        moved = delta(await asyncio.to_thread(scrape, metrics), counters_before)
        writes = await _settled_store_writes(metrics) - writes_before
        committed = result.committed
        load = f"open loop {args.open_rate:g} op/s" if args.open_rate else ""
        load = load or f"in flight {args.inflight}"
        print(
            f"{load}: {committed / result.seconds:.1f} op/s, "
            f"latency {percentiles(result.latencies_ms)}, errors {result.errors}, "
            f"sidecar CPU {1000 * cpu / max(1, committed):.2f} ms per committed txn, "
            f"Cassandra writes per row write {writes / max(1, result.applied):.3f}"
        )
        print(
            f"fast path {fast_path_share(moved)}, fsync mean {fsync_ms_mean(moved)} ms, "
            f"syncs {moved.get('accord_journal_syncs_total')} "
            f"({moved.get('accord_journal_syncs_total', 0.0) / result.seconds:.0f}/s), "
            f"recoveries {moved.get('accord_recoveries_total')}, "
            f"dropped peer messages {moved.get('accord_peer_messages_dropped_total')}"
        )
        per = {
            name: round(moved.get(f"accord_{name}_total", 0.0) / max(1, committed), 2)
            for name in PER_TXN
        }
        print(f"per committed txn, over the sidecars: {per}")
        print(
            f"waiting for a CPU (run queue), ms per committed txn: sidecars "
            f"{1000 * waited[0] / max(1, committed):.2f}"
            + (f", Cassandra {1000 * waited[1] / max(1, committed):.2f}" if cassandra_pids else "")
        )
        if cassandra_pids:
            print(
                f"Cassandra CPU {1000 * cassandra_cpu / max(1, committed):.2f} ms per committed "
                f"txn ({1000 * cassandra_cpu / result.seconds:.0f} ms per second, 3 nodes)"
            )
        by_thread = ", ".join(
            f"{name} {1000 * seconds / max(1, committed):.2f}"
            for name, seconds in sorted(threads.items(), key=lambda kv: -kv[1])[:8]
        )
        print(f"sidecar CPU ms per committed txn by thread name: {by_thread}")
        for process, _ in spies:
            process.wait(timeout=120)
        _print_profile([out for _, out in spies if out.exists()], args.top)
    finally:
        for client in clients:
            await client.close()


def _print_profile(paths: list[Path], top: int) -> None:
    if not paths:
        return
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = codec = 0
    for path in paths:
        o, c, t = _frames(path)
        own.update(o)
        cumulative.update(c)
        total += t
        inside, _ = _codec_share(path)
        codec += inside
    print(f"py-spy: {total} busy samples over {len(paths)} sidecars")
    print(f"codec ({CODEC_FILE}) on the stack: {100 * codec / max(1, total):.1f}%")
    print("top by own samples:")
    for frame, count in own.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    print("top by cumulative samples:")
    for frame, count in cumulative.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.saturate", description=__doc__)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--hot-keys", type=int, default=0, help="draw from the first N only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--py-spy", metavar="DIR", help="sample the sidecars into DIR")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--recover-delay-ms", type=int, default=0, help="sidecars' timing.recover_delay_ms"
    )
    parser.add_argument("--retry-ms", type=int, default=0, help="sidecars' timing.retry_ms")
    parser.add_argument(
        "--peer-link",
        choices=("frames", "grpc"),
        default="frames",
        help="the sidecars' peer transport (grpc: Peer.Stream, no frame listeners)",
    )
    parser.add_argument(
        "--recover-delay",
        choices=("adaptive", "fixed"),
        default="adaptive",
        help="sidecars' timing.recover_delay (fixed: recover_delay_ms alone)",
    )
    parser.add_argument(
        "--recover-delay-percentile",
        type=float,
        default=0.0,
        help="sidecars' timing.recover_delay_percentile (adaptive; 0: the default)",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="run the sidecars under cProfile and print their top N entries by own time "
        "(the whole run, preload and warm-up included; slower than unprofiled)",
    )
    parser.add_argument(
        "--keep-profiles",
        metavar="DIR",
        help="with --cprofile, copy the sidecars' profile dumps into DIR (for callers etc.)",
    )
    parser.add_argument("--idle", type=float, default=0.0, help="first measure idle CPU")
    parser.add_argument(
        "--open-rate",
        type=float,
        default=0.0,
        help="measure an open loop at this many op/s instead of the closed loop (the "
        "warm-up stays closed)",
    )
    parser.add_argument(
        "--trace-dir",
        metavar="DIR",
        help="the sidecars note stage timestamps into DIR (bench/stage_trace.py)",
    )
    parser.add_argument(
        "--electorate-size",
        type=int,
        default=0,
        help="sidecars' electorate_size (fast-path voters per shard; 0: every replica)",
    )
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="sidecars' journal_fsync: false (a diagnostic: not durable)",
    )
    parser.add_argument(
        "--batch-max-parts",
        type=int,
        default=0,
        help="sidecars' batch_max_parts (group commit; 0: the default)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run the sidecars on the compiled build (python -m bench.accel build-sidecar)",
    )
    args = parser.parse_args(argv)
    pythonpath = None
    if args.compiled:
        from bench import accel

        state = accel.status(accel.SIDECAR_ACCEL_DIR)
        if state != "ready":
            parser.error(
                f"the sidecars' compiled build is {state}: "
                "run `python -m bench.accel build-sidecar`"
            )
        pythonpath = accel.SIDECAR_ACCEL_DIR
    if args.py_spy:
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    from accord_cassandra.launcher import driver_cluster

    with bench_cassandra(3) as cassandra:
        driver = driver_cluster(cassandra.contact_points, cassandra.native_port, timeout=30.0)
        session = driver.connect()
        keyspace = f"accord_sat_{uuid.uuid4().hex[:8]}"
        try:
            for statement in schema(
                keyspace, replication="{'class': 'SimpleStrategy', 'replication_factor': 3}"
            ):
                session.execute(statement, timeout=DDL_TIMEOUT)
            # On a loaded machine the driver's own wait for schema agreement can run out:
            # sidecars on a node that lacks the table retry "Unknown CF" until it arrives.
            if not driver.control_connection.wait_for_schema_agreement(wait_time=DDL_TIMEOUT):
                note("warning: the nodes do not agree on the schema yet")
            timing: dict[str, object] = {"recover_delay": args.recover_delay}
            if args.recover_delay_ms:
                timing["recover_delay_ms"] = args.recover_delay_ms
            if args.retry_ms:
                timing["retry_ms"] = args.retry_ms
            if args.recover_delay_percentile:
                timing["recover_delay_percentile"] = args.recover_delay_percentile
            with tempfile.TemporaryDirectory(prefix="bench-saturate-") as folder:
                sidecars = BenchSidecars(
                    Path(folder),
                    nodes=3,
                    store="cassandra",
                    cassandra={
                        "contact_points": cassandra.contact_points,
                        "port": cassandra.native_port,
                        "keyspaces": [keyspace],
                    },
                    extra={
                        "timing": timing,
                        **({"peer_frames_listen": None} if args.peer_link == "grpc" else {}),
                        **(
                            {"batch_max_parts": args.batch_max_parts}
                            if args.batch_max_parts
                            else {}
                        ),
                        **({"journal_fsync": False} if args.no_fsync else {}),
                        **(
                            {"electorate_size": args.electorate_size}
                            if args.electorate_size
                            else {}
                        ),
                    },
                    profile=bool(args.cprofile),
                    pythonpath=pythonpath,
                    trace_dir=Path(args.trace_dir) if args.trace_dir else None,
                )
                started = time.monotonic()
                with sidecars:
                    note(f"sidecars up in {time.monotonic() - started:.1f} s")
                    asyncio.run(_run(args, sidecars, keyspace, cassandra.pids))
                if args.cprofile:
                    paths = [sidecars.profile_path(node) for node in sidecars.sidecars]
                    print("\n".join(sidecar_profile(paths, entries=args.cprofile)))
                    present = [str(path) for path in paths if path.exists()]
                    if args.keep_profiles:
                        Path(args.keep_profiles).mkdir(parents=True, exist_ok=True)
                        for path in present:
                            shutil.copy(path, args.keep_profiles)
                    if present:
                        stats = pstats.Stats(*present)
                        print("by cumulative time:")
                        print("\n".join(top_lines(stats, sort="cumtime", entries=args.cprofile)))
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=DDL_TIMEOUT)
        finally:
            driver.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
