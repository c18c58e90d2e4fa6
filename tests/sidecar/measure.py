"""Sidecar figures on this machine: commit latency, throughput at saturation, journal sync cost.

    python -m tests.sidecar.measure --store memory
    python -m tests.sidecar.measure --store cassandra --cassandra-dir DIR   # launcher up dir
    python -m tests.sidecar.measure --peer-auth none    # the cost of the peer MAC, by difference

Three sidecar processes on loopback run bank transfers (two accounts read and written per
transaction, plus a receipt row) from N concurrent clients spread over the sidecars, for
each N in --concurrency. Latency is client-observed, from submit to acknowledgement. The
journal figures come from the sidecars' /metrics counters.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from accord_cassandra.cluster import LocalSidecars, metrics_of
from tests.sidecar.bank import Bank
from tests.sidecar.conftest import EMBEDDED_TABLES, bank_schema


def _journal(cluster: LocalSidecars) -> dict[str, float]:
    totals = {"syncs": 0.0, "seconds": 0.0, "records": 0.0, "fast": 0.0, "slow": 0.0}
    for sidecar in cluster.sidecars.values():
        figures = metrics_of(sidecar.metrics_address)
        totals["syncs"] += figures["accord_journal_syncs_total"]
        totals["seconds"] += figures["accord_journal_sync_seconds_total"]
        totals["records"] += figures["accord_journal_records_total"]
        totals["fast"] += figures["accord_fast_path_total"]
        totals["slow"] += figures["accord_slow_path_total"]
    return totals


def run(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(prefix="accord-measure-"))
    keyspace = "bank"
    session: Any = None
    cassandra: Any = None
    if args.store == "cassandra":
        from accord_cassandra.launcher import LocalCluster

        cassandra = LocalCluster.attach(Path(args.cassandra_dir))
        session = cassandra.connect()
        keyspace = f"measure_{uuid.uuid4().hex[:8]}"
        for statement in bank_schema(keyspace):
            session.execute(statement, timeout=60)
        cluster = LocalSidecars(
            directory,
            store="cassandra",
            cassandra={"contact_points": cassandra.contact_points, "keyspaces": [keyspace]},
            extra={"peer_auth": args.peer_auth},
        )
    else:
        cluster = LocalSidecars(
            directory, tables=EMBEDDED_TABLES, extra={"peer_auth": args.peer_auth}
        )
    try:
        cluster.start(timeout=90)
        print(
            f"store={args.store} peer_auth={args.peer_auth} accounts={args.accounts} "
            f"seconds={args.seconds}"
        )
        print("clients  txns/s  p50_ms  p99_ms  declined  fast_share  s/sync  records/sync")
        first = 1
        for clients in args.concurrency:
            before = _journal(cluster)
            bank = Bank(
                cluster.addresses(),
                keyspace,
                [f"c{clients}a{i}" for i in range(args.accounts)],
                audit_share=0.0,
                first_transfer=first,
            )
            first += 10_000_000

            async def main(bank: Bank = bank, clients: int = clients) -> float:
                try:
                    await bank.setup()
                    started = time.monotonic()
                    deadline = started + args.seconds
                    await bank.run(clients, lambda: time.monotonic() > deadline)
                    return time.monotonic() - started
                finally:
                    await bank.close()

            elapsed = asyncio.run(main())
            after = _journal(cluster)
            syncs = after["syncs"] - before["syncs"]
            fast = after["fast"] - before["fast"]
            slow = after["slow"] - before["slow"]
            p50, p99 = bank.latency_ms()
            statuses = bank.statuses()
            print(
                f"{clients:7d} {len(bank.commits) / elapsed:7.1f} {p50:7.1f} {p99:7.1f} "
                f"{statuses['declined']:9d} {fast / max(1.0, fast + slow):11.2f} "
                f"{(after['seconds'] - before['seconds']) / max(1.0, syncs):7.4f} "
                f"{(after['records'] - before['records']) / max(1.0, syncs):13.2f}"
            )
    finally:
        cluster.stop()
        if session is not None:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
            cassandra.close_sessions()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=("memory", "cassandra"), default="memory")
    parser.add_argument("--cassandra-dir", help="base dir of `launcher up --nodes 3`")
    parser.add_argument("--accounts", type=int, default=32)
    parser.add_argument("--peer-auth", choices=("hmac", "none"), default="hmac")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--concurrency", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4, 8, 16]
    )
    args = parser.parse_args()
    if args.store == "cassandra" and not args.cassandra_dir:
        parser.error("--store cassandra needs --cassandra-dir")
    run(args)


if __name__ == "__main__":
    main()
