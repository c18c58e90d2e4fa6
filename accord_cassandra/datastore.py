"""Where user data lives: Cassandra (:class:`CassandraDataStore`), or memory for the embedded
mode (:class:`accord_cassandra.memory_store.MemoryDataStore`).

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

TTLs (docs/sidecars.md, "TTL") are judged as of executeAt, exactly as
:class:`accord.MemoryPartitions` judges them: a row written at executeAt E with TTL t is
visible to a read at X iff ``X.hlc < E.hlc + t``. Cassandra keeps the cell ``margin`` longer
than that (``USING TTL t + margin``, with the query's "now" set to E's second through the
native protocol's ``now_in_seconds``, so the expiry Cassandra stores is exactly
``E_s + t + margin``); a read sets "now" to X's second too, so ``TTL(col)`` is exactly
``E_s + t + margin - X_s`` and with ``WRITETIME(col)`` (E exactly) gives back t, whatever the
clocks say. A read more than ``margin / 2`` older than this sidecar's clock is refused with
an error result: a cell it needs could already be purged by Cassandra's real clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol, cast

from accord import (
    MAX_PARTITION_READ_BYTES,
    MAX_ROWS_PER_SLICE,
    MAX_TTL_SECONDS,
    BinOp,
    Const,
    CountOf,
    Expr,
    Key,
    MakeTuple,
    PartitionRead,
    PutRow,
    PutStatic,
    ReadOf,
    RowAt,
    RowOf,
    Selection,
    Slice,
    StaticAt,
    Timestamp,
    WriteOp,
    WriteScope,
)
from accord.api import (
    in_slice,
    partition_too_large,
    slice_too_large,
    value_size,
)
from accord_cassandra.cql_requests import (
    REQUEST_TIMEOUT_SECONDS,
    PlannedWrite,
    execute,
    execute_pages,
    now_in_seconds_handler,
    write_chunks,
    write_size,
)
from accord_cassandra.driver_values import from_driver, to_driver
from accord_cassandra.schema import (
    Catalog,
    SchemaError,
    TableSchema,
    partition_values,
    routing_key_of,
)

logger = logging.getLogger(__name__)

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


# TTLs on the Cassandra store (docs/sidecars.md, "TTL").
TTL_MARGIN_SECONDS = 3600
"""How much longer than its logical expiry Cassandra keeps a TTL'd cell. A constant: every
read decodes the logical TTL with the margin its write used."""
LATE_READ_SECONDS = TTL_MARGIN_SECONDS // 2
"""A read whose executeAt is older than this by the sidecar's clock is refused."""
CASSANDRA_MAX_EXPIRY = 2_147_483_646
"""The latest expiry Cassandra 5.0 stores (2038-01-19T03:14:06Z, seconds since the epoch;
``storage_compatibility_mode: CASSANDRA_4``, the 5.0 default); a later one is refused."""
TTL_EXPIRY_HEADROOM_SECONDS = 30 * 86_400
"""A client's TTL must expire (with the margin) this long before ``CASSANDRA_MAX_EXPIRY``:
its transaction may be applied that much later than it was checked."""
MAX_EXPIRED_ROWS_SKIPPED = 10_000
"""Most logically expired rows (still kept by Cassandra for the margin) one slice skips."""
IN_READ_KEYS_MAX = 16
"""Most partitions one ``IN`` read names (see :meth:`CassandraDataStore.read`)."""
# Types of a last partition key column whose values come back from Cassandra equal to the
# driver values sent (so a row of an IN read is matched to its partition by that value).
_IN_KEY_TYPES = frozenset(
    (
        "text",
        "varchar",
        "ascii",
        "int",
        "bigint",
        "smallint",
        "tinyint",
        "varint",
        "uuid",
        "timeuuid",
        "blob",
    )
)


def max_clock_skew_for_ttl() -> float:
    """The largest clock skew (sidecars against each other and against Cassandra's nodes)
    under which a read refused by none of the checks still finds every cell it needs:
    ``LATE_READ_SECONDS + skew + REQUEST_TIMEOUT_SECONDS + 1 <= TTL_MARGIN_SECONDS``."""
    return TTL_MARGIN_SECONDS - LATE_READ_SECONDS - REQUEST_TIMEOUT_SECONDS - 1


def read_too_late(execute_at: Timestamp, late_seconds: float) -> str:
    return (
        f"a read at executeAt {execute_at} arrived {late_seconds:.0f} s late (over "
        f"{LATE_READ_SECONDS} s): a TTL'd cell it needs may be gone from Cassandra already"
    )


def _never_null(expr: Expr) -> bool:
    """Whether ``expr`` can only evaluate to a value (arithmetic on a null fails the
    transaction instead)."""
    if isinstance(expr, Const):
        return expr.value is not None
    if isinstance(expr, ReadOf | RowOf):
        return expr.default is not None
    return isinstance(expr, BinOp | CountOf | MakeTuple)


def _single_cell(cql_type: str) -> bool:
    # WRITETIME and TTL of a non-frozen collection are one per element, not one per column.
    return not cql_type.startswith(("list<", "set<", "map<"))


class _InRead(NamedTuple):
    """One partition's share of an IN read: its key and clustering values (driver values)
    and, of them, the last partition key column's, which the IN names."""

    key_values: list[object]
    clustering: tuple[object, ...]
    last: object


class CassandraDataStore:
    """User rows in Cassandra through cassandra-driver, prepared statements only.

    ``clock`` is this sidecar's wall clock in seconds (the lateness of a read is judged by it).
    """

    def __init__(
        self,
        session: Any,
        catalog: Catalog,
        *,
        consistency: str = "QUORUM",
        clock: Callable[[], float] = time.time,
    ) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.query import BatchStatement, BatchType

        self.session = session
        self.catalog = catalog
        self.consistency = ConsistencyLevel.name_to_value[consistency]
        self._batch, self._unlogged = BatchStatement, BatchType.UNLOGGED
        self.clock = clock
        self._prepared: dict[tuple[str, object], Any] = {}
        self.writes_executed = 0
        # Requests that carried several writes (UNLOGGED batches, write_chunks), and
        # requests Cassandra answered with a warning (a batch over a threshold set lower
        # than its default, say): logged once, counted always.
        self.write_batches = 0
        self.server_warnings = 0
        # Read requests sent (a slice's later pages not counted), and the partition reads
        # (rows, slices, static rows) they carried, an IN read being one request of several:
        # what the bench compares with Cassandra's CPU per operation.
        self.reads_executed = 0
        self.partitions_read = 0
        # Why TTLs cannot be served (the protocol lacks now_in_seconds), else None.
        self.ttl_refused: str | None = None
        # Why new TTLs are refused (a Cassandra node's clock is off by more than the skew
        # TTLs assume), else None. Not applied to a peer's transaction: its TTL was checked
        # by the sidecar that took it, and a refusal here would split the replicas.
        self.clock_problem: str | None = None
        version = getattr(getattr(session, "cluster", None), "protocol_version", 5)
        if not isinstance(version, int) or version < 5 or version >= 0x40:
            self.ttl_refused = (
                f"USING TTL needs native protocol v5 (its now_in_seconds); "
                f"the session speaks {version!r}"
            )
        session.client_protocol_handler = now_in_seconds_handler(session.client_protocol_handler)

    # ------------------------------------------------------------------ TTL checks

    def ttl_problem(
        self, table: TableSchema, write: PutRow | PutStatic, from_peer: bool
    ) -> str | None:
        """Why this store cannot honour ``write``'s TTL, or None. ``from_peer``: a peer's
        transaction, checked against the expiry bound without the client's headroom (the
        clocks of the two sidecars may differ)."""
        ttl = write.ttl
        if ttl is None:
            return None
        if self.ttl_refused is not None:
            return self.ttl_refused
        if self.clock_problem is not None and not from_peer:
            return self.clock_problem
        longest = MAX_TTL_SECONDS - TTL_MARGIN_SECONDS
        if ttl > longest:
            return (
                f"TTL {ttl} s exceeds the Cassandra store's maximum {longest} s (Cassandra's "
                f"{MAX_TTL_SECONDS} s less the {TTL_MARGIN_SECONDS} s it keeps expired cells)"
            )
        headroom = 0 if from_peer else TTL_EXPIRY_HEADROOM_SECONDS
        if self.clock() + ttl + TTL_MARGIN_SECONDS + headroom > CASSANDRA_MAX_EXPIRY:
            return (
                f"TTL {ttl} s would expire after 2038-01-19T03:14:06Z, the latest expiry "
                f"Cassandra stores (with the {TTL_MARGIN_SECONDS} s margin and "
                f"{headroom // 86_400} days' headroom)"
            )
        static = isinstance(write, PutStatic)
        columns = table.static if static else table.columns
        value = write.value
        items: tuple[Expr, ...] = ()
        if isinstance(value, MakeTuple):
            items = value.items
        elif isinstance(value, Const) and isinstance(value.value, tuple):
            items = tuple(Const(item) for item in value.value)
        if not any(
            _never_null(item) and _single_cell(cql_type)
            for item, (_, cql_type) in zip(items, columns, strict=False)
        ):
            kind = "static" if static else "regular"
            return (
                f"{table.qualified}: USING TTL on the Cassandra store needs a {kind} column "
                "set to a value that cannot be null (a literal, arithmetic or a count): "
                "the row's expiry is read back from that cell's TTL"
            )
        return None

    async def check_clocks(self, max_skew_seconds: float) -> list[str]:
        """Compare every Cassandra node's clock with this sidecar's; each node off by more
        than ``max_skew_seconds`` (less the round trip) is a problem, and clients' TTLs are
        refused (``clock_problem``) while any is. A node that does not answer is reported
        but not held against TTLs."""
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable

        statement = "SELECT toUnixTimestamp(now()) FROM system.local"
        problems: list[str] = []
        unchecked: list[str] = []
        if max_skew_seconds > max_clock_skew_for_ttl():
            problems.append(
                f"max_clock_skew_seconds={max_skew_seconds:g} exceeds the "
                f"{max_clock_skew_for_ttl():g} s the TTL margin tolerates"
            )
        for host in list(self.session.cluster.metadata.all_hosts()):
            sent = self.clock()
            try:
                rows = await asyncio.to_thread(
                    self.session.execute, statement, host=host, timeout=REQUEST_TIMEOUT_SECONDS
                )
            except (DriverException, NoHostAvailable, OSError) as error:
                # Unchecked, as every clock is after startup: said, not held against TTLs.
                unchecked.append(f"cannot read the clock of Cassandra node {host}: {error}")
                continue
            received = self.clock()
            skew = int(rows.one()[0]) / 1000 - (sent + received) / 2
            if abs(skew) > max_skew_seconds - (received - sent) / 2:
                problems.append(
                    f"Cassandra node {host}'s clock is {skew:+.1f} s off this sidecar's "
                    f"(max_clock_skew_seconds={max_skew_seconds:g})"
                )
        if problems:
            self.clock_problem = "USING TTL refused while clocks disagree: " + "; ".join(problems)
        return problems + unchecked

    # ------------------------------------------------------------------ statements

    def _key_values(self, table: TableSchema, key: Key) -> list[object]:
        values = partition_values(table, routing_key_of(key))
        return [to_driver(t, v) for (_, t), v in zip(table.partition_key, values, strict=True)]

    @staticmethod
    def _timed(columns: tuple[tuple[str, str], ...]) -> list[int]:
        """Indexes of the columns whose WRITETIME and TTL a read selects."""
        return [i for i, (_, cql_type) in enumerate(columns) if _single_cell(cql_type)]

    def _selectors(self, table: TableSchema, columns: tuple[tuple[str, str], ...]) -> list[str]:
        names = [f'"{name}"' for name, _ in columns]
        for i in self._timed(columns):
            name = columns[i][0]
            names += [f'WRITETIME("{name}")', f'TTL("{name}")']
        return names

    def _shaped(self, table: TableSchema, shape: tuple[object, ...]) -> Any:
        """A prepared statement for reads and writes of rows by clustering key: plain reads
        and writes of the table (no history). Reads select each column's WRITETIME and TTL
        after the columns (TTLs are judged as of executeAt from them)."""
        cached = self._prepared.get((table.qualified, shape))
        if cached is not None:
            return cached
        target = f'"{table.keyspace}"."{table.table}"'
        key_where = [f'"{name}" = ?' for name, _ in table.partition_key]
        ck_names = [name for name, _, _ in table.clustering]
        regular = self._selectors(table, table.columns) or [f'"{table.partition_key[0][0]}"']
        kind = shape[0]
        using = "USING TIMESTAMP ? AND TTL ?" if shape[-1] == "ttl" else "USING TIMESTAMP ?"
        if kind == "row":
            where = key_where + [f'"{n}" = ?' for n in ck_names]
            cql = f"SELECT {', '.join(regular)} FROM {target} WHERE {' AND '.join(where)}"
        elif kind == "whole":
            cql = f"SELECT {', '.join(regular)} FROM {target} WHERE {' AND '.join(key_where)}"
        elif kind in ("whole_in", "row_in"):
            # The last partition key column varies (IN) and is selected last, after the
            # columns and their WRITETIME/TTL, so the rows' layout is the single reads'.
            last = table.partition_key[-1][0]
            where = [*key_where[:-1], f'"{last}" IN ?']
            if kind == "row_in":
                where += [f'"{n}" = ?' for n in ck_names]
            selected = ", ".join([*regular, f'"{last}"'])
            cql = f"SELECT {selected} FROM {target} WHERE {' AND '.join(where)}"
        elif kind == "static":
            statics = ", ".join(self._selectors(table, table.static))
            cql = f"SELECT {statics} FROM {target} WHERE {' AND '.join(key_where)} LIMIT 1"
        elif kind == "slice":
            _, prefix_len, lower, upper, reverse = shape
            prefix_len = _count(prefix_len)
            where = key_where + [f'"{n}" = ?' for n in ck_names[:prefix_len]]
            if lower is not None:
                where.append(f'"{ck_names[prefix_len]}" {lower} ?')
            if upper is not None:
                where.append(f'"{ck_names[prefix_len]}" {upper} ?')
            selected = ", ".join(
                [f'"{n}"' for n in ck_names] + self._selectors(table, table.columns)
            )
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
                f"INSERT INTO {target} ({quoted}) VALUES ({', '.join('?' for _ in names)}) {using}"
            )
        elif kind == "put_static":
            names = [name for name, _ in table.partition_key] + [n for n, _ in table.static]
            quoted = ", ".join(f'"{n}"' for n in names)
            cql = (
                f"INSERT INTO {target} ({quoted}) VALUES ({', '.join('?' for _ in names)}) {using}"
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

    # ------------------------------------------------------------------ reads

    async def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> dict[Key, PartitionRead]:
        by_key: dict[Key, list[Selection]] = {}
        for selection in selections:
            by_key.setdefault(selection.key, []).append(selection)
        late = self.clock() - execute_at.hlc / 1_000_000
        if late > LATE_READ_SECONDS:
            # A cell this read needs may already be purged (docs/sidecars.md, "TTL"): an
            # error result, so the transaction completes (failing, writing nothing) instead
            # of waiting forever; the outcome chosen is the only one any client sees.
            error = read_too_late(execute_at, late)
            return {key: PartitionRead((), error) for key in by_key}

        def answered(
            key: Key, unique: list[Selection], answers: Sequence[tuple[object, str | None]]
        ) -> tuple[Key, PartitionRead]:
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

        async def one(key: Key, unique: list[Selection]) -> tuple[Key, PartitionRead]:
            table = self.catalog.for_key(key)
            self.reads_executed += len(unique)
            self.partitions_read += len(unique)
            answers = await asyncio.gather(*(self._select(table, s, execute_at) for s in unique))
            return answered(key, unique, answers)

        async def grouped(
            table: TableSchema, kind: str, members: list[tuple[Key, RowAt, _InRead]]
        ) -> list[tuple[Key, PartitionRead]]:
            self.reads_executed += 1
            self.partitions_read += len(members)
            values = await self._select_in(table, kind, [m[2] for m in members], execute_at)
            return [
                answered(key, [selection], [(value, None)])
                for (key, selection, _), value in zip(members, values, strict=True)
            ]

        singles: list[tuple[Key, list[Selection]]] = []
        groups: dict[tuple[object, ...], list[tuple[Key, RowAt, _InRead]]] = {}
        for key, asked in by_key.items():
            unique = list(dict.fromkeys(asked))
            found = self._in_read(key, unique[0]) if len(unique) == 1 else None
            if found is None:
                singles.append((key, unique))
            else:
                group, read = found
                groups.setdefault(group, []).append((key, cast("RowAt", unique[0]), read))
        work: list[Awaitable[Any]] = [one(key, unique) for key, unique in singles]
        for group, members in groups.items():
            if len(members) == 1:
                work.append(one(members[0][0], [members[0][1]]))
                continue
            table = self.catalog.for_key(members[0][0])
            for start in range(0, len(members), IN_READ_KEYS_MAX):
                work.append(
                    grouped(table, cast("str", group[1]), members[start : start + IN_READ_KEYS_MAX])
                )
        out: dict[Key, PartitionRead] = {}
        for done in await asyncio.gather(*work):
            if isinstance(done, list):
                out.update(done)
            else:
                key, answer = done
                out[key] = answer
        return out

    def _in_read(self, key: Key, selection: Selection) -> tuple[tuple[object, ...], _InRead] | None:
        """The group of single-row reads ``selection`` may share one ``IN`` read with, and
        its part of it; None when it goes alone.

        Reads of one row each, of one table, naming the same partition key but for its last
        column (and the same clustering key) go as one read ``... AND last IN ?``: a saga
        store batch reads a dozen es_transaction rows of one service, and the driver spends
        ~0.2 ms of CPU per request (16 single reads: 3.5 ms; one IN read of 16: 0.6 ms, and
        half the latency). Same consistency level, same now_in_seconds; each row is matched
        to its partition by the last key column, selected with it."""
        if not isinstance(selection, RowAt):
            return None
        table = self.catalog.for_key(key)
        if table.partition_key[-1][1] not in _IN_KEY_TYPES:
            return None
        clustering: tuple[object, ...] = ()
        if not table.clustering:
            if selection.clustering:
                return None
            kind = "whole_in"
        elif len(selection.clustering) == len(table.clustering):
            kind = "row_in"
            clustering = tuple(self._clustering_values(table, selection.clustering))
        else:
            return None
        values = self._key_values(table, key)
        group = (table.qualified, kind, tuple(values[:-1]), clustering)
        try:
            hash(group)
        except TypeError:  # a collection in the key: it reads alone
            return None
        return group, _InRead(values, clustering, values[-1])

    async def _select_in(
        self, table: TableSchema, kind: str, reads: list[_InRead], execute_at: Timestamp
    ) -> list[object]:
        """Each read's row (None: none, or not live at executeAt), by one IN read."""
        first = reads[0]
        lasts = [read.last for read in reads]
        statement = self._shaped(table, (kind,))
        values = [*first.key_values[:-1], lasts, *first.clustering]
        rows = await execute(self.session, statement, values, execute_at.hlc // 1_000_000)
        width = len(self._selectors(table, table.columns) or [None])
        by_last: dict[object, Any] = {row[width]: row for row in rows}
        named = set(lasts)
        if len(rows) > len(reads) or any(last not in named for last in by_last):
            # A type whose values do not come back as sent would end here (_IN_KEY_TYPES).
            raise RuntimeError(
                f"{table.qualified}: an IN read returned rows of partitions it did not name"
            )
        out: list[object] = []
        for read in reads:
            row = by_last.get(read.last)
            if row is None or not self._live(row, 0, table.columns, execute_at):
                out.append(None)
            else:
                out.append(self._row(row, 0, table.columns))
        return out

    def _live(
        self,
        row: Any,
        start: int,
        columns: tuple[tuple[str, str], ...],
        execute_at: Timestamp,
    ) -> bool:
        """Whether the row read from ``start`` (its columns, then each timed column's
        WRITETIME and TTL) is live as of ``execute_at``: TTL judged as of executeAt.

        Every write sets every column, so all non-null cells of a row carry its newest
        write's timestamp and TTL. Reads run with now = X_s (X = execute_at), and a TTL'd
        write landed with now = E_s and TTL t + margin, so ``TTL(col) = E_s + t + margin -
        X_s`` exactly and ``t`` follows, whatever any clock says."""
        meta = start + len(columns)
        for j, i in enumerate(self._timed(columns)):
            if row[start + i] is None:
                continue
            remaining = row[meta + 2 * j + 1]
            if remaining is None:
                return True
            written = (int(row[meta + 2 * j]) >> (NODE_BITS + FLAG_BITS)) + HLC_BASE_MICROS
            ttl = int(remaining) + execute_at.hlc // 1_000_000 - written // 1_000_000
            ttl -= TTL_MARGIN_SECONDS
            return execute_at.hlc < written + ttl * 1_000_000
        return True

    async def _select(
        self, table: TableSchema, selection: Selection, execute_at: Timestamp
    ) -> tuple[object, str | None]:
        key_values = self._key_values(table, selection.key)
        now = execute_at.hlc // 1_000_000
        if isinstance(selection, RowAt):
            if not table.clustering:
                if selection.clustering:
                    return None, None
                statement = self._shaped(table, ("whole",))
                rows = await execute(self.session, statement, key_values, now)
            elif len(selection.clustering) != len(table.clustering):
                return None, None  # no row has that clustering key
            else:
                clustering = self._clustering_values(table, selection.clustering)
                statement = self._shaped(table, ("row",))
                rows = await execute(self.session, statement, [*key_values, *clustering], now)
            if not rows or not self._live(rows[0], 0, table.columns, execute_at):
                return None, None
            return self._row(rows[0], 0, table.columns), None
        if isinstance(selection, StaticAt):
            if not table.static:
                return None, None
            rows = await execute(self.session, self._shaped(table, ("static",)), key_values, now)
            if not rows or not self._live(rows[0], 0, table.static, execute_at):
                return None, None
            value = self._row(rows[0], 0, table.static)
            return (None if all(v is None for v in value) else value), None
        return await self._slice(table, selection, key_values, execute_at)

    async def _slice(
        self, table: TableSchema, selection: Slice, key_values: list[object], execute_at: Timestamp
    ) -> tuple[object, str | None]:
        now = execute_at.hlc // 1_000_000
        if not table.clustering:
            # One row at (): the slice of a single-row partition.
            rows = await execute(self.session, self._shaped(table, ("whole",)), key_values, now)
            alive = bool(rows) and self._live(rows[0], 0, table.columns, execute_at)
            found = (((), self._row(rows[0], 0, table.columns)),) if alive else ()
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
            bounds.append(to_driver(table.clustering[ranged][1], bound.value))
        shape.append(selection.reverse)
        fetch = (selection.limit or MAX_ROWS_PER_SLICE) + (0 if selection.limit else 1)
        # Cassandra still holds rows whose TTL ran out as of executeAt (for the margin): page
        # past them, at most MAX_EXPIRED_ROWS_SKIPPED of them.
        scan = fetch + MAX_EXPIRED_ROWS_SKIPPED
        statement = self._shaped(table, tuple(shape))
        width = len(table.clustering)
        live: list[Any] = []
        scanned = 0
        async for page in execute_pages(
            self.session, statement, [*key_values, *prefix, *bounds, scan], fetch, now
        ):
            scanned += len(page)
            # A partition holding only static columns reads as one row of null clustering.
            live += [
                row
                for row in page
                if row[0] is not None and self._live(row, width, table.columns, execute_at)
            ]
            if len(live) >= fetch:
                break
        if len(live) < fetch and scanned >= scan:
            return None, (
                f"a slice of {selection.key.name} skips more than MAX_EXPIRED_ROWS_SKIPPED="
                f"{MAX_EXPIRED_ROWS_SKIPPED} rows whose TTL ran out; give it a narrower range"
            )
        if selection.limit is None and len(live) > MAX_ROWS_PER_SLICE:
            return None, slice_too_large(selection.key)
        out = tuple(
            (
                tuple(from_driver(row[i], table.clustering[i][1]) for i in range(width)),
                self._row(row, width, table.columns),
            )
            for row in live[:fetch]
        )
        return out, None

    @staticmethod
    def _row(row: Any, start: int, columns: Sequence[tuple[str, str]]) -> tuple[object, ...]:
        return tuple(from_driver(row[start + i], t) for i, (_, t) in enumerate(columns))

    def _clustering_values(self, table: TableSchema, values: tuple[object, ...]) -> list[object]:
        return [
            to_driver(cql_type, value)
            for (_, cql_type, _), value in zip(table.clustering, values, strict=False)
        ]

    # ------------------------------------------------------------------ writes

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        """The writes in as few requests as Cassandra takes without a warning: each chunk
        (:func:`write_chunks`) one UNLOGGED batch, a chunk of one statement a plain write.

        A transaction's writes used to be one request each. A group-commit batch of saga
        state changes writes ~40 rows, and the driver's cost per request was then the largest
        share of a sidecar's CPU. An unlogged batch is not atomic, and needs not be: every
        write carries the transaction's timestamp, so a repeat is idempotent, an Apply is
        re-run until it is done, and no reader sees its rows before its outcome is durable at
        a quorum (docs/sidecars.md)."""
        stamp = write_timestamp(execute_at)
        planned: list[PlannedWrite] = []
        for write in writes:
            table = self.catalog.for_key(write.key)
            key_values = self._key_values(table, write.key)
            statement, values, now = self._write_rows(table, write, key_values, stamp, execute_at)
            planned.append(PlannedWrite(write.key, statement, values, now, write_size(write)))
        await asyncio.gather(*(self._write_chunk(chunk) for chunk in write_chunks(planned)))
        self.writes_executed += len(planned)

    async def _write_chunk(self, chunk: Sequence[PlannedWrite]) -> None:
        if len(chunk) == 1:
            await execute(self.session, chunk[0].statement, chunk[0].values, chunk[0].now)
            return
        batch = self._batch(self._unlogged, consistency_level=self.consistency)
        for planned in chunk:
            batch.add(planned.statement, planned.values)
        self.write_batches += 1
        await execute(self.session, batch, None, chunk[0].now, self._warned)

    def _warned(self, warnings: Sequence[str]) -> None:
        self.server_warnings += 1
        if self.server_warnings == 1:
            logger.warning(
                "Cassandra warned about a batch of a transaction's writes (%s); its batch "
                "thresholds may be set below their defaults (docs/sidecars.md); not logged again",
                "; ".join(warnings),
            )

    def _physical_ttl(self, ttl: int, execute_at: Timestamp) -> tuple[int, int]:
        """The "now" (E's second) and TTL a write of logical ``ttl`` lands with: Cassandra
        stores the expiry ``E_s + ttl + TTL_MARGIN_SECONDS``.

        The caps only keep a write Cassandra would refuse from being retried forever; the
        client API and the peer checks refuse every TTL that needs them (``ttl_problem``)."""
        written = execute_at.hlc // 1_000_000
        latest = (
            CASSANDRA_MAX_EXPIRY - 1 - max(written, int(self.clock() + max_clock_skew_for_ttl()))
        )
        physical = max(1, min(ttl + TTL_MARGIN_SECONDS, MAX_TTL_SECONDS, latest))
        return written, physical

    def _write_rows(
        self,
        table: TableSchema,
        write: WriteOp,
        key_values: list[object],
        stamp: int,
        execute_at: Timestamp,
    ) -> tuple[Any, list[object], int | None]:
        """Any write, as its statement, values and "now": a plain write of the table with
        ``USING TIMESTAMP``, no history; an ``INSERT`` of every column, so a TTL applies to
        the row (its cells and its primary key liveness) as the model's row TTL does."""
        # A row written as nothing (a ``Put`` that computed None) is deleted, as in the model.
        deleting = write.delete or (write.scope is WriteScope.ROW and write.value is None)
        if write.deletes_partition or (
            not table.clustering and write.scope is WriteScope.ROW and deleting
        ):
            statement = self._shaped(table, ("delete_range", 0, None, None))
            return statement, [stamp, *key_values], None
        timing: list[object] = [stamp]
        now: int | None = None
        ttl_shape: tuple[str, ...] = ()
        if write.ttl is not None:
            now, physical = self._physical_ttl(write.ttl, execute_at)
            timing.append(physical)
            ttl_shape = ("ttl",)
        if write.scope is WriteScope.STATIC:
            if write.delete:
                statement = self._shaped(table, ("delete_static",))
                return statement, [stamp, *key_values], None
            statics = _checked_row(table, write.value, table.static)
            put = self._shaped(table, ("put_static", *ttl_shape))
            return put, [*key_values, *statics, *timing], now
        prefix = self._clustering_values(table, write.clustering)
        if write.scope is WriteScope.RANGE or deleting:
            bounds: list[object] = []
            shape: list[object] = ["delete_range", len(prefix)]
            for bound, op in ((write.lower, ">"), (write.upper, "<")):
                if bound is None:
                    shape.append(None)
                    continue
                shape.append(op + ("=" if bound.inclusive else ""))
                bounds.append(to_driver(table.clustering[len(prefix)][1], bound.value))
            statement = self._shaped(table, tuple(shape))
            return statement, [stamp, *key_values, *prefix, *bounds], None
        row = _checked_row(table, write.value, table.columns)
        put = self._shaped(table, ("put_row", *ttl_shape))
        return put, [*key_values, *prefix, *row, *timing], now

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
    return [to_driver(t, v) for (_, t), v in zip(columns, value, strict=True)]


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
