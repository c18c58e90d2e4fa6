"""The client API over clustered tables: LET slices, counts, static columns, range deletes,
TTLs, and the clear refusal of what a client gets wrong (translate.py, no processes).

Transactions built with the client's builder are translated, read from an
``accord.MemoryPartitions`` (the model every in-memory store shares) and executed by accord's
own ``execute``; the writes are applied and the response is decoded as the client sees it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from accord import MAX_ROWS_PER_SLICE, MAX_TTL_SECONDS, Timestamp
from accord.primitives import MemoryPartitions
from accord.primitives.txn import execute
from accord_cassandra.client import Result, Transaction
from accord_cassandra.datastore import TTL_MARGIN_SECONDS, CassandraDataStore
from accord_cassandra.schema import Catalog, SchemaError, TableSchema
from accord_cassandra.translate import RequestError, to_response, to_txn

TABLES = {
    "bank.ledger": {
        "partition_key": [["account", "text"]],
        "clustering": [["at", "bigint", "desc"], ["transfer", "text", "asc"]],
        "columns": [["amount", "bigint"], ["memo", "text"]],
        "static": [["balance", "bigint"]],
    },
    "bank.accounts": {
        "partition_key": [["id", "text"]],
        "columns": [["balance", "bigint"]],
    },
}


def catalog() -> Catalog:
    found = Catalog.from_mapping(TABLES)
    try:
        TableSchema("bank", "hits", (("id", "text"),), (("n", "counter"),))
    except SchemaError as error:
        found.unusable["bank.hits"] = str(error)
    return found


class Harness:
    """One replica's worth of the transaction path, in memory."""

    def __init__(self) -> None:
        self.catalog = catalog()

        def descending(key: object) -> tuple[bool, ...]:
            table = self.catalog.for_key(key)  # type: ignore[arg-type]
            return tuple(order == "desc" for _, _, order in table.clustering)

        self.store = MemoryPartitions(descending)
        self.seconds = 100

    def run(self, t: Transaction) -> Result:
        translation = to_txn(t.request, self.catalog)
        self.seconds += 1
        when = Timestamp(1, self.seconds * 1_000_000, 0, 1)
        values = self.store.read(translation.txn.selections, when)
        writes, result = execute(translation.txn, values)
        self.store.write(writes, when)
        response = to_response(
            "1:1:0:1", result, translation.lets, self.catalog, views=translation.views
        )
        return Result.from_proto(response)


def cassandra_store(found: Catalog, protocol_version: int = 5) -> CassandraDataStore:
    """The Cassandra store's TTL checks, over a session that is never used."""
    from cassandra.protocol import ProtocolHandler

    session = SimpleNamespace(
        cluster=SimpleNamespace(protocol_version=protocol_version),
        client_protocol_handler=ProtocolHandler,
    )
    return CassandraDataStore(session, found)


def error_of(t: Transaction, store: str = "memory", protocol_version: int = 5) -> str:
    found = catalog()
    if store == "cassandra":
        found.ttl_check = cassandra_store(found, protocol_version).ttl_problem
    with pytest.raises(RequestError) as caught:
        to_txn(t.request, found)
    return str(caught.value)


def transfer(h: Harness, src: str, dst: str, amount: int, at: int, name: str) -> Result:
    t = Transaction()
    s = t.let_slice("s", "bank", "ledger", src, limit=1)
    d = t.let_slice("d", "bank", "ledger", dst, limit=1)
    t.where(s["balance"] >= amount)
    t.update("bank", "ledger", src, balance=s["balance"] - amount)
    t.update("bank", "ledger", dst, balance=d["balance"] + amount)
    t.update("bank", "ledger", src, (at, name), amount=-amount, memo=f"to {dst}")
    t.update("bank", "ledger", dst, (at, name), amount=amount, memo=f"from {src}")
    return h.run(t)


def test_a_clustered_ledger_moves_money_and_reads_back_in_order() -> None:
    h = Harness()
    for account in ("alice", "bob"):
        opening = Transaction().update(
            "bank", "ledger", account, (0, "open"), amount=100, memo="opening"
        )
        opening.update("bank", "ledger", account, balance=100)
        assert h.run(opening).applied
    assert transfer(h, "alice", "bob", 30, 10, "t1").applied
    assert transfer(h, "alice", "bob", 20, 20, "t2").applied
    refused = transfer(h, "alice", "bob", 500, 30, "t3")
    assert not refused.applied and refused.error is None

    t = Transaction()
    t.let_slice("recent", "bank", "ledger", "alice", column="at", ge=5, limit=5)
    oldest = t.let_slice("oldest", "bank", "ledger", "alice", reversed=True, limit=1)
    everything = t.let_slice("all", "bank", "ledger", "bob")
    t.where(everything.count() == 3, everything.exists(), oldest["memo"] == "opening")
    result = h.run(t)
    assert result.applied, result
    # DESC on "at": newest first; the bounds restrict "at"; statics ride along.
    assert [r["transfer"] for r in result.slices["recent"]] == ["t2", "t1"]
    assert [r["amount"] for r in result.slices["recent"]] == [-20, -30]
    assert result.rows["recent"] == {"balance": 50}
    assert [r["at"] for r in result.slices["all"]] == [20, 10, 0]
    assert sum(r["amount"] for r in result.slices["all"]) == 150  # type: ignore[misc]
    assert result.rows["all"] == {"balance": 150}


def test_rows_by_full_key_range_deletes_partition_deletes_and_ttl() -> None:
    h = Harness()
    t = Transaction()
    for at in range(1, 6):
        t.update("bank", "ledger", "carol", (at, "x"), amount=at)
    t.update("bank", "ledger", "carol", (9, "temp"), ttl=8, amount=9)
    assert h.run(t).applied

    t = Transaction()
    row = t.let("r", "bank", "ledger", "carol", (3, "x"))
    gone = t.let("g", "bank", "ledger", "carol", (3, "nope"))
    t.where(row["amount"] == 3, gone.is_null(), gone.not_exists())
    assert h.run(t).applied
    # A partial update keeps the other columns; a row read back by its full key.
    t = Transaction().update("bank", "ledger", "carol", (3, "x"), memo="kept")
    assert h.run(t).applied
    t = Transaction()
    t.let("r", "bank", "ledger", "carol", (3, "x"))
    assert h.run(t).rows["r"] == {"amount": 3, "memo": "kept", "balance": None}

    t = Transaction().delete_range("bank", "ledger", "carol", column="at", gt=1, le=3)
    assert h.run(t).applied
    t = Transaction()
    t.let_slice("all", "bank", "ledger", "carol")
    assert [r["at"] for r in h.run(t).slices["all"]] == [9, 5, 4, 1]
    # Two more transactions (two more seconds): the TTL'd row has expired as of executeAt.
    h.seconds += 2
    t = Transaction()
    t.let_slice("all", "bank", "ledger", "carol")
    assert [r["at"] for r in h.run(t).slices["all"]] == [5, 4, 1]
    t = Transaction().delete("bank", "ledger", "carol", (5,))  # a prefix: every row at 5
    assert h.run(t).applied
    t = Transaction().delete_partition("bank", "ledger", "carol")
    t.update("bank", "accounts", "carol", balance=1)
    assert h.run(t).applied
    t = Transaction()
    s = t.let_slice("all", "bank", "ledger", "carol")
    t.where(s.not_exists())
    assert h.run(t).applied


def test_single_row_tables_work_as_before() -> None:
    h = Harness()
    assert h.run(Transaction().update("bank", "accounts", "a", balance=5)).applied
    t = Transaction()
    a = t.let("a", "bank", "accounts", "a")
    t.where(a["balance"] == 5, a.count() == 1)
    t.update("bank", "accounts", "a", balance=a["balance"] + 1)
    result = h.run(t)
    assert result.applied and result.rows["a"] == {"balance": 5}


def _unknown_clustering_column() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", "alice", column="when", ge=1)
    return t


def _range_over_a_regular_column() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", "alice", column="amount", ge=1)
    return t


def _range_skipping_a_clustering_column() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", "alice", column="transfer", ge="a")
    return t


def _slice_without_partition_key() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", [], column="at", ge=1)
    return t


def _limit_over_the_cap() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", "alice", limit=MAX_ROWS_PER_SLICE + 1)
    return t


def _counter_table() -> Transaction:
    return Transaction().update("bank", "hits", "alice", n=1)


def _column_of_a_wide_slice() -> Transaction:
    t = Transaction()
    s = t.let_slice("s", "bank", "ledger", "alice", limit=2)
    return t.where(s["amount"] > 1)


def _row_without_every_clustering_value() -> Transaction:
    t = Transaction()
    t.let("r", "bank", "ledger", "alice", (1,))
    return t


def _upsert_of_a_partial_key() -> Transaction:
    return Transaction().update("bank", "ledger", "alice", (1,), amount=1)


def _bound_of_the_wrong_type() -> Transaction:
    t = Transaction()
    t.let_slice("s", "bank", "ledger", "alice", column="at", ge="soon")
    return t


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (_unknown_clustering_column, "unknown clustering column 'when' in bank.ledger"),
        (_range_over_a_regular_column, "bank.ledger.amount is not a clustering column"),
        (_range_skipping_a_clustering_column, "the next clustering column is at"),
        (_slice_without_partition_key, "(account): every read or write names a whole partition"),
        (_limit_over_the_cap, f"LIMIT {MAX_ROWS_PER_SLICE + 1} exceeds MAX_ROWS_PER_SLICE"),
        (_counter_table, "bank.hits.n is a counter"),
        (_column_of_a_wide_slice, "s.amount: LET s is a slice; a column of it needs LIMIT 1"),
        (_row_without_every_clustering_value, "needs every clustering column (at, transfer)"),
        (_upsert_of_a_partial_key, "needs every clustering column (at, transfer)"),
        (_bound_of_the_wrong_type, "bank.ledger.at is bigint"),
    ],
)
def test_bad_clustered_requests_name_the_culprit(build: object, problem: str) -> None:
    assert problem in error_of(build())  # type: ignore[operator]


def test_a_ttl_the_store_cannot_honour_is_refused_before_commit() -> None:
    def ttl(seconds: int, **columns: object) -> Transaction:
        return Transaction().update("bank", "ledger", "a", (1, "x"), ttl=seconds, **columns)

    bad = ttl(MAX_TTL_SECONDS + 1, amount=1)
    assert "exceeds the maximum" in error_of(bad)
    # The memory store honours every TTL the core takes, the Cassandra store those it can
    # read back exactly and Cassandra can keep for the margin.
    found = catalog()
    to_txn(ttl(MAX_TTL_SECONDS, amount=1).request, found)
    longest = MAX_TTL_SECONDS - TTL_MARGIN_SECONDS
    assert f"maximum {longest} s" in error_of(ttl(longest + 1, amount=1), "cassandra")
    assert "after 2038-01-19" in error_of(ttl(longest, amount=1), "cassandra")
    assert "native protocol v5" in error_of(ttl(5, amount=1), "cassandra", protocol_version=4)
    # The row's expiry is read back from a cell's TTL: some column must hold a value.
    for no_value in (ttl(5), ttl(5, memo=None)):
        assert "cannot be null" in error_of(no_value, "cassandra")
    copied = Transaction()
    source = copied.let("r", "bank", "ledger", "b", (1, "x"))
    copied.update("bank", "ledger", "a", (1, "x"), ttl=5, memo=source["memo"])
    assert "needs a regular column" in error_of(copied, "cassandra")
    statics = Transaction().update("bank", "ledger", "a", ttl=5, balance=None)
    assert "needs a static column" in error_of(statics, "cassandra")
    found.ttl_check = cassandra_store(found).ttl_problem
    computed = Transaction()
    source = computed.let("r", "bank", "ledger", "b", (1, "x"))
    computed.update("bank", "ledger", "a", (1, "x"), ttl=5, amount=source["amount"] + 1)
    for fine in (
        ttl(5, amount=1),
        computed,
        Transaction().update("bank", "ledger", "a", ttl=5, balance=3),
    ):
        assert to_txn(fine.request, found).txn.update is not None


def test_time_inet_and_decimal_types_are_checked_and_keys_round_trip() -> None:
    from accord_cassandra.schema import partition_values, routing_key_of

    table = TableSchema(
        "ks",
        "typed",
        (("day", "date"), ("host", "inet"), ("at", "timestamp")),
        (("price", "decimal"), ("tod", "time")),
    )
    key = table.key([-3, "::ffff:1.2.3.4", -1])
    assert partition_values(table, routing_key_of(key)) == (-3, "::ffff:102:304", -1)
    assert table.check_value("price", "1.50") == "1.50"
    for column, value, problem in (
        ("price", "abc", "not a number"),
        ("price", "NaN", "not a finite number"),
        ("tod", 86_400 * 10**9, "out of range"),
        ("tod", "noon", "got str"),
    ):
        with pytest.raises(SchemaError, match=problem):
            table.check_value(column, value)
    with pytest.raises(SchemaError, match="not an IP address"):
        table.key([1, "nowhere", 0])
    # Years 1 to 9999 only: a timestamp the Cassandra store could not write is refused.
    assert table.key([1, "1.2.3.4", 253_402_300_799_999]) is not None
    assert table.key([1, "1.2.3.4", -62_135_596_800_000]) is not None
    for outside in (253_402_300_800_000, -62_135_596_800_001):
        with pytest.raises(SchemaError, match="out of range"):
            table.key([1, "1.2.3.4", outside])
    with pytest.raises(SchemaError, match="not supported as a clustering column"):
        TableSchema("ks", "t", (("id", "text"),), (), (("ip", "inet", "asc"),))
    with pytest.raises(SchemaError, match="not supported in a partition key"):
        TableSchema("ks", "t", (("d", "decimal"),), ())


def test_a_peers_row_write_that_cannot_land_is_refused() -> None:
    from accord import Const, Deps, MakeTuple, PutRow, Txn, TxnResult, Update, WriteOp
    from accord.messages import Apply, Envelope
    from accord.messages.validate import InvalidMessage
    from accord.primitives import Route
    from accord_cassandra.server import peer_data_check

    found = catalog()
    key = found.table("bank", "ledger").key(["p"])
    ts = Timestamp(1, 1_800_000_000_000_000, 1, 2)

    def apply(write: PutRow, op: WriteOp) -> Envelope:
        txn = Txn((), Update((write,)))
        body = Apply(1, ts, txn, Route(key, (key,)), ts, Deps({}), (op,), TxnResult((), True))
        return Envelope(2, 1, body)

    good = PutRow(key, (1, "t"), Const((1, "m")), ttl=5)
    peer_data_check(found)(apply(good, WriteOp(key, (1, "m"), clustering=(1, "t"), ttl=5)))
    for write, op, problem in (
        (PutRow(key, (1,), Const((1, "m"))), WriteOp(key, (1, "m"), clustering=(1,)), "got 1"),
        (
            PutRow(key, (1, "t"), MakeTuple((Const(1),))),
            WriteOp(key, (1, "m"), clustering=(1, "t")),
            "wrong width",
        ),
        (
            PutRow(key, (1, "t"), Const((1, "m"))),
            WriteOp(key, (1,), clustering=(1, "t")),
            "a row needs 2 values",
        ),
        (PutRow(key, ("x", "t"), Const((1, "m"))), WriteOp(key, (1, "m")), "is bigint"),
    ):
        with pytest.raises(InvalidMessage, match=problem):
            peer_data_check(found)(apply(write, op))
    # On the Cassandra store a declared TTL'd write must carry a value its expiry can be read
    # back from; a computed write's TTL (an outcome) is never refused.
    found.ttl_check = cassandra_store(found).ttl_problem
    peer_data_check(found)(apply(good, WriteOp(key, (1, "m"), clustering=(1, "t"), ttl=5)))
    nothing = PutRow(key, (1, "t"), MakeTuple((Const(None), Const(None))), ttl=5)
    with pytest.raises(InvalidMessage, match="cannot be null"):
        peer_data_check(found)(apply(nothing, WriteOp(key, (1, None), clustering=(1, "t"), ttl=5)))
