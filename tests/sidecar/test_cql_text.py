"""Accord CQL transaction text (accord_cassandra.cql): every statement form parses to the
transaction the builder API makes by hand, generated transactions survive print → parse,
syntax errors name line, column and the expected tokens, and every refusal names its
construct. No sidecar needed: the result side is checked on hand-made results."""

from __future__ import annotations

import decimal
import math
import uuid
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord_cassandra.client import Result, RowHandle, Transaction
from accord_cassandra.cql import CqlError, CqlSyntaxError, as_catalog, bind, prepare, to_cql
from accord_cassandra.cql.build import HIDDEN_PREFIX, SELECT_LET
from accord_cassandra.v1 import client_pb2 as pb
from tests.sidecar.conftest import EMBEDDED_TABLES

CATALOG = as_catalog(EMBEDDED_TABLES)


def txn(body: str) -> str:
    return f"BEGIN TRANSACTION\n{body}\nCOMMIT TRANSACTION"


def bank_transfer() -> Transaction:
    t = Transaction()
    src = t.let("src", "bank", "accounts", "alice")
    dst = t.let("dst", "bank", "accounts", "bob")
    t.where(src["balance"] >= 10)
    t.update("bank", "accounts", "alice", balance=src["balance"] - 10)
    t.update("bank", "accounts", "bob", balance=dst["balance"] + 10)
    return t


def _slice_reversed() -> Transaction:
    t = Transaction()
    t.let_slice("r", "bank", "ledger", "a", (), column="at", ge=5, lt=10, reversed=True, limit=3)
    return t


def _slice_prefix() -> Transaction:
    t = Transaction()
    t.let_slice("r", "bank", "ledger", "a", (7,), column="transfer", gt="m", limit=2)
    return t


def _conditions() -> Transaction:
    t = Transaction()
    a = t.let("a", "bank", "accounts", "x")
    s = t.let_slice("s", "bank", "ledger", "x", (), limit=1)
    t.where(
        a["balance"] == 1,
        a["balance"] != 2,
        a["balance"] < 3,
        a["balance"] <= 4,
        a["balance"] > 5,
        a["balance"] >= 6,
        a["tag"].is_null(),
        a["tag"].not_null(),
        a.is_null(),
        pb.Condition(op="not_null", left=pb.Expr(row="a")),
        s.exists(),
        s.not_exists(),
        s.count() >= 1,
        s["amount"] > a["balance"] - 3,
        pb.Condition(op="<", left=pb.Expr(literal=pb.Value(int=7)), right=a["tag"].proto),
    )
    t.update("bank", "accounts", "x", tag=s["balance"])
    return t


def _writes() -> Transaction:
    t = Transaction()
    t.update("bank", "accounts", "k", ttl=60, balance=5, tag=None)
    t.update("bank", "ledger", "k", (3, "t"), amount=-2, memo="it's")
    t.update("bank", "ledger", "k", (), balance=9)
    t.update("shop", "items", ("eu", 4), qty=1, name="n", photo=b"\xca\xfe", active=True)
    t.delete("bank", "ledger", "k", (3, "t"))
    t.delete("bank", "ledger", "k", (3,))
    t.delete_range("bank", "ledger", "k", (), column="at", gt=1, le=3)
    t.delete_range("bank", "ledger", "k", (3,), column="transfer", ge="a")
    t.delete_partition("bank", "accounts", "k")
    t.update("bank", "ledger", "k", (4, "u"), values={"memo": None, "amount": None})
    return t


def _increments() -> Transaction:
    t = Transaction()
    row = t.let("_row1", "bank", "accounts", "k")
    t.update("bank", "accounts", "k", balance=row["balance"] + 5, tag=row["tag"] - 1)
    other = t.let("_row2", "bank", "ledger", "k", (1, "x"))
    t.update("bank", "ledger", "k", (1, "x"), amount=other["amount"] + 2)
    return t


def _literals() -> Transaction:
    t = Transaction()
    t.update(
        "bank",
        "ledger",
        "k",
        (-5, "o'k"),
        values={
            "memo": " 'raw' ",
            "amount": [1, -2.5, 3e-07, math.inf, -math.inf, None, True, False],
        },
    )
    t.update(
        "bank",
        "accounts",
        uuid.UUID("123e4567-e89b-12d3-a456-426614174000"),
        balance=[[1, 2], ("a", b"")],
        tag={"k": [1], "j": {}},
    )
    return t


def _markers() -> Transaction:
    t = Transaction()
    a = t.let("a", "bank", "accounts", "alice")
    t.where(a["balance"] >= 10)
    t.update("bank", "accounts", "alice", ttl=30, balance=a["balance"] - 10)
    t.update("bank", "accounts", "bob", balance=10)
    return t


CASES: list[tuple[str, str, object, Callable[[], Transaction]]] = [
    (
        "the bank transfer of issue 19",
        txn(
            "LET src = (SELECT balance FROM bank.accounts WHERE id = 'alice');\n"
            "LET dst = (SELECT balance FROM bank.accounts WHERE id = 'bob');\n"
            "SELECT src.balance, dst.balance;\n"
            "IF src.balance >= 10 THEN\n"
            "  UPDATE bank.accounts SET balance = src.balance - 10 WHERE id = 'alice';\n"
            "  UPDATE bank.accounts SET balance = dst.balance + 10 WHERE id = 'bob';\n"
            "END IF"
        ),
        None,
        bank_transfer,
    ),
    (
        "keywords in any case, comments of all three kinds, quoted names",
        "begin Transaction -- a line comment\n"
        '  let SRC = (select * from "bank".accounts where "id" = \'alice\' LIMIT 1); // another\n'
        "  LET dst = (SELECT * FROM bank.accounts WHERE id = 'bob'); /* a block\n comment */\n"
        "  IF src.balance >= 10 THEN\n"
        "    update bank.ACCOUNTS set BALANCE = src.balance - 10 where id = 'alice';\n"
        "    UPDATE bank.accounts SET balance = dst.balance + 10 WHERE id = 'bob';\n"
        "  end if\n"
        "commit transaction;",
        None,
        bank_transfer,
    ),
    (
        "a slice: range, ORDER BY against the table's order, LIMIT",
        txn(
            "LET r = (SELECT * FROM bank.ledger WHERE account = 'a' AND at >= 5 AND at < 10 "
            "ORDER BY at ASC, transfer DESC LIMIT 3);"
        ),
        None,
        _slice_reversed,
    ),
    (
        "a slice: clustering prefix then a range on the next column",
        txn(
            "LET r = (SELECT * FROM bank.ledger WHERE account = 'a' AND at = 7 "
            "AND transfer > 'm' ORDER BY at DESC LIMIT 2);"
        ),
        None,
        _slice_prefix,
    ),
    (
        "every condition form",
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = 'x');\n"
            "LET s = (SELECT * FROM bank.ledger WHERE account = 'x' LIMIT 1);\n"
            "IF a.balance = 1 AND a.balance != 2 AND a.balance < 3 AND a.balance <= 4 "
            "AND a.balance > 5 AND a.balance >= 6 AND a.tag IS NULL AND a.tag IS NOT NULL "
            "AND a IS NULL AND a IS NOT NULL AND EXISTS s AND NOT EXISTS s AND COUNT(s) >= 1 "
            "AND s.amount > a.balance - 3 AND 7 < a.tag THEN\n"
            "  UPDATE bank.accounts SET tag = s.balance WHERE id = 'x';\n"
            "END IF"
        ),
        None,
        _conditions,
    ),
    (
        "INSERT, UPDATE, DELETE of a row, prefix, range, partition and columns",
        txn(
            "INSERT INTO bank.accounts (id, balance, tag) VALUES ('k', 5, null) USING TTL 60;\n"
            "UPDATE bank.ledger SET amount = -2, memo = 'it''s' "
            "WHERE account = 'k' AND at = 3 AND transfer = 't';\n"
            "INSERT INTO bank.ledger (account, balance) VALUES ('k', 9);\n"
            "INSERT INTO shop.items (sku, region, qty, name, photo, active) "
            "VALUES (4, 'eu', 1, 'n', 0xCAFE, TRUE);\n"
            "DELETE FROM bank.ledger WHERE account = 'k' AND at = 3 AND transfer = 't';\n"
            "DELETE FROM bank.ledger WHERE account = 'k' AND at = 3;\n"
            "DELETE FROM bank.ledger WHERE account = 'k' AND at > 1 AND at <= 3;\n"
            "DELETE FROM bank.ledger WHERE account = 'k' AND at = 3 AND transfer >= 'a';\n"
            "DELETE FROM bank.accounts WHERE id = 'k';\n"
            "DELETE memo, amount FROM bank.ledger WHERE account = 'k' AND at = 4 "
            "AND transfer = 'u';"
        ),
        None,
        _writes,
    ),
    (
        "+=, -= and col = col + v read the row in a LET of their own",
        txn(
            "UPDATE bank.accounts SET balance += 5, tag -= 1 WHERE id = 'k';\n"
            "UPDATE bank.ledger SET amount = amount + 2 "
            "WHERE account = 'k' AND at = 1 AND transfer = 'x';"
        ),
        None,
        _increments,
    ),
    (
        "literals: strings, numbers, infinities, uuid, blob, booleans, null, collections",
        txn(
            "UPDATE bank.ledger SET memo = $$ 'raw' $$, "
            "amount = [1, -2.5, 3e-07, Infinity, -Infinity, null, true, false] "
            "WHERE account = 'k' AND at = -5 AND transfer = 'o''k';\n"
            "UPDATE bank.accounts SET balance = [[1, 2], ('a', 0x)], "
            "tag = {'k': {1}, 'j': {}} WHERE id = 123e4567-e89b-12d3-a456-426614174000;"
        ),
        None,
        _literals,
    ),
    (
        "positional markers everywhere a value goes",
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = ?);\n"
            "IF a.balance >= ? THEN\n"
            "  UPDATE bank.accounts USING TTL ? SET balance = a.balance - ? WHERE id = ?;\n"
            "  INSERT INTO bank.accounts (id, balance) VALUES (?, ?);\n"
            "END IF"
        ),
        ["alice", 10, 30, 10, "alice", "bob", 10],
        _markers,
    ),
    (
        "named markers, one name used twice",
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = :src);\n"
            "IF a.balance >= :amount THEN\n"
            "  UPDATE bank.accounts USING TTL :ttl SET balance = a.balance - :amount "
            "WHERE id = :src;\n"
            "  INSERT INTO bank.accounts (id, balance) VALUES (:dst, :amount);\n"
            "END IF"
        ),
        {"src": "alice", "dst": "bob", "amount": 10, "ttl": 30},
        _markers,
    ),
]


@pytest.mark.parametrize(
    ("text", "params", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_statement_form_equals_the_builder(
    text: str, params: object, expected: Callable[[], Transaction]
) -> None:
    bound = bind(text, params, EMBEDDED_TABLES)  # type: ignore[arg-type]
    assert bound.transaction == expected(), to_cql(bound.transaction, CATALOG)


def test_names_that_start_with_a_keyword_are_names() -> None:
    t = Transaction()
    letter = t.let("letter", "bank", "accounts", "a")
    nullx = t.let("nullx", "bank", "accounts", "b")
    t.where(letter["tag"] == nullx["tag"], letter["balance"].not_null())
    t.update("bank", "accounts", "a", tag=True)
    text = txn(
        "LET letter = (SELECT * FROM bank.accounts WHERE id = 'a');\n"
        "LET nullx = (SELECT * FROM bank.accounts WHERE id = 'b');\n"
        "IF letter.tag = nullx.tag AND letter.balance IS NOT NULL THEN\n"
        "  UPDATE bank.accounts SET tag = TRUE WHERE id = 'a';\n"
        "END IF"
    )
    assert bind(text, None, CATALOG).transaction == t
    # Where only a value may stand, a name that starts like one is reported whole.
    with pytest.raises(CqlSyntaxError) as raised:
        bind(txn("UPDATE bank.accounts SET tag = 1 WHERE id = truex;"), None, CATALOG)
    assert (raised.value.token, raised.value.column) == ("truex", 45), str(raised.value)


def test_nan_parses_to_nan() -> None:
    bound = bind(
        txn("UPDATE bank.accounts SET balance = NaN, tag = -nan WHERE id = 'k';"),
        None,
        CATALOG,
    )
    values = [a.value.literal.float64 for a in bound.transaction.request.mutations[0].upsert.set]
    assert all(math.isnan(v) for v in values)


def test_the_final_select_reads_the_result() -> None:
    bound = bind(
        txn(
            "LET src = (SELECT * FROM bank.accounts WHERE id = 'alice');\n"
            "LET s = (SELECT * FROM bank.ledger WHERE account = 'alice' LIMIT 1);\n"
            "SELECT src.balance, src.id, s.amount, s.at, s.balance;"
        ),
        None,
        CATALOG,
    )
    assert bound.columns == ["src.balance", "src.id", "s.amount", "s.at", "s.balance"]
    result = Result(
        "t",
        True,
        {"src": {"balance": 7, "tag": 1}, "s": {"balance": 70}},
        None,
        True,
        {"s": [{"at": 5, "transfer": "x", "amount": 3, "memo": None}]},
    )
    assert bound.result(result).rows == [(7, "alice", 3, 5, 70)]
    missing = Result("t", True, {"src": None, "s": None}, None, True, {"s": []})
    assert bound.result(missing).rows == [(None, None, None, None, None)]


def test_a_plain_select_returns_its_rows() -> None:
    single = bind(txn("SELECT balance, id FROM bank.accounts WHERE id = 'alice';"), None, CATALOG)
    assert single.columns == ["balance", "id"]
    found = Result("t", True, {"_select": {"balance": 4, "tag": 2}}, None, True)
    assert single.result(found).rows == [(4, "alice")]
    assert single.result(Result("t", True, {"_select": None}, None, True)).rows == []
    star = bind(txn("SELECT * FROM bank.ledger WHERE account = 'a' LIMIT 2;"), None, CATALOG)
    assert star.columns == ["account", "at", "transfer", "amount", "balance", "memo"]
    rows = Result(
        "t",
        True,
        {"_select": {"balance": 9}},
        None,
        True,
        {
            "_select": [
                {"at": 2, "transfer": "b", "amount": 1, "memo": "m"},
                {"at": 1, "transfer": "a", "amount": 2, "memo": None},
            ]
        },
    )
    assert star.result(rows).rows == [("a", 2, "b", 1, 9, "m"), ("a", 1, "a", 2, 9, None)]


SYNTAX_ERRORS = [
    # (text, line, column, offending token, a token that must be expected)
    (txn("LET x = (SELECT * FROM bank.accounts WHERE id = 'a')"), 3, 1, "COMMIT", "';'"),
    (
        "BEGIN TRANSACTION\n  UPDATE bank.accounts SET tag = 1 WHERE id = 'a'\nEND",
        3,
        1,
        "END",
        "';'",
    ),
    ("BEGIN TRANSACTION\n  LET = (SELECT", 2, 7, "=", "a name"),
    (
        "BEGIN TRANSACTION\n  UPDATE bank.accounts SET tag = 1 * 2 WHERE id = 'a';",
        2,
        36,
        "*",
        "'+'",
    ),
    (
        "BEGIN TRANSACTION\n  SELECT x.y;\n  IF x.y > 1 THEN\nCOMMIT TRANSACTION",
        4,
        1,
        "COMMIT",
        "'END'",
    ),
    (
        "BEGIN TRANSACTION\n  UPDATE bank.accounts SET tag = 1 WHERE id IN ('a');",
        2,
        45,
        "IN",
        "'='",
    ),
    ("BEGIN BATCH", 1, 7, "BATCH", "'TRANSACTION'"),
]


@pytest.mark.parametrize(("text", "line", "column", "token", "expected"), SYNTAX_ERRORS)
def test_syntax_errors_name_line_column_and_expected_tokens(
    text: str, line: int, column: int, token: str, expected: str
) -> None:
    with pytest.raises(CqlSyntaxError) as raised:
        bind(text, None, CATALOG)
    error = raised.value
    assert (error.line, error.column, error.token) == (line, column, token), str(error)
    assert expected in error.expected, str(error)
    assert str(error).startswith(f"line {line}:{column} ")


def test_end_of_input_and_stray_characters() -> None:
    with pytest.raises(CqlSyntaxError) as raised:
        bind("BEGIN TRANSACTION\n  UPDATE bank.accounts SET tag = 1 WHERE id = 'a';", None, CATALOG)
    assert raised.value.token is None
    assert (raised.value.line, raised.value.column) == (2, 51)
    assert "end of input" in str(raised.value) and "'COMMIT'" in raised.value.expected
    with pytest.raises(CqlSyntaxError) as stray:
        bind(txn("UPDATE bank.accounts SET tag = 1 # WHERE id = 'a';"), None, CATALOG)
    assert (stray.value.line, stray.value.column, stray.value.token) == (2, 34, "#")


REFUSED = [
    (txn("SELECT x.y;"), "unknown LET name 'x'"),
    (txn("UPDATE bank.accounts SET nope = 1 WHERE id = 'a';"), "unknown column 'nope'"),
    (txn("UPDATE bank.nope SET tag = 1 WHERE id = 'a';"), "unknown table bank.nope"),
    (txn("UPDATE accounts SET tag = 1 WHERE id = 'a';"), "name the keyspace"),
    (
        txn("UPDATE bank.accounts USING TIMESTAMP 5 SET tag = 1 WHERE id = 'a';"),
        "USING TIMESTAMP",
    ),
    (
        txn("UPDATE bank.accounts SET tag = 1 WHERE id = 'a' IF EXISTS;"),
        "a condition on one UPDATE",
    ),
    (
        txn("INSERT INTO bank.accounts (id, tag) VALUES ('a', 1) IF NOT EXISTS;"),
        "a condition on one INSERT",
    ),
    (txn("DELETE FROM bank.accounts USING TTL 3 WHERE id = 'a';"), "USING TTL on DELETE"),
    (txn("UPDATE bank.accounts SET tag = 1 WHERE tag = 1;"), "not a key column"),
    (txn("UPDATE bank.accounts SET tag = 1 WHERE id > 'a';"), "takes = only"),
    (txn("UPDATE bank.ledger SET amount = 1 WHERE account = 'a';"), "needs every clustering"),
    (txn("UPDATE bank.accounts SET id = 'b' WHERE id = 'a';"), "cannot SET key column"),
    (txn("UPDATE shop.items SET qty = 1 WHERE region = 'eu';"), "missing sku"),
    (
        txn("LET s = (SELECT * FROM bank.ledger WHERE account = 'a' AND transfer > 'x');"),
        "the range can only be on at",
    ),
    (
        txn("LET s = (SELECT * FROM bank.ledger WHERE account = 'a' ORDER BY transfer ASC);"),
        "ORDER BY must list",
    ),
    (
        txn(
            "LET s = (SELECT * FROM bank.ledger WHERE account = 'a' ORDER BY at ASC, transfer ASC);"
        ),
        "clustering order of bank.ledger or its reverse",
    ),
    (
        txn(
            "LET s = (SELECT * FROM bank.ledger WHERE account = 'a' LIMIT 5);\n"
            "IF s.amount > 1 THEN UPDATE bank.accounts SET tag = 1 WHERE id = 'a'; END IF"
        ),
        "needs LIMIT 1",
    ),
    (
        txn(
            "LET a = (SELECT tag FROM bank.accounts WHERE id = 'a');\n"
            "IF a.balance > 1 THEN UPDATE bank.accounts SET tag = 1 WHERE id = 'a'; END IF"
        ),
        "a.balance is not among them",
    ),
    (
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = 'a');\n"
            "IF a.id = 'a' THEN UPDATE bank.accounts SET tag = 1 WHERE id = 'a'; END IF"
        ),
        "a.id is a partition key column",
    ),
    (txn("LET \"_x\" = (SELECT * FROM bank.accounts WHERE id = 'a');"), "reserved"),
    (
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = 'a');\n"
            "LET A = (SELECT * FROM bank.accounts WHERE id = 'b');"
        ),
        "LET a is defined twice",
    ),
    (txn("UPDATE bank.accounts SET tag = ? WHERE id = 'a';"), "1 bind marker(s) but 0 value(s)"),
    (
        txn(
            "LET a = (SELECT * FROM bank.accounts WHERE id = 'a');\n"
            "UPDATE bank.accounts SET tag = [a.tag] WHERE id = 'a';"
        ),
        "an element of a list literal",
    ),
    (
        txn("LET a = (SELECT * FROM bank.accounts WHERE id = 'a' LIMIT 0);"),
        "LIMIT must be a positive",
    ),
    (txn("UPDATE bank.accounts USING TTL -1 SET tag = 1 WHERE id = 'a';"), "mismatched input '-'"),
    (txn("SELECT *;"), "SELECT * needs FROM"),
    (
        txn("IF 1 = 1 THEN UPDATE bank.accounts SET tag = 1 WHERE id = 'a'; END IF"),
        "both sides here are constants",
    ),
    (txn("DELETE memo FROM bank.ledger WHERE account = 'a' AND at = 1;"), "DELETE of columns"),
    (txn("UPDATE bank.accounts SET tag = 1 + tag WHERE id = 'a';"), "list prepend"),
    (txn("UPDATE bank.accounts SET tag = {street: 'x'} WHERE id = 'a';"), "a UDT literal"),
    (txn("UPDATE bank.accounts SET tag = 1h30m WHERE id = 'a';"), "token recognition error"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_refusals_name_the_construct(text: str, message: str) -> None:
    with pytest.raises(CqlError) as raised:
        bind(text, None, CATALOG)
    assert message in str(raised.value)


def test_binding_errors_name_the_marker() -> None:
    text = txn("UPDATE bank.accounts SET tag = :t WHERE id = :id;")
    with pytest.raises(CqlError, match="no value bound for :id"):
        bind(text, {"t": 1}, CATALOG)
    with pytest.raises(CqlError, match=r"no marker for: \['extra'\]"):
        bind(text, {"t": 1, "id": "a", "extra": 2}, CATALOG)
    with pytest.raises(CqlError, match="2 bind marker"):
        bind(text, [1], CATALOG)
    with pytest.raises(CqlError, match="cannot be bound by name"):
        bind(txn("UPDATE bank.accounts SET tag = ? WHERE id = 'a';"), {"x": 1}, CATALOG)
    decimal_text = txn("UPDATE bank.accounts SET tag = ? WHERE id = 'a';")
    with pytest.raises(CqlError, match="no client representation for Decimal"):
        bind(decimal_text, [decimal.Decimal(1)], CATALOG)
    prepared = prepare(text, CATALOG)
    assert [(m.index, m.name) for m in prepared.markers] == [(0, "t"), (1, "id")]
    first = prepared.bind({"t": 1, "id": "a"}).transaction
    second = prepared.bind([2, "b"]).transaction
    assert first != second
    assert first == Transaction().update("bank", "accounts", "a", tag=1)


def test_prepared_markers_name_the_columns_they_bind() -> None:
    prepared = prepare(
        txn(
            "LET a = (SELECT * FROM bank.ledger WHERE account = ? AND at >= ? LIMIT ?);\n"
            "IF a.amount > ? + 1 AND ? = a.memo THEN\n"
            "  UPDATE bank.accounts USING TTL ? SET balance = a.amount - ? WHERE id = ?;\n"
            "  INSERT INTO shop.items (region, sku, qty, photo) VALUES (?, ?, ?, [?]);\n"
            "END IF"
        ),
        CATALOG,
    )
    described = [
        None if c is None else (f"{c.keyspace}.{c.table}", c.name, c.cql_type)
        for c in prepared.bind_columns()
    ]
    assert described == [
        ("bank.ledger", "account", "text"),
        ("bank.ledger", "at", "bigint"),
        ("bank.ledger", "[limit]", "int"),
        ("bank.ledger", "amount", "bigint"),
        ("bank.ledger", "memo", "text"),
        ("bank.accounts", "[ttl]", "int"),
        ("bank.accounts", "balance", "bigint"),
        ("bank.accounts", "id", "text"),
        ("shop.items", "region", "text"),
        ("shop.items", "sku", "int"),
        ("shop.items", "qty", "int"),
        None,
    ]


# -- generated transactions: builder → text → parse gives the same transaction -------------

_NAMES = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True),
    st.sampled_from(
        ["Src", "select", "ttl", 'we"ird', "two words", "count", "letter", "truex", "ifx", "nan1"]
    ),
)
_INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    _INTS,
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=4),
)
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=6
)


@st.composite
def _transactions(draw: st.DrawFn) -> Transaction:
    t = Transaction()
    names = draw(st.lists(_NAMES, min_size=1, max_size=4, unique_by=str.lower))
    # Unquoted names fold to lower case, so generated names are what the text will say.
    names = list(dict.fromkeys(names))
    handles = []
    columns: list[tuple[object, str]] = []
    for name in names:
        kind = draw(st.sampled_from(["account", "ledger_row", "slice"]))
        if kind == "account":
            h = t.let(name, "bank", "accounts", draw(st.text(max_size=5)))
            columns += [(h, "balance"), (h, "tag")]
        elif kind == "ledger_row":
            h = t.let(name, "bank", "ledger", "a", (draw(_INTS), draw(st.text(max_size=3))))
            columns += [(h, "amount"), (h, "balance"), (h, "at")]
        else:
            bounds = draw(
                st.fixed_dictionaries({}, optional={"ge": _INTS, "lt": _INTS})
                | st.fixed_dictionaries({}, optional={"gt": _INTS, "le": _INTS})
            )
            limit = draw(st.sampled_from([None, 1, 2, 50]))
            h = t.let_slice(
                name,
                "bank",
                "ledger",
                draw(st.text(max_size=3)),
                (),
                column="at" if bounds else None,
                reversed=draw(st.booleans()),
                limit=limit,
                **bounds,
            )
            columns.append((h, "balance"))
            if limit == 1:
                columns.append((h, "memo"))
        handles.append(h)
    if draw(st.booleans()):  # a plain SELECT: its read follows the LETs, nothing names it
        if draw(st.booleans()):
            t.let(SELECT_LET, "bank", "accounts", draw(st.text(max_size=3)))
        else:
            t.let_slice(
                SELECT_LET, "bank", "ledger", "a", (), limit=draw(st.sampled_from([None, 2]))
            )

    def expression(depth: int = 0) -> object:
        choice = draw(st.integers(0, 3 if depth < 3 else 1))
        if choice == 0:
            h, c = draw(st.sampled_from(columns))
            return h[c]  # type: ignore[index]
        if choice == 1:
            return draw(_INTS)
        left, right = expression(depth + 1), expression(depth + 1)
        op = draw(st.sampled_from(["+", "-"]))
        return pb_binary(op, left, right)

    for _ in range(draw(st.integers(0, 4))):
        form = draw(st.integers(0, 4))
        h, c = draw(st.sampled_from(columns))
        ref = h[c]  # type: ignore[index]
        if form == 0:
            t.where(ref.is_null() if draw(st.booleans()) else ref.not_null())
        elif form == 1:
            op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]))
            t.where(pb.Condition(op=op, left=ref.proto, right=as_expr(expression())))
        elif form == 2:
            row = draw(st.sampled_from(handles))
            t.where(row.exists() if draw(st.booleans()) else row.not_exists())
        elif form == 3:
            t.where(draw(st.sampled_from(handles)).count() >= draw(_INTS))
        else:
            t.where(draw(st.sampled_from(handles)).is_null())
    # ``c += v`` reads its row in a LET of the parser's (``_row1``, … in order of first use,
    # one per row), made here as the parser makes it.
    increments: dict[tuple[str, object, tuple[object, ...]], str] = {}

    def increment() -> None:
        table, key, clustering, columns = draw(
            st.sampled_from(
                [
                    # Few keys, so that rows are updated twice and share their read.
                    ("accounts", draw(st.sampled_from(["k", "j'"])), (), ["balance", "tag"]),
                    ("ledger", "a", (draw(st.integers(0, 1)), "t"), ["amount", "balance"]),
                    ("ledger", draw(st.sampled_from(["a", ""])), (), ["balance"]),  # static
                ]
            )
        )
        hidden = increments.get((table, key, clustering))
        if hidden is None:
            hidden = increments[(table, key, clustering)] = f"_row{len(increments) + 1}"
            if table == "ledger" and not clustering:
                t.let_slice(hidden, "bank", table, key, (), limit=1)
            else:
                t.let(hidden, "bank", table, key, clustering)
        chosen = draw(st.lists(st.sampled_from(columns), min_size=1, unique=True))
        values = {
            c: pb_binary(draw(st.sampled_from(["+", "-"])), RowHandle(hidden)[c], expression())
            for c in chosen
        }
        t.update(
            "bank", table, key, clustering, ttl=draw(st.sampled_from([None, 5])), values=values
        )

    for _ in range(draw(st.integers(0, 5))):
        form = draw(st.integers(0, 6))
        if form >= 5:
            increment()
        elif form == 0:
            ttl = draw(st.sampled_from([None, 1, 3600]))
            t.update(
                "bank",
                "accounts",
                draw(st.text(max_size=4)),
                ttl=ttl,
                balance=expression(),
                tag=draw(_VALUES),
            )
        elif form == 1:
            t.update("bank", "ledger", "a", (draw(_INTS), "t"), memo=draw(st.text(max_size=4)))
        elif form == 2:
            t.delete("bank", "ledger", draw(st.text(max_size=3)), (draw(_INTS),))
        elif form == 3:
            t.delete_range("bank", "ledger", "a", (), column="at", gt=draw(_INTS))
        else:
            t.delete_partition("shop", "items", ("eu", draw(st.integers(-(2**31), 2**31 - 1))))
    return t


def as_expr(value: object) -> pb.Expr:
    from accord_cassandra.client import Expression
    from accord_cassandra.translate import value_to_proto

    if isinstance(value, Expression):
        return value.proto
    return pb.Expr(literal=value_to_proto(value))


def pb_binary(op: str, left: object, right: object) -> object:
    from accord_cassandra.client import Expression

    return Expression(
        pb.Expr(binary=pb.BinaryExpr(op=op, left=as_expr(left), right=as_expr(right)))
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_transactions())
def test_generated_transactions_print_and_parse_back_equal(transaction: Transaction) -> None:
    text = to_cql(transaction, CATALOG)
    assert bind(text, None, CATALOG).transaction == transaction, text
    for hidden in [e.name for e in transaction.request.lets if e.name.startswith(HIDDEN_PREFIX)]:
        assert hidden not in text, text


def test_the_parsers_own_reads_print_as_the_statements_that_make_them() -> None:
    text = txn(
        "LET a = (SELECT * FROM bank.accounts WHERE id = 'x');\n"
        "SELECT * FROM bank.ledger WHERE account = 'x' AND at > 3 LIMIT 2;\n"
        "UPDATE bank.accounts SET balance += a.balance, tag -= 1 WHERE id = 'k';\n"
        "UPDATE bank.ledger SET balance = balance + 2 WHERE account = 'k';\n"
        "UPDATE bank.accounts SET tag += 7 WHERE id = 'k';"
    )
    parsed = bind(text, None, CATALOG).transaction
    assert [e.name for e in parsed.request.lets] == ["a", SELECT_LET, "_row1", "_row2"]
    printed = to_cql(parsed, CATALOG)
    assert "_row" not in printed and SELECT_LET not in printed, printed
    assert "SELECT * FROM bank.ledger WHERE account = 'x' AND at > 3 LIMIT 2;" in printed
    assert "SET balance += a.balance, tag -= 1 WHERE id = 'k'" in printed
    assert bind(printed, None, CATALOG).transaction == parsed
    assert to_cql(_increments(), CATALOG).count("+=") == 2


def _hand_built(mutate: Callable[[Transaction], None]) -> Transaction:
    t = Transaction()
    t.let("a", "bank", "accounts", "x")
    mutate(t)
    return t


def _read_by_name(t: Transaction) -> None:
    row = t.let("_row1", "bank", "accounts", "k")
    t.update("bank", "accounts", "k", balance=row["balance"] + 1)
    t.where(row["tag"].is_null())


def _numbered_out_of_order(t: Transaction) -> None:
    row = t.let("_row2", "bank", "accounts", "k")
    t.update("bank", "accounts", "k", balance=row["balance"] + 1)


def _another_rows_read(t: Transaction) -> None:
    row = t.let("_row1", "bank", "accounts", "j")
    t.update("bank", "accounts", "k", balance=row["balance"] + 1)


def _let_after_a_read(t: Transaction) -> None:
    row = t.let("_row1", "bank", "accounts", "k")
    t.update("bank", "accounts", "k", balance=row["balance"] + 1)
    t.let("b", "bank", "accounts", "y")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.let("_mine", "bank", "accounts", "k"), r"'_mine' has no text form"),
        (_read_by_name, r"'_row1' has no text form: .* it is read by name"),
        (_numbered_out_of_order, r"'_row2' has no text form: .* would read this row as '_row1'"),
        (_another_rows_read, r"'_row1' has no text form: .* not the read of a row that \+="),
        (_let_after_a_read, r"LET 'b' has no text form here: it follows '_row1'"),
    ],
    ids=["unused", "read by name", "numbering", "another row", "order"],
)
def test_underscore_lets_the_parser_would_not_add_are_refused_naming_them(
    mutate: Callable[[Transaction], None], message: str
) -> None:
    with pytest.raises(CqlError, match=message):
        to_cql(_hand_built(mutate), CATALOG)


def test_a_plain_select_and_returning_do_not_print_together() -> None:
    t = Transaction()
    t.let("a", "bank", "accounts", "x")
    t.let(SELECT_LET, "bank", "accounts", "y")
    with pytest.raises(CqlError, match="has one SELECT"):
        to_cql(t, CATALOG, returning=[("a", "balance")])
    with pytest.raises(CqlError, match="'_select' has no text form"):
        to_cql(t, CATALOG, returning=[(SELECT_LET, "balance")])


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE bank.accounts SET balance += 1 WHERE id = 'k';\n"
        "UPDATE bank.accounts SET tag = \"_row1\".tag WHERE id = 'j';",
        "SELECT * FROM bank.accounts WHERE id = 'k';\nIF EXISTS \"_select\" THEN END IF",
    ],
    ids=["value", "exists"],
)
def test_text_cannot_name_the_parsers_own_reads(statement: str) -> None:
    with pytest.raises(CqlError, match=r"reserved for the reads the parser adds; the text cannot"):
        bind(txn(statement), None, CATALOG)
