"""The sidecar's check of keys and rows in peer messages remembers keys it found good; a
remembered key must never let through a forged key of the same partition name."""

from __future__ import annotations

from typing import Any

import pytest

from accord.messages import Apply, Envelope
from accord.messages.validate import InvalidMessage
from accord.primitives import (
    Const,
    Deps,
    Key,
    MakeTuple,
    Put,
    Route,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
)
from accord_cassandra import server
from accord_cassandra.schema import Catalog
from accord_cassandra.server import KNOWN_KEYS_MAX, peer_data_check
from tests.sidecar.conftest import EMBEDDED_TABLES

CATALOG = Catalog.from_mapping(EMBEDDED_TABLES)
ACCOUNTS = CATALOG.table("bank", "accounts")


TXN_ID = Timestamp(1, 1_800_000_000_000_000, 1, 2)


def row_txn(key: Key, balance: object) -> Txn:
    return Txn(reads=(key,), update=Update((Put(key, MakeTuple((Const(balance), Const(0)))),)))


def apply_of(key: Key, txn: Txn | None = None) -> Envelope:
    txn = txn or Txn(reads=(key,), update=Update((Put(key, Const((1, 0))),)))
    txn_id = TXN_ID
    body = Apply(
        1,
        txn_id,
        txn,
        Route(key, (key,)),
        txn_id,
        Deps({}),
        (WriteOp(key, (1, 0)),),
        TxnResult((), True),
    )
    return Envelope(2, 1, body)


def test_a_known_key_does_not_vouch_for_a_forged_token() -> None:
    check = peer_data_check(CATALOG)
    good = ACCOUNTS.key(["alice"])
    check(apply_of(good))
    check(apply_of(good))  # remembered
    forged = good._replace(token=good.token + 1)
    with pytest.raises(InvalidMessage, match="token"):
        check(apply_of(forged))
    check(apply_of(good))


def test_the_memory_of_good_keys_is_bounded_and_still_checks() -> None:
    check = peer_data_check(CATALOG)
    for i in range(KNOWN_KEYS_MAX + 10):
        check(apply_of(ACCOUNTS.key([f"k{i}"])))
    forged = ACCOUNTS.key(["k1"])._replace(token=0)
    with pytest.raises(InvalidMessage):
        check(apply_of(forged))


def test_a_txn_the_node_holds_is_not_checked_again_but_a_different_one_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = ACCOUNTS.key(["alice"])
    good = row_txn(key, 5)
    held: dict[Any, Txn] = {TXN_ID: good}
    check = server.peer_data_check(CATALOG, held.get)
    check(apply_of(key, good))
    # Same id, a row the table cannot take: checked in full, refused.
    with pytest.raises(InvalidMessage, match="balance"):
        check(apply_of(key, row_txn(key, "not a number")))
    # An equal txn (another object, as decoded from another message) is not type-checked
    # again: a check that would now fail is never reached.
    calls: list[str] = []

    def failing(name: str, *args: object, **kwargs: object) -> None:
        calls.append(name)
        raise server.SchemaError(f"{name}: checked again")

    monkeypatch.setattr(server, "check_type", failing)
    check(apply_of(key, row_txn(key, 5)))
    assert calls == []
    # Without the node holding it, the same txn is checked (and the failing check seen).
    held.clear()
    with pytest.raises(InvalidMessage, match="checked again"):
        check(apply_of(key, row_txn(key, 5)))
    assert calls
