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
