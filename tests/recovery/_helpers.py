"""Helpers shared by the recovery tests: raw directory dumps and small sagas."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stacksaga_store.directory import DirectoryScope
from stacksaga_store.runtime import StoreRuntime

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
        from stacksaga_store.retry_node import DispatchOutcome
        from stacksaga_store.writer import instance_token

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
