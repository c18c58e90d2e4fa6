"""Batches (group commit): a Txn of parts evaluated against one read, its codec form, its
limits and the disjointness rule that makes every order of its parts a serial order."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import batches, values

from accord import codec
from accord.codec import CodecError, walk
from accord.invariants import InvalidTransaction
from accord.local.command import CommandSnapshot
from accord.messages import Apply, PreAccept
from accord.primitives import (
    BinOp,
    Const,
    Deps,
    Key,
    Predicate,
    Put,
    ReadOf,
    Route,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
    execute,
    sim_key,
)
from accord.primitives.txn import MAX_BATCH_PARTS, disjoint

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
A, B, C, D = (sim_key(n) for n in "abcd")
TS = Timestamp(1, 1_000_000, 1, 3)


def add(key: Key, amount: int, *, read: Key | None = None) -> Txn:
    source = key if read is None else read
    return Txn((key,), Update((Put(key, BinOp("+", ReadOf(source, 0), Const(amount))),)))


# ---------------------------------------------------------------------------- execute


@given(batch=batches(), data=st.data())
@SLOW
def test_each_part_of_a_batch_gets_what_it_would_get_alone(batch: Txn, data: st.DataObject) -> None:
    read = {key: data.draw(values(max_leaves=4)) for key in batch.read_keys}
    writes, result = execute(batch, read)
    alone = [execute(part, read) for part in batch.parts]
    assert result.parts == tuple(r for _, r in alone)
    assert writes == tuple(w for ws, _ in alone for w in ws)
    assert result.applied and result.reads == () and result.error is None


def test_one_parts_error_or_false_condition_touches_no_other_part() -> None:
    failing = Txn((A,), Update((Put(A, BinOp("-", ReadOf(A), Const(1))),)))  # "x" - 1
    declined = Txn((B,), Update((Put(B, Const(9)),), (Predicate("=", ReadOf(B), Const(0)),)))
    fine = add(C, 5)
    writes, result = execute(Txn.batch((failing, declined, fine)), {A: "x", B: 1, C: 2})
    assert result.parts[0].error is not None and not result.parts[0].applied
    assert not result.parts[1].applied and result.parts[1].error is None
    assert result.parts[2] == TxnResult(((C, 2),), True)
    assert writes == (WriteOp(C, 7),)


# ---------------------------------------------------------------------------- the rule


def test_reads_may_overlap_but_no_part_writes_what_another_uses() -> None:
    both_read = Txn.batch((Txn((A,), Update((Put(B, ReadOf(A)),))), Txn((A, C))))
    assert both_read.keys == (A, B, C) if A < B < C else set(both_read.keys) == {A, B, C}
    assert both_read.write_keys == (B,)
    with pytest.raises(InvalidTransaction, match="part 1"):
        Txn.batch((add(A, 1), add(A, 2)))  # both write A
    with pytest.raises(InvalidTransaction, match="part 1"):
        Txn.batch((add(A, 1), Txn((A,))))  # reads what part 0 writes
    with pytest.raises(InvalidTransaction, match="part 1"):
        Txn.batch((Txn((A,)), add(A, 1)))  # writes what part 0 reads
    with pytest.raises(InvalidTransaction, match="part 1"):
        Txn.batch((add(B, 1, read=A), add(A, 1)))  # writes the key part 0 reads for B
    assert disjoint(add(A, 1), {B}, set()) and not disjoint(Txn((B,)), {B}, {B})


def test_a_batch_holds_two_to_max_parts_plain_transactions() -> None:
    with pytest.raises(InvalidTransaction, match="2 to"):
        Txn.batch((add(A, 1),))
    many = tuple(add(sim_key(f"k{i}"), 1) for i in range(MAX_BATCH_PARTS + 1))
    with pytest.raises(InvalidTransaction, match="2 to"):
        Txn.batch(many)
    assert len(Txn.batch(many[:MAX_BATCH_PARTS]).parts) == MAX_BATCH_PARTS
    inner = Txn.batch((add(A, 1), add(B, 1)))
    with pytest.raises(InvalidTransaction, match="not a plain"):
        Txn.batch((inner, add(C, 1)))
    with pytest.raises(InvalidTransaction, match="no reads"):
        Txn((D,), None, (), (add(A, 1), add(B, 1)))


# ---------------------------------------------------------------------------- codec


def _preaccept(txn: Txn) -> PreAccept:
    return PreAccept(1, TS, txn, Route(txn.keys[0], txn.keys))


def test_a_batch_and_its_result_travel_and_are_journaled_by_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = Txn.batch((add(A, 1), add(B, 2)))
    _, result = execute(batch, {A: 1, B: 2})
    apply = Apply(1, TS, batch, Route(A, batch.keys), TS, Deps(), (WriteOp(A, 2),), result)
    data = [codec.encode_message(_preaccept(batch)), codec.encode_message(apply)]
    assert data == [walk.encode_message(_preaccept(batch)), walk.encode_message(apply)]

    def refuse(*_: object) -> None:
        raise AssertionError("the walk was used")

    for name in ("encode_message", "decode_message"):
        monkeypatch.setattr(walk, name, refuse)
    decoded = [codec.decode_message(d) for d in data]
    assert decoded == [_preaccept(batch), apply]
    assert decoded[1].result.parts == result.parts  # type: ignore[union-attr]


# A journal record written by codec version 3 (before batches): an applied command whose
# txn has returns and whose result has returned values, the trailing fields of version 3.
V3_SNAPSHOT = bytes.fromhex(
    "9d649401ce000f4240010346939192cf40f89e395b66422fa1619291930092cf40f89e395b66422fa16194"
    "0200930192cf40f89e395b66422fa161009200019091930192cf40f89e395b66422fa161c09292cf40f89e"
    "395b66422fa1619192cf40f89e395b66422fa1619401ce000f424001039401ce000f424001039401ce000f"
    "42400103919292cf40f89e395b66422fa161919401ce000f42400103919392cf40f89e395b66422fa16102"
    "c294919292cf40f89e395b66422fa16101c3c09101c392cf40f89e395b66422fa161"
)


def test_version_3_journal_records_decode_unchanged_and_encode_to_the_same_bytes() -> None:
    record = codec.decode_record(V3_SNAPSHOT)
    assert isinstance(record, CommandSnapshot)
    assert record.txn is not None and record.txn.parts == () and record.txn.returns
    assert record.result == TxnResult(((A, 1),), True, None, (1,))
    assert record.result.parts == ()
    # What has no parts is written exactly as version 3 wrote it.
    assert codec.encode_record(record) == V3_SNAPSHOT
    assert walk.decode_record(V3_SNAPSHOT) == record


def _with_parts(count: int) -> bytes:
    wire = msgpack.unpackb(walk.encode_message(_preaccept(add(A, 1))), use_list=True)
    part = wire[3]
    wire[3] = [[], None, [], [part] * count]
    return msgpack.packb(wire)


def test_decoding_refuses_more_than_max_parts_and_nested_batches() -> None:
    with pytest.raises(CodecError, match="MAX_BATCH_PARTS"):
        codec.decode_message(_with_parts(MAX_BATCH_PARTS + 1))
    # Parts equal to each other write the same key: refused by the rule, named.
    with pytest.raises(CodecError, match="part 1"):
        codec.decode_message(_with_parts(2))
    wire = msgpack.unpackb(walk.encode_message(_preaccept(add(A, 1))), use_list=True)
    nested = [[], None, [], [wire[3], wire[3]]]
    wire[3] = [[], None, [], [nested, nested]]
    with pytest.raises(CodecError, match="parts of its own"):
        codec.decode_message(msgpack.packb(wire))
