"""Hypothesis strategies for Accord's values, messages and journal records.

Reusable by any test: ``from strategies import messages, txns, ...`` (pytest puts this
directory on ``sys.path``). Strategies that take ``keys`` or ``timestamps`` let a caller
narrow the domain to force collisions (same key, equal timestamps); the defaults cover the
whole wire range, including the signed 64-bit bounds.

:func:`identical` compares two values by type as well as by ``==``, which a round-trip test
needs: ``True == 1``, ``Status.APPLIED == 70`` and ``Key(1, "a") == (1, "a")`` in Python.

The functions that build strategies are cached (``functools.cache``: the same arguments give
the same strategy object), and the composites build none while drawing. Hypothesis validates
every strategy object the first time it is drawn from, and for a deep one (``st.recursive``,
``st.builds`` over classes) that costs far more than drawing: built afresh on every draw
inside ``txns``, validation took 52 of the 67 s (under cProfile) a hundred PreAccepts took.
A cached strategy is the same strategy, so what is generated does not change, only how often
it is validated. A caller that passes a new strategy object on every draw (``keys=``) gets a
new cache entry each time: build the argument once, as the module does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

import msgspec
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from accord.api import Durable, HlcFloor
from accord.local.command import CommandSnapshot
from accord.messages import (
    Accept,
    AcceptInvalidate,
    AcceptInvalidateOk,
    AcceptOk,
    Apply,
    ApplyOk,
    BeginInvalidation,
    BeginRecovery,
    CheckStatus,
    CheckStatusOk,
    Commit,
    CommitInvalidate,
    CommitOk,
    Envelope,
    InformDurable,
    Insufficient,
    InvalidateOk,
    Message,
    Nack,
    OutcomeDurable,
    PreAccept,
    PreAcceptOk,
    ReadOk,
    ReadRedundant,
    RecoverOk,
)
from accord.primitives import (
    MAX_ROWS_PER_SLICE,
    MAX_TTL_SECONDS,
    TOKEN_MAX,
    TOKEN_MIN,
    BinOp,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Deps,
    Expr,
    Item,
    Key,
    MakeTuple,
    PartitionRead,
    Predicate,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    Route,
    RowAt,
    RowOf,
    Selection,
    Slice,
    SliceOf,
    StaticAt,
    StaticOf,
    Status,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    Value,
    Write,
    WriteOp,
    WriteScope,
)

T = TypeVar("T")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

int64s: SearchStrategy[int] = st.one_of(st.integers(-3, 3), st.integers(INT64_MIN, INT64_MAX))
"""Signed 64-bit integers, biased towards small ones and the bounds."""


@functools.cache
def timestamps(*, small: bool = False) -> SearchStrategy[Timestamp]:
    """Timestamps; ``small`` draws each field from 0..3 so that ties and equality are common."""
    field = st.integers(0, 3) if small else st.one_of(st.integers(0, 3), int64s)
    return st.builds(Timestamp, field, field, field, field)


@functools.cache
def keys(*, small: bool = False) -> SearchStrategy[Key]:
    """Keys; ``small`` draws from six keys over three tokens (equal tokens, distinct names)."""
    if small:
        return st.builds(Key, st.integers(-1, 1), st.sampled_from(["a", "b"]))
    tokens = st.one_of(st.integers(-3, 3), st.integers(TOKEN_MIN + 1, TOKEN_MAX))
    return st.builds(Key, tokens, st.text(max_size=6))


scalar_values: SearchStrategy[Value] = st.one_of(
    st.none(), st.booleans(), int64s, st.text(max_size=8), st.binary(max_size=8)
)


@functools.cache
def values(*, max_leaves: int = 12) -> SearchStrategy[Value]:
    """Values: None, bool, int64, str, bytes and (nested) tuples of values."""
    return st.recursive(
        scalar_values, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=max_leaves
    ).filter(lambda v: value_depth(v) <= 32)


def value_depth(value: Value) -> int:
    """How many tuples ``value`` nests (``()`` has depth 1)."""
    if type(value) is not tuple:
        return 0
    return 1 + max((value_depth(v) for v in value), default=0)


clusterings: SearchStrategy[tuple[Value, ...]] = st.lists(
    st.one_of(st.booleans(), int64s, st.text(max_size=4), st.binary(max_size=4)), max_size=2
).map(tuple)
bounds: SearchStrategy[Bound | None] = st.none() | st.builds(
    Bound, st.one_of(int64s, st.text(max_size=4)), st.booleans()
)
ttls: SearchStrategy[int | None] = st.none() | st.integers(1, MAX_TTL_SECONDS)


@functools.cache
def slices(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Slice]:
    return st.builds(
        Slice,
        keys() if key is None else key,
        clusterings,
        bounds,
        bounds,
        st.booleans(),
        st.none() | st.integers(1, MAX_ROWS_PER_SLICE),
    )


@functools.cache
def selections(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Selection]:
    key = keys() if key is None else key
    return st.one_of(st.builds(RowAt, key, clusterings), slices(key), st.builds(StaticAt, key))


@functools.cache
def exprs(
    key: SearchStrategy[Key] | None = None, value: SearchStrategy[Value] | None = None
) -> SearchStrategy[Expr]:
    key = keys() if key is None else key
    value = values(max_leaves=4) if value is None else value
    # Partition reads are a third of the leaves: drawing them is dearer (slices, bounds).
    partition_leaves = st.one_of(
        st.builds(RowOf, key, clusterings, value),
        st.builds(SliceOf, slices(key)),
        st.builds(CountOf, slices(key)),
        st.builds(StaticOf, key),
    )
    leaves = st.one_of(st.builds(Const, value), st.builds(ReadOf, key, value), partition_leaves)
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(BinOp, st.sampled_from(["+", "-", "concat"]), inner, inner),
            st.builds(Item, inner, st.one_of(st.integers(-3, 3), int64s)),
            st.builds(MakeTuple, st.lists(inner, max_size=3).map(tuple)),
        ),
        max_leaves=6,
    )


COMPARISONS = ("=", "!=", "<", "<=", ">", ">=", "is_null", "not_null")


@functools.cache
def predicates(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Predicate]:
    return _predicates(exprs(key))


@st.composite
def _predicates(draw: st.DrawFn, expr: SearchStrategy[Expr]) -> Predicate:
    op = draw(st.sampled_from(COMPARISONS))
    left = draw(expr)
    right = None if op in ("is_null", "not_null") else draw(expr)
    return Predicate(op, left, right)  # type: ignore[arg-type]


@functools.cache
def writes(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Write]:
    key = keys() if key is None else key
    return st.one_of(
        st.builds(Put, key, exprs(key)),
        st.builds(Delete, key),
        row_writes(key),
    )


@functools.cache
def row_writes(key: SearchStrategy[Key]) -> SearchStrategy[Write]:
    return st.one_of(
        st.builds(PutRow, key, clusterings, exprs(key), ttls),
        st.builds(PutStatic, key, exprs(key), ttls),
        st.builds(DeleteRow, key, clusterings),
        st.builds(DeleteRange, key, clusterings, bounds, bounds),
        st.builds(DeletePartition, key),
    )


@functools.cache
def updates(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Update]:
    return st.builds(
        Update,
        st.lists(writes(key), max_size=3).map(tuple),
        st.lists(predicates(key), max_size=2).map(tuple),
    )


@functools.cache
def txns(key: SearchStrategy[Key] | None = None) -> SearchStrategy[Txn]:
    """Valid transactions: every one reads or writes at least one key."""
    return _txns_of(keys() if key is None else key)


def _txns_of(key: SearchStrategy[Key]) -> SearchStrategy[Txn]:
    return _txns(
        st.none() | updates(key),
        st.lists(key, min_size=1, max_size=3),
        st.lists(key, max_size=3),
        st.lists(exprs(key), max_size=1),
    )


@st.composite
def _txns(
    draw: st.DrawFn,
    update: SearchStrategy[Update | None],
    some_reads: SearchStrategy[list[Key]],
    any_reads: SearchStrategy[list[Key]],
    returns: SearchStrategy[list[Expr]],
) -> Txn:
    drawn = draw(update)
    must_read = drawn is None or not drawn.writes
    reads = draw(some_reads if must_read else any_reads)
    return Txn(tuple(reads), drawn, tuple(draw(returns)))


SHARED_READ = Key(0, "shared")


@functools.cache
def part_keys(index: int) -> SearchStrategy[Key]:
    """The keys of a batch's part ``index``: its own names, three tokens, so parts collide
    on tokens but never on keys."""
    return st.builds(Key, st.integers(-3, 3), st.sampled_from([f"p{index}a", f"p{index}b"]))


@functools.cache
def batches(max_parts: int = 3) -> SearchStrategy[Txn]:
    """Valid batches: each part's keys are its own (names ``p<i>…``), but any part may also
    read one key they all share, as reads may overlap reads."""
    return _batches(st.integers(2, max_parts), tuple(txns(part_keys(i)) for i in range(max_parts)))


@st.composite
def _batches(
    draw: st.DrawFn, count: SearchStrategy[int], part_txns: tuple[SearchStrategy[Txn], ...]
) -> Txn:
    parts = []
    for index in range(draw(count)):
        part = draw(part_txns[index])
        if draw(st.booleans()):
            part = Txn((*part.reads, SHARED_READ), part.update, part.returns)
        parts.append(part)
    return Txn.batch(tuple(parts))


@functools.cache
def any_txns() -> SearchStrategy[Txn]:
    """Transactions, batches among them (a third: one_of drops a strategy object it already
    holds, so the two plain branches must be two objects)."""
    return st.one_of(_txns_of(keys()), _txns_of(keys()), batches())


@st.composite
def routes(draw: st.DrawFn, key: SearchStrategy[Key] | None = None) -> Route:
    members = draw(st.lists(keys() if key is None else key, min_size=1, max_size=4))
    return Route(draw(st.sampled_from(members)), tuple(members))


@functools.cache
def deps(
    key: SearchStrategy[Key] | None = None, timestamp: SearchStrategy[Timestamp] | None = None
) -> SearchStrategy[Deps]:
    return st.dictionaries(
        keys() if key is None else key,
        st.lists(timestamps() if timestamp is None else timestamp, max_size=4),
        max_size=4,
    ).map(Deps)


statuses: SearchStrategy[Status] = st.sampled_from(Status)
write_ops: SearchStrategy[WriteOp] = st.one_of(
    st.builds(WriteOp, keys(), values(), st.booleans()),
    st.builds(
        WriteOp,
        keys(),
        values(),
        st.just(False),
        st.sampled_from([WriteScope.ROW, WriteScope.STATIC]),
        clusterings,
        ttl=ttls,
    ),
    st.builds(
        WriteOp,
        keys(),
        st.none(),
        st.just(True),
        st.sampled_from(WriteScope),
        clusterings,
        bounds,
        bounds,
    ),
)


@st.composite
def partition_reads(draw: st.DrawFn) -> tuple[Key, Value]:
    """A key with a data store's answer for it: plain (a row at ()) or a PartitionRead."""
    key = draw(keys())
    if draw(st.booleans()):
        return key, draw(values())
    # Drawn for a placeholder key, then moved to the drawn one: selections(st.just(key))
    # would be a new strategy, validated anew, on every draw. The key draws no choices
    # either way, so the selections are distributed as before.
    asked = draw(_placeholder_selections)
    results = tuple(
        (msgspec.structs.replace(selection, key=key), draw(values())) for selection in asked
    )
    return key, PartitionRead(results, draw(_read_errors))


_PLACEHOLDER_KEY = Key(0, "placeholder")
_placeholder_selections = st.lists(selections(st.just(_PLACEHOLDER_KEY)), max_size=3)
_read_errors = st.none() | st.text(max_size=12)


reads: SearchStrategy[tuple[tuple[Key, Value], ...]] = st.lists(
    st.tuples(keys(), values()), max_size=3
).map(tuple)
part_results: SearchStrategy[TxnResult] = st.builds(
    TxnResult,
    reads,
    st.booleans(),
    st.none() | st.text(max_size=12),
    st.lists(values(), max_size=2).map(tuple),
)
txn_results: SearchStrategy[TxnResult] = st.one_of(
    part_results,
    part_results,
    st.builds(
        TxnResult,
        st.just(()),
        st.just(True),
        parts=st.lists(part_results, min_size=2, max_size=3).map(tuple),
    ),
)
"""Client results, a batch's (one per part) among them."""


def _tuples(element: SearchStrategy[T]) -> SearchStrategy[tuple[T, ...]]:
    return st.lists(element, max_size=3).map(tuple)


def _message_strategies() -> dict[type[Any], SearchStrategy[Any]]:
    ts, cid = timestamps(), int64s
    common = {"cid": cid, "txn_id": ts}
    opt_writes, opt_result = st.none() | _tuples(write_ops), st.none() | txn_results
    return {
        PreAccept: st.builds(PreAccept, **common, txn=any_txns(), route=routes()),
        Accept: st.builds(
            Accept,
            **common,
            txn=any_txns(),
            route=routes(),
            ballot=ts,
            execute_at=ts,
            deps=deps(),
        ),
        AcceptInvalidate: st.builds(
            AcceptInvalidate, **common, ballot=ts, route=st.none() | routes()
        ),
        Commit: st.builds(
            Commit,
            **common,
            execute_at=ts,
            deps=deps(),
            stable=st.booleans(),
            read=st.booleans(),
            txn=st.none() | any_txns(),
            route=st.none() | routes(),
        ),
        Apply: st.builds(
            Apply,
            **common,
            txn=any_txns(),
            route=routes(),
            execute_at=ts,
            deps=deps(),
            writes=_tuples(write_ops),
            result=txn_results,
            ballot=ts,
            chosen=st.booleans(),
        ),
        OutcomeDurable: st.builds(OutcomeDurable, **common, ballot=ts, written=st.booleans()),
        CommitInvalidate: st.builds(CommitInvalidate, **common),
        InformDurable: st.builds(InformDurable, **common),
        BeginRecovery: st.builds(
            BeginRecovery, **common, txn=any_txns(), route=routes(), ballot=ts
        ),
        BeginInvalidation: st.builds(BeginInvalidation, **common, ballot=ts),
        CheckStatus: st.builds(CheckStatus, **common),
        CheckStatusOk: st.builds(
            CheckStatusOk, **common, status=statuses, chosen=st.booleans(), result=opt_result
        ),
        PreAcceptOk: st.builds(
            PreAcceptOk, **common, witnessed_at=ts, deps=deps(), rejected=st.booleans()
        ),
        Nack: st.builds(Nack, **common, promised=ts, status=statuses),
        AcceptOk: st.builds(AcceptOk, **common, deps=deps()),
        AcceptInvalidateOk: st.builds(AcceptInvalidateOk, **common),
        CommitOk: st.builds(CommitOk, **common),
        Insufficient: st.builds(Insufficient, **common),
        ReadOk: st.builds(
            ReadOk, **common, values=st.lists(partition_reads(), max_size=3).map(tuple)
        ),
        ReadRedundant: st.builds(
            ReadRedundant,
            **common,
            writes=_tuples(write_ops),
            result=txn_results,
            ballot=ts,
            chosen=st.booleans(),
        ),
        ApplyOk: st.builds(ApplyOk, **common, applied=st.booleans()),
        RecoverOk: st.builds(
            RecoverOk,
            **common,
            status=statuses,
            accepted=ts,
            execute_at=st.none() | ts,
            deps=deps(),
            accepts_fast_path=st.booleans(),
            rejects_fast_path=st.booleans(),
            earlier_committed_witness=_tuples(ts),
            earlier_accepted_no_witness=_tuples(ts),
            writes=opt_writes,
            result=opt_result,
        ),
        InvalidateOk: st.builds(
            InvalidateOk,
            **common,
            status=statuses,
            accepted=ts,
            accepts_fast_path=st.booleans(),
            txn=st.none() | any_txns(),
            route=st.none() | routes(),
        ),
    }


MESSAGE_STRATEGIES: dict[type[Any], SearchStrategy[Any]] = _message_strategies()
"""A strategy for every message class, keyed by class."""

messages: SearchStrategy[Message] = st.one_of(*MESSAGE_STRATEGIES.values())
envelopes: SearchStrategy[Envelope] = st.builds(Envelope, int64s, int64s, messages)

command_snapshots: SearchStrategy[CommandSnapshot] = st.builds(
    CommandSnapshot,
    txn_id=timestamps(),
    status=statuses,
    txn=st.none() | any_txns(),
    route=st.none() | routes(),
    promised=timestamps(),
    accepted=timestamps(),
    execute_at=st.none() | timestamps(),
    deps=deps(),
    writes=st.none() | _tuples(write_ops),
    result=st.none() | txn_results,
    fast_vote=st.booleans(),
    key_hint=st.none() | keys(),
)
hlc_floors: SearchStrategy[HlcFloor] = st.builds(HlcFloor, int64s)
durables: SearchStrategy[Durable] = st.builds(
    Durable, st.lists(timestamps(), max_size=4).map(tuple)
)
journal_records: SearchStrategy[CommandSnapshot | HlcFloor | Durable] = st.one_of(
    command_snapshots, hlc_floors, durables
)


def identical(a: object, b: object) -> bool:
    """``a == b`` with every nested value also of exactly the same type."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Deps) and isinstance(b, Deps):
        return identical(tuple(a.items()), tuple(b.items()))
    if isinstance(a, msgspec.Struct):
        return all(identical(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(identical(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b
