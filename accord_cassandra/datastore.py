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
import dataclasses
import datetime
import decimal
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from accord import (
    MAX_PARTITION_READ_BYTES,
    MAX_ROWS_PER_SLICE,
    Key,
    MemoryPartitions,
    PartitionRead,
    RowAt,
    Selection,
    Slice,
    StaticAt,
    Status,
    Timestamp,
    WriteOp,
    WriteScope,
)
from accord.api import (
    ColumnKeys,
    CommandSnapshot,
    in_slice,
    partition_too_large,
    slice_too_large,
    value_size,
)
from accord_cassandra.schema import (
    Catalog,
    CqlType,
    SchemaError,
    TableSchema,
    check_type,
    column_order_key,
    parse_type,
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
    """:class:`accord.api.DataStore`, asynchronously: read selections, write rows."""

    # Row writes executed so far (Cassandra statements, or cells set in memory): the cost
    # the bench reports per Accord row write (accord_store_writes_total).
    writes_executed: int

    async def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> dict[Key, PartitionRead]: ...

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None: ...

    async def close(self) -> None: ...


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
            check_type(f"{table.qualified}.{name}", cql_type, value)
            for (name, cql_type), value in zip(columns, write.value, strict=True)
        )
        return dataclasses.replace(write, value=row)

    async def close(self) -> None:
        return None


CASSANDRA_TTL_REFUSED = (
    'USING TTL is not yet served by the Cassandra store (docs/sidecars.md, "TTL"); '
    "the embedded memory store serves it"
)


def _to_driver(cql_type: str, value: object) -> object:
    """A core value of a ``cql_type`` column as the driver takes it, in its canonical form
    (check_type: a float column's value rounded to binary32, as the memory store holds it)."""
    if value is None:
        return None
    if cql_type == "timestamp" and not isinstance(value, int):
        raise ValueError(f"a timestamp is milliseconds as an integer, not {value!r}")
    return _driver_value(parse_type(cql_type), check_type(cql_type, cql_type, value))


class _Entries:
    """A map value as the driver serializes one (``len`` and ``items``), keeping the core's
    entry order and taking keys a dict could not hold (a frozen list)."""

    def __init__(self, entries: list[tuple[object, object]]) -> None:
        self.entries = entries

    def __len__(self) -> int:
        return len(self.entries)

    def items(self) -> list[tuple[object, object]]:
        return self.entries


def _driver_value(t: CqlType, value: object) -> object:
    if value is None:
        return None
    if t.composite:
        items = value if isinstance(value, tuple) else ()
        if t.name in ("list", "set"):
            return [_driver_value(t.args[0], item) for item in items]
        if t.name == "map":
            return _Entries(
                [
                    (_driver_value(t.args[0], k), _driver_value(t.args[1], v))
                    for k, v in cast("tuple[tuple[object, object], ...]", items)
                ]
            )
        return tuple(_driver_value(sub, item) for sub, item in zip(t.args, items, strict=True))
    if t.name in ("uuid", "timeuuid"):
        return uuid.UUID(str(value))
    if t.name == "timestamp":
        return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=_int(value))
    if t.name == "date":
        from cassandra.util import Date

        return Date(value)
    if t.name == "time":
        from cassandra.util import Time

        return Time(value)
    if t.name == "decimal":
        return decimal.Decimal(str(value))
    if t.name == "duration":
        from cassandra.util import Duration

        months, days, nanos = cast("tuple[int, int, int]", value)
        return Duration(months, days, nanos)
    return value


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"expected an integer, not {value!r}")
    return value


def _from_driver(value: object, cql_type: str | None = None) -> object:
    """A driver value as the core's (schema.py's mapping of each CQL type); a composite
    one (a collection, tuple, UDT or duration) needs its ``cql_type``, and comes back in
    its canonical form (sets and maps sorted)."""
    if (
        cql_type is not None
        and value is not None
        and (cql_type == "duration" or parse_type(cql_type).composite)
    ):
        return check_type(cql_type, cql_type, _core_value(parse_type(cql_type), value))
    return _scalar_from_driver(value)


def _core_value(t: CqlType, value: object) -> object:
    if value is None:
        return None
    if t.name == "duration":
        return (
            getattr(value, "months", None),
            getattr(value, "days", None),
            getattr(value, "nanoseconds", None),
        )
    if not t.composite:
        return _scalar_from_driver(value)
    if t.name in ("list", "set"):
        return tuple(_core_value(t.args[0], item) for item in cast("list[object]", value))
    if t.name == "map":
        pairs = cast("Any", value).items()
        return tuple((_core_value(t.args[0], k), _core_value(t.args[1], v)) for k, v in pairs)
    fields = tuple(cast("tuple[object, ...]", value))
    fields += (None,) * (len(t.args) - len(fields))  # a UDT written with fewer fields
    return tuple(_core_value(sub, item) for sub, item in zip(t.args, fields, strict=True))


def _scalar_from_driver(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime.datetime):
        # The driver reads a timestamp through float seconds, a few microseconds off far
        # from the epoch: to the nearest millisecond, not down, or it reads back 1 ms less.
        delta = value.replace(tzinfo=None) - datetime.datetime(1970, 1, 1)
        return (delta.days * 86_400 + delta.seconds) * 1000 + (delta.microseconds + 500) // 1000
    if isinstance(value, decimal.Decimal):
        return str(value)
    days = getattr(value, "days_from_epoch", None)
    if isinstance(days, int):
        return days
    nanos = getattr(value, "nanosecond_time", None)
    if isinstance(nanos, int):
        return nanos
    return value


class CassandraDataStore:
    """User rows in Cassandra through cassandra-driver, prepared statements only."""

    def __init__(self, session: Any, catalog: Catalog, *, consistency: str = "QUORUM") -> None:
        from cassandra import ConsistencyLevel

        self.session = session
        self.catalog = catalog
        self.consistency = ConsistencyLevel.name_to_value[consistency]
        self._prepared: dict[tuple[str, object], Any] = {}
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

    async def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> dict[Key, PartitionRead]:
        by_key: dict[Key, list[Selection]] = {}
        for selection in selections:
            by_key.setdefault(selection.key, []).append(selection)

        async def one(key: Key, asked: list[Selection]) -> tuple[Key, PartitionRead]:
            table = self.catalog.for_key(key)
            unique = list(dict.fromkeys(asked))
            answers = await asyncio.gather(*(self._select(table, s, execute_at) for s in unique))
            results: list[tuple[Selection, object]] = []
            size = 0
            for selection, (value, error) in zip(unique, answers, strict=True):
                if error is not None:
                    return key, PartitionRead((), error)
                size += value_size(value)
                if size > MAX_PARTITION_READ_BYTES:
                    return key, PartitionRead((), partition_too_large(key))
                results.append((selection, value))
            return key, PartitionRead(tuple(results))

        return dict(await asyncio.gather(*(one(k, a) for k, a in by_key.items())))

    async def _select(
        self, table: TableSchema, selection: Selection, execute_at: Timestamp
    ) -> tuple[object, str | None]:
        key_values = self._key_values(table, selection.key)
        if isinstance(selection, RowAt):
            if not selection.clustering and not table.clustering:
                return await self._read_single_row(table, selection.key, execute_at), None
            if len(selection.clustering) != len(table.clustering):
                return None, None  # no row has that clustering key
            clustering = self._clustering_values(table, selection.clustering)
            statement = self._shaped(table, ("row",))
            rows = await _execute(self.session, statement, [*key_values, *clustering])
            return (self._row(rows[0], 0, table.columns) if rows else None), None
        if isinstance(selection, StaticAt):
            if not table.static:
                return None, None
            rows = await _execute(self.session, self._shaped(table, ("static",)), key_values)
            if not rows:
                return None, None
            value = self._row(rows[0], 0, table.static)
            return (None if all(v is None for v in value) else value), None
        return await self._slice(table, selection, key_values)

    async def _slice(
        self, table: TableSchema, selection: Slice, key_values: list[object]
    ) -> tuple[object, str | None]:
        if not table.clustering:
            # One row at (): the slice of a single-row partition.
            rows = await _execute(self.session, self._shaped(table, ("whole",)), key_values)
            found = () if not rows else (((), self._row(rows[0], 0, table.columns)),)
            matching = (
                found if in_slice((), selection.prefix, selection.lower, selection.upper) else ()
            )
            return matching[: selection.limit or MAX_ROWS_PER_SLICE], None
        prefix = self._clustering_values(table, selection.prefix)
        if len(prefix) > len(table.clustering) or (
            len(prefix) == len(table.clustering)
            and (selection.lower is not None or selection.upper is not None)
        ):
            return (), None
        ranged = len(prefix)
        bounds: list[object] = []
        shape: list[object] = ["slice", len(prefix)]
        for bound, op in ((selection.lower, ">"), (selection.upper, "<")):
            if bound is None:
                shape.append(None)
                continue
            shape.append(op + ("=" if bound.inclusive else ""))
            bounds.append(_to_driver(table.clustering[ranged][1], bound.value))
        shape.append(selection.reverse)
        fetch = (selection.limit or MAX_ROWS_PER_SLICE) + (0 if selection.limit else 1)
        statement = self._shaped(table, tuple(shape))
        rows = await _execute(self.session, statement, [*key_values, *prefix, *bounds, fetch])
        if selection.limit is None and len(rows) > MAX_ROWS_PER_SLICE:
            return None, slice_too_large(selection.key)
        width = len(table.clustering)
        out = tuple(
            (
                tuple(_from_driver(row[i], table.clustering[i][1]) for i in range(width)),
                self._row(row, width, table.columns),
            )
            for row in rows
            # A partition holding only static columns reads as one row of null clustering.
            if row[0] is not None
        )
        return out, None

    @staticmethod
    def _row(row: Any, start: int, columns: Sequence[tuple[str, str]]) -> tuple[object, ...]:
        return tuple(_from_driver(row[start + i], t) for i, (_, t) in enumerate(columns))

    def _clustering_values(self, table: TableSchema, values: tuple[object, ...]) -> list[object]:
        return [
            _to_driver(cql_type, value)
            for (_, cql_type, _), value in zip(table.clustering, values, strict=False)
        ]

    def _shaped(self, table: TableSchema, shape: tuple[object, ...]) -> Any:
        """A prepared statement for reads and writes of rows by clustering key: plain reads
        and writes of the table (no history)."""
        cached = self._prepared.get((table.qualified, shape))
        if cached is not None:
            return cached
        target = f'"{table.keyspace}"."{table.table}"'
        key_where = [f'"{name}" = ?' for name, _ in table.partition_key]
        ck_names = [name for name, _, _ in table.clustering]
        regular = [f'"{name}"' for name, _ in table.columns]
        kind = shape[0]
        if kind == "row":
            where = key_where + [f'"{n}" = ?' for n in ck_names]
            cql = f"SELECT {', '.join(regular) or '*'} FROM {target} WHERE {' AND '.join(where)}"
        elif kind == "whole":
            cql = (
                f"SELECT {', '.join(regular) or '*'} FROM {target} WHERE {' AND '.join(key_where)}"
            )
        elif kind == "static":
            statics = ", ".join(f'"{name}"' for name, _ in table.static)
            cql = f"SELECT {statics} FROM {target} WHERE {' AND '.join(key_where)} LIMIT 1"
        elif kind == "slice":
            _, prefix_len, lower, upper, reverse = shape
            prefix_len = _count(prefix_len)
            where = key_where + [f'"{n}" = ?' for n in ck_names[:prefix_len]]
            if lower is not None:
                where.append(f'"{ck_names[prefix_len]}" {lower} ?')
            if upper is not None:
                where.append(f'"{ck_names[prefix_len]}" {upper} ?')
            selected = ", ".join([f'"{n}"' for n in ck_names] + regular)
            order = ""
            if reverse:
                flipped = [
                    f'"{name}" {"ASC" if direction == "desc" else "DESC"}'
                    for name, _, direction in table.clustering
                ]
                order = f" ORDER BY {', '.join(flipped)}"
            cql = f"SELECT {selected} FROM {target} WHERE {' AND '.join(where)}{order} LIMIT ?"
        elif kind == "put_row":
            names = [name for name, _ in table.partition_key] + ck_names
            names += [name for name, _ in table.columns]
            quoted = ", ".join(f'"{n}"' for n in names)
            cql = (
                f"INSERT INTO {target} ({quoted}) VALUES ({', '.join('?' for _ in names)}) "
                "USING TIMESTAMP ?"
            )
        elif kind == "put_static":
            names = [name for name, _ in table.partition_key] + [n for n, _ in table.static]
            quoted = ", ".join(f'"{n}"' for n in names)
            cql = (
                f"INSERT INTO {target} ({quoted}) VALUES ({', '.join('?' for _ in names)}) "
                "USING TIMESTAMP ?"
            )
        elif kind == "delete_static":
            statics = ", ".join(f'"{name}"' for name, _ in table.static)
            cql = (
                f"DELETE {statics} FROM {target} USING TIMESTAMP ? WHERE {' AND '.join(key_where)}"
            )
        elif kind == "delete_range":
            _, prefix_len, lower, upper = shape
            prefix_len = _count(prefix_len)
            where = key_where + [f'"{n}" = ?' for n in ck_names[:prefix_len]]
            if lower is not None:
                where.append(f'"{ck_names[prefix_len]}" {lower} ?')
            if upper is not None:
                where.append(f'"{ck_names[prefix_len]}" {upper} ?')
            cql = f"DELETE FROM {target} USING TIMESTAMP ? WHERE {' AND '.join(where)}"
        else:
            raise ValueError(f"no statement of shape {shape!r}")
        statement = self.session.prepare(cql)
        statement.consistency_level = self.consistency
        self._prepared[(table.qualified, shape)] = statement
        return statement

    async def _read_single_row(self, table: TableSchema, key: Key, execute_at: Timestamp) -> object:
        # A plain read of the table: writes land only once their transaction's outcome is
        # durable, so nothing at or after this read's executeAt is visible (module docstring).
        rows = await _execute(
            self.session, self._statement(table, "select"), self._key_values(table, key)
        )
        if not rows:
            return None
        return self._row(rows[0], 0, table.columns)

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        stamp = write_timestamp(execute_at)
        data = []
        for write in writes:
            table = self.catalog.for_key(write.key)
            key_values = self._key_values(table, write.key)
            if table.clustering or write.scope is not WriteScope.ROW or write.clustering:
                data.append(self._write_rows(table, write, key_values, stamp))
                continue
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

    def _write_rows(
        self, table: TableSchema, write: WriteOp, key_values: list[object], stamp: int
    ) -> Any:
        """A write of a clustered table, a static row, a range or a partition: a plain
        write of the table with ``USING TIMESTAMP``, no history."""
        if write.ttl is not None:
            # Refused by the client API before commit (translate.py); a peer's write with a
            # TTL is refused by the input checks. See docs/sidecars.md, "TTL".
            raise ValueError(f"{table.qualified}: the Cassandra store does not take TTLs")
        if write.scope is WriteScope.PARTITION:
            return _execute(self.session, self._statement(table, "delete"), [stamp, *key_values])
        if write.scope is WriteScope.STATIC:
            if write.delete:
                statement = self._shaped(table, ("delete_static",))
                return _execute(self.session, statement, [stamp, *key_values])
            statics = _checked_row(table, write.value, table.static)
            return _execute(
                self.session,
                self._shaped(table, ("put_static",)),
                [*key_values, *statics, stamp],
            )
        prefix = self._clustering_values(table, write.clustering)
        if write.scope is WriteScope.RANGE or write.delete:
            bounds: list[object] = []
            shape: list[object] = ["delete_range", len(prefix)]
            for bound, op in ((write.lower, ">"), (write.upper, "<")):
                if bound is None:
                    shape.append(None)
                    continue
                shape.append(op + ("=" if bound.inclusive else ""))
                bounds.append(_to_driver(table.clustering[len(prefix)][1], bound.value))
            statement = self._shaped(table, tuple(shape))
            return _execute(self.session, statement, [stamp, *key_values, *prefix, *bounds])
        row = _checked_row(table, write.value, table.columns)
        return _execute(
            self.session, self._shaped(table, ("put_row",)), [*key_values, *prefix, *row, stamp]
        )

    async def close(self) -> None:
        return None


def _count(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"a statement shape's prefix length is an integer, not {value!r}")
    return value


def _checked_row(
    table: TableSchema, value: object, columns: tuple[tuple[str, str], ...]
) -> list[object]:
    if not isinstance(value, tuple) or len(value) != len(columns):
        raise ValueError(f"{table.qualified}: a row needs {len(columns)} values, got {value!r}")
    return [_to_driver(t, v) for (_, t), v in zip(columns, value, strict=True)]


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

    A table Accord cannot serve (a counter, or a column type the sidecar does not handle) is
    left out, and why goes into ``unusable`` (by ``keyspace.table``): one such
    table in a keyspace must not stop the sidecar from serving the others.
    """
    found = []
    for name in keyspaces:
        keyspace = metadata.keyspaces.get(name)
        if keyspace is None:
            raise ValueError(f"keyspace {name!r} does not exist in Cassandra")
        udts = {
            udt: tuple(zip(t.field_names, t.field_types, strict=True))
            for udt, t in getattr(keyspace, "user_types", {}).items()
        }
        for table in keyspace.tables.values():
            if table.name in LEGACY_TABLES:
                continue
            qualified = f"{name}.{table.name}"
            key_names = {c.name for c in (*table.partition_key, *table.clustering_key)}
            try:
                found.append(
                    TableSchema(
                        name,
                        table.name,
                        tuple((c.name, c.cql_type) for c in table.partition_key),
                        tuple(
                            (c.name, c.cql_type)
                            for n, c in table.columns.items()
                            if n not in key_names and not c.is_static
                        ),
                        tuple(
                            (c.name, c.cql_type, "desc" if c.is_reversed else "asc")
                            for c in table.clustering_key
                        ),
                        tuple(
                            (c.name, c.cql_type)
                            for n, c in table.columns.items()
                            if n not in key_names and c.is_static
                        ),
                        udts,
                    )
                )
            except SchemaError as error:
                if unusable is not None:
                    unusable[qualified] = str(error)
    return found
