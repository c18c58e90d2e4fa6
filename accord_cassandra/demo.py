"""The README demo: three sidecars on the embedded store, concurrent cross-partition bank
transfers, then the totals, throughput and fast-path share."""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from accord_cassandra.client import AsyncClient, Transaction, TransactionError
from accord_cassandra.cluster import LocalSidecars, metrics_of

ACCOUNTS = 20
INITIAL = 1_000


def transfer(source: str, target: str, amount: int) -> Transaction:
    t = Transaction()
    src = t.let("src", "bank", "accounts", source)
    dst = t.let("dst", "bank", "accounts", target)
    t.where(src["balance"] >= amount)
    t.update("bank", "accounts", source, balance=src["balance"] - amount)
    t.update("bank", "accounts", target, balance=dst["balance"] + amount)
    return t


async def _run(
    cluster: LocalSidecars, *, seconds: float, concurrency: int, seed: int
) -> dict[str, object]:
    rng = random.Random(seed)
    addresses = cluster.addresses()
    clients = [AsyncClient(address) for address in addresses]
    names = [f"acct{i:02d}" for i in range(ACCOUNTS)]
    setup = Transaction()
    for name in names:
        setup.update("bank", "accounts", name, balance=INITIAL)
    await clients[0].transact(setup)
    latencies: list[float] = []
    outcomes = {"applied": 0, "declined": 0, "error": 0}
    deadline = time.monotonic() + seconds

    async def worker(index: int) -> None:
        client = clients[index % len(clients)]
        while time.monotonic() < deadline:
            source, target = rng.sample(names, 2)
            started = time.perf_counter()
            try:
                result = await client.transact(transfer(source, target, rng.randint(1, 50)))
            except TransactionError:
                outcomes["error"] += 1
                continue
            latencies.append(time.perf_counter() - started)
            outcomes["applied" if result.applied else "declined"] += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.monotonic() - started
    audit = Transaction()
    for name in names:
        audit.let(name, "bank", "accounts", name)
    final = await clients[1].transact(audit)
    total = sum(int(row["balance"]) for row in final.rows.values() if row is not None)  # type: ignore[call-overload]
    for client in clients:
        await client.close()
    fast = slow = 0.0
    for sidecar in cluster.sidecars.values():
        figures = metrics_of(sidecar.metrics_address)
        fast += figures.get("accord_fast_path_total", 0)
        slow += figures.get("accord_slow_path_total", 0)
    ordered = sorted(latencies)
    return {
        "transfers": len(latencies),
        **outcomes,
        "seconds": round(elapsed, 1),
        "txns_per_second": round(len(latencies) / elapsed, 1),
        "latency_p50_ms": round(1000 * statistics.median(ordered), 1) if ordered else None,
        "latency_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1)
        if ordered
        else None,
        "fast_path_share": round(fast / (fast + slow), 3) if fast + slow else None,
        "total_before": ACCOUNTS * INITIAL,
        "total_after": total,
    }


def run(*, seconds: float = 10.0, concurrency: int = 16, seed: int = 1) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="accord-demo-") as folder,
        LocalSidecars(Path(folder)) as cluster,
    ):
        return asyncio.run(_run(cluster, seconds=seconds, concurrency=concurrency, seed=seed))
