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

That last rule is the reason for the ``accord_history`` table. The sidecars share one copy
of the data, where Accord assumes each replica has its own. A transaction's writes reach
Cassandra as soon as *one* replica applies them. If that replica (say its coordinator, which
applies its own Apply first) dies before the Apply reaches the others, a recovery
coordinator finds no replica that knows the writes and re-executes the transaction: it reads
again at executeAt. Against a private copy that read returns the same values (nothing at or
after executeAt was applied there); against the shared table it returns the transaction's
own writes, and a bank transfer is applied twice (found by tests/sidecar: a total grew after
a SIGKILL).

So every write also appends the row's new version to ``accord_history`` (clustered by write
timestamp, newest first), and a read for a transaction takes the newest version *before*
its write timestamp: the same answer however late the read comes, which keeps re-execution
deterministic. Versions expire after :data:`HISTORY_TTL_SECONDS`; a read that finds none
falls back to the table itself, checking the write timestamp of what it finds: at or after
the reader's own, it is refused (:class:`ReadTooLate`) and the replica answers that
transaction only with its outcome, which the replica that applied it has in its journal.
A row's write timestamp is that of any non-null cell (every write sets every column); a
deleted or all-null row has none, so such writes first record theirs in ``accord_markers``
(written before the data, read after it, so a read that sees the data's effect sees it too).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgpack

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


MARKER_TABLE = "accord_markers"
HISTORY_TABLE = "accord_history"
# Recovery re-executes a transaction within seconds of its coordinator's failure; a day of
# versions leaves room for a replica that stays down much longer.
HISTORY_TTL_SECONDS = 24 * 3600
ACCORD_TABLES = (MARKER_TABLE, HISTORY_TABLE)


def accord_tables_cql(keyspace: str) -> list[str]:
    """The sidecars' own tables in a served keyspace (see the module docstring)."""
    return [
        f'CREATE TABLE IF NOT EXISTS "{keyspace}"."{MARKER_TABLE}" '
        "(key text PRIMARY KEY, stamp bigint)",
        f'CREATE TABLE IF NOT EXISTS "{keyspace}"."{HISTORY_TABLE}" '
        "(key text, stamp bigint, row blob, PRIMARY KEY (key, stamp)) "
        f"WITH CLUSTERING ORDER BY (stamp DESC) AND default_time_to_live = {HISTORY_TTL_SECONDS}",
    ]


def encode_row(value: object) -> bytes | None:
    """A row value (tuple of cells, or None when deleted) for the history table."""
    return None if value is None else msgpack.packb(list(value), use_bin_type=True)  # type: ignore[call-overload]


def decode_row(data: bytes | None) -> object:
    return None if data is None else tuple(msgpack.unpackb(data, raw=False))


class ReadTooLate(RuntimeError):
    """A read found data written at or after the reading transaction's executeAt: the
    transaction (or a later one) was applied already, so this read cannot be answered."""


class AsyncDataStore(Protocol):
    async def read(self, keys: Sequence[Key], execute_at: Timestamp) -> dict[Key, object]: ...

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None: ...

    async def close(self) -> None: ...


class MemoryDataStore:
    """Last-write-wins by write timestamp, in memory (the embedded mode and the demo)."""

    def __init__(self) -> None:
        self.cells: dict[Key, tuple[int, object]] = {}

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

    def _statement(self, table: TableSchema, kind: str) -> Any:
        cached = self._prepared.get((table.qualified, kind))
        if cached is not None:
            return cached
        key_where = " AND ".join(f'"{name}" = ?' for name, _ in table.partition_key)
        columns = [name for name, _ in table.columns]
        target = f'"{table.keyspace}"."{table.table}"'
        if kind == "select":
            # Each column, then each column's write timestamp (null for a null cell).
            selected = ", ".join(
                [f'"{c}"' for c in columns] + [f'WRITETIME("{c}")' for c in columns]
            ) or ", ".join(f'"{name}"' for name, _ in table.partition_key)
            cql = f"SELECT {selected} FROM {target} WHERE {key_where}"
        elif kind == "insert":
            names = [name for name, _ in table.partition_key] + columns
            quoted = ", ".join(f'"{n}"' for n in names)
            markers = ", ".join("?" for _ in names)
            cql = f"INSERT INTO {target} ({quoted}) VALUES ({markers}) USING TIMESTAMP ?"
        elif kind == "delete":
            cql = f"DELETE FROM {target} USING TIMESTAMP ? WHERE {key_where}"
        elif kind == "history":
            cql = (
                f'SELECT row FROM "{table.keyspace}"."{HISTORY_TABLE}" '
                "WHERE key = ? AND stamp < ? LIMIT 1"
            )
        elif kind == "version":
            cql = (
                f'INSERT INTO "{table.keyspace}"."{HISTORY_TABLE}" (key, stamp, row) '
                "VALUES (?, ?, ?) USING TIMESTAMP ?"
            )
        elif kind == "mark":
            cql = (
                f'INSERT INTO "{table.keyspace}"."{MARKER_TABLE}" (key, stamp) '
                "VALUES (?, ?) USING TIMESTAMP ?"
            )
        else:
            cql = f'SELECT stamp FROM "{table.keyspace}"."{MARKER_TABLE}" WHERE key = ?'
        statement = self.session.prepare(cql)
        statement.consistency_level = self.consistency
        self._prepared[(table.qualified, kind)] = statement
        return statement

    def _key_values(self, table: TableSchema, key: Key) -> list[object]:
        values = partition_values(table, routing_key_of(key))
        return [_to_driver(t, v) for (_, t), v in zip(table.partition_key, values, strict=True)]

    async def read(self, keys: Sequence[Key], execute_at: Timestamp) -> dict[Key, object]:
        stamp = write_timestamp(execute_at)

        async def one(key: Key) -> tuple[Key, object]:
            table = self.catalog.for_key(key)
            versions = await _execute(
                self.session, self._statement(table, "history"), [key.name, stamp]
            )
            if versions:
                return key, decode_row(versions[0][0])
            # No version before this read: never written through Accord, or expired.
            rows = await _execute(
                self.session, self._statement(table, "select"), self._key_values(table, key)
            )
            width = len(table.columns)
            value = None
            written: int | None = None
            if rows:
                row = rows[0]
                value = tuple(_from_driver(row[i]) for i in range(width))
                stamps = [row[width + i] for i in range(width) if row[width + i] is not None]
                written = max(stamps) if stamps else None
            if written is None:
                # Deleted, never written, or all nulls: the marker holds the timestamp.
                marks = await _execute(self.session, self._statement(table, "marked"), [key.name])
                written = marks[0][0] if marks else None
            if written is not None and written >= stamp:
                raise ReadTooLate(
                    f"{key.name}: written at {written}, not before this read's {stamp}"
                )
            return key, value

        return dict(await asyncio.gather(*(one(k) for k in keys)))

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        stamp = write_timestamp(execute_at)
        marks, data = [], []
        for write in writes:
            table = self.catalog.for_key(write.key)
            key_values = self._key_values(table, write.key)
            version = None if write.delete else write.value
            data.append(
                _execute(
                    self.session,
                    self._statement(table, "version"),
                    [write.key.name, stamp, encode_row(version), stamp],
                )
            )
            if write.delete or write.value is None:
                marks.append(self._mark(table, write.key, stamp))
                data.append(
                    _execute(self.session, self._statement(table, "delete"), [stamp, *key_values])
                )
                continue
            row = write.value
            if not isinstance(row, tuple) or len(row) != len(table.columns):
                raise ValueError(
                    f"{table.qualified}: a row needs {len(table.columns)} values, got {row!r}"
                )
            if all(cell is None for cell in row):
                marks.append(self._mark(table, write.key, stamp))
            values = [_to_driver(t, v) for (_, t), v in zip(table.columns, row, strict=True)]
            data.append(
                _execute(
                    self.session, self._statement(table, "insert"), [*key_values, *values, stamp]
                )
            )
        # Markers strictly before the data they describe; the version and the row together
        # (a reader after this replica applied the write finds the version, see above).
        await asyncio.gather(*marks)
        await asyncio.gather(*data)

    def _mark(self, table: TableSchema, key: Key, stamp: int) -> Any:
        # The stamp is also the cell's timestamp: last-write-wins keeps the highest.
        return _execute(self.session, self._statement(table, "mark"), [key.name, stamp, stamp])

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
            if table.name in ACCORD_TABLES:
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
