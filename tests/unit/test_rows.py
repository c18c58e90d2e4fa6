"""Partitions of rows: the memory model against a naive one, evaluation, TTL, limits, wire."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.api import CommandSnapshot, DataStore
from accord.codec import (
    CODEC_VERSION,
    CodecError,
    decode_message,
    decode_record,
    encode_message,
    encode_record,
)
from accord.invariants import InvalidTransaction
from accord.messages import Apply, Envelope, ReadOk
from accord.messages.validate import InvalidMessage, MessageLimits, validate
from accord.primitives import (
    MAX_PARTITION_READ_BYTES,
    MAX_ROWS_PER_SLICE,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Deps,
    Item,
    Key,
    MakeTuple,
    MemoryPartitions,
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
    WriteOp,
    WriteScope,
    execute,
)
from accord.primitives.rows import order_key
from accord.primitives.txn import _last_per_target
from accord.sim.cluster import SimDataStore
from accord.topology import ring_topology
from maelstrom.node import MemoryStore

K = Key(5, "ks.t:00")
SECOND = 1_000_000


def at(seconds: float, node: int = 1) -> Timestamp:
    return Timestamp(1, int(seconds * SECOND), 0, node)


# Every in-memory store is an accord.api.DataStore (mypy checks these assignments).
_STORES: tuple[DataStore, ...] = (MemoryPartitions(), SimDataStore(), MemoryStore())


def read(store: MemoryPartitions, selection: Selection, when: Timestamp) -> object:
    answer = store.read([selection], when)[selection.key]
    assert answer.error is None, answer.error
    return answer.get(selection)


# ---------------------------------------------------------------------------- naive model


@dataclass(frozen=True)
class _Op:
    stamp: Timestamp
    write: WriteOp


class NaiveModel:
    """Every write ever made, judged afresh at each read: the newest write touching a row
    (deletions winning ties) decides it."""

    def __init__(self, descending: tuple[bool, ...] = ()) -> None:
        self.ops: list[_Op] = []
        self.descending = descending

    def write(self, writes: list[WriteOp], stamp: Timestamp) -> None:
        self.ops.extend(_Op(stamp, w) for w in writes)

    def _covers(self, write: WriteOp, ck: tuple[object, ...]) -> bool:
        if write.scope is WriteScope.PARTITION:
            return True
        if write.scope is WriteScope.ROW:
            return write.clustering == ck
        if write.scope is WriteScope.RANGE:
            prefix = write.clustering
            if ck[: len(prefix)] != prefix:
                return False
            if write.lower is None and write.upper is None:
                return True
            if len(ck) <= len(prefix):
                return False
            v = order_key(ck[len(prefix)])
            if write.lower is not None:
                lo = order_key(write.lower.value)
                if v < lo or (v == lo and not write.lower.inclusive):
                    return False
            if write.upper is not None:
                hi = order_key(write.upper.value)
                if v > hi or (v == hi and not write.upper.inclusive):
                    return False
            return True
        return False

    def _decide(self, touching: list[_Op], when: Timestamp) -> object:
        if not touching:
            return None
        newest = max(op.stamp for op in touching)
        last = [op for op in touching if op.stamp == newest]
        if any(op.write.delete for op in last):
            return None
        op = last[-1]
        if op.write.ttl is not None and when.hlc >= op.stamp.hlc + op.write.ttl * SECOND:
            return None
        return op.write.value

    def row(self, key: Key, ck: tuple[object, ...], when: Timestamp) -> object:
        touching = [
            op
            for op in self.ops
            if op.write.key == key
            and op.write.scope is not WriteScope.STATIC
            and self._covers(op.write, ck)
        ]
        return self._decide(touching, when)

    def static(self, key: Key, when: Timestamp) -> object:
        touching = [
            op
            for op in self.ops
            if op.write.key == key
            and (op.write.scope is WriteScope.STATIC or op.write.deletes_partition)
        ]
        value = self._decide(touching, when)
        # Null in every static column leaves no live static cell: no static row.
        if isinstance(value, tuple) and all(v is None for v in value):
            return None
        return value

    def slice(self, selection: Slice, when: Timestamp) -> object:
        cks = {
            op.write.clustering
            for op in self.ops
            if op.write.key == selection.key and op.write.scope is WriteScope.ROW
        }
        rows = []
        for ck in cks:
            value = self.row(selection.key, ck, when)
            probe = WriteOp(
                selection.key,
                None,
                True,
                WriteScope.RANGE,
                selection.prefix,
                selection.lower,
                selection.upper,
            )
            if value is not None and self._covers(probe, ck):
                rows.append((ck, value))

        def sort_key(item: tuple[tuple[object, ...], object]) -> list[object]:
            parts: list[object] = []
            for i, v in enumerate(item[0]):
                o = order_key(v)
                parts.append((1, o) if not (i < len(self.descending) and self.descending[i]) else o)
            return parts

        rows.sort(key=lambda item: tuple(order_key(v) for v in item[0]))
        if any(self.descending):
            rows.sort(key=lambda item: _desc_key(item[0], self.descending))
        if selection.reverse:
            rows.reverse()
        if selection.limit is None and len(rows) > MAX_ROWS_PER_SLICE:
            return "too large"
        return tuple(rows[: selection.limit or MAX_ROWS_PER_SLICE])


def _desc_key(ck: tuple[object, ...], descending: tuple[bool, ...]) -> tuple[object, ...]:
    # Descending columns sort by the negated rank of their value among sortable ints.
    out: list[object] = []
    for i, v in enumerate(ck):
        o = order_key(v)
        if i < len(descending) and descending[i]:
            assert type(v) is int
            out.append((-v,))
        else:
            out.append(o)
    return tuple(out)


# ---------------------------------------------------------------------------- strategies

cks = st.tuples(st.integers(0, 3), st.integers(0, 3))
bounds = st.none() | st.builds(Bound, st.integers(0, 3), st.booleans())
prefixes = st.one_of(st.just(()), st.tuples(st.integers(0, 3)))


@st.composite
def write_ops(draw: st.DrawFn) -> WriteOp:
    kind = draw(st.sampled_from(["row", "row", "row", "delete", "range", "partition", "static"]))
    ttl = draw(st.none() | st.integers(1, 5))
    if kind == "row":
        value = (draw(st.none() | st.integers(0, 9)),)
        return WriteOp(K, value, clustering=draw(cks), ttl=ttl)
    if kind == "delete":
        return WriteOp(K, None, True, clustering=draw(cks))
    if kind == "static":
        value = (draw(st.none() | st.integers(0, 9)),)
        return WriteOp(K, value, scope=WriteScope.STATIC, ttl=ttl)
    if kind == "partition":
        return WriteOp(K, None, True, WriteScope.PARTITION)
    prefix = draw(prefixes)
    lower, upper = draw(bounds), draw(bounds)
    return WriteOp(K, None, True, WriteScope.RANGE, prefix, lower, upper)


slices = st.builds(
    Slice,
    st.just(K),
    prefixes,
    bounds,
    bounds,
    st.booleans(),
    st.none() | st.integers(1, 4),
)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.integers(0, 8), st.lists(write_ops(), min_size=1, max_size=3)),
        min_size=1,
        max_size=8,
    ),
    reads=st.lists(st.tuples(st.integers(0, 14), slices, cks), min_size=1, max_size=6),
    descending=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_memory_partitions_agree_with_the_naive_model_in_any_write_order(
    batches: list[tuple[int, list[WriteOp]]],
    reads: list[tuple[int, Slice, tuple[int, int]]],
    descending: bool,
    seed: int,
) -> None:
    order = (descending, False)
    model = NaiveModel(order)
    stores = [MemoryPartitions(lambda _: order) for _ in range(2)]
    # A transaction's own writes of one row are reduced to the last by execute().
    stamped = [
        (at(t, node=i + 1), list(_last_per_target(ops))) for i, (t, ops) in enumerate(batches)
    ]
    for stamp, ops in stamped:
        model.write(ops, stamp)
    # One store in commit order, the other shuffled with each batch applied twice: writes
    # are idempotent and order-agnostic.
    for stamp, ops in stamped:
        stores[0].write(ops, stamp)
    shuffled = stamped * 2
    random.Random(seed).shuffle(shuffled)
    for stamp, ops in shuffled:
        stores[1].write(ops, stamp)
    for when_s, selection, ck in reads:
        when = at(when_s + 0.5)
        for store in stores:
            assert read(store, selection, when) == model.slice(selection, when)
            assert read(store, RowAt(K, ck), when) == model.row(K, ck, when)
            assert read(store, StaticAt(K), when) == model.static(K, when)


# ---------------------------------------------------------------------------- TTL


def test_an_all_null_static_row_is_absent_and_an_all_null_row_is_present() -> None:
    store = MemoryPartitions()
    other = Key(6, "ks.t:01")
    store.write([WriteOp(other, (4, "x"), scope=WriteScope.STATIC)], at(1))
    store.write(
        [
            WriteOp(K, (None, None), scope=WriteScope.STATIC),
            WriteOp(K, (None, None), clustering=(1,)),
            WriteOp(other, (None, None), scope=WriteScope.STATIC),
        ],
        at(2),
    )
    assert read(store, StaticAt(K), at(3)) is None
    assert read(store, StaticAt(other), at(3)) is None  # and it shadows the older one
    assert read(store, RowAt(K, (1,)), at(3)) == (None, None)
    assert read(store, Slice(K), at(3)) == (((1,), (None, None)),)
    store.write([WriteOp(K, (None, 7), scope=WriteScope.STATIC)], at(4))
    assert read(store, StaticAt(K), at(5)) == (None, 7)


def test_ttl_is_judged_as_of_the_readers_execute_at() -> None:
    store = MemoryPartitions()
    store.write([WriteOp(K, (1,), clustering=(1,), ttl=10)], at(100))
    row = RowAt(K, (1,))
    assert read(store, row, at(109.999999)) == (1,)
    assert read(store, row, at(110)) is None
    # The same read at the same executeAt gives the same answer whenever it runs.
    assert read(store, row, at(105)) == (1,)


def test_a_later_write_without_ttl_makes_a_row_permanent() -> None:
    store = MemoryPartitions()
    store.write([WriteOp(K, (1,), clustering=(1,), ttl=1)], at(1))
    store.write([WriteOp(K, (2,), clustering=(1,))], at(2))
    assert read(store, RowAt(K, (1,)), at(1000)) == (2,)


def test_ttl_bounds_are_refused() -> None:
    with pytest.raises(InvalidTransaction, match="TTL"):
        PutRow(K, (1,), Const((1,)), ttl=0)
    with pytest.raises(InvalidTransaction, match="TTL"):
        WriteOp(K, None, True, ttl=5)


# ---------------------------------------------------------------------------- evaluation


def _values(store: MemoryPartitions, txn: Txn, when: Timestamp) -> dict[Key, object]:
    return dict(store.read(txn.selections, when))


def test_slices_counts_and_static_rows_evaluate_in_a_transaction() -> None:
    store = MemoryPartitions()
    store.write(
        [WriteOp(K, (i * 10,), clustering=("a", i)) for i in range(5)]
        + [WriteOp(K, (99,), clustering=("b", 0)), WriteOp(K, (7,), scope=WriteScope.STATIC)],
        at(1),
    )
    newest_two = Slice(K, ("a",), Bound(1), Bound(4, inclusive=False), reverse=True, limit=2)
    txn = Txn(
        (),
        Update(
            (PutRow(K, ("a", 9), MakeTuple((CountOf(Slice(K, ("a",))),))),),
            (Predicate(">", CountOf(Slice(K, ("a",))), Const(3)),),
        ),
        returns=(SliceOf(newest_two), StaticOf(K), RowOf(K, ("b", 0)), RowOf(K, ("z", 1), "d")),
    )
    writes, result = execute(txn, _values(store, txn, at(2)))
    assert result.error is None and result.applied
    assert result.returned == (
        ((("a", 3), (30,)), (("a", 2), (20,))),
        (7,),
        (99,),
        "d",
    )
    assert writes == (WriteOp(K, (5,), clustering=("a", 9)),)
    store.write(writes, at(2))
    assert read(store, RowAt(K, ("a", 9)), at(3)) == (5,)


def test_selections_and_row_writes_tell_one_from_one_point_zero_and_true() -> None:
    # Python calls 1, 1.0 and True equal; rows and selections tell them apart.
    kinds: list[object] = [1, 1.0, True]
    rows = [RowAt(K, (v,)) for v in kinds] + [RowAt(K, ((v,),)) for v in kinds]
    prefixes = [Slice(K, (v,)) for v in kinds]
    ranged = [Slice(K, (), Bound(v), Bound(2)) for v in kinds] + [
        Slice(K, (), None, Bound(v, False)) for v in kinds
    ]
    for group in (rows, prefixes, ranged):
        for i, a in enumerate(group):
            for j, b in enumerate(group):
                assert (a == b) == (i == j), (a, b)
        assert len(set(group)) == len(group)
    assert RowAt(K, (1, "a")) == RowAt(K, (1, "a"))
    assert hash(RowAt(K, (1, "a"))) == hash(RowAt(K, (1, "a")))
    assert Slice(K, (1,), Bound(2.5)) == Slice(K, (1,), Bound(2.5))
    assert Bound(float("nan")) == Bound(float("nan")) != Bound(-0.0) != Bound(0.0)
    assert len({Bound(float("nan")), Bound(float("nan"))}) == 1

    store = MemoryPartitions()
    store.write([WriteOp(K, (10 + i,), clustering=(v,)) for i, v in enumerate(kinds)], at(1))
    txn = Txn(
        (),
        Update(
            tuple(PutRow(K, (v, "w"), Const((i,))) for i, v in enumerate(kinds)),
            (Predicate("=", RowOf(K, (1.0,)), Const((11,))),),
        ),
        returns=(
            *(RowOf(K, (v,)) for v in kinds),
            *(SliceOf(Slice(K, (v,))) for v in kinds),
        ),
    )
    assert len(txn.selections) == 6
    writes, result = execute(txn, _values(store, txn, at(2)))
    assert result.error is None and result.applied
    assert result.returned == (
        *((10 + i,) for i in range(3)),
        *((((v,), (10 + i,)),) for i, v in enumerate(kinds)),
    )
    # Three rows written, none of them taken for another's earlier write.
    assert [w.clustering for w in writes] == [(v, "w") for v in kinds]
    assert [type(w.clustering[0]) for w in writes] == [int, float, bool]


def test_range_and_partition_deletes() -> None:
    store = MemoryPartitions()
    store.write([WriteOp(K, (i,), clustering=(i,)) for i in range(6)], at(1))
    txn = Txn((), Update((DeleteRange(K, (), Bound(1), Bound(3)), DeleteRow(K, (5,)))))
    writes, _ = execute(txn, {})
    store.write(writes, at(2))
    assert read(store, Slice(K), at(3)) == (((0,), (0,)), ((4,), (4,)))
    # A row written before the range delete but arriving after it stays deleted.
    store.write([WriteOp(K, (22,), clustering=(2,))], at(1.5))
    assert read(store, RowAt(K, (2,)), at(3)) is None
    writes, _ = execute(Txn((), Update((DeletePartition(K),))), {})
    store.write(writes, at(4))
    assert read(store, Slice(K), at(5)) == ()


def test_a_deletion_wins_over_a_write_of_the_same_transaction() -> None:
    txn = Txn((), Update((PutRow(K, (1,), Const((1,))), DeleteRange(K))))
    writes, _ = execute(txn, {})
    for ordered in (writes, tuple(reversed(writes))):
        store = MemoryPartitions()
        store.write(ordered, at(1))
        assert read(store, RowAt(K, (1,)), at(2)) is None


def test_two_writes_of_one_row_keep_the_later() -> None:
    txn = Txn((), Update((PutRow(K, (1,), Const((1,))), PutRow(K, (1,), Const((2,))))))
    writes, _ = execute(txn, {})
    assert writes == (WriteOp(K, (2,), clustering=(1,)),)


def test_single_row_tables_keep_their_old_meaning() -> None:
    store = MemoryPartitions()
    store.write([WriteOp(K, (1, "x"))], at(1))
    txn = Txn((K,), Update((Put(K, MakeTuple((Item(ReadOf(K), 0), Const("y")))),)))
    values = _values(store, txn, at(2))
    writes, result = execute(txn, values)
    assert result.reads == ((K, (1, "x")),)
    assert writes == (WriteOp(K, (1, "y")),)
    # A store without partitions (a plain value per key) still works.
    assert execute(txn, {K: (1, "x")}) == (writes, result)
    store.write([WriteOp(K, None, delete=True)], at(3))
    assert execute(Txn((K,)), _values(store, Txn((K,)), at(4)))[1].reads == ((K, None),)


def test_a_slice_past_the_row_cap_is_a_deterministic_error() -> None:
    store = MemoryPartitions()
    store.write([WriteOp(K, (i,), clustering=(i,)) for i in range(MAX_ROWS_PER_SLICE + 1)], at(1))
    unbounded = Txn((), returns=(CountOf(Slice(K)),))
    writes, result = execute(unbounded, _values(store, unbounded, at(2)))
    assert writes == () and not result.applied
    assert result.error is not None and "MAX_ROWS_PER_SLICE" in result.error
    limited = Txn((), returns=(CountOf(Slice(K, limit=MAX_ROWS_PER_SLICE)),))
    assert execute(limited, _values(store, limited, at(2)))[1].returned == (MAX_ROWS_PER_SLICE,)
    with pytest.raises(InvalidTransaction, match="MAX_ROWS_PER_SLICE"):
        Slice(K, limit=MAX_ROWS_PER_SLICE + 1)


def test_a_partition_read_past_the_byte_cap_is_a_deterministic_error() -> None:
    store = MemoryPartitions()
    big = b"x" * (64 * 1024)
    count = MAX_PARTITION_READ_BYTES // len(big) + 1
    store.write([WriteOp(K, (big,), clustering=(i,)) for i in range(count)], at(1))
    txn = Txn((), returns=(SliceOf(Slice(K)),))
    _, result = execute(txn, _values(store, txn, at(2)))
    assert result.error is not None and "MAX_PARTITION_READ_BYTES" in result.error
    small = Txn((), returns=(SliceOf(Slice(K, limit=2)),))
    assert execute(small, _values(store, small, at(2)))[1].error is None


def test_selections_are_the_read_set() -> None:
    txn = Txn(
        (K,),
        Update((PutRow(K, (1,), MakeTuple((CountOf(Slice(K, (1,))),))),)),
        returns=(StaticOf(K),),
    )
    assert txn.selections == (RowAt(K), StaticAt(K), Slice(K, (1,)))
    assert txn.read_keys == (K,) and txn.write_keys == (K,)


# ---------------------------------------------------------------------------- wire


def test_version_2_journal_records_decode_and_reencode_unchanged() -> None:
    # Encoded by the codec before partitions held rows (CODEC_VERSION 2): a journaled
    # APPLIED command with a conditional update, writes (a put and a delete) and a result,
    # and a ReadOk. Journals must stay readable across versions; messages need not (a peer
    # batch of another codec version is refused whole, transport.py), and version 3's
    # Apply carries the outcome's ballot, so a version-2 Apply is refused by name.
    old_record = bytes.fromhex(
        "9d649401cd03e801024692919203a76b732e743a3030929293009207a76b732e743a303194020093"
        "019203a76b732e743a30300092000592019203a76b732e743a303091930593019203a76b732e743a"
        "303000920001929203a76b732e743a3030929203a76b732e743a30309207a76b732e743a30319401"
        "05000394010500039401cd03e9000291929203a76b732e743a3030919401cd0384010192939207a7"
        "6b732e743a30319306c40178a173c2939203a76b732e743a3030c0c39391929203a76b732e743a30"
        "309101c3c0c39207a76b732e743a3031"
    )
    old_read = bytes.fromhex("942403940102010391929205a76b732e743a30309201c4017a")
    old_apply = bytes.fromhex(
        "990e07940102010392919205a76b732e743a3030929293009205a76b732e743a30309204929303930192"
        "05a76b732e743a30309101009200a17892019206a16291930793019205a76b732e743a3030c0c0929205"
        "a76b732e743a3030929205a76b732e743a30309206a162940102010391929205a76b732e743a30309194"
        "0101010292939205a76b732e743a30309201a178c2939206a162c0c39391929205a76b732e743a303092"
        "01a178c3c0"
    )
    assert CODEC_VERSION >= 3  # still read by every later version
    record = decode_record(old_record)
    assert isinstance(record, CommandSnapshot) and record.status is Status.APPLIED
    assert encode_record(record) == old_record
    decoded = decode_message(old_read)
    assert isinstance(decoded, ReadOk) and encode_message(decoded) == old_read
    with pytest.raises(CodecError, match="Apply"):
        decode_message(old_apply)


def test_partition_reads_and_new_writes_round_trip() -> None:
    ts = Timestamp(1, 2, 1, 3)
    part = Slice(K, (1,), Bound(2), None, True, 5)
    answer = PartitionRead(
        ((RowAt(K, (1, 2)), (3,)), (part, (((1, 2), (3,)),)), (StaticAt(K), None))
    )
    message = ReadOk(3, ts, ((K, answer), (Key(6, "b"), (1,))))
    assert decode_message(encode_message(message)) == message
    txn = Txn(
        (),
        Update(
            (
                PutRow(K, (1,), Const((1,)), ttl=60),
                PutStatic(K, Const((2,))),
                DeleteRow(K, (2,)),
                DeleteRange(K, (1,), Bound(0, False), Bound(9)),
                DeletePartition(Key(6, "b")),
                Delete(K),
            )
        ),
        returns=(SliceOf(part), CountOf(part), StaticOf(K), RowOf(K, (1,), 0)),
    )
    writes, result = execute(
        txn, {K: PartitionRead(((part, ()), (StaticAt(K), None), (RowAt(K, (1,)), None)))}
    )
    apply = Apply(1, ts, txn, Route(K, (K, Key(6, "b"))), ts, Deps({}), writes, result)
    assert decode_message(encode_message(apply)) == apply


def test_malformed_selections_are_codec_errors() -> None:
    ts = Timestamp(1, 2, 1, 3)
    data = encode_message(ReadOk(3, ts, ((K, PartitionRead(((RowAt(K, (1,)), None),))),)))
    wire = bytearray(data)
    # The RowAt's clustering value 1 becomes nil: a null clustering value is refused.
    index = data.rindex(bytes([0x91, 0x01]))
    wire[index + 1] = 0xC0
    with pytest.raises(CodecError, match="null clustering value"):
        decode_message(bytes(wire))


def test_validation_refuses_a_forged_oversize_slice_answer() -> None:
    topology = ring_topology([1, 2, 3], 3)
    ts = Timestamp(topology.epoch, 10, 0, 1)
    key = Key(5, "k")
    part = Slice(key, limit=1)
    forged = PartitionRead(((part, (((1,), 1), ((2,), 2))),))
    envelope = Envelope(1, 2, ReadOk(3, ts, ((key, forged),)))
    with pytest.raises(InvalidMessage, match="more than 1 rows"):
        validate(envelope, topology, 10, MessageLimits())
    honest = PartitionRead(((part, (((1,), 1),)),))
    validate(Envelope(1, 2, ReadOk(3, ts, ((key, honest),))), topology, 10, MessageLimits())


def test_txn_result_returned_values_round_trip() -> None:
    ts = Timestamp(1, 2, 1, 3)
    result = TxnResult(((K, None),), True, None, ((1, "a"), None))
    apply = Apply(1, ts, Txn((K,)), Route(K, (K,)), ts, Deps({}), (), result)
    assert decode_message(encode_message(apply)) == apply
