"""Restart storms and hot-key bursts against real sidecar processes, with their figures.

    python -m tests.sidecar.storm kills [--kills 2,3] [--clients 8]
    python -m tests.sidecar.storm burst [--concurrency 300]

``kills``: bank transfers from N clients while sidecars are SIGKILLed and restarted one
after another (the load before the first kill and after each restart a fixed time, or,
with ``progress``, until the cluster has answered that many more transfers); ok transfers
per window, and per second the sidecars' recoveries, active coordinations, peer queue
depth, dropped peer messages and journal size. After the load, how long until every
sidecar serves a two-row read again and until recoveries stop rising.

``burst``: N transfers at once among 3 accounts; how each was answered, the sidecars' peak
RSS, and how long until a normal transfer succeeds again.

The tests (tests/sidecar/test_storm.py) and the bench suites (bench/restart.py,
bench/overload.py) drive the same functions; the tests assert outcomes, the bench reports
the times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord_cassandra.client import AsyncClient, Transaction, TransactionError
from accord_cassandra.cluster import LocalSidecars, metrics_of, wait_serving
from tests.sidecar.bank import Bank, verify_ledger

WATCHED = (
    "accord_recoveries_total",
    "accord_active_coordinations",
    "accord_peer_messages_dropped_total",
    "accord_pending_clients",
)


def _journal_bytes(cluster: LocalSidecars, node_id: int) -> int:
    folder = cluster.directory / f"node{node_id}" / "journal"
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file())


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def sample(cluster: LocalSidecars) -> dict[int, dict[str, float]]:
    """Each live sidecar's watched figures (absent when its metrics do not answer)."""
    figures: dict[int, dict[str, float]] = {}
    for node_id, sidecar in cluster.sidecars.items():
        row: dict[str, float] = {"journal_bytes": float(_journal_bytes(cluster, node_id))}
        if sidecar.alive():
            assert sidecar.process is not None
            row["rss_bytes"] = float(_rss_bytes(sidecar.process.pid))
            try:
                scraped = metrics_of(sidecar.metrics_address)
            except OSError:
                scraped = {}
            for name in WATCHED:
                if name in scraped:
                    row[name] = scraped[name]
            row["peer_queue_depth"] = sum(
                v for k, v in scraped.items() if k.startswith("accord_peer_queue_depth")
            )
        figures[node_id] = row
    return figures


async def _sampler(
    cluster: LocalSidecars,
    out: list[tuple[float, dict[int, dict[str, float]]]],
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        out.append((time.monotonic(), await asyncio.to_thread(sample, cluster)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def read_txn(keyspace: str, accounts: Sequence[str]) -> Transaction:
    t = Transaction()
    for account in accounts[:2]:
        t.let(account, keyspace, "accounts", account)
    return t


async def serves(
    address: str, keyspace: str, accounts: Sequence[str], token: str | None, deadline: float
) -> float | None:
    """Monotonic time at which ``address`` first answered a two-row read, or None."""
    async with AsyncClient(address, token=token, timeout=5.0) as client:
        while time.monotonic() < deadline:
            try:
                await client.transact(read_txn(keyspace, accounts))
                return time.monotonic()
            except TransactionError:
                await asyncio.sleep(0.2)
    return None


@dataclass
class KillReport:
    windows: list[tuple[float, int]] = field(default_factory=list)  # (start offset, ok)
    events: list[tuple[float, str]] = field(default_factory=list)
    rejoin_seconds: dict[int, float | None] = field(default_factory=dict)
    samples: list[tuple[float, dict[int, dict[str, float]]]] = field(default_factory=list)
    load_stopped_at: float = 0.0
    all_serving_seconds: float | None = None
    quiet_seconds: float | None = None  # after load: until recoveries stopped rising
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    # Phases (with ``progress``) in which the cluster answered too few within the guard.
    stalls: list[str] = field(default_factory=list)
    started: float = 0.0
    # Transfers answered (ok or declined) after the last restart. Counted from each answer's
    # own time: the windows start on a 2.5 s grid, and when the load after the last rejoin
    # ends within the window it started in, no window starts after the restart.
    answered_after_last_restart: int = 0

    def ok_rate(self, start: float, end: float) -> float:
        """ok transfers per second between two offsets from the start of the load."""
        count = sum(n for at, n in self.windows if start <= at < end)
        span = sum(1 for at, _ in self.windows if start <= at < end)
        return count / max(1e-9, span * self.window)

    window: float = 2.5

    def summary(self) -> dict[str, Any]:
        last = self.samples[-1][1] if self.samples else {}
        peak: dict[str, float] = {}
        for _, nodes in self.samples:
            for row in nodes.values():
                for name in ("peer_queue_depth", "accord_active_coordinations", "journal_bytes"):
                    peak[name] = max(peak.get(name, 0.0), row.get(name, 0.0))
        return {
            "events": self.events,
            "windows": self.windows,
            "rejoin_seconds": self.rejoin_seconds,
            "all_serving_seconds": self.all_serving_seconds,
            "quiet_seconds": self.quiet_seconds,
            "statuses": dict(self.statuses),
            "errors": dict(self.errors),
            "problems": self.problems,
            "stalls": self.stalls,
            "answered_after_last_restart": self.answered_after_last_restart,
            "peaks": peak,
            "final": {
                n: {k: row.get(k) for k in (*WATCHED, "peer_queue_depth", "journal_bytes")}
                for n, row in last.items()
            },
        }


async def _phase(
    report: KillReport,
    bank: Bank,
    what: str,
    *,
    seconds: float,
    progress: int | None,
    guard: float,
) -> None:
    """Load between faults: ``seconds`` of it, or, with ``progress``, until that many more
    transfers were answered (ok or declined); a phase that reaches ``guard`` seconds first
    is a stall."""
    if progress is None:
        await asyncio.sleep(seconds)
        return
    since = len(bank.commits)
    deadline = time.monotonic() + guard
    while len(bank.commits) - since < progress and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    answered = len(bank.commits) - since
    if answered < progress:
        report.stalls.append(f"{what}: {answered} of {progress} answered in {guard:.0f} s")


async def kill_storm(
    cluster: LocalSidecars,
    keyspace: str,
    *,
    kills: Sequence[int] = (2, 3),
    clients: int = 8,
    accounts: int = 8,
    token: str | None = None,
    before: float = 10.0,
    down: float = 5.0,
    after: float = 15.0,
    progress: int | None = None,
    window: float = 2.5,
    serve_deadline: float = 120.0,
    quiet_for: float = 10.0,
    quiet_deadline: float = 120.0,
    first_transfer: int = 1,
    seed: int = 1,
) -> KillReport:
    """Load, then for each node in ``kills``: SIGKILL, ``down`` s, restart, ``after`` s.

    With ``progress`` the load before the first kill and after each restarted node served
    a read again is counted in answered transfers instead of seconds (``serve_deadline``
    bounds each); the ``down`` seconds stay, being the fault rather than a wait.

    Then stop the load and wait (bounded) until every sidecar serves a read and no
    sidecar's recovery counter rose for ``quiet_for`` s. The bank's receipts judge the run.
    """
    report = KillReport(window=window)
    names = [f"s{first_transfer}a{i}" for i in range(accounts)]
    bank = Bank(
        cluster.addresses(),
        keyspace,
        names,
        token=token,
        seed=seed,
        audit_share=0.1,
        timeout=12.0,
        first_transfer=first_transfer,
    )
    stop_sampling = asyncio.Event()
    sampler = asyncio.create_task(_sampler(cluster, report.samples, stop_sampling))
    phase = functools.partial(_phase, report, bank, progress=progress, guard=serve_deadline)
    try:
        await bank.setup()
        load_done = False
        report.started = started = time.monotonic()
        load = asyncio.create_task(bank.run(clients, lambda: load_done))
        await phase("before the first kill", seconds=before)
        for node_id in kills:
            address = cluster.sidecars[node_id].address
            report.events.append((time.monotonic() - started, f"kill {node_id}"))
            await asyncio.to_thread(cluster.sidecars[node_id].kill)
            await asyncio.sleep(down)
            restarted = time.monotonic()
            report.events.append((restarted - started, f"restart {node_id}"))
            cluster.sidecars[node_id].start()
            served = await serves(address, keyspace, names, token, restarted + serve_deadline)
            report.rejoin_seconds[node_id] = None if served is None else served - restarted
            remaining = after - (time.monotonic() - restarted)
            await phase(f"after node {node_id} served", seconds=max(0.0, remaining))
        load_done = True
        await load
        report.load_stopped_at = stopped = time.monotonic()
        report.events.append((stopped - started, "load stopped"))
        # Every sidecar serves again.
        deadline = stopped + serve_deadline
        times = await asyncio.gather(
            *(serves(a, keyspace, names, token, deadline) for a in cluster.addresses())
        )
        if all(t is not None for t in times):
            report.all_serving_seconds = max(t for t in times if t is not None) - stopped
        # Recoveries stop rising: quiet_for seconds with no increase anywhere.
        quiet_since = time.monotonic()
        previous = None
        while time.monotonic() < stopped + quiet_deadline:
            now_figures = await asyncio.to_thread(sample, cluster)
            current = {n: r.get("accord_recoveries_total", -1.0) for n, r in now_figures.items()}
            if current != previous:
                previous, quiet_since = current, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_for:
                report.quiet_seconds = quiet_since - stopped
                break
            await asyncio.sleep(1.0)
        try:
            final = await bank.audit()
            receipts = await bank.read_receipts(sorted(bank.transfers))
        except (AssertionError, TransactionError) as error:
            report.problems = [f"the final audit failed: {error}"]
        else:
            report.problems = verify_ledger(bank, final, receipts)
    finally:
        stop_sampling.set()
        await sampler
        await bank.close()
    report.statuses = bank.statuses()
    report.errors = bank.errors
    restarts = [at for at, what in report.events if what.startswith("restart")]
    if restarts:
        last_restart = started + max(restarts)
        report.answered_after_last_restart = sum(1 for c in bank.commits if c.at > last_restart)
    end = max((c.at for c in bank.commits), default=started)
    n_windows = int((end - started) / window) + 1
    counts = Counter(int((c.at - started) / window) for c in bank.commits if c.at >= started)
    report.windows = [(i * window, counts.get(i, 0)) for i in range(n_windows)]
    return report


async def kill_at_random(
    cluster: LocalSidecars,
    *,
    kills: int,
    seed: int,
    gap: tuple[float, float] = (1.5, 5.0),
    down: tuple[float, float] = (0.5, 2.0),
    restart_deadline: float = 90.0,
) -> list[tuple[float, str]]:
    """``kills`` times: after a random ``gap`` s, SIGKILL a sidecar, leave it dead a random
    ``down`` s and restart it. Every other kill hits the one just restarted while it starts
    (mid-start or mid-replay); the others wait until it serves and hit a random one. One is
    down at a time, so a quorum stays. Returns (monotonic time, event); the last is the last
    restart serving."""
    rng = random.Random(seed)
    events: list[tuple[float, str]] = []
    starting: tuple[int, asyncio.Task[bool]] | None = None
    for index in range(kills):
        if starting is not None and index % 2 == 0 and not await starting[1]:
            tail = cluster.sidecars[starting[0]].log_tail()
            raise RuntimeError(f"sidecar {starting[0]} did not restart; log tail:\n{tail}")
        await asyncio.sleep(rng.uniform(*gap))
        if starting is not None and not starting[1].done():
            victim, what = starting[0], "kill {} while starting"
        else:
            victim, what = rng.choice(sorted(cluster.sidecars)), "kill {}"
        await asyncio.to_thread(cluster.sidecars[victim].kill)
        events.append((time.monotonic(), what.format(victim)))
        if starting is not None:
            await starting[1]
        await asyncio.sleep(rng.uniform(*down))
        sidecar = cluster.sidecars[victim]
        sidecar.start()
        events.append((time.monotonic(), f"restart {victim}"))
        deadline = time.monotonic() + restart_deadline
        serving = asyncio.create_task(
            asyncio.to_thread(wait_serving, sidecar.address, deadline, sidecar.alive)
        )
        starting = (victim, serving)
    if starting is not None:
        victim, serving = starting
        if not await serving:
            tail = cluster.sidecars[victim].log_tail()
            raise RuntimeError(f"sidecar {victim} did not restart; log tail:\n{tail}")
        events.append((time.monotonic(), f"serving {victim}"))
    return events


# ------------------------------------------------------------------------------------------
# Burst


@dataclass
class BurstReport:
    concurrency: int
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    rss_peak_bytes: int = 0
    recovered_seconds: float | None = None  # after the burst, until a transfer succeeded
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "outcomes": dict(self.outcomes),
            "burst_seconds": round(self.seconds, 2),
            "rss_peak_mib": round(self.rss_peak_bytes / 2**20, 1),
            "recovered_seconds": self.recovered_seconds,
            "problems": self.problems,
        }


async def _rss_watch(cluster: LocalSidecars, report: BurstReport, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for sidecar in cluster.sidecars.values():
            if sidecar.alive() and sidecar.process is not None:
                report.rss_peak_bytes = max(report.rss_peak_bytes, _rss_bytes(sidecar.process.pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def burst(
    cluster: LocalSidecars,
    keyspace: str,
    *,
    concurrency: int,
    token: str | None = None,
    prefix: str = "hot",
    first_transfer: int = 1,
    timeout: float = 20.0,
    recover_deadline: float = 120.0,
    seed: int = 1,
) -> BurstReport:
    """``concurrency`` transfers among 3 accounts at once, spread over the sidecars.

    Every answer is classed by its gRPC code (``ok``/``declined`` for answered transfers).
    Afterwards the receipts judge that every acknowledged transfer applied exactly once.
    """
    report = BurstReport(concurrency)
    names = [f"{prefix}{i}" for i in range(3)]
    bank = Bank(
        cluster.addresses(),
        keyspace,
        names,
        token=token,
        seed=seed,
        timeout=timeout,
        first_transfer=first_transfer,
        initial=1_000_000,
    )
    stop = asyncio.Event()
    watcher = asyncio.create_task(_rss_watch(cluster, report, stop))
    rng = random.Random(seed)
    try:
        await bank.setup()
        addresses = cluster.addresses()
        transfers = [bank._new_transfer(rng) for _ in range(concurrency)]

        async def one(i: int) -> str:
            transfer = transfers[i]
            address = addresses[i % len(addresses)]
            await bank._transfer_op(i, address, transfer)
            return transfer.status

        started = time.monotonic()
        statuses = await asyncio.gather(*(one(i) for i in range(concurrency)))
        report.seconds = time.monotonic() - started
        for status in statuses:
            report.outcomes[status] += 1
        for code, n in bank.errors.items():
            report.outcomes[f"error:{code}"] = n
        # Normal service: one ordinary transfer on the hot accounts succeeds, at each sidecar.
        after = time.monotonic()
        deadline = after + recover_deadline
        recovered = True
        for index, address in enumerate(addresses):
            while True:
                transfer = bank._new_transfer(rng)
                if await bank._transfer_op(10_000_000 + index, address, transfer) and (
                    transfer.status in ("ok", "declined")
                ):
                    break
                if time.monotonic() > deadline:
                    recovered = False
                    break
                await asyncio.sleep(0.2)
        if recovered:
            report.recovered_seconds = round(time.monotonic() - after, 2)
            try:
                final = await bank.audit()
                receipts = await bank.read_receipts(sorted(bank.transfers))
            except (AssertionError, TransactionError) as error:
                report.problems = [f"the final audit failed: {error}"]
            else:
                report.problems = verify_ledger(bank, final, receipts)
        else:
            report.problems = ["no normal transfer succeeded after the burst"]
    finally:
        stop.set()
        await watcher
        await bank.close()
    return report


# ------------------------------------------------------------------------------------------
# Command line


def _cluster(directory: Path, store: str) -> LocalSidecars:
    from tests.sidecar.conftest import EMBEDDED_TABLES

    return LocalSidecars(directory, tables=EMBEDDED_TABLES, extra={"drain_seconds": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("kills", "burst"))
    parser.add_argument("--kills", default="2,3")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="accord-storm-"))
    cluster = _cluster(directory, "memory")
    cluster.start(timeout=90)
    try:
        if args.what == "kills":
            kills = [int(n) for n in args.kills.split(",")]
            result = asyncio.run(
                kill_storm(cluster, "bank", kills=kills, clients=args.clients, seed=args.seed)
            )
            for at, nodes in result.samples:
                print(
                    f"{at - result.started:6.1f}s "
                    + " | ".join(
                        f"n{n} rec={r.get('accord_recoveries_total', '-')} "
                        f"co={r.get('accord_active_coordinations', '-')} "
                        f"q={r.get('peer_queue_depth', '-')} "
                        f"drop={r.get('accord_peer_messages_dropped_total', '-')} "
                        f"j={r['journal_bytes'] / 2**20:.1f}M"
                        for n, r in sorted(nodes.items())
                    )
                )
            print(json.dumps(result.summary(), indent=1, default=str))
        else:
            burst_result = asyncio.run(
                burst(cluster, "bank", concurrency=args.concurrency, seed=args.seed)
            )
            print(json.dumps(burst_result.summary(), indent=1))
            print(json.dumps(sample(cluster), indent=1))
    finally:
        cluster.stop()
        print(f"logs in {directory}")


if __name__ == "__main__":
    main()
