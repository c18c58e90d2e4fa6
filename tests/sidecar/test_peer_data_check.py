"""The sidecar's check of keys and rows in peer messages remembers keys it found good; a
remembered key must never let through a forged key of the same partition name."""

from __future__ import annotations

import pytest

from accord.messages import Apply, Envelope
from accord.messages.validate import InvalidMessage
from accord.primitives import (
    Const,
    Deps,
    Key,
    Put,
    Route,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
)
from accord_cassandra.schema import Catalog
from accord_cassandra.server import KNOWN_KEYS_MAX, peer_data_check
from tests.sidecar.conftest import EMBEDDED_TABLES

CATALOG = Catalog.from_mapping(EMBEDDED_TABLES)
ACCOUNTS = CATALOG.table("bank", "accounts")


def apply_of(key: Key) -> Envelope:
    txn = Txn(reads=(key,), update=Update((Put(key, Const((1, 0))),)))
    txn_id = Timestamp(1, 1_800_000_000_000_000, 1, 2)
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
