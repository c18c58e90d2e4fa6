"""translate.py: client requests become Accord transactions, and results become responses.

Two halves. Every mistake a client can make is refused before the protocol sees it, with a
message naming the culprit (table-driven). And for random *valid* transactions built with the
client's builder, the translated transaction, executed by accord's own ``execute``, does what
an independent model of the client API says it should, and ``to_response`` shows the rows it
read.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord import Key, TxnResult
from accord.primitives.txn import execute
from accord_cassandra.client import Expression, Result, RowHandle, Transaction
from accord_cassandra.schema import INT_TYPES, Catalog
from accord_cassandra.translate import (
    MAX_EXPR_DEPTH,
    MAX_REQUEST_BYTES,
    RequestError,
    to_response,
    to_txn,
    value_from_proto,
)
from accord_cassandra.v1 import client_pb2 as pb

CATALOG = Catalog.from_mapping(
    {
        "bank.accounts": {
            "partition_key": [["id", "text"]],
            "columns": [["balance", "bigint"], ["tag", "bigint"]],
        },
        "shop.items": {
            "partition_key": [["region", "text"], ["sku", "int"]],
            "columns": [
                ["qty", "int"],
                ["name", "text"],
                ["code", "ascii"],
                ["photo", "blob"],
                ["active", "boolean"],
                ["ref", "uuid"],
                ["small", "tinyint"],
                ["seen", "timeuuid"],
            ],
        },
    }
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def translate_error(request: pb.TransactRequest | Transaction) -> str:
    proto = request.request if isinstance(request, Transaction) else request
    with pytest.raises(RequestError) as caught:
        to_txn(proto, CATALOG)
    return str(caught.value)


# ---------------------------------------------------------------------------- errors


def _t() -> Transaction:
    return Transaction()


def _let_alice(t: Transaction) -> RowHandle:
    return t.let("src", "bank", "accounts", "alice")


def _unknown_keyspace() -> Transaction:
    t = _t()
    t.let("x", "nope", "accounts", "alice")
    return t


def _unknown_table() -> Transaction:
    t = _t()
    t.let("x", "bank", "vaults", "alice")
    return t


def _unknown_column_read() -> Transaction:
    t = _t()
    src = _let_alice(t)
    return t.where(src["colour"] == 1)


def _unknown_column_write() -> Transaction:
    return _t().update("bank", "accounts", "alice", colour=1)


def _unknown_let() -> Transaction:
    t = _t()
    _let_alice(t)
    return t.where(RowHandle("ghost")["balance"] > 1)


def _literal_wrong_type_set() -> Transaction:
    return _t().update("bank", "accounts", "alice", balance="ten")


def _literal_wrong_type_condition() -> Transaction:
    t = _t()
    src = _let_alice(t)
    return t.where(src["balance"] >= "ten")


def _literal_wrong_type_condition_reversed() -> Transaction:
    # The literal on the left, the column on the right: still checked against the column.
    t = _t()
    src = _let_alice(t)
    return t.where(Expression(pb.Expr(literal=pb.Value(text="ten"))) < src["balance"])


def _key_wrong_type() -> Transaction:
    return _t().update("bank", "accounts", 42, balance=1)


def _key_wrong_arity() -> Transaction:
    return _t().update("shop", "items", "eu", qty=1)


def _key_null() -> Transaction:
    return _t().update("bank", "accounts", None, balance=1)


def _int_out_of_range() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), small=300)


def _ascii_non_ascii() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), code="ключ")


def _bad_uuid() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), ref="not-a-uuid")


def _random_uuid_as_timeuuid() -> Transaction:
    # Cassandra refuses a version-4 UUID in a timeuuid column; the write would fail forever.
    return _t().update("shop", "items", ("eu", 1), seen=str(uuid.uuid4()))


def _bool_as_int() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), qty=True)


def _row_mutated_twice() -> Transaction:
    return _t().update("bank", "accounts", "alice", balance=1).delete("bank", "accounts", "alice")


def _set_twice() -> pb.TransactRequest:
    value = pb.Expr(literal=pb.Value(int=1))
    return pb.TransactRequest(
        mutations=[
            pb.Mutation(
                row=_alice_ref(),
                upsert=pb.Upsert(
                    set=[
                        pb.Assignment(column="balance", value=value),
                        pb.Assignment(column="balance", value=value),
                    ]
                ),
            )
        ]
    )


def _set_partition_key() -> Transaction:
    return _t().update("bank", "accounts", "alice", id="bob")


def _empty_upsert() -> Transaction:
    return _t().update("bank", "accounts", "alice")


def _neither_upsert_nor_delete() -> pb.TransactRequest:
    return pb.TransactRequest(mutations=[pb.Mutation(row=_alice_ref())])


def _alice_ref() -> pb.RowRef:
    return pb.RowRef(keyspace="bank", table="accounts", partition_key=[pb.Value(text="alice")])


def _empty_txn() -> Transaction:
    return _t()


def _let_without_name() -> pb.TransactRequest:
    return pb.TransactRequest(lets=[pb.Let(name="", row=_alice_ref())])


def _let_twice() -> Transaction:
    t = _t()
    t.let("x", "bank", "accounts", "alice")
    t.let("x", "bank", "accounts", "bob")
    return t


def _row_without_table() -> pb.TransactRequest:
    return pb.TransactRequest(lets=[pb.Let(name="x", row=pb.RowRef(keyspace="bank"))])


def _unknown_comparison() -> pb.TransactRequest:
    left = pb.Expr(column=pb.ColumnRef(let="src", column="balance"))
    return pb.TransactRequest(
        lets=[pb.Let(name="src", row=_alice_ref())],
        conditions=[pb.Condition(op="~", left=left, right=left)],
    )


def _is_null_with_right() -> pb.TransactRequest:
    left = pb.Expr(column=pb.ColumnRef(let="src", column="balance"))
    return pb.TransactRequest(
        lets=[pb.Let(name="src", row=_alice_ref())],
        conditions=[pb.Condition(op="is_null", left=left, right=left)],
    )


def _compare_without_right() -> pb.TransactRequest:
    left = pb.Expr(column=pb.ColumnRef(let="src", column="balance"))
    return pb.TransactRequest(
        lets=[pb.Let(name="src", row=_alice_ref())],
        conditions=[pb.Condition(op="<", left=left)],
    )


def _unknown_operator() -> pb.TransactRequest:
    column = pb.Expr(column=pb.ColumnRef(let="src", column="balance"))
    times = pb.Expr(binary=pb.BinaryExpr(op="*", left=column, right=column))
    return pb.TransactRequest(
        lets=[pb.Let(name="src", row=_alice_ref())],
        mutations=[
            pb.Mutation(
                row=_alice_ref(),
                upsert=pb.Upsert(set=[pb.Assignment(column="balance", value=times)]),
            )
        ],
    )


def _arithmetic_on_text() -> Transaction:
    # "+" on text would only fail at execution, after commit; refuse it up front.
    t = _t()
    item = t.let("item", "shop", "items", ("eu", 1))
    return t.update("shop", "items", ("eu", 1), name=item["name"] + "!")


def _arithmetic_on_text_literals() -> Transaction:
    plus = Expression(pb.Expr(literal=pb.Value(text="a"))) + "b"
    return _t().update("shop", "items", ("eu", 1), name=plus)


def _text_into_ascii() -> Transaction:
    # A text column may hold what an ascii column cannot: Cassandra would refuse the write.
    t = _t()
    item = t.let("item", "shop", "items", ("eu", 1))
    return t.update("shop", "items", ("eu", 2), code=item["name"])


def _int_into_text() -> Transaction:
    t = _t()
    src = _let_alice(t)
    return t.update("shop", "items", ("eu", 1), name=src["balance"])


def _too_deep() -> Transaction:
    t = _t()
    src = _let_alice(t)
    expr = src["balance"]
    for _ in range(MAX_EXPR_DEPTH + 1):
        expr = expr + 1
    return t.update("bank", "accounts", "alice", balance=expr)


def _empty_expression() -> pb.TransactRequest:
    return pb.TransactRequest(
        mutations=[
            pb.Mutation(
                row=_alice_ref(),
                upsert=pb.Upsert(set=[pb.Assignment(column="balance", value=pb.Expr())]),
            )
        ]
    )


def _too_many_lets() -> Transaction:
    t = _t()
    for i in range(65):
        t.let(f"l{i}", "bank", "accounts", f"a{i}")
    return t


def _oversize() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), photo=b"x" * (MAX_REQUEST_BYTES + 1))


def _oversize_value() -> Transaction:
    return _t().update("shop", "items", ("eu", 1), photo=b"x" * (64 * 1024 + 1))


def _oversize_partition_key() -> Transaction:
    # Cassandra's partition keys are at most 65535 bytes; a longer one could never be written.
    return _t().update("bank", "accounts", "k" * 65536, balance=1)


ERROR_CASES: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
    ("unknown keyspace", _unknown_keyspace, ("unknown keyspace", "'nope'")),
    ("unknown table", _unknown_table, ("unknown table", "bank.vaults")),
    ("unknown column read", _unknown_column_read, ("unknown column", "'colour'", "bank.accounts")),
    ("unknown column write", _unknown_column_write, ("unknown column", "'colour'")),
    ("unknown LET", _unknown_let, ("unknown LET name", "'ghost'")),
    ("literal type in SET", _literal_wrong_type_set, ("bank.accounts.balance", "bigint", "'ten'")),
    ("literal type in IF", _literal_wrong_type_condition, ("src.balance", "bigint", "'ten'")),
    ("literal type in IF (lhs)", _literal_wrong_type_condition_reversed, ("bigint", "'ten'")),
    ("key type", _key_wrong_type, ("bank.accounts.id", "text", "42")),
    ("key arity", _key_wrong_arity, ("shop.items", "2 partition key column", "1 value")),
    ("key null", _key_null, ("bank.accounts.id", "null")),
    ("int range", _int_out_of_range, ("shop.items.small", "tinyint", "300")),
    ("ascii", _ascii_non_ascii, ("shop.items.code", "ascii")),
    ("uuid", _bad_uuid, ("shop.items.ref", "'not-a-uuid'")),
    ("timeuuid version", _random_uuid_as_timeuuid, ("shop.items.seen", "timeuuid")),
    ("bool is not int", _bool_as_int, ("shop.items.qty", "int", "bool")),
    ("row mutated twice", _row_mutated_twice, ("mutation 1", "bank.accounts", "'alice'", "twice")),
    ("column set twice", _set_twice, ("bank.accounts.balance", "set twice")),
    ("partition key set", _set_partition_key, ("bank.accounts.id", "partition key")),
    ("empty upsert", _empty_upsert, ("mutation 0", "at least one column")),
    ("neither", _neither_upsert_nor_delete, ("mutation 0", "neither upsert nor delete")),
    ("empty txn", _empty_txn, ("must read (LET) or write",)),
    ("LET without name", _let_without_name, ("LET needs a name",)),
    ("LET twice", _let_twice, ("LET name 'x'", "twice")),
    ("row without table", _row_without_table, ("keyspace and a table",)),
    ("unknown comparison", _unknown_comparison, ("condition 0", "'~'")),
    ("is_null with rhs", _is_null_with_right, ("condition 0", "is_null", "no right-hand side")),
    ("< without rhs", _compare_without_right, ("condition 0", "<", "needs a right-hand side")),
    ("unknown operator", _unknown_operator, ("'*'",)),
    ("+ on text", _arithmetic_on_text, ("shop.items.name", "text", "+")),
    ("+ on text literals", _arithmetic_on_text_literals, ("shop.items.name", "+")),
    ("text into ascii", _text_into_ascii, ("shop.items.code", "ascii", "text")),
    ("int into text", _int_into_text, ("shop.items.name", "text", "bigint")),
    ("too deep", _too_deep, (f"deeper than {MAX_EXPR_DEPTH}",)),
    ("empty expression", _empty_expression, ("empty expression",)),
    ("too many LETs", _too_many_lets, ("65 LETs", "64")),
    ("oversize request", _oversize, (f"exceeds {MAX_REQUEST_BYTES}",)),
    ("oversize value", _oversize_value, ("shop.items.photo", "65536 bytes")),
    ("oversize partition key", _oversize_partition_key, ("bank.accounts", "65535 bytes")),
]


@pytest.mark.parametrize(
    ("build", "expected"),
    [pytest.param(build, expected, id=name) for name, build, expected in ERROR_CASES],
)
def test_bad_requests_are_refused_naming_the_culprit(
    build: Callable[[], Any], expected: tuple[str, ...]
) -> None:
    message = translate_error(build())
    for fragment in expected:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


# ---------------------------------------------------------------------------- shapes


def test_transfer_translates_to_reads_condition_and_puts() -> None:
    t = Transaction()
    src = t.let("src", "bank", "accounts", "alice")
    dst = t.let("dst", "bank", "accounts", "bob")
    t.where(src["balance"] >= 10)
    t.update("bank", "accounts", "alice", balance=src["balance"] - 10)
    t.update("bank", "accounts", "bob", balance=dst["balance"] + 10)
    txn, lets, _, _ = to_txn(t.request, CATALOG)
    accounts = CATALOG.table("bank", "accounts")
    alice, bob = accounts.key(["alice"]), accounts.key(["bob"])
    assert lets == {"src": alice, "dst": bob}
    assert set(txn.reads) == {alice, bob}
    assert txn.update is not None and len(txn.update.condition) >= 1
    assert {w.key for w in txn.update.writes} == {alice, bob}
    writes, result = execute(txn, {alice: (100, 1), bob: (5, 2)})
    assert result.applied and result.error is None
    # Unassigned columns (tag) keep their value.
    assert {w.key: w.value for w in writes} == {alice: (90, 1), bob: (15, 2)}
    writes, result = execute(txn, {alice: (3, 1), bob: (5, 2)})
    assert not result.applied and writes == ()


def test_keys_are_cassandra_partitions() -> None:
    items = CATALOG.table("shop", "items")
    key = items.key(["eu", 7])
    assert key.name.startswith("shop.items:")
    # Same partition, same key; different partition, different key.
    assert items.key(["eu", 7]) == key
    assert items.key(["eu", 8]) != key


def test_delete_and_blind_upsert_need_no_read() -> None:
    t = Transaction().delete("bank", "accounts", "alice")
    t.update("bank", "accounts", "bob", balance=1, tag=2)
    txn, lets, _, _ = to_txn(t.request, CATALOG)
    assert lets == {}
    assert txn.reads == () and txn.read_keys == ()
    assert len(txn.write_keys) == 2


def test_computed_value_outside_a_narrow_column_fails_instead_of_writing() -> None:
    # Arithmetic is checked against int64 by accord; a tinyint column needs its own range,
    # or every replica would retry a write Cassandra refuses, forever.
    t = Transaction()
    item = t.let("item", "shop", "items", ("eu", 1))
    t.update("shop", "items", ("eu", 1), small=item["small"] + 1)
    t.update("shop", "items", ("eu", 2), small=item["small"] - 1)
    txn, lets, checked, _ = to_txn(t.request, CATALOG)
    assert checked == ("shop.items.small (tinyint)", "shop.items.small (tinyint)")
    key = lets["item"]
    for small, fits in [(126, True), (127, False), (-127, True), (-128, False), (0, True)]:
        row = [None] * 8
        row[6] = small
        writes, result = execute(txn, {key: tuple(row)})
        assert result.applied == fits, small
        if fits:
            assert sorted(w.value[6] for w in writes) == [small - 1, small + 1]  # type: ignore[index]
            continue
        assert writes == ()
        response = to_response("1:1:1:1", result, lets, CATALOG, range_checked=checked)
        assert "shop.items.small (tinyint)" in response.error


def test_a_failed_client_condition_is_not_an_error_even_with_range_guards() -> None:
    t = Transaction()
    item = t.let("item", "shop", "items", ("eu", 1))
    t.where(item["qty"] > 5)
    t.update("shop", "items", ("eu", 1), small=item["small"] + 1)
    txn, lets, _, _ = to_txn(t.request, CATALOG)
    row = (1, None, None, None, None, None, 127, None)
    writes, result = execute(txn, {lets["item"]: row})
    assert (writes, result.applied, result.error) == ((), False, None)


def test_a_wider_integer_column_cannot_be_copied_into_a_narrower_one() -> None:
    t = Transaction()
    src = t.let("src", "bank", "accounts", "alice")
    t.update("shop", "items", ("eu", 1), qty=src["balance"])
    message = translate_error(t)
    assert "shop.items.qty is int" in message and "src.balance" in message
    # The other way round always fits.
    t = Transaction()
    item = t.let("item", "shop", "items", ("eu", 1))
    t.update("bank", "accounts", "alice", balance=item["qty"])
    to_txn(t.request, CATALOG)


def test_comparing_columns_of_different_types_is_refused() -> None:
    t = Transaction()
    src = t.let("src", "bank", "accounts", "alice")
    item = t.let("item", "shop", "items", ("eu", 1))
    t.where(src["balance"] == item["name"])
    message = translate_error(t)
    assert "src.balance" in message and "bigint" in message and "item.name" in message


def test_to_response_names_rows_and_columns() -> None:
    t = Transaction()
    t.let("a", "bank", "accounts", "alice")
    t.let("z", "bank", "accounts", "zed")
    _, lets, _, _ = to_txn(t.request, CATALOG)
    result = TxnResult(((lets["a"], (7, 9)), (lets["z"], None)), applied=True)
    response = Result.from_proto(to_response("1:2:0:3", result, lets, CATALOG))
    assert response.rows == {"a": {"balance": 7, "tag": 9}, "z": None}
    assert response.applied and response.error is None and response.txn_id == "1:2:0:3"


# ---------------------------------------------------------------------------- the model


COLUMN_VALUES: dict[str, st.SearchStrategy[object]] = {
    "bigint": st.one_of(
        st.integers(-5, 5), st.integers(INT64_MIN, INT64_MAX), st.sampled_from([0])
    ),
    "int": st.one_of(st.integers(-5, 5), st.integers(-(2**31), 2**31 - 1)),
    "tinyint": st.integers(-128, 127),
    "text": st.text(max_size=4),
    "ascii": st.text(alphabet="abcXYZ01 ", max_size=4),
    "blob": st.binary(max_size=4),
    "boolean": st.booleans(),
    "uuid": st.uuids().map(str),
    "timeuuid": st.uuids(version=1).map(str),
}
ROWS: list[tuple[str, str, tuple[object, ...]]] = [
    ("bank", "accounts", ("alice",)),
    ("bank", "accounts", ("bob",)),
    ("bank", "accounts", ("ключ",)),
    ("shop", "items", ("eu", 1)),
    ("shop", "items", ("us", -2)),
]
COMPARISONS = ["=", "!=", "<", "<=", ">", ">=", "is_null", "not_null"]


class EvalError(Exception):
    """The model's deterministic execution error (the result has an error, no writes)."""


@dataclass
class ModelTxn:
    lets: dict[str, int]  # LET name -> index into ROWS
    conditions: list[tuple[str, tuple[Any, ...], tuple[Any, ...] | None]]
    mutations: list[tuple[int, dict[str, tuple[Any, ...]] | None]]  # None: delete


def table_of(row: int) -> Any:
    keyspace, table, _ = ROWS[row]
    return CATALOG.table(keyspace, table)


def key_of(row: int) -> Key:
    return table_of(row).key(list(ROWS[row][2]))


@st.composite
def states(draw: st.DrawFn) -> dict[int, tuple[object, ...] | None]:
    state: dict[int, tuple[object, ...] | None] = {}
    for index in range(len(ROWS)):
        if draw(st.booleans()):
            state[index] = None
            continue
        columns = table_of(index).columns
        # Mostly non-null cells, so that arithmetic and comparisons get past None.
        state[index] = tuple(
            None if draw(st.integers(0, 5)) == 0 else draw(COLUMN_VALUES[cql_type])
            for _, cql_type in columns
        )
    return state


def _int_columns(lets: dict[str, int]) -> list[tuple[str, str, str]]:
    return [
        (name, column, cql_type)
        for name, row in lets.items()
        for column, cql_type in table_of(row).columns
        if cql_type in INT_TYPES
    ]


@st.composite
def expressions(draw: st.DrawFn, lets: dict[str, int], cql_type: str) -> tuple[Any, ...]:
    """An expression whose static type is ``cql_type``'s: a literal, a column of the same
    type, or (integers) a sum/difference of integer columns and literals."""
    same = [
        (name, column)
        for name, row in lets.items()
        for column, other in table_of(row).columns
        if other == cql_type
    ]
    choices = ["literal"]
    if same:
        choices.append("column")
    ints = _int_columns(lets)
    if cql_type in INT_TYPES and ints:
        choices += ["binary", "binary"]
    kind = draw(st.sampled_from(choices))
    if kind == "literal":
        return ("literal", draw(st.none() | COLUMN_VALUES[cql_type]))
    if kind == "column":
        return ("column", *draw(st.sampled_from(same)))
    name, column, _ = draw(st.sampled_from(ints))
    right = draw(
        st.one_of(
            st.tuples(st.just("literal"), COLUMN_VALUES[cql_type]),
            st.sampled_from(ints).map(lambda c: ("column", c[0], c[1])),
        )
    )
    return ("binary", draw(st.sampled_from("+-")), ("column", name, column), right)


@st.composite
def model_txns(draw: st.DrawFn) -> ModelTxn:
    let_rows = draw(st.lists(st.integers(0, len(ROWS) - 1), unique=True, max_size=3))
    lets = {f"l{i}": row for i, row in enumerate(let_rows)}
    conditions: list[tuple[str, tuple[Any, ...], tuple[Any, ...] | None]] = []
    for _ in range(draw(st.integers(0, 2)) if lets else 0):
        name = draw(st.sampled_from(sorted(lets)))
        column, cql_type = draw(st.sampled_from(table_of(lets[name]).columns))
        op = draw(st.sampled_from(COMPARISONS))
        right = None if op in ("is_null", "not_null") else draw(expressions(lets, cql_type))
        conditions.append((op, ("column", name, column), right))
    mutations: list[tuple[int, dict[str, tuple[Any, ...]] | None]] = []
    for row in draw(st.lists(st.integers(0, len(ROWS) - 1), unique=True, max_size=3)):
        if draw(st.integers(0, 3)) == 0:
            mutations.append((row, None))
            continue
        columns = table_of(row).columns
        chosen = draw(st.lists(st.sampled_from(columns), unique=True, min_size=1, max_size=3))
        mutations.append(
            (row, {column: draw(expressions(lets, cql_type)) for column, cql_type in chosen})
        )
    if not lets and not mutations:
        mutations.append((0, {"balance": ("literal", 1)}))
    return ModelTxn(lets, conditions, mutations)


def to_builder(model: ModelTxn) -> Transaction:
    t = Transaction()
    handles = {
        name: t.let(name, *ROWS[row][:2], list(ROWS[row][2])) for name, row in model.lets.items()
    }

    def build(expr: tuple[Any, ...]) -> Any:
        if expr[0] == "literal":
            return Expression(pb.Expr(literal=_literal(expr[1])))
        if expr[0] == "column":
            return handles[expr[1]][expr[2]]
        left, right = build(expr[2]), build(expr[3])
        return left + right if expr[1] == "+" else left - right

    for op, left, right in model.conditions:
        lhs = build(left)
        if op == "is_null":
            t.where(lhs.is_null())
        elif op == "not_null":
            t.where(lhs.not_null())
        else:
            t.where(pb.Condition(op=op, left=lhs.proto, right=build(right).proto))  # type: ignore[arg-type]
    for row, assignments in model.mutations:
        keyspace, table, key = ROWS[row]
        if assignments is None:
            t.delete(keyspace, table, list(key))
        else:
            t.update(keyspace, table, list(key), **{c: build(e) for c, e in assignments.items()})
    return t


def _literal(value: object) -> pb.Value:
    from accord_cassandra.translate import value_to_proto

    return value_to_proto(value)


def run_model(
    model: ModelTxn, state: dict[int, tuple[object, ...] | None]
) -> tuple[dict[Key, tuple[object, bool]], bool, bool]:
    """What the client API promises: ``(writes {key: (row, delete)}, applied, errored)``."""

    def value(expr: tuple[Any, ...]) -> object:
        if expr[0] == "literal":
            return expr[1]
        if expr[0] == "column":
            row = state[model.lets[expr[1]]]
            table = table_of(model.lets[expr[1]])
            return None if row is None else row[table.column_index(expr[2])]
        left, right = value(expr[2]), value(expr[3])
        if not _is_int(left) or not _is_int(right):
            raise EvalError
        assert isinstance(left, int) and isinstance(right, int)
        result = left + right if expr[1] == "+" else left - right
        if not INT64_MIN <= result <= INT64_MAX:
            raise EvalError
        return result

    def holds(op: str, left: object, right: object) -> bool:
        if op == "is_null":
            return left is None
        if op == "not_null":
            return left is not None
        equal = type(left) is type(right) and left == right
        if op == "=":
            return equal
        if op == "!=":
            return not equal
        if left is None or right is None or type(left) is not type(right):
            raise EvalError
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[  # type: ignore[operator]
            op
        ]

    try:
        for op, left, right in model.conditions:
            if not holds(op, value(left), None if right is None else value(right)):
                return {}, False, False
        writes: dict[Key, tuple[object, bool]] = {}
        for row, assignments in model.mutations:
            if assignments is None:
                writes[key_of(row)] = (None, True)
                continue
            table = table_of(row)
            current = state[row]
            cells = list(current) if current is not None else [None] * len(table.columns)
            for column, expr in assignments.items():
                cell = value(expr)
                cql_type = table.column_type(column)
                if cql_type in INT_TYPES and cell is not None:
                    bits = INT_TYPES[cql_type]
                    if not -(2 ** (bits - 1)) <= cell < 2 ** (bits - 1):  # type: ignore[operator]
                        raise EvalError  # outside the column's range: nothing is written
                cells[table.column_index(column)] = cell
            writes[key_of(row)] = (tuple(cells), False)
    except EvalError:
        return {}, False, True
    return writes, True, False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=model_txns(), state=states())
def test_random_builder_transactions_do_what_the_model_says(
    model: ModelTxn, state: dict[int, tuple[object, ...] | None]
) -> None:
    txn, lets, _, _ = to_txn(to_builder(model).request, CATALOG)
    assert lets == {name: key_of(row) for name, row in model.lets.items()}
    values = {key_of(row): state[row] for row in range(len(ROWS))}
    writes, result = execute(txn, {k: values[k] for k in txn.read_keys})
    expected_writes, applied, errored = run_model(model, state)
    assert result.applied == applied
    assert (result.error is not None) == errored
    assert {w.key: (None if w.delete else w.value, w.delete) for w in writes} == expected_writes
    # The response reflects exactly the LET rows, as read.
    response = to_response("1:1:1:1", result, lets, CATALOG)
    assert [row.let for row in response.rows] == sorted(model.lets)
    for row in response.rows:
        index = model.lets[row.let]
        read = state[index]
        assert row.exists == (read is not None)
        if read is not None:
            names = [c for c, _ in table_of(index).columns]
            assert [c.name for c in row.columns] == names
            got = [value_from_proto(c.value) for c in row.columns]
            assert [(type(v), v) for v in got] == [(type(v), v) for v in read]


def test_comparing_literals_of_different_types_is_refused() -> None:
    # Before: accepted, and the comparison failed only at execution, after consensus.
    def literal_condition(op: str, left: pb.Value, right: pb.Value) -> Transaction:
        t = Transaction()
        t.let("src", "bank", "accounts", "alice")
        t.where(pb.Condition(op=op, left=pb.Expr(literal=left), right=pb.Expr(literal=right)))
        return t

    for op in ("<", "="):
        message = translate_error(literal_condition(op, pb.Value(int=1), pb.Value(text="a")))
        assert "cannot compare bigint with text" in message and "'a'" in message
    same = literal_condition("<", pb.Value(int=1), pb.Value(int=2))
    txn, lets, _, _ = to_txn(same.request, CATALOG)
    _, result = execute(txn, {lets["src"]: (5, 0)})
    assert result.applied and result.error is None
