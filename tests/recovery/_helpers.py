"""Helpers shared by the recovery tests: raw directory dumps and small sagas."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.saga.runtime import StoreRuntime

TIERS = (
    "es_days_by_year",
    "es_recovery_windows_by_day",
    "es_instances_by_recovery_window",
    "es_buckets_by_instance",
    "es_recovery_transactions_by_instance",
)


@dataclass
class DirectoryDump:
    """Every directory row of one scope, read with ALLOW FILTERING (test code only)."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def count(self, table: str) -> int:
        return len(self.rows.get(table, []))

    @property
    def empty_below_tier2(self) -> bool:
        return all(self.count(t) == 0 for t in TIERS[2:])

    def tier5_sizes(self) -> Counter[tuple[str, int, str, int]]:
        """Rows per Tier-5 partition."""
        return Counter(
            (r["date_of_year"], r["minute_of_day"], r["instance_id"], r["bucket_index"])
            for r in self.rows.get(TIERS[4], [])
        )

    def windows(self) -> list[tuple[str, int]]:
        return sorted((r["date_of_year"], r["minute_of_day"]) for r in self.rows.get(TIERS[1], []))

    def tier5_transactions(self, *, odd: bool | None = None) -> list[Any]:
        return [
            r["transaction_id"]
            for r in self.rows.get(TIERS[4], [])
            if odd is None or (r["bucket_index"] % 2 == 1) == odd
        ]


async def dump_directory(runtime: StoreRuntime, scope: DirectoryScope) -> DirectoryDump:
    keyspace = runtime.driver_config.keyspace
    session = runtime.cql.session

    def read() -> DirectoryDump:
        dump = DirectoryDump()
        for table in TIERS:
            statement = (
                f"SELECT * FROM {keyspace}.{table} WHERE region = %s AND cluster = %s "
                "AND service_name = %s ALLOW FILTERING"
            )
            rows = session.execute(statement, scope.params())
            dump.rows[table] = [dict(row) for row in rows]
        return dump

    return await asyncio.get_running_loop().run_in_executor(None, read)


@dataclass(frozen=True)
class DispatchRecord:
    node_id: str
    transaction_id: Any
    instance_id: str
    window: str
    epoch: int
    at: float


class RecordingDispatcher:
    """Records every dispatch (node, transaction, the lease it ran under) and takes
    ``seconds`` per row; checks at dispatch time that the node's lease covers the row."""

    def __init__(
        self, node_id: str, leases: Any, log: list[DispatchRecord], seconds: float = 0.0
    ) -> None:
        self.node_id = node_id
        self.leases = leases
        self.log = log
        self.seconds = seconds
        self.violations: list[str] = []

    async def dispatch(self, entry: Any) -> Any:
        from stacksaga_store.recovery.retry_node import DispatchOutcome
        from stacksaga_store.recovery.writer import instance_token

        lease = self.leases.current()
        token = instance_token(entry.bucket.instance_id)
        if lease is None or not lease.range.contains(token):
            self.violations.append(f"{self.node_id} dispatched {entry.transaction_id} unleased")
        self.log.append(
            DispatchRecord(
                self.node_id,
                entry.transaction_id,
                entry.bucket.instance_id,
                str(entry.bucket.window),
                lease.epoch if lease else -1,
                self.leases.monotonic(),
            )
        )
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return DispatchOutcome.RESUMED


def bulk_load_retry_bucket(
    runtime: StoreRuntime,
    scope: DirectoryScope,
    *,
    date_of_year: str,
    minute_of_day: int,
    instance_id: str,
    instance_id_token: int,
    transaction_ids: list[Any],
    payload: bytes,
    created_at: Any,
) -> None:
    """A fast loader for big buckets (synchronous; run it in a thread): es_transaction rows in
    FAILED_WITH_RETRYABLE_ERROR, one retry bucket (index 0) holding all of them, and Tiers 1-4
    above it. Tier-5 rows go in UNLOGGED batches (one partition each)."""
    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.query import BatchStatement, BatchType

    session = runtime.cql.session
    ks = runtime.driver_config.keyspace
    scope_values = scope.params()
    insert_txn = session.prepare(
        f"INSERT INTO {ks}.es_transaction (region, cluster, service_name, transaction_id, "
        "running_status, created_at, updated_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )
    execute_concurrent_with_args(
        session,
        insert_txn,
        [
            (*scope_values, txn, "FAILED_WITH_RETRYABLE_ERROR", created_at, created_at, payload)
            for txn in transaction_ids
        ],
        concurrency=64,
        raise_on_first_error=True,
    )
    insert_row = session.prepare(
        f"INSERT INTO {ks}.es_recovery_transactions_by_instance (region, cluster, service_name, "
        "date_of_year, minute_of_day, instance_id, bucket_index, transaction_id) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, ?)"
    )
    for start in range(0, len(transaction_ids), 250):
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for txn in transaction_ids[start : start + 250]:
            batch.add(insert_row, (*scope_values, date_of_year, minute_of_day, instance_id, txn))
        session.execute(batch)
    year = int(date_of_year[:4])
    session.execute(
        f"INSERT INTO {ks}.es_days_by_year (region, cluster, service_name, year, date_of_year) "
        "VALUES (%s, %s, %s, %s, %s)",
        (*scope_values, year, date_of_year),
    )
    session.execute(
        f"INSERT INTO {ks}.es_recovery_windows_by_day (region, cluster, service_name, "
        "date_of_year, minute_of_day) VALUES (%s, %s, %s, %s, %s)",
        (*scope_values, date_of_year, minute_of_day),
    )
    session.execute(
        f"INSERT INTO {ks}.es_instances_by_recovery_window (region, cluster, service_name, "
        "date_of_year, minute_of_day, instance_id_token, instance_id) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (*scope_values, date_of_year, minute_of_day, instance_id_token, instance_id),
    )
    session.execute(
        f"INSERT INTO {ks}.es_buckets_by_instance (region, cluster, service_name, date_of_year, "
        "minute_of_day, instance_id, bucket_index) VALUES (%s, %s, %s, %s, %s, %s, 0)",
        (*scope_values, date_of_year, minute_of_day, instance_id),
    )


def committed_markers(
    runtime: StoreRuntime, scope: DirectoryScope, transaction_ids: list[Any], step_id: str
) -> set[Any]:
    """The transactions whose marker for ``step_id`` is COMMITTED (synchronous)."""
    from cassandra.concurrent import execute_concurrent_with_args

    session = runtime.cql.session
    ks = runtime.driver_config.keyspace
    select = session.prepare(
        f"SELECT transaction_id, execution_state FROM {ks}.es_execution_markers WHERE "
        "region = ? AND cluster = ? AND service_name = ? AND transaction_id = ? AND step_id = ?"
    )
    results = execute_concurrent_with_args(
        session,
        select,
        [(*scope.params(), txn, step_id) for txn in transaction_ids],
        concurrency=64,
        raise_on_first_error=True,
    )
    found = set()
    for _, rows in results:
        for row in rows:
            if row["execution_state"] == "COMMITTED":
                found.add(row["transaction_id"])
    return found


def statuses(
    runtime: StoreRuntime, scope: DirectoryScope, transaction_ids: list[Any]
) -> Counter[str]:
    from cassandra.concurrent import execute_concurrent_with_args

    session = runtime.cql.session
    ks = runtime.driver_config.keyspace
    select = session.prepare(
        f"SELECT running_status FROM {ks}.es_transaction WHERE region = ? AND cluster = ? "
        "AND service_name = ? AND transaction_id = ?"
    )
    results = execute_concurrent_with_args(
        session,
        select,
        [(*scope.params(), txn) for txn in transaction_ids],
        concurrency=64,
        raise_on_first_error=True,
    )
    counts: Counter[str] = Counter()
    for _, rows in results:
        for row in rows:
            counts[row["running_status"]] += 1
    return counts
