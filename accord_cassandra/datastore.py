"""Where user data lives: Cassandra, or memory for the embedded mode.

Both stores obey :class:`accord.api.DataStore`'s contract, asynchronously:

* a write carries the transaction's executeAt and lands with ``USING TIMESTAMP`` equal to
  :func:`write_timestamp` of it. That mapping is injective and order-preserving over
  timestamps of one epoch, so replaying a write (recovery, retries, every replica applying
  the same transaction) is idempotent, and Cassandra's last-write-wins agrees with Accord's
  order — equal write timestamps, whose tie-break Cassandra decides by cell content, never
  occur between different transactions;
* reads and writes use QUORUM (configurable to LOCAL_QUORUM or ALL). Each sidecar replica
  reads only after every conflicting transaction ordered before it was *applied*, and
  "applied" means a quorum write was acknowledged; a quorum read then intersects that write
  quorum, so the read sees it whichever Cassandra replica answers (R + W > RF);
* a read for a transaction returns the rows as of its executeAt: never what it or a later
  transaction wrote.

That last rule holds without any versioned copy of the rows, although the sidecars share
one copy of the data where Accord assumes each replica has its own: a replica hands a
transaction's writes to the store only once its outcome is *chosen*, journaled by a
quorum of every shard it touches, and a recovery coordinator that finds a chosen outcome
re-proposes it instead of executing again (docs/accord.md, "Writes wait for a durable
outcome"). So every read that feeds an outcome runs before any write of its transaction or
of a later conflicting one is in Cassandra. (Earlier versions kept ``accord_history`` and
``accord_markers`` for re-executions that read their own writes; nothing reads them now.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from accord import Key, Status, Timestamp, WriteOp
from accord.api import CommandSnapshot
from accord_cassandra.schema import (
    Catalog,
    SchemaError,
    TableSchema,
    partition_values,
    routing_key_of,
)

# Write timestamps count microseconds from 2024-01-01 so that 12 low bits can carry the
# flags and node id and the result still fits a signed 64-bit integer until about 2095.
HLC_BASE_MICROS = 1_704_067_200_000_000
NODE_BITS = 10
FLAG_BITS = 2
MAX_NODE_ID = (1 << NODE_BITS) - 1


def write_timestamp(execute_at: Timestamp) -> int:
    """Cassandra write timestamp for a transaction executing at ``execute_at``.

    Order: (hlc, flags, node) lexicographically — exactly the Timestamp order within an
    epoch. Epochs are compared first by the protocol; the sidecar runs a single epoch and
    HLC values never go backwards across epochs, so the order holds across them too.
    """
    if not 0 <= execute_at.node <= MAX_NODE_ID:
        raise ValueError(f"node id {execute_at.node} exceeds {MAX_NODE_ID}")
    if not 0 <= execute_at.flags < (1 << FLAG_BITS):
        raise ValueError(f"timestamp flags {execute_at.flags} do not fit {FLAG_BITS} bits")
    return (
        ((execute_at.hlc - HLC_BASE_MICROS) << (NODE_BITS + FLAG_BITS))
        | (execute_at.flags << NODE_BITS)
        | execute_at.node
    )


# Left in served keyspaces by earlier versions (see the module docstring): never served.
LEGACY_TABLES = ("accord_markers", "accord_history")


class AsyncDataStore(Protocol):
    # Row writes executed so far (Cassandra statements, or cells set in memory): the cost
    # the bench reports per Accord row write (accord_store_writes_total).
    writes_executed: int

    async def read(self, keys: Sequence[Key], execute_at: Timestamp) -> dict[Key, object]: ...

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None: ...

    async def close(self) -> None: ...


class MemoryDataStore:
    """Last-write-wins by write timestamp, in memory (the embedded mode and the demo)."""

    def __init__(self) -> None:
        self.cells: dict[Key, tuple[int, object]] = {}
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

    async def read(self, keys: Sequence[Key], execute_at: Timestamp) -> dict[Key, object]:
        # Private to this replica: nothing at or after execute_at was applied here (the
        # replica answers with the outcome instead of reading once it applied it).
        return {k: self.cells[k][1] if k in self.cells else None for k in keys}

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        self._apply(writes, execute_at)
        self.writes_executed += len(writes)

    def _apply(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        stamp = write_timestamp(execute_at)
        for write in writes:
            current = self.cells.get(write.key)
            # Equal stamps mean the same transaction replayed: keep what is there.
            if current is None or current[0] < stamp:
                self.cells[write.key] = (stamp, None if write.delete else write.value)

    async def close(self) -> None:
        return None


def _to_driver(cql_type: str, value: object) -> object:
    if value is not None and cql_type in ("uuid", "timeuuid"):
        return uuid.UUID(str(value))
    return value


def _from_driver(value: object) -> object:
    return str(value) if isinstance(value, uuid.UUID) else value


class CassandraDataStore:
    """User rows in Cassandra through cassandra-driver, prepared statements only."""

    def __init__(self, session: Any, catalog: Catalog, *, consistency: str = "QUORUM") -> None:
        from cassandra import ConsistencyLevel

        self.session = session
        self.catalog = catalog
        self.consistency = ConsistencyLevel.name_to_value[consistency]
        self._prepared: dict[tuple[str, str], Any] = {}
        self.writes_executed = 0

    def _statement(self, table: TableSchema, kind: str) -> Any:
        cached = self._prepared.get((table.qualified, kind))
        if cached is not None:
            return cached
        key_where = " AND ".join(f'"{name}" = ?' for name, _ in table.partition_key)
        columns = [name for name, _ in table.columns]
        target = f'"{table.keyspace}"."{table.table}"'
        if kind == "select":
            selected = ", ".join(f'"{c}"' for c in columns) or ", ".join(
                f'"{name}"' for name, _ in table.partition_key
            )
            cql = f"SELECT {selected} FROM {target} WHERE {key_where}"
        elif kind == "insert":
            names = [name for name, _ in table.partition_key] + columns
            quoted = ", ".join(f'"{n}"' for n in names)
            markers = ", ".join("?" for _ in names)
            cql = f"INSERT INTO {target} ({quoted}) VALUES ({markers}) USING TIMESTAMP ?"
        elif kind == "delete":
            cql = f"DELETE FROM {target} USING TIMESTAMP ? WHERE {key_where}"
        else:
            raise ValueError(f"unknown statement kind {kind!r}")
        statement = self.session.prepare(cql)
        statement.consistency_level = self.consistency
        self._prepared[(table.qualified, kind)] = statement
        return statement

    def _key_values(self, table: TableSchema, key: Key) -> list[object]:
        values = partition_values(table, routing_key_of(key))
        return [_to_driver(t, v) for (_, t), v in zip(table.partition_key, values, strict=True)]

    async def read(self, keys: Sequence[Key], execute_at: Timestamp) -> dict[Key, object]:
        async def one(key: Key) -> tuple[Key, object]:
            table = self.catalog.for_key(key)
            rows = await _execute(
                self.session, self._statement(table, "select"), self._key_values(table, key)
            )
            if not rows:
                return key, None
            return key, tuple(_from_driver(rows[0][i]) for i in range(len(table.columns)))

        return dict(await asyncio.gather(*(one(k) for k in keys)))

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        stamp = write_timestamp(execute_at)
        data = []
        for write in writes:
            table = self.catalog.for_key(write.key)
            key_values = self._key_values(table, write.key)
            if write.delete or write.value is None:
                data.append(
                    _execute(self.session, self._statement(table, "delete"), [stamp, *key_values])
                )
                continue
            row = write.value
            if not isinstance(row, tuple) or len(row) != len(table.columns):
                raise ValueError(
                    f"{table.qualified}: a row needs {len(table.columns)} values, got {row!r}"
                )
            values = [_to_driver(t, v) for (_, t), v in zip(table.columns, row, strict=True)]
            data.append(
                _execute(
                    self.session, self._statement(table, "insert"), [*key_values, *values, stamp]
                )
            )
        await asyncio.gather(*data)
        self.writes_executed += len(data)

    async def close(self) -> None:
        return None


async def _execute(session: Any, statement: Any, values: Sequence[object]) -> list[Any]:
    """Run a prepared statement and await its rows from the driver's I/O thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[Any]] = loop.create_future()

    def done(rows: Any) -> None:
        loop.call_soon_threadsafe(_settle, future, list(rows or []), None)

    def failed(error: BaseException) -> None:
        loop.call_soon_threadsafe(_settle, future, None, error)

    response = session.execute_async(statement, list(values))
    response.add_callbacks(done, failed)
    return await future


def _settle(
    future: asyncio.Future[list[Any]], rows: list[Any] | None, error: BaseException | None
) -> None:
    if future.done():  # cancelled while the driver worked
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(rows or [])


def tables_from_cluster(
    metadata: Any, keyspaces: Sequence[str], unusable: dict[str, str] | None = None
) -> list[TableSchema]:
    """Table schemas from the driver's metadata.

    A table Accord cannot serve (clustering columns, or a column type the sidecar does not
    handle) is left out, and why goes into ``unusable`` (by ``keyspace.table``): one such
    table in a keyspace must not stop the sidecar from serving the others.
    """
    found = []
    for name in keyspaces:
        keyspace = metadata.keyspaces.get(name)
        if keyspace is None:
            raise ValueError(f"keyspace {name!r} does not exist in Cassandra")
        for table in keyspace.tables.values():
            if table.name in LEGACY_TABLES:
                continue
            qualified = f"{name}.{table.name}"
            if table.clustering_key:
                if unusable is not None:
                    unusable[qualified] = (
                        "it has clustering columns; a partition must be one row to be an Accord key"
                    )
                continue
            key_names = [c.name for c in table.partition_key]
            try:
                found.append(
                    TableSchema(
                        name,
                        table.name,
                        tuple((c.name, c.cql_type) for c in table.partition_key),
                        tuple(
                            (c.name, c.cql_type)
                            for n, c in table.columns.items()
                            if n not in key_names
                        ),
                    )
                )
            except SchemaError as error:
                if unusable is not None:
                    unusable[qualified] = str(error)
    return found
