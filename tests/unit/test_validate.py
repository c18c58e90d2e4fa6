"""accord.messages.validate: what an honest peer could send passes, and each kind of value
no honest peer sends is refused with a message naming the field."""

from __future__ import annotations

import pytest

from accord import ring_topology
from accord.messages import (
    Accept,
    Apply,
    Commit,
    Envelope,
    Message,
    PreAccept,
    PreAcceptOk,
    RecoverOk,
)
from accord.messages.validate import InvalidMessage, MessageLimits, validate
from accord.primitives import (
    BALLOT_ZERO,
    Const,
    Deps,
    Key,
    Put,
    Route,
    Status,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
)

TOPOLOGY = ring_topology([1, 2, 3], 3, shards_per_node=1)
NOW = 1_800_000_000_000_000
LIMITS = MessageLimits(max_future_skew_micros=60_000_000, max_node_id=1023, max_keys=4)
KEY = Key(42, "k")
TXN = Txn(reads=(), update=Update((Put(KEY, Const(1)),)))
ROUTE = Route(KEY, (KEY,))
TXN_ID = Timestamp(1, NOW, 1, 2)


def check(body: Message, src: int = 2, dest: int = 1) -> None:
    validate(Envelope(src, dest, body), TOPOLOGY, NOW, LIMITS)


def test_honest_messages_pass() -> None:
    later = Timestamp(1, NOW + 5, 0, 3)
    check(PreAccept(1, TXN_ID, TXN, ROUTE))
    check(Accept(1, TXN_ID, TXN, ROUTE, Timestamp(1, NOW, 0, 3), later, Deps({KEY: (TXN_ID,)})))
    check(Commit(1, TXN_ID, TXN_ID, Deps({}), True, False, TXN, ROUTE))
    check(Apply(1, TXN_ID, TXN, ROUTE, later, Deps({}), (WriteOp(KEY, 1),), TxnResult((), True)))
    check(PreAcceptOk(1, TXN_ID, later, Deps({KEY: (TXN_ID,)})))
    check(
        RecoverOk(1, TXN_ID, Status.NOT_DEFINED, BALLOT_ZERO, None, Deps({}), False, False, (), ())
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (PreAccept(1, TXN_ID._replace(hlc=2**63 - 10), TXN, ROUTE), "beyond the allowed clock"),
        (PreAccept(1, TXN_ID._replace(hlc=NOW + 61_000_000), TXN, ROUTE), "clock skew"),
        (PreAccept(1, TXN_ID._replace(hlc=-1), TXN, ROUTE), "negative"),
        (PreAccept(1, TXN_ID._replace(node=5000), TXN, ROUTE), "node 5000"),
        (PreAccept(1, TXN_ID._replace(node=4), TXN, ROUTE), "node 4"),
        (PreAccept(1, TXN_ID._replace(epoch=2), TXN, ROUTE), "epoch 2"),
        (PreAccept(1, TXN_ID._replace(flags=2), TXN, ROUTE), "flags"),
        (PreAccept(1, TXN_ID._replace(flags=0), TXN, ROUTE), "kind"),
        (
            Commit(1, TXN_ID, TXN_ID._replace(node=5000), Deps({}), True, False, None, None),
            "Commit.execute_at",
        ),
        (Commit(1, TXN_ID, TXN_ID._replace(hlc=NOW - 1), Deps({}), True), "below txnId"),
        (PreAcceptOk(1, TXN_ID, TXN_ID, Deps({KEY: (TXN_ID._replace(node=9),)})), "deps"),
        (
            PreAccept(1, TXN_ID, TXN, Route(Key(7, "other"), (Key(7, "other"),))),
            "within its route",
        ),
        (
            PreAccept(
                1,
                TXN_ID,
                Txn(reads=tuple(Key(i, f"k{i}") for i in range(5))),
                Route(Key(0, "k0"), tuple(Key(i, f"k{i}") for i in range(5))),
            ),
            "limit of 4",
        ),
    ],
)
def test_what_no_honest_peer_sends_is_refused(body: Message, problem: str) -> None:
    with pytest.raises(InvalidMessage, match=problem):
        check(body)


def test_deps_are_bounded_in_total() -> None:
    ids = tuple(Timestamp(1, NOW - i, 1, 2) for i in range(10))
    limits = MessageLimits(max_deps=9)
    with pytest.raises(InvalidMessage, match="limit of 9"):
        validate(
            Envelope(2, 1, PreAcceptOk(1, TXN_ID, TXN_ID, Deps({KEY: ids}))), TOPOLOGY, NOW, limits
        )


def test_a_sender_outside_the_topology_or_posing_as_the_receiver_is_refused() -> None:
    for src in (7, 1):
        with pytest.raises(InvalidMessage, match="sender"):
            check(PreAccept(1, TXN_ID, TXN, ROUTE), src=src)
