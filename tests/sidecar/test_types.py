"""CQL value types through the client API: float and double, duration, frozen collections,
tuples and UDTs (schema.py's checks and canonical forms, translate.py, the memory store),
and the clear refusal of what cannot be served (no processes).

The Cassandra side of the same values is tests/sidecar/test_rows_cassandra.py (the stores
agree value for value, and composite clustering columns sort as Cassandra sorts them).
"""

from __future__ import annotations

import asyncio
import functools
import math
import struct
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest

from accord import Bound, RowAt, Slice, Timestamp, WriteOp, WriteScope
from accord.primitives.txn import execute
from accord_cassandra.client import Result, Transaction
from accord_cassandra.datastore import HLC_BASE_MICROS
from accord_cassandra.memory_store import MemoryDataStore
from accord_cassandra.schema import (
    Catalog,
    SchemaError,
    TableSchema,
    check_type,
    column_order_key,
)
from accord_cassandra.translate import RequestError, to_response, to_txn

TABLES = {
    "shop.addr": {"fields": [["street", "text"], ["zip", "int"], ["tags", "frozen<list<text>>"]]},
    "shop.things": {
        "partition_key": [["id", "double"]],
        "clustering": [["at", "frozen<tuple<int, text>>", "desc"]],
        "columns": [
            ["f", "float"],
            ["d", "double"],
            ["n", "bigint"],
            ["span", "duration"],
            ["l", "frozen<list<int>>"],
            ["s", "frozen<set<text>>"],
            ["m", "frozen<map<text, float>>"],
            ["a", "frozen<addr>"],
        ],
    },
}


def binary32(number: float) -> float:
    return float(struct.unpack(">f", struct.pack(">f", number))[0])


class Harness:
    """One replica's transaction path over the sidecar's memory store."""

    def __init__(self) -> None:
        self.catalog = Catalog.from_mapping(TABLES)
        self.store = MemoryDataStore(self.catalog)
        self.seconds = 100

    def run(self, t: Transaction) -> Result:
        translation = to_txn(t.request, self.catalog)
        self.seconds += 1
        when = Timestamp(1, HLC_BASE_MICROS + self.seconds * 1_000_000, 0, 1)
        values = asyncio.run(self.store.read(translation.txn.selections, when))
        writes, result = execute(translation.txn, values)
        asyncio.run(self.store.write(writes, when))
        response = to_response(
            "1:1:0:1", result, translation.lets, self.catalog, views=translation.views
        )
        return Result.from_proto(response)


def refused(t: Transaction) -> str:
    with pytest.raises(RequestError) as caught:
        to_txn(t.request, Catalog.from_mapping(TABLES))
    return str(caught.value)


def test_every_type_round_trips_through_the_client_api_in_canonical_form() -> None:
    h = Harness()
    t = Transaction().update(
        "shop",
        "things",
        1.5,
        [(2, "b")],
        f=0.1,
        d=0.1,
        n=3,
        span=(1, 2, 3),
        l=[3, 1, 3],
        s={"b", "a", "é"},
        m={"z": 1, "a": 0.5},
        a=("Main St", None, ["x"]),
    )
    assert h.run(t).applied
    t = Transaction()
    t.let("r", "shop", "things", 1.5, [(2, "b")])
    row = h.run(t).rows["r"]
    assert row == {
        "f": binary32(0.1),  # rounded to binary32 as a float column holds it
        "d": 0.1,
        "n": 3,
        "span": (1, 2, 3),
        "l": (3, 1, 3),
        "s": ("a", "b", "é"),  # sorted
        "m": (("a", 0.5), ("z", 1.0)),  # sorted by key; 1 given for a float is 1.0
        "a": ("Main St", None, ("x",)),
    }
    assert type(row["m"][1][1]) is float  # type: ignore[index]


def test_a_computed_double_lands_in_a_float_column_rounded_to_binary32() -> None:
    # Planted-bug check: without the memory store's rounding the stored f would be
    # 0.1 + binary32(0.1) in binary64, which a Cassandra float column cannot hold.
    h = Harness()
    assert h.run(Transaction().update("shop", "things", 2.0, [(1, "a")], f=0.1, d=0.0)).applied
    t = Transaction()
    r = t.let("r", "shop", "things", 2.0, [(1, "a")])
    t.update("shop", "things", 2.0, [(1, "a")], f=r["f"] + 0.1, d=r["f"] + 0.1)
    assert h.run(t).applied
    t = Transaction()
    t.let("r", "shop", "things", 2.0, [(1, "a")])
    row = h.run(t).rows["r"]
    assert row is not None
    exact = binary32(0.1) + 0.1
    assert row["d"] == exact and row["f"] == binary32(exact) != exact


def test_the_memory_store_rounds_a_peers_float_write_too() -> None:
    catalog = Catalog.from_mapping(TABLES)
    table = catalog.table("shop", "things")
    store = MemoryDataStore(catalog)
    key = table.key([0.5])
    row = (1e300, 1e300, None, None, None, None, None, None)
    stamp = Timestamp(1, HLC_BASE_MICROS + 10**6, 0, 1)
    asyncio.run(store.write([WriteOp(key, row, clustering=((1, "a"),))], stamp))
    later = Timestamp(1, HLC_BASE_MICROS + 2 * 10**6, 0, 1)
    read = asyncio.run(store.read([RowAt(key, ((1, "a"),))], later))
    assert read[key].get(RowAt(key, ((1, "a"),))) == (math.inf, 1e300, *row[2:])


def test_clustering_by_a_tuple_descending() -> None:
    h = Harness()
    t = Transaction()
    for at in [(1, "b"), (2, "a"), (1, "a"), (-1, "z")]:
        t.update("shop", "things", 3.0, [at], n=at[0])
    assert h.run(t).applied
    t = Transaction()
    t.let_slice("all", "shop", "things", 3.0)
    t.let_slice("low", "shop", "things", 3.0, column="at", lt=(1, "b"))
    result = h.run(t)
    assert [r["at"] for r in result.slices["all"]] == [(2, "a"), (1, "b"), (1, "a"), (-1, "z")]
    assert [r["at"] for r in result.slices["low"]] == [(1, "a"), (-1, "z")]


def test_conditions_on_floats_and_composites() -> None:
    h = Harness()
    assert h.run(
        Transaction().update("shop", "things", 4.0, [(1, "a")], f=0.1, d=2.5, s={"x"})
    ).applied
    t = Transaction()
    r = t.let("r", "shop", "things", 4.0, [(1, "a")])
    # A float literal compared with a float column is rounded as the column's values are.
    t.where(r["f"] == 0.1, r["d"] > 2.0, r["s"] == {"x"}, r["l"].is_null())
    assert h.run(t).applied
    t = Transaction()
    r = t.let("r", "shop", "things", 4.0, [(1, "a")])
    t.where(r["s"] != ("x",))
    assert not h.run(t).applied


def test_type_errors_are_refused_before_commit_naming_the_column() -> None:
    def update(**columns: object) -> Transaction:
        return Transaction().update("shop", "things", 1.0, [(1, "a")], **columns)

    assert "shop.things.f is float; got str" in refused(update(f="1"))
    assert "shop.things.f is float; got bool" in refused(update(f=True))
    assert "shop.things.n is bigint; got float" in refused(update(n=1.0))
    assert "one sign" in refused(update(span=(1, -1, 0)))
    assert "map key 'a' given twice" in refused(update(m=[("a", 1.0), ("a", 2.0)]))
    assert "cannot be null" in refused(update(l=[1, None]))
    assert "got 2 of 3 fields" in refused(update(a=("x", 1)))
    t = Transaction()
    r = t.let("r", "shop", "things", 1.0, [(1, "a")])
    t.update("shop", "things", 1.0, [(1, "a")], d=r["n"] + 1.5)
    assert "+ of bigint and 1.5: integers and floats do not mix" in refused(t)
    t = Transaction()
    r = t.let("r", "shop", "things", 1.0, [(1, "a")])
    t.update("shop", "things", 1.0, [(1, "a")], d=r["d"] + r["n"])
    assert "integers and floats do not mix" in refused(t)
    t = Transaction()
    r = t.let("r", "shop", "things", 1.0, [(1, "a")])
    t.where(r["l"] < [1])
    assert "does not order frozen<list<int>>" in refused(t)
    t = Transaction()
    r = t.let("r", "shop", "things", 1.0, [(1, "a")])
    t.where(r["span"] >= (1, 0, 0))
    assert "does not order duration" in refused(t)


def test_nan_and_negative_zero_are_refused_where_they_would_name_a_row() -> None:
    assert "NaN and -0.0 are refused" in refused(
        Transaction().update("shop", "things", math.nan, [(1, "a")], n=1)
    )
    assert "NaN and -0.0 are refused" in refused(
        Transaction().update("shop", "things", -0.0, [(1, "a")], n=1)
    )
    t = Transaction()
    t.let_slice("s", "shop", "things", 1.0, column="at", ge=(1, "a"))
    to_txn(t.request, Catalog.from_mapping(TABLES))
    bounded = Catalog.from_mapping(
        {"k.t": {"partition_key": [["p", "int"]], "clustering": [["c", "double"]]}}
    )
    t = Transaction()
    t.let_slice("s", "k", "t", 1, column="c", gt=math.nan)
    with pytest.raises(RequestError, match=r"NaN and -0\.0 are refused"):
        to_txn(t.request, bounded)
    for value in ((math.nan,), (-0.0, 0.0)):
        with pytest.raises(SchemaError, match=r"NaN and -0\.0 are refused"):
            check_type("w", "frozen<set<double>>", value)
    with pytest.raises(SchemaError, match=r"NaN and -0\.0 are refused"):
        check_type("w", "frozen<map<float, int>>", ((math.nan, 1),))
    assert check_type("w", "frozen<map<int, double>>", ((1, math.nan),)) is not None
    # Elsewhere they are values like any other.
    h = Harness()
    assert h.run(
        Transaction().update("shop", "things", 1.0, [(1, "a")], f=math.nan, d=-0.0)
    ).applied
    t = Transaction()
    t.let("r", "shop", "things", 1.0, [(1, "a")])
    row = h.run(t).rows["r"]
    assert row is not None and math.isnan(row["f"]) and math.copysign(1, row["d"]) < 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("column", "role", "culprit"),
    [
        ("list<int>", "columns", "non-frozen list<int> is not served"),
        ("set<text>", "columns", "non-frozen set<text> is not served"),
        ("map<text, int>", "columns", "non-frozen map<text, int> is not served"),
        ("counter", "columns", "is a counter"),
        ("frozen<list<counter>>", "columns", "holds a counter"),
        ("frozen<set<duration>>", "columns", "set element or map key of type duration"),
        ("frozen<map<decimal, int>>", "columns", "set element or map key of type decimal"),
        ("vector<float, 3>", "columns", "is not a type the sidecar serves"),
        ("frozen<nope>", "columns", "nope is not a type the sidecar serves"),
        ("duration", "clustering", "not supported as a clustering column"),
        ("frozen<list<inet>>", "clustering", "an element's Accord value would not sort"),
        ("tuple<int, uuid>", "clustering", "an element's Accord value would not sort"),
        ("frozen<list<int>>", "partition_key", "not supported in a partition key"),
        ("duration", "partition_key", "not supported in a partition key"),
    ],
)
def test_types_that_cannot_be_served_are_refused_naming_the_column(
    column: str, role: str, culprit: str
) -> None:
    spec: dict[str, list[list[str]]] = {"partition_key": [["id", "int"]]}
    if role == "partition_key":
        spec["partition_key"] = [["x", column]]
    elif role == "clustering":
        spec["clustering"] = [["x", column]]
    else:
        spec["columns"] = [["x", column]]
    with pytest.raises(SchemaError) as caught:
        Catalog.from_mapping({"shop.bad": spec})
    assert "shop.bad.x" in str(caught.value) and culprit in str(caught.value)


def test_user_types_resolve_nested_and_refuse_cycles() -> None:
    table = TableSchema(
        "k",
        "t",
        (("id", "int"),),
        (("home", "frozen<place>"),),
        udts={"place": [["at", "frozen<pos>"], ["name", "text"]], "pos": [["x", "double"]]},
    )
    assert table.columns[0][1] == "frozen<place{at: frozen<pos{x: double}>, name: text}>"
    assert check_type("w", table.columns[0][1], ((1,), "n")) == ((1.0,), "n")
    with pytest.raises(SchemaError, match="contains itself"):
        TableSchema(
            "k", "t", (("id", "int"),), (("a", "frozen<u>"),), udts={"u": [["u", "frozen<u>"]]}
        )


def test_float_and_double_partition_keys_serialize_as_cassandra_does() -> None:
    table = Catalog.from_mapping(TABLES).table("shop", "things")
    assert table.routing_key([1.5]) == struct.pack(">d", 1.5)
    f = TableSchema("k", "t", (("id", "float"),), (("v", "int"),))
    assert f.routing_key([0.1]) == struct.pack(">f", 0.1)


def _uuid(time_: int, version: int = 1, clock_seq: int = 0x0101, node: int = 0x42) -> str:
    return str(
        uuid.UUID(
            fields=(
                time_ & 0xFFFFFFFF,
                (time_ >> 32) & 0xFFFF,
                ((time_ >> 48) & 0x0FFF) | (version << 12),
                0x80 | (clock_seq >> 8),
                clock_seq & 0xFF,
                node,
            )
        )
    )


# Each list in Cassandra's order, derived from the comparators' definitions, none in text order.
TIMEUUID_ORDER = [
    _uuid(2),  # time_low 2: text "00000002-0000-1000-…"
    _uuid(1 << 32),  # time_mid 1: text "00000000-0001-1000-…", yet later
    _uuid(1 << 33, node=0x80 << 40),  # one timestamp: the node's first byte signed, -128 …
    _uuid(1 << 33, node=0x7F << 40),  # … before 127
    _uuid(1 << 48),
]
UUID_ORDER = [
    _uuid(2),  # version 1 first, by timestamp, then the low bytes unsigned: 0x7F …
    _uuid(1 << 32, node=0x7F << 40),
    _uuid(1 << 32, node=0x80 << 40),  # … before 0x80
    "00000000-0000-4000-8000-000000000000",  # version 4: after every version 1, by bytes
    "00000000-0000-4000-8000-000000000001",
    "ffffffff-0000-4000-8000-000000000000",
]


def test_uuid_and_timeuuid_sort_keys_are_cassandras_order() -> None:
    for cql_type, expected in (("timeuuid", TIMEUUID_ORDER), ("uuid", UUID_ORDER)):
        order = column_order_key(cql_type)
        assert order is not None
        assert sorted(expected, key=order) == expected, cql_type
        assert sorted(expected) != expected, cql_type  # the text order would be wrong
    assert column_order_key("int") is None  # order_key is Cassandra's order there
    with pytest.raises(SchemaError, match="not a UUID"):
        cast("Any", column_order_key("uuid"))("nope")


def _uuids_read(store: MemoryDataStore, stamp: Iterator[Timestamp], selection: Slice) -> list[str]:
    read = asyncio.run(store.read([selection], next(stamp)))[selection.key].get(selection)
    return [ck[0] for ck, _ in cast("tuple[tuple[tuple[str], object], ...]", read)]


def test_the_memory_store_orders_slices_bounds_and_range_deletes_of_uuids_as_cassandra() -> None:
    spec = {
        f"shop.{cql_type}s": {
            "partition_key": [["p", "int"]],
            "clustering": [["at", cql_type, direction]],
            "columns": [["v", "int"]],
        }
        for cql_type, direction in (("timeuuid", "desc"), ("uuid", "asc"))
    }
    catalog = Catalog.from_mapping(spec)
    for cql_type, expected in (("timeuuid", TIMEUUID_ORDER), ("uuid", UUID_ORDER)):
        table = catalog.table("shop", f"{cql_type}s")
        store = MemoryDataStore(catalog)
        key = table.key([1])
        stamp = iter(Timestamp(1, HLC_BASE_MICROS + s * 10**6, 0, 1) for s in range(1, 9))
        writes = [WriteOp(key, (i,), clustering=(u,)) for i, u in enumerate(reversed(expected))]
        asyncio.run(store.write(writes, next(stamp)))
        rows = functools.partial(_uuids_read, store, stamp)
        stored = expected[::-1] if table.clustering[0][2] == "desc" else expected
        assert rows(Slice(key)) == stored
        between = Slice(key, (), Bound(expected[1]), Bound(expected[3], False), limit=5)
        assert rows(between) == [u for u in stored if u in expected[1:3]]
        delete = WriteOp(key, None, True, WriteScope.RANGE, (), Bound(expected[1], False), None)
        asyncio.run(store.write([delete], next(stamp)))
        assert rows(Slice(key, reverse=True)) == [u for u in stored[::-1] if u in expected[:2]]


def test_a_remembered_key_never_stands_in_for_an_equal_value_of_another_type() -> None:
    from accord_cassandra import schema

    ints = TableSchema("ks", "ints", (("id", "int"),), (("v", "text"),))
    doubles = TableSchema("ks", "doubles", (("id", "double"),), (("v", "text"),))
    first = ints.key([1])
    assert ints.key([1]) is first  # remembered
    # True == 1 and 1.0 == 1, yet a bool is no int and a float no int column's value.
    for value in (True, 1.0):
        with pytest.raises(SchemaError, match=r"ks\.ints\.id is int"):
            ints.key([value])
    # An int given for a double is that double, whichever came first.
    assert doubles.key([1]) == doubles.key([1.0]) == doubles._derive_key([1.0])
    # 0.0 == -0.0, yet -0.0 names no partition.
    doubles.key([0.0])
    with pytest.raises(SchemaError, match=r"-0\.0"):
        doubles.key([-0.0])
    # Collections are not remembered, and still checked every time.
    things = Catalog.from_mapping(TABLES).table("shop", "things")
    assert things.key([2.5]) == things._derive_key([2.5])
    # Bounded.
    for i in range(schema.KEYS_REMEMBERED + 10):
        assert ints.key([i]) == ints._derive_key([i])
    assert len(ints._keys) <= schema.KEYS_REMEMBERED
