"""Partitions: what one Accord key holds, and what a transaction may read of it.

A key is a partition (keyspace, table, partition key, as in Cassandra's own Accord). Its value
is an ordered set of *rows*, each named by a clustering key (a tuple of values, empty for a
table without clustering columns, whose partition is then a single row at ``()``), plus an
optional *static row* shared by the partition. A row's value is a tuple of its regular columns
(any :data:`Value` for the simulator and Maelstrom, which have no schema).

A transaction names what it reads as :data:`Selection` s, fixed before it runs (like the
``LET`` selects of Cassandra's Accord CQL): one row by full clustering key (:class:`RowAt`),
a slice (:class:`Slice`: rows whose clustering key starts with a prefix and whose next
clustering value lies between optional bounds, in clustering order or reversed, at most
``limit``), or the static row (:class:`StaticAt`). A data store answers each key with a
:class:`PartitionRead`: the result of every selection on it, or one error naming a limit the
partition's data exceeds. Both are functions of the data as of the transaction's executeAt
alone, so every replica, and a recovery coordinator re-executing later, gets the same answer.

Every limit is explicit: a slice returns at most :data:`MAX_ROWS_PER_SLICE` rows (a slice
with more matching rows and no smaller LIMIT reads as an error, never a silent truncation),
and one partition's read results may total at most :data:`MAX_PARTITION_READ_BYTES`
(:func:`value_size`). A TTL is whole seconds up to :data:`MAX_TTL_SECONDS` (Cassandra's own
bound).

:class:`MemoryPartitions` is the one in-memory model of these semantics (clustering order,
TTL judged as of executeAt, row, range and partition tombstones with last-write-wins by
executeAt) behind the simulator's, Maelstrom's and the embedded sidecar's data stores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, cast

import msgspec

from accord.invariants import InvalidTransaction
from accord.primitives.keys import Key
from accord.primitives.timestamp import Int64, Timestamp

Value: TypeAlias = object
Clustering: TypeAlias = tuple[Value, ...]

MAX_ROWS_PER_SLICE = 1000
"""Most rows one slice returns; a slice matching more, with no LIMIT at or below this, fails."""
MAX_PARTITION_READ_BYTES = 1024 * 1024
"""Most bytes (by :func:`value_size`) one partition's read results may total."""
MAX_TTL_SECONDS = 630_720_000
"""Longest TTL (20 years, Cassandra's bound)."""
MAX_CLUSTERING_COLUMNS = 64


class Bound(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One end of a clustering range on the column after a slice's prefix.

    Equal to another bound only when their values are one value in clustering order
    (:func:`order_key`: ``1``, ``1.0`` and ``True`` are three bounds), as stores use them."""

    value: Value
    inclusive: bool = True

    def __eq__(self, other: object) -> bool:
        if type(other) is not Bound:
            return NotImplemented
        return self.inclusive == other.inclusive and order_key(self.value) == order_key(other.value)

    def __hash__(self) -> int:
        return hash((order_key(self.value), self.inclusive))


def _check_clustering(values: Clustering, what: str) -> None:
    if values == () and type(values) is tuple:
        return  # most rows: a partition without clustering columns
    if type(values) is not tuple:
        raise InvalidTransaction(f"{what} must be a tuple, got {type(values).__name__}")
    if len(values) > MAX_CLUSTERING_COLUMNS:
        raise InvalidTransaction(f"{what} has more than {MAX_CLUSTERING_COLUMNS} columns")
    for value in values:  # most clusterings: text, integers, bytes; checked in one pass
        kind = type(value)
        if not (kind is str or kind is int or kind is bytes or kind is bool):
            break
    else:
        return
    if any(v is None for v in values):
        raise InvalidTransaction(f"{what} has a null clustering value")
    if any(_odd_float(v) for v in values):
        # Python's == and hash, which key the stored rows, call -0.0 and 0.0 one value and
        # NaN none, where Cassandra's order (Double.compare) sees two and one.
        raise InvalidTransaction(f"{what} holds NaN or -0.0, which cannot name a row")


def _odd_float(value: Value) -> bool:
    if type(value) is float:
        return math.isnan(value) or (value == 0.0 and math.copysign(1.0, value) < 0)
    if type(value) is tuple:
        return any(_odd_float(item) for item in cast("tuple[object, ...]", value))
    return False


def _same_kinds(left: Clustering, right: Clustering) -> bool:
    """Whether two clustering keys Python calls equal hold values of one kind throughout
    (nested tuples too): then they name one row, as :class:`MemoryPartitions` keys rows
    (NaN and -0.0, where ``==`` and order differ otherwise, never name a row)."""
    for a, b in zip(left, right, strict=True):
        kind = type(a)
        if kind is not type(b):
            return False
        if kind is tuple and not _same_kinds(
            cast("tuple[object, ...]", a), cast("tuple[object, ...]", b)
        ):
            return False
    return True


def _check_bounds(lower: Bound | None, upper: Bound | None) -> None:
    for bound in (lower, upper):
        if bound is not None and bound.value is None:
            raise InvalidTransaction("a clustering bound cannot be null")


# Selections compare type-strictly (RowAt(k, (1,)) is not RowAt(k, (1.0,))): a transaction
# reads each once, and a result answers the selection that asked for it, not its look-alike.


class RowAt(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """The row at clustering key ``clustering`` (``()``: a single-row partition's row)."""

    key: Key
    clustering: Clustering = ()

    def __post_init__(self) -> None:
        _check_clustering(self.clustering, "a row's clustering key")

    def __eq__(self, other: object) -> bool:
        if type(other) is not RowAt:
            return NotImplemented
        return (
            self.key == other.key
            and self.clustering == other.clustering
            and _same_kinds(self.clustering, other.clustering)
        )

    def __hash__(self) -> int:
        return hash((self.key, self.clustering))


class Slice(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Rows whose clustering key starts with ``prefix`` and whose next clustering value lies
    within ``lower``/``upper`` (each optional, inclusive or not), in clustering order or
    ``reverse``, at most ``limit`` of them."""

    key: Key
    prefix: Clustering = ()
    lower: Bound | None = None
    upper: Bound | None = None
    reverse: bool = False
    limit: Int64 | None = None

    def __post_init__(self) -> None:
        _check_clustering(self.prefix, "a slice's clustering prefix")
        _check_bounds(self.lower, self.upper)
        if self.limit is not None and (
            type(self.limit) is not int or not 1 <= self.limit <= MAX_ROWS_PER_SLICE
        ):
            raise InvalidTransaction(
                f"LIMIT {self.limit!r} is not between 1 and MAX_ROWS_PER_SLICE={MAX_ROWS_PER_SLICE}"
            )

    def __eq__(self, other: object) -> bool:
        if type(other) is not Slice:
            return NotImplemented
        return (
            self.key == other.key
            and self.prefix == other.prefix
            and _same_kinds(self.prefix, other.prefix)
            and self.lower == other.lower
            and self.upper == other.upper
            and self.reverse == other.reverse
            and self.limit == other.limit
        )

    def __hash__(self) -> int:
        return hash((self.key, self.prefix, self.lower, self.upper, self.reverse, self.limit))


class StaticAt(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """The partition's static row."""

    key: Key


Selection: TypeAlias = RowAt | Slice | StaticAt


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """A data store's answer for one key: each selection's result, or why there is none.

    A :class:`RowAt` or :class:`StaticAt` result is the row's value or None; a :class:`Slice`
    result is a tuple of ``(clustering, row)`` pairs in the order asked for.
    """

    results: tuple[tuple[Selection, Value], ...]
    error: str | None = None

    def get(self, selection: Selection) -> Value:
        for asked, value in self.results:
            if asked == selection:
                return value
        return None


# ---------------------------------------------------------------------------- ordering, size


def order_key(value: Value) -> tuple[object, ...]:
    """A total, deterministic order over values: by kind (None, bool, int, float, str, bytes,
    tuple), then naturally within a kind; tuples element by element.

    Floats order as Java's ``Double.compare`` (Cassandra's order of float and double):
    ``-inf < … < -0.0 < 0.0 < … < inf < NaN``, every NaN equal. So a value's order key is
    equal to another's only when both are of one kind and equal, with ``-0.0`` and ``0.0``
    apart and NaN equal to NaN: ``True``, ``1`` and ``1.0`` never meet.
    """
    kind = type(value)
    if value is None:
        return (0,)
    if kind is bool:
        return (1, value)
    if kind is int:
        return (2, value)
    if kind is float:
        number: float = value  # type: ignore[assignment]
        if math.isnan(number):
            return (3, 1, 0.0, 0.0)
        return (3, 0, number, math.copysign(1.0, number))
    if kind is str:
        return (4, value)
    if kind is bytes:
        return (5, value)
    if kind is tuple:
        return (6, tuple(order_key(item) for item in cast("tuple[object, ...]", value)))
    return (7, kind.__name__, repr(value))


def same_value(left: Value, right: Value) -> bool:
    """Type-strict equality, element by element inside tuples: ``True``, ``1`` and ``1.0``
    are three different values (Python's ``==`` calls them equal). Floats compare as IEEE
    754 does: ``-0.0`` equals ``0.0`` and NaN equals nothing."""
    if type(left) is not type(right):
        return False
    if type(left) is tuple:
        items = cast("tuple[object, ...]", left)
        others = cast("tuple[object, ...]", right)
        return len(items) == len(others) and all(
            same_value(a, b) for a, b in zip(items, others, strict=True)
        )
    return bool(left == right)


def value_size(value: Value) -> int:
    """Bytes a value counts for against :data:`MAX_PARTITION_READ_BYTES` (an upper bound on
    its msgpack size, the same on every machine)."""
    if value is None or type(value) is bool:
        return 1
    if type(value) is int or type(value) is float:
        return 9
    if type(value) is str:
        return 5 + len(value.encode("utf-8", "surrogatepass"))
    if type(value) is bytes:
        return 5 + len(value)
    if type(value) is tuple:
        # List-append reads size long tuples of ints, once a tenth of the simulator's CPU:
        # count the ints in C (bool is not int here: type() is exact) and walk the rest.
        ints = list(map(type, value)).count(int)
        size = 5 + 9 * ints
        if ints != len(value):
            for item in value:
                if type(item) is not int:
                    size += value_size(item)
        return size
    return 5 + len(repr(value))


ColumnKey: TypeAlias = Callable[[Value], tuple[object, ...]]
"""A clustering column's own order, when :func:`order_key` is not its order (a data store
with a schema gives one per column: a uuid's text does not sort as its type does)."""
ColumnKeys: TypeAlias = Sequence[ColumnKey | None]
"""Per clustering column, its :data:`ColumnKey` or None for :func:`order_key`."""


def _column_key(keys: ColumnKeys, index: int) -> ColumnKey:
    found = keys[index] if index < len(keys) else None
    return order_key if found is None else found


def _in_range(
    clustering: Clustering,
    prefix: Clustering,
    lower: Bound | None,
    upper: Bound | None,
    keys: ColumnKeys = (),
) -> bool:
    if lower is None and upper is None:
        return True
    if len(clustering) <= len(prefix):
        return False
    ordered = _column_key(keys, len(prefix))
    value = ordered(clustering[len(prefix)])
    if lower is not None:
        low = ordered(lower.value)
        if value < low or (value == low and not lower.inclusive):
            return False
    if upper is not None:
        high = ordered(upper.value)
        if value > high or (value == high and not upper.inclusive):
            return False
    return True


def _prefix_matches(clustering: Clustering, prefix: Clustering) -> bool:
    # Equality is type-strict, as in predicates: 1 never matches True nor 1.0.
    if len(clustering) < len(prefix):
        return False
    return all(order_key(a) == order_key(b) for a, b in zip(clustering, prefix, strict=False))


def in_slice(
    clustering: Clustering,
    prefix: Clustering,
    lower: Bound | None,
    upper: Bound | None,
    keys: ColumnKeys = (),
) -> bool:
    """Whether a row at ``clustering`` falls within a slice's (or a range delete's) range,
    its bounds judged by the columns' ``keys`` (:data:`ColumnKeys`)."""
    return _prefix_matches(clustering, prefix) and _in_range(clustering, prefix, lower, upper, keys)


def clustering_sort_key(
    descending: tuple[bool, ...], keys: ColumnKeys = ()
) -> Callable[[Clustering], tuple[object, ...]]:
    """The sort key of clustering keys for a table whose clustering columns are ordered
    ``descending`` (per column; missing entries ascend), each by its ``keys`` entry."""

    def key(clustering: Clustering) -> tuple[object, ...]:
        parts: list[object] = []
        for index, value in enumerate(clustering):
            ordered = _column_key(keys, index)(value)
            parts.append(
                _Reversed(ordered) if index < len(descending) and descending[index] else ordered
            )
        return tuple(parts)

    return key


@dataclass(frozen=True, slots=True, order=False)
class _Reversed:
    value: tuple[object, ...]

    def __lt__(self, other: _Reversed) -> bool:
        return other.value < self.value

    def __gt__(self, other: _Reversed) -> bool:
        return other.value > self.value


# ---------------------------------------------------------------------------- memory model


def expires_at(execute_at: Timestamp, ttl: int | None) -> int | None:
    """The HLC (microseconds) from which a write with ``ttl`` seconds is no longer visible."""
    return None if ttl is None else execute_at.hlc + ttl * 1_000_000


def visible(expiry: int | None, reader: Timestamp) -> bool:
    """TTL judged as of the reader's executeAt: visible iff its time precedes the expiry."""
    return expiry is None or reader.hlc < expiry


@dataclass(slots=True)
class _Cell:
    stamp: Timestamp
    value: Value  # None: deleted
    expiry: int | None = None


_NO_CLUSTERING_KEY = order_key(())


class _Rows:
    """Cells by clustering key, told apart type-strictly (:func:`order_key`): Python's dict
    would take ``(1,)``, ``(1.0,)`` and ``(True,)`` for one row."""

    __slots__ = ("_cells",)

    def __init__(self, items: Iterable[tuple[Clustering, _Cell]] = ()) -> None:
        self._cells: dict[tuple[object, ...], tuple[Clustering, _Cell]] = {
            order_key(ck): (ck, cell) for ck, cell in items
        }

    def get(self, clustering: Clustering) -> _Cell | None:
        # The row at () is the only row of most keys: its order key without the walk.
        found = self._cells.get(order_key(clustering) if clustering else _NO_CLUSTERING_KEY)
        return None if found is None else found[1]

    def __setitem__(self, clustering: Clustering, cell: _Cell) -> None:
        key = order_key(clustering) if clustering else _NO_CLUSTERING_KEY
        self._cells[key] = (clustering, cell)

    def items(self) -> list[tuple[Clustering, _Cell]]:
        return list(self._cells.values())

    def __len__(self) -> int:
        return len(self._cells)


@dataclass(slots=True)
class _Partition:
    rows: _Rows = field(default_factory=_Rows)
    static: _Cell | None = None
    deleted: Timestamp | None = None
    ranges: list[tuple[Timestamp, Clustering, Bound | None, Bound | None]] = field(
        default_factory=list
    )

    def shadowed(self, clustering: Clustering, stamp: Timestamp, keys: ColumnKeys) -> bool:
        # A deletion wins over a write of the same timestamp, as in Cassandra.
        if self.deleted is not None and stamp <= self.deleted:
            return True
        return any(
            stamp <= at and in_slice(clustering, prefix, lower, upper, keys)
            for at, prefix, lower, upper in self.ranges
        )


def _newer(current: _Cell | None, stamp: Timestamp, value: Value) -> bool:
    if current is None or current.stamp < stamp:
        return True
    if current.stamp != stamp:
        return False
    # Equal stamps, as Cassandra settles them: a delete (tombstone) beats a write, and
    # between two writes the larger content wins. Legitimately only one transaction's
    # replay (same value) or a delete beside a write in one transaction meet here; the
    # shared-storage simulation needs the rest to show what two outcomes of one
    # transaction (a protocol bug) would leave in Cassandra.
    if value is None:
        return current.value is not None
    return current.value is not None and repr(value) > repr(current.value)


class MemoryPartitions:
    """Partitions in memory with Cassandra's semantics, last-write-wins by executeAt.

    ``descending(key)`` gives the clustering order of the key's table (every column
    ascending when omitted), and ``column_keys(key)`` each clustering column's own order
    (:data:`ColumnKeys`; :func:`order_key` when omitted), which orders its rows and judges
    slice and range-delete bounds on it. Writes are idempotent and order-agnostic:
    applying the same writes again, or two transactions' writes in either order, gives the
    same state.
    """

    __slots__ = ("_column_keys", "_descending", "partitions")

    def __init__(
        self,
        descending: Callable[[Key], tuple[bool, ...]] | None = None,
        column_keys: Callable[[Key], ColumnKeys] | None = None,
    ) -> None:
        self.partitions: dict[Key, _Partition] = {}
        self._descending = descending
        self._column_keys = column_keys

    def _keys(self, key: Key) -> ColumnKeys:
        return self._column_keys(key) if self._column_keys else ()

    def _sorter(self, key: Key) -> Callable[[Clustering], tuple[object, ...]]:
        return clustering_sort_key(
            self._descending(key) if self._descending else (), self._keys(key)
        )

    # -- writes

    def write(self, writes: Iterable[object], execute_at: Timestamp) -> None:
        from accord.primitives.txn import WriteOp, WriteScope  # txn builds on this module

        for write in writes:
            if not isinstance(write, WriteOp):
                raise TypeError(f"expected a WriteOp, got {type(write).__name__}")
            part = self.partitions.get(write.key)
            if part is None:
                part = self.partitions[write.key] = _Partition()
            if write.deletes_partition:
                if part.deleted is None or part.deleted < execute_at:
                    part.deleted = execute_at
                part.rows = _Rows(
                    (ck, cell) for ck, cell in part.rows.items() if cell.stamp > execute_at
                )
                if part.static is not None and part.static.stamp <= execute_at:
                    part.static = None
                continue
            if write.scope is WriteScope.RANGE:
                keys = self._keys(write.key)
                part.ranges.append((execute_at, write.clustering, write.lower, write.upper))
                part.rows = _Rows(
                    (ck, cell)
                    for ck, cell in part.rows.items()
                    if cell.stamp > execute_at
                    or not in_slice(ck, write.clustering, write.lower, write.upper, keys)
                )
                continue
            value = None if write.delete else write.value
            expiry = expires_at(execute_at, write.ttl)
            if write.scope is WriteScope.STATIC:
                if type(value) is tuple and all(v is None for v in value):
                    # Null in every static column leaves no live static cell (Cassandra
                    # writes each a tombstone): the static row is gone, as if deleted.
                    value = None
                if part.deleted is not None and execute_at <= part.deleted:
                    continue
                if _newer(part.static, execute_at, value):
                    part.static = _Cell(execute_at, value, expiry)
                continue
            if (part.deleted is not None or part.ranges) and part.shadowed(
                write.clustering, execute_at, self._keys(write.key)
            ):
                continue
            current = part.rows.get(write.clustering)
            if _newer(current, execute_at, value):
                part.rows[write.clustering] = _Cell(execute_at, value, expiry)

    # -- reads

    def read(
        self, selections: Sequence[Selection], execute_at: Timestamp
    ) -> dict[Key, PartitionRead]:
        """Every selection's result as of ``execute_at``, grouped by key."""
        by_key: dict[Key, list[Selection]] = {}
        for selection in selections:
            by_key.setdefault(selection.key, []).append(selection)
        return {key: self._read_partition(key, asked, execute_at) for key, asked in by_key.items()}

    def _live_rows(self, key: Key, at: Timestamp) -> list[tuple[Clustering, Value]]:
        part = self.partitions.get(key)
        if part is None:
            return []
        rows = [
            (ck, cell.value)
            for ck, cell in part.rows.items()
            if cell.value is not None and visible(cell.expiry, at)
        ]
        sorter = self._sorter(key)
        rows.sort(key=lambda item: sorter(item[0]))
        return rows

    def _read_partition(
        self, key: Key, selections: Sequence[Selection], at: Timestamp
    ) -> PartitionRead:
        part = self.partitions.get(key)
        rows: list[tuple[Clustering, Value]] | None = None
        results: list[tuple[Selection, Value]] = []
        size = 0
        for selection in dict.fromkeys(selections):
            value: Value
            if isinstance(selection, StaticAt):
                cell = None if part is None else part.static
                live = cell is not None and cell.value is not None and visible(cell.expiry, at)
                value = cell.value if live and cell is not None else None
            elif isinstance(selection, RowAt):
                cell = None if part is None else part.rows.get(selection.clustering)
                live = cell is not None and cell.value is not None and visible(cell.expiry, at)
                value = cell.value if live and cell is not None else None
            else:
                if rows is None:
                    rows = self._live_rows(key, at)
                value, error = slice_of(rows, selection, self._keys(key))
                if error is not None:
                    return PartitionRead((), error)
            size += value_size(value)
            if size > MAX_PARTITION_READ_BYTES:
                return PartitionRead((), partition_too_large(key))
            results.append((selection, value))
        return PartitionRead(tuple(results))

    def preload(self, key: Key, value: Value, stamp: Timestamp) -> None:
        """Set the row at ``()`` of ``key`` as if written at ``stamp`` (initial data)."""
        self.partitions.setdefault(key, _Partition()).rows[()] = _Cell(stamp, value)

    def keys(self) -> list[Key]:
        return list(self.partitions)

    def state(self, key: Key) -> tuple[object, ...]:
        """A canonical description of ``key``'s stored cells, equal on two stores iff they
        hold the same rows, static row and partition deletion with the same timestamps."""
        part = self.partitions.get(key)
        if part is None:
            return ()
        rows = tuple(
            sorted(
                ((ck, cell.stamp, cell.value, cell.expiry) for ck, cell in part.rows.items()),
                key=lambda item: order_key(item[0]),
            )
        )
        static = part.static
        stored = None if static is None else (static.stamp, static.value, static.expiry)
        return (rows, stored, part.deleted)

    def value(self, key: Key) -> Value:
        """The row at ``()`` of ``key`` ignoring TTLs (a store without clustering's value)."""
        part = self.partitions.get(key)
        cell = None if part is None else part.rows.get(())
        return None if cell is None else cell.value

    def snapshot(
        self, at: Timestamp
    ) -> dict[Key, tuple[Value, tuple[tuple[Clustering, Value], ...]]]:
        """Every partition's live static row and rows as of ``at`` (for tests and checks)."""
        out = {}
        for key, part in self.partitions.items():
            static = part.static
            static_value = (
                static.value if static is not None and visible(static.expiry, at) else None
            )
            rows = tuple(self._live_rows(key, at))
            if static_value is not None or rows:
                out[key] = (static_value, rows)
        return out


def slice_of(
    rows: Sequence[tuple[Clustering, Value]], selection: Slice, keys: ColumnKeys = ()
) -> tuple[Value, str | None]:
    """``selection`` applied to a partition's live ``rows`` (in clustering order, by the
    columns' ``keys``): the result tuple, or an error when more rows match than the slice
    may return."""
    matching = [
        (ck, row)
        for ck, row in rows
        if in_slice(ck, selection.prefix, selection.lower, selection.upper, keys)
    ]
    if selection.reverse:
        matching.reverse()
    cap = selection.limit if selection.limit is not None else MAX_ROWS_PER_SLICE
    if selection.limit is None and len(matching) > MAX_ROWS_PER_SLICE:
        return None, slice_too_large(selection.key)
    return tuple(matching[:cap]), None


def slice_too_large(key: Key) -> str:
    return (
        f"a slice of {key.name} matches more than MAX_ROWS_PER_SLICE={MAX_ROWS_PER_SLICE} rows;"
        " give it a LIMIT"
    )


def partition_too_large(key: Key) -> str:
    return (
        f"the rows read from {key.name} exceed MAX_PARTITION_READ_BYTES={MAX_PARTITION_READ_BYTES}"
    )


def read_results(values: Mapping[Key, Value], selection: Selection) -> tuple[Value, str | None]:
    """The result of ``selection`` in what a data store returned, or an error.

    A key whose value is not a :class:`PartitionRead` holds a single row at ``()`` (a data
    store that predates partitions).
    """
    value = values.get(selection.key)
    if isinstance(value, PartitionRead):
        if value.error is not None:
            return None, value.error
        return value.get(selection), None
    if isinstance(selection, RowAt):
        return (value if selection.clustering == () else None), None
    if isinstance(selection, Slice):
        rows = () if value is None else (((), value),)
        return slice_of(rows, selection)
    return None, None
