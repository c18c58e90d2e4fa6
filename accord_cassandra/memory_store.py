"""User rows in memory: the embedded mode and the demo (docs/sidecars.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from accord import (
    Key,
    MemoryPartitions,
    PartitionRead,
    Selection,
    Status,
    Timestamp,
    WriteOp,
    WriteScope,
)
from accord.api import ColumnKeys, CommandSnapshot
from accord_cassandra.datastore import write_timestamp
from accord_cassandra.schema import Catalog, SchemaError, check_type, column_order_key


class MemoryDataStore:
    """Partitions in memory (the embedded mode and the demo), with the semantics of
    :class:`accord.MemoryPartitions`: clustering order, TTLs judged as of executeAt, row,
    range and partition tombstones, last-write-wins by executeAt."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        def clustering(key: Key) -> tuple[tuple[str, str, str], ...]:
            if catalog is None:
                return ()
            try:
                return catalog.for_key(key).clustering
            except SchemaError:
                return ()

        def descending(key: Key) -> tuple[bool, ...]:
            return tuple(order == "desc" for _, _, order in clustering(key))

        def column_keys(key: Key) -> ColumnKeys:
            # Cassandra's order of each column where the core value's is not (uuids).
            return tuple(column_order_key(cql_type) for _, cql_type, _ in clustering(key))

        self.partitions = MemoryPartitions(descending, column_keys)
        self._catalog = catalog
        self.writes_executed = 0

    def restore(self, records: Sequence[object], owns: Callable[[Key], bool]) -> int:
        """Re-apply the writes of every transaction the journal says was applied here.

        Memory dies with the process, but the node restarted from its journal believes
        those writes are in place (it re-issues only writes a crash interrupted), so
        without this a restarted embedded sidecar would read its rows as absent.
        """
        applied = 0
        for record in records:
            if (
                isinstance(record, CommandSnapshot)
                and record.status is Status.APPLIED
                and record.writes
                and record.execute_at is not None
            ):
                self._apply([w for w in record.writes if owns(w.key)], record.execute_at)
                applied += 1
        return applied

    async def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> dict[Key, PartitionRead]:
        # Private to this replica: nothing at or after execute_at was applied here (the
        # replica answers with the outcome instead of reading once it applied it).
        return self.partitions.read(selections, execute_at)

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        self._apply(writes, execute_at)
        self.writes_executed += len(writes)

    def _apply(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        write_timestamp(execute_at)  # the same refusal of unencodable timestamps as Cassandra
        self.partitions.write([self._stored(write) for write in writes], execute_at)

    def _stored(self, write: WriteOp) -> WriteOp:
        """``write`` with its row as Cassandra would hold it (check_type's canonical form: a
        float column's computed value rounded to binary32), so both stores read alike."""
        if self._catalog is None or write.delete or not isinstance(write.value, tuple):
            return write
        try:
            table = self._catalog.for_key(write.key)
        except SchemaError:
            return write
        columns = table.static if write.scope is WriteScope.STATIC else table.columns
        if len(columns) != len(write.value):
            return write
        row = tuple(
            check_type(table.where(name), cql_type, value)
            for (name, cql_type), value in zip(columns, write.value, strict=True)
        )
        return dataclasses.replace(write, value=row)

    async def close(self) -> None:
        return None
