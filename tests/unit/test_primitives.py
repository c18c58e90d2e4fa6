"""Properties of the protocol's values: timestamps, the HLC, deps, transactions, execute."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import deps, keys, timestamps, txns, values

from accord.codec import MAX_VALUE_DEPTH, encode_message
from accord.invariants import InvalidTransaction
from accord.messages import ReadOk
from accord.primitives import (
    EMPTY_DEPS,
    TIMESTAMP_MIN,
    TOKEN_MAX,
    TOKEN_MIN,
    BinOp,
    Const,
    CountOf,
    Delete,
    Deps,
    Expr,
    Hlc,
    Item,
    Key,
    Kind,
    MakeTuple,
    Predicate,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    Route,
    RowOf,
    SliceOf,
    StaticOf,
    Status,
    Timestamp,
    TokenRange,
    Txn,
    TxnResult,
    Update,
    Value,
    WriteOp,
    execute,
    merge_max,
    sim_key,
)

small_ts = timestamps(small=True)
small_deps = deps(keys(small=True), small_ts)

# ---------------------------------------------------------------------------- Timestamp


def fields(ts: Timestamp) -> tuple[int, int, int, int]:
    return (ts.epoch, ts.hlc, ts.flags, ts.node)


@given(small_ts, small_ts)
def test_timestamp_order_is_total_and_is_epoch_hlc_flags_node(a: Timestamp, b: Timestamp) -> None:
    # Reference: accord.md §1 "Ordering" (epoch first, then hlc, flags, node).
    assert [a < b, a == b, a > b].count(True) == 1
    assert (a < b) == (fields(a) < fields(b))
    assert (a == b) == (fields(a) == fields(b))
    assert (a == b) <= (hash(a) == hash(b))


@given(small_ts, small_ts, small_ts)
def test_timestamp_order_is_transitive_and_antisymmetric(
    a: Timestamp, b: Timestamp, c: Timestamp
) -> None:
    if a <= b and b <= c:
        assert a <= c
    if a <= b and b <= a:
        assert a == b


@given(timestamps())
def test_timestamp_text_round_trips_and_kind_is_the_low_flag_bit(ts: Timestamp) -> None:
    assert Timestamp.parse(str(ts)) == ts
    assert ts.kind is (Kind.WRITE if ts.flags & 1 else Kind.READ)


@given(small_ts, small_ts)
def test_merge_max_is_commutative_and_never_forges(a: Timestamp, b: Timestamp) -> None:
    # Reference: accord.md §1 mergeMax; Accord Timestamp.mergeMax. The result is one input's
    # (hlc, flags, node) with the larger epoch, never an hlc of one and a node of the other.
    merged = merge_max(a, b)
    assert merged == merge_max(b, a)
    assert (merged.hlc, merged.flags, merged.node) in {fields(a)[1:], fields(b)[1:]}
    assert merged.epoch == max(a.epoch, b.epoch)
    assert merged >= a and merged >= b
    assert merge_max(a, a) == a


@given(small_ts, small_ts, small_ts)
def test_merge_max_is_associative(a: Timestamp, b: Timestamp, c: Timestamp) -> None:
    assert merge_max(merge_max(a, b), c) == merge_max(a, merge_max(b, c))


# ---------------------------------------------------------------------------- Hlc


at_least = st.none() | st.integers(0, 60).map(lambda hlc: Timestamp(1, hlc, 0, 9))


@given(st.integers(0, 20), st.lists(st.tuples(st.integers(0, 50), at_least), max_size=30))
def test_hlc_next_strictly_increases_and_respects_at_least(
    floor: int, steps: list[tuple[int, Timestamp | None]]
) -> None:
    clock = Hlc(1, floor=floor)
    previous = floor
    for physical, bound in steps:
        value = clock.next(physical, bound)
        assert value > previous
        assert value >= physical
        if bound is not None:
            assert value > bound.hlc
        # It is the least value with all three properties: the HLC never runs ahead.
        assert value == max(physical, previous + 1, 0 if bound is None else bound.hlc + 1)
        previous = value


def test_hlc_needs_a_positive_reserve() -> None:
    with pytest.raises(ValueError, match="reserve_micros"):
        Hlc(1, reserve_micros=0)


@given(
    st.integers(1, 10),
    st.lists(
        st.tuples(
            st.integers(0, 60), at_least, st.sampled_from(["send", "crash-unsent", "crash-sent"])
        ),
        max_size=40,
    ),
)
def test_restarting_from_the_persisted_floor_never_reissues_a_value(
    reserve: int, steps: list[tuple[int, Timestamp | None, str]]
) -> None:
    """Model of the node's contract (accord.node.Node._mint, accord.api.Journal).

    Each mint calls ``floor_to_persist`` and appends any floor to the journal, which is
    durable before the value leaves the node. A crash may strike before that (the value
    never left) or after. A restart builds the clock from the largest persisted floor.
    Every value a node ever sent must be larger than every value it sent before.
    """
    journal: list[int] = []
    clock = Hlc(1, floor=0, reserve_micros=reserve)
    sent: list[int] = []
    for physical, bound, fate in steps:
        value = clock.next(physical, bound)
        assert all(value > earlier for earlier in sent), "re-issued an HLC value"
        floor = clock.floor_to_persist()
        if fate != "crash-unsent":
            if floor is not None:
                journal.append(floor)
            assert value <= max(journal, default=0), "sent a value above the durable floor"
            sent.append(value)
        if fate != "send":
            clock = Hlc(1, floor=max(journal, default=0), reserve_micros=reserve)


def test_floor_is_persisted_once_per_reserve_not_per_value() -> None:
    clock = Hlc(1, floor=0, reserve_micros=100)
    persisted = []
    for now in range(1, 250):
        clock.next(now)
        floor = clock.floor_to_persist()
        if floor is not None:
            persisted.append(floor)
    # The floor moves only when a value reaches it: at 1, 101 and 201.
    assert persisted == [101, 201, 301]


# ---------------------------------------------------------------------------- Deps


@given(small_deps, small_deps, small_deps)
def test_deps_merge_is_a_semilattice_with_empty_as_identity(a: Deps, b: Deps, c: Deps) -> None:
    # Reference: accord/primitives/deps.py docstring; STYLE.md "Tests" (Deps merge laws).
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c)) == a.merge(b, c)
    assert a.merge(a) == a
    assert a.merge(EMPTY_DEPS) == EMPTY_DEPS.merge(a) == a
    assert EMPTY_DEPS.merge() == EMPTY_DEPS


@given(small_deps, small_deps)
def test_deps_merge_is_per_key_union(a: Deps, b: Deps) -> None:
    merged = a.merge(b)
    for key in set(a.keys()) | set(b.keys()):
        assert merged.for_key(key) == tuple(sorted(set(a.for_key(key)) | set(b.for_key(key))))
    assert set(merged.keys()) == set(a.keys()) | set(b.keys())
    assert set(merged.txn_ids()) == set(a.txn_ids()) | set(b.txn_ids())


@given(st.dictionaries(keys(small=True), st.lists(small_ts, max_size=4), max_size=6))
def test_deps_normalise_to_sorted_unique_nonempty(raw: Mapping[Key, list[Timestamp]]) -> None:
    built = Deps(raw)
    assert list(built.keys()) == sorted(k for k, ids in raw.items() if ids)
    for key, ids in built.items():
        assert ids == tuple(sorted(set(raw[key])))
    assert built == Deps({k: list(reversed(v)) + v for k, v in raw.items()})
    assert hash(built) == hash(Deps(dict(reversed(list(raw.items())))))
    assert len(built) == sum(len(set(ids)) for ids in raw.values())
    assert built.is_empty() == (len(built) == 0)
    every = [t for ids in raw.values() for t in ids]
    assert built.max_txn_id() == (max(every) if every else None)
    assert all(built.contains(t) for t in every)


@given(small_deps, st.data())
def test_deps_filter_keeps_exactly_what_the_predicate_accepts(
    deps_: Deps, data: st.DataObject
) -> None:
    pairs = [(key, t) for key, ids in deps_.items() for t in ids]
    kept = data.draw(st.sets(st.sampled_from(pairs)) if pairs else st.just(set()))
    filtered = deps_.filter(lambda key, t: (key, t) in kept)
    assert {(key, t) for key, ids in filtered.items() for t in ids} == kept
    assert all(ids for _, ids in filtered.items()), "an emptied key must disappear"
    assert deps_.filter(lambda _k, _t: True) == deps_
    assert deps_.filter(lambda _k, _t: False) == EMPTY_DEPS


@given(small_deps, st.sets(keys(small=True)))
def test_deps_slice_keeps_only_the_given_keys(deps_: Deps, wanted: set[Key]) -> None:
    sliced = deps_.slice(wanted)
    assert set(sliced.keys()) == set(deps_.keys()) & wanted
    for key in wanted:
        assert sliced.for_key(key) == deps_.for_key(key)
    assert deps_.slice(deps_.keys()) == deps_


# ---------------------------------------------------------------------------- keys


@given(st.text(max_size=10))
def test_sim_keys_are_stable_and_never_the_excluded_minimum_token(name: str) -> None:
    key = sim_key(name)
    assert key == sim_key(name)
    assert TOKEN_MIN < key.token <= TOKEN_MAX


def test_token_ranges_are_half_open_and_non_empty() -> None:
    assert TokenRange(0, 10).contains(10) and not TokenRange(0, 10).contains(0)
    with pytest.raises(ValueError, match="empty"):
        TokenRange(5, 5)


def test_a_route_needs_its_home_key_among_its_keys() -> None:
    a, b = sim_key("a"), sim_key("b")
    with pytest.raises(ValueError, match="not a participant"):
        Route(a, (b,))
    with pytest.raises(ValueError, match="at least one key"):
        Route(a, ())


@pytest.mark.parametrize(
    ("status", "decided", "has_execute_at", "proposal", "terminal"),
    [
        (Status.NOT_DEFINED, False, False, False, False),
        (Status.PRE_ACCEPTED, False, False, False, False),
        (Status.ACCEPTED_INVALIDATE, False, False, True, False),
        (Status.ACCEPTED, False, False, True, False),
        (Status.COMMITTED, True, True, False, False),
        (Status.STABLE, True, True, False, False),
        (Status.PRE_APPLIED, True, True, False, False),
        (Status.APPLIED, True, True, False, True),
        (Status.INVALIDATED, True, False, False, True),
    ],
)
def test_status_predicates(
    status: Status, decided: bool, has_execute_at: bool, proposal: bool, terminal: bool
) -> None:
    assert (status.is_decided, status.has_execute_at, status.is_proposal, status.is_terminal) == (
        decided,
        has_execute_at,
        proposal,
        terminal,
    )


# ---------------------------------------------------------------------------- Txn


def expr_keys(expr: Expr | None) -> set[Key]:
    if isinstance(expr, ReadOf | RowOf | StaticOf):
        return {expr.key}
    if isinstance(expr, SliceOf | CountOf):
        return {expr.slice.key}
    if isinstance(expr, BinOp):
        return expr_keys(expr.left) | expr_keys(expr.right)
    if isinstance(expr, Item):
        return expr_keys(expr.value)
    if isinstance(expr, MakeTuple):
        return set().union(*(expr_keys(item) for item in expr.items))
    return set()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(txns(keys(small=True)))
def test_txn_derives_kind_and_keys(txn: Txn) -> None:
    reads, writes = set(txn.reads), set()
    for expr in txn.returns:
        reads |= expr_keys(expr)
    if txn.update is not None:
        for predicate in txn.update.condition:
            reads |= expr_keys(predicate.left) | expr_keys(predicate.right)
        for write in txn.update.writes:
            writes.add(write.key)
            if isinstance(write, Put | PutRow | PutStatic):
                reads |= expr_keys(write.value)
    assert txn.read_keys == tuple(sorted(reads))
    assert txn.write_keys == tuple(sorted(writes))
    assert txn.keys == tuple(sorted(reads | writes))
    assert txn.kind is (Kind.WRITE if writes else Kind.READ)


A, B, C = sim_key("a"), sim_key("b"), sim_key("c")


def test_txn_shapes_that_are_refused() -> None:
    with pytest.raises(InvalidTransaction, match="at least one key"):
        Txn(())
    with pytest.raises(InvalidTransaction, match="at least one key"):
        Txn((), Update((), (Predicate("=", Const(1), Const(1)),)))
    with pytest.raises(InvalidTransaction, match="unknown operator"):
        BinOp("*", Const(1), Const(2))  # type: ignore[arg-type]
    with pytest.raises(InvalidTransaction, match="unknown comparison"):
        Predicate("~", Const(1), Const(2))  # type: ignore[arg-type]
    with pytest.raises(InvalidTransaction, match="wrong number of operands"):
        Predicate("is_null", Const(1), Const(2))
    with pytest.raises(InvalidTransaction, match="wrong number of operands"):
        Predicate("<", Const(1))


def test_a_condition_only_read_makes_a_read_txn_and_a_delete_makes_a_write() -> None:
    assert Txn((), Update((), (Predicate("is_null", ReadOf(A)),))).kind is Kind.READ
    deleting = Txn((), Update((Delete(B),)))
    assert (deleting.kind, deleting.read_keys, deleting.keys) == (Kind.WRITE, (), (B,))


# ---------------------------------------------------------------------------- execute


RA, RB = ReadOf(A), ReadOf(B)
K = Const


def nested_tuple(depth: int) -> Value:
    value: Value = ()
    for _ in range(depth - 1):
        value = (value,)
    return value


def when(*condition: Predicate, writes: tuple[Put | Delete, ...] = (Put(C, K("w")),)) -> Txn:
    return Txn((A,), Update(writes, condition))


def cond(op: str, left: Expr, right: Expr | None = None) -> Predicate:
    return Predicate(op, left, right)  # type: ignore[arg-type]


def compute(expr: Expr) -> Txn:
    """Write ``expr`` to C unconditionally."""
    return when(writes=(Put(C, expr),))


def op(name: str, left: Expr, right: Expr) -> BinOp:
    return BinOp(name, left, right)  # type: ignore[arg-type]


WROTE = (WriteOp(C, "w"),)


@pytest.mark.parametrize(
    ("txn", "store", "writes", "applied", "error"),
    [
        # Comparisons between equal types.
        (when(cond("=", RA, K(1))), {A: 1}, WROTE, True, None),
        (when(cond("=", RA, K(1))), {A: 2}, (), False, None),
        (when(cond("=", RA, K(None))), {}, WROTE, True, None),
        (when(cond("!=", RA, K(1))), {A: 2}, WROTE, True, None),
        (when(cond("!=", RA, K(1))), {A: 1}, (), False, None),
        (when(cond("!=", RA, K("1"))), {A: 1}, WROTE, True, None),
        (when(cond("<", RA, K(5))), {A: 4}, WROTE, True, None),
        (when(cond("<", RA, K(5))), {A: 5}, (), False, None),
        (when(cond("<=", RA, K(5))), {A: 5}, WROTE, True, None),
        (when(cond("<=", RA, K(5))), {A: 6}, (), False, None),
        (when(cond(">", RA, K(5))), {A: 6}, WROTE, True, None),
        (when(cond(">", RA, K(5))), {A: 5}, (), False, None),
        (when(cond(">=", RA, K(5))), {A: 5}, WROTE, True, None),
        (when(cond(">=", RA, K(5))), {A: 4}, (), False, None),
        (when(cond("<", RA, K("b"))), {A: "a"}, WROTE, True, None),
        (when(cond("<", RA, K(b"b"))), {A: b"a"}, WROTE, True, None),
        (when(cond("<", RA, K((1, 3)))), {A: (1, 2)}, WROTE, True, None),
        (when(cond("is_null", RA)), {}, WROTE, True, None),
        (when(cond("is_null", RA)), {A: 0}, (), False, None),
        (when(cond("not_null", RA)), {A: 0}, WROTE, True, None),
        (when(cond("not_null", RA)), {}, (), False, None),
        (when(cond("not_null", ReadOf(A, 0))), {}, WROTE, True, None),
        # Conditions are ANDed; no condition always holds.
        (when(cond("=", RA, K(1)), cond("is_null", RB)), {A: 1}, WROTE, True, None),
        (when(cond("=", RA, K(1)), cond("is_null", RB)), {A: 1, B: 2}, (), False, None),
        (when(), {}, WROTE, True, None),
        # Ordering across types, or against absence, is a deterministic error.
        (when(cond("<", RA, K(5))), {}, (), False, "cannot order NoneType against int"),
        (when(cond("<", RA, K(5))), {A: "5"}, (), False, "cannot order str against int"),
        (when(cond(">=", RA, K(1))), {A: True}, (), False, "cannot order bool against int"),
        (when(cond("<", RA, K((1,)))), {A: ("x",)}, (), False, "cannot order str against int"),
        # Writes: arithmetic, concatenation, defaults, deletes.
        (compute(op("+", ReadOf(A, 0), K(1))), {}, (WriteOp(C, 1),), True, None),
        (compute(op("+", RA, K(1))), {A: 41}, (WriteOp(C, 42),), True, None),
        (compute(op("-", RA, K(3))), {A: 10}, (WriteOp(C, 7),), True, None),
        (compute(op("concat", RA, K((2, 3)))), {A: (1,)}, (WriteOp(C, (1, 2, 3)),), True, None),
        (compute(op("concat", RA, K((1,)))), {}, (WriteOp(C, (1,)),), True, None),
        (
            when(writes=(Delete(C), Put(B, RA))),
            {A: "v"},
            (WriteOp(C, None, delete=True), WriteOp(B, "v")),
            True,
            None,
        ),
        # Type errors in writes: no writes at all (not even earlier ones), never an exception.
        (
            when(writes=(Put(B, K(1)), Put(C, op("+", RA, K(1))))),
            {A: "x"},
            (),
            False,
            "+ needs integers, got str and int",
        ),
        (compute(op("-", RA, K(1))), {}, (), False, "- needs integers, got NoneType and int"),
        (compute(op("+", RA, K(1))), {A: True}, (), False, "+ needs integers, got bool and int"),
        (compute(op("concat", RA, K((1,)))), {A: 1}, (), False, "concat needs lists, got int"),
        (compute(op("concat", RA, K("b"))), {A: "a"}, (), False, "concat needs lists, got str"),
        (compute(op("concat", RA, K(b"b"))), {A: b"a"}, (), False, "needs lists, got bytes"),
        # Rows and columns: Item picks a column (None when out of range), MakeTuple builds.
        (compute(Item(RA, 1)), {A: (5, 6)}, (WriteOp(C, 6),), True, None),
        (compute(Item(RA, -1)), {A: (5, 6)}, (WriteOp(C, 6),), True, None),
        (compute(Item(RA, 2)), {A: (5, 6)}, (WriteOp(C, None),), True, None),
        (compute(Item(RA, 0)), {}, (WriteOp(C, None),), True, None),
        (compute(Item(RA, 0)), {A: "ab"}, (), False, "item 0 of a str, not a tuple"),
        (
            compute(MakeTuple((RA, K(b"t"), MakeTuple(())))),
            {A: 1},
            (WriteOp(C, (1, b"t", ())),),
            True,
            None,
        ),
        (when(cond(">", Item(RA, 0), K(0))), {A: (1, "x")}, WROTE, True, None),
        # A false condition stops before the writes are evaluated, so their errors never show.
        (
            when(cond("=", RA, K(0)), writes=(Put(C, op("+", K("x"), K(1))),)),
            {A: 1},
            (),
            False,
            None,
        ),
    ],
)
def test_execute_semantics(
    txn: Txn, store: dict[Key, Value], writes: tuple[WriteOp, ...], applied: bool, error: str | None
) -> None:
    produced, result = execute(txn, store)
    assert produced == writes
    assert result == TxnResult(((A, store.get(A)),), applied, result.error)
    if error is None:
        assert result.error is None
    else:
        assert result.error is not None and error in result.error


def test_a_txn_without_update_reads_in_its_own_order() -> None:
    writes, result = execute(Txn((B, A)), {A: 1})
    assert writes == ()
    assert result == TxnResult(((B, None), (A, 1)), applied=True)
    assert result.read(A) == 1 and result.read(C) is None


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(txns(keys(small=True)), st.dictionaries(keys(small=True), values(max_leaves=4)))
def test_execute_is_total_and_deterministic(txn: Txn, store: dict[Key, Value]) -> None:
    produced, result = execute(txn, store)
    assert (produced, result) == execute(txn, dict(reversed(list(store.items()))))
    assert result.reads == tuple((key, store.get(key)) for key in txn.reads)
    if result.error is not None or not result.applied:
        assert produced == ()
        assert not result.applied
    elif txn.update is not None:
        writes = txn.update.writes
        assert {op.key for op in produced} == {w.key for w in writes}
        legacy = all(isinstance(w, Put | Delete) for w in writes)
        if legacy and len({w.key for w in writes}) == len(writes):
            assert [op.key for op in produced] == [w.key for w in writes]
            for op, write in zip(produced, writes, strict=True):
                assert op.delete == isinstance(write, Delete)
                if op.delete:
                    assert op.value is None
        for op in produced:
            if op.delete:
                assert op.value is None and op.ttl is None


@pytest.mark.parametrize(
    ("expr", "start", "value"),
    [(op("+", RA, K(1)), 2**63 - 2, 2**63 - 1), (op("-", RA, K(1)), -(2**63) + 1, -(2**63))],
    ids=["max", "min"],
)
def test_arithmetic_reaches_the_64_bit_bounds(expr: Expr, start: int, value: int) -> None:
    assert execute(compute(expr), {A: start})[0] == (WriteOp(C, value),)


@pytest.mark.parametrize(("name", "start"), [("+", 2**63 - 1), ("-", -(2**63))])
def test_arithmetic_beyond_64_bits_is_a_deterministic_error(name: str, start: int) -> None:
    # Values cross the wire as signed 64-bit integers (accord.codec).
    writes, result = execute(compute(op(name, RA, K(1))), {A: start})
    assert writes == ()
    assert not result.applied
    assert result.error == f"{name} overflows a signed 64-bit integer"


def test_results_nested_beyond_the_wire_depth_are_a_deterministic_error() -> None:
    deepest = nested_tuple(MAX_VALUE_DEPTH)
    assert encode_message(ReadOk(1, TIMESTAMP_MIN, ((A, deepest),)))  # the input is encodable
    writes, result = execute(compute(MakeTuple((RA,))), {A: deepest})
    assert writes == ()
    assert result.error is not None and not result.applied
