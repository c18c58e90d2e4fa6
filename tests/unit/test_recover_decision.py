"""The recovery decision table, one row per line of coordinate/recover.py's table."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace
from strategies import deps as deps_of
from strategies import keys

from accord.coordinate.recover import Action, Decision, decide
from accord.messages import RecoverOk
from accord.primitives import (
    BALLOT_ZERO,
    EMPTY_DEPS,
    Ballot,
    Deps,
    Key,
    Status,
    Timestamp,
    TokenRange,
    TxnId,
    TxnResult,
    WriteOp,
)
from accord.topology import Shard

TXN = Timestamp(1, 100, 1, 9)
BEFORE, BEFORE2, AFTER = Timestamp(1, 50, 1, 2), Timestamp(1, 60, 0, 3), Timestamp(1, 150, 1, 4)
LATER = Timestamp(1, 200, 0, 5)  # a later executeAt
K1, K2 = Key(1, "k1"), Key(2, "k2")
B1, B2 = Timestamp(1, 300, 0, 1), Timestamp(1, 400, 0, 2)  # recovery ballots, B1 < B2
WRITES = (WriteOp(K1, 7),)
RESULT = TxnResult(((K1, None),), True)

# n = 5, e = 5: fq 4, so recovery rejects the fast path at more than e - fq = 1 non-fast vote.
FIVE = Shard(TokenRange(0, 10), (1, 2, 3, 4, 5), frozenset({1, 2, 3, 4, 5}))
# n = 5, e = 4: fq 4, so any non-fast electorate vote rejects; node 5 never votes.
FIVE_E4 = Shard(TokenRange(0, 10), (1, 2, 3, 4, 5), frozenset({1, 2, 3, 4}))
# Two shards sharing node 3 (n = 3, e = 3: fq 3, any non-fast vote rejects).
LEFT = Shard(TokenRange(0, 10), (1, 2, 3), frozenset({1, 2, 3}))
RIGHT = Shard(TokenRange(10, 20), (3, 4, 5), frozenset({3, 4, 5}))


def ok(
    status: Status = Status.PRE_ACCEPTED,
    *,
    fast: bool = True,
    accepted: Ballot = BALLOT_ZERO,
    execute_at: Timestamp | None = None,
    deps: Deps = EMPTY_DEPS,
    rejects: bool = False,
    committed_witness: tuple[TxnId, ...] = (),
    accepted_no_witness: tuple[TxnId, ...] = (),
    writes: tuple[WriteOp, ...] | None = None,
    result: TxnResult | None = None,
) -> RecoverOk:
    """A recovery reply; by default a replica that pre-accepted with a fast vote."""
    if execute_at is None and status is Status.PRE_ACCEPTED:
        execute_at = TXN if fast else AFTER
    return RecoverOk(
        1,
        TXN,
        status,
        accepted,
        execute_at,
        deps,
        fast,
        rejects,
        committed_witness,
        accepted_no_witness,
        writes,
        result,
    )


D_COMMITTED = Deps({K1: [BEFORE]})
D_LOW, D_HIGH = Deps({K1: [BEFORE]}), Deps({K2: [BEFORE2, AFTER]})
D_ANY = Deps({K1: [BEFORE, AFTER], K2: [BEFORE2, LATER]})


# Reference: accord.md §5; Accord Recover.java. Each row is one line of the table in
# accord/coordinate/recover.py, in its priority order.
@pytest.mark.parametrize(
    ("shards", "replies", "expected"),
    [
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.INVALIDATED),
                2: ok(Status.ACCEPTED, accepted=B2, execute_at=LATER),
                3: ok(),
            },
            Decision(Action.COMMIT_INVALIDATION),
            id="invalidated wins over everything",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.COMMITTED, execute_at=LATER, deps=D_COMMITTED),
                2: ok(
                    Status.APPLIED, execute_at=LATER, deps=D_COMMITTED, writes=WRITES, result=RESULT
                ),
                3: ok(),
            },
            Decision(Action.PERSIST, LATER, D_COMMITTED, WRITES, RESULT),
            id="applied: persist the recorded outcome",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(
                    Status.PRE_APPLIED,
                    execute_at=LATER,
                    deps=D_COMMITTED,
                    writes=WRITES,
                    result=RESULT,
                ),
                2: ok(),
                3: ok(),
            },
            Decision(Action.PERSIST, LATER, D_COMMITTED, WRITES, RESULT),
            id="pre-applied: persist the recorded outcome",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.ACCEPTED, accepted=B2, execute_at=AFTER, deps=D_HIGH),
                2: ok(Status.COMMITTED, execute_at=LATER, deps=D_COMMITTED),
                3: ok(),
            },
            Decision(Action.STABILISE, LATER, D_COMMITTED),
            id="committed: stabilise its executeAt and deps",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.COMMITTED, execute_at=LATER, deps=D_COMMITTED),
                2: ok(Status.STABLE, execute_at=LATER, deps=D_COMMITTED),
                3: ok(Status.ACCEPTED, accepted=B1, execute_at=LATER, deps=D_COMMITTED),
            },
            Decision(Action.STABILISE, LATER, D_COMMITTED),
            id="stable: stabilise (and execute)",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.ACCEPTED_INVALIDATE, accepted=B1),
                2: ok(Status.ACCEPTED, accepted=B2, execute_at=LATER, deps=D_LOW),
                3: ok(deps=D_HIGH),
            },
            Decision(Action.PROPOSE, LATER, D_LOW.merge(D_HIGH)),
            id="accepted at the highest ballot: re-propose its executeAt, deps merged below it",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.ACCEPTED_INVALIDATE, accepted=B2),
                2: ok(Status.ACCEPTED, accepted=B1, execute_at=LATER, deps=D_LOW),
                3: ok(),
            },
            Decision(Action.INVALIDATE),
            id="accepted-invalidate at the highest ballot: invalidate",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(Status.ACCEPTED, accepted=B1, execute_at=AFTER, deps=D_LOW),
                2: ok(Status.ACCEPTED, accepted=B2, execute_at=LATER, deps=D_ANY),
                3: ok(Status.PRE_ACCEPTED, fast=False),
            },
            Decision(Action.PROPOSE, LATER, Deps({K1: [BEFORE, AFTER], K2: [BEFORE2]})),
            id="of two proposals the higher ballot wins; deps at or above executeAt dropped",
        ),
        pytest.param(
            (FIVE,),
            {1: ok(fast=False), 2: ok(fast=False), 3: ok()},
            Decision(Action.INVALIDATE),
            id="fast path rejected: 2 non-fast electorate votes > e - fq = 1",
        ),
        pytest.param(
            (FIVE,),
            {1: ok(fast=False), 2: ok(), 3: ok(deps=D_ANY)},
            Decision(Action.PROPOSE, TXN, Deps({K1: [BEFORE], K2: [BEFORE2]})),
            id="1 non-fast vote = e - fq: the fast path may have won, propose txnId",
        ),
        pytest.param(
            (FIVE_E4,),
            {5: ok(fast=False), 1: ok(), 2: ok()},
            Decision(Action.PROPOSE, TXN, EMPTY_DEPS),
            id="a non-fast vote outside the electorate does not count",
        ),
        pytest.param(
            (FIVE_E4,),
            {4: ok(fast=False), 1: ok(), 2: ok()},
            Decision(Action.INVALIDATE),
            id="e=4: one non-fast electorate vote > e - fq = 0",
        ),
        pytest.param(
            (LEFT, RIGHT),
            {1: ok(), 2: ok(), 3: ok(), 4: ok(), 5: ok(fast=False)},
            Decision(Action.INVALIDATE),
            id="rejected in one shard rejects the txn",
        ),
        pytest.param(
            (FIVE,),
            {1: ok(), 2: ok(rejects=True), 3: ok()},
            Decision(Action.INVALIDATE),
            id="fast path rejected by a replica's rejects_fast_path",
        ),
        pytest.param(
            (FIVE,),
            {1: ok(fast=False), 2: ok(fast=False), 3: ok(accepted_no_witness=(BEFORE,))},
            Decision(Action.INVALIDATE),
            id="a rejected fast path invalidates before waiting on earlier txns",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(accepted_no_witness=(BEFORE2, BEFORE)),
                2: ok(committed_witness=(BEFORE2,)),
                3: ok(accepted_no_witness=(Timestamp(1, 70, 1, 1),)),
            },
            Decision(Action.RETRY_LATER, wait_for=(BEFORE, Timestamp(1, 70, 1, 1))),
            id="earlier accepted without witness, minus committed witnesses: wait for them",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(accepted_no_witness=(BEFORE,)),
                2: ok(committed_witness=(BEFORE,)),
                3: ok(deps=D_LOW),
            },
            Decision(Action.PROPOSE, TXN, D_LOW),
            id="every earlier accepted txn witnessed us: propose txnId",
        ),
        pytest.param(
            (FIVE,),
            {
                1: ok(deps=D_LOW),
                2: ok(deps=D_HIGH),
                3: ok(Status.NOT_DEFINED, fast=False, execute_at=None),
            },
            Decision(Action.PROPOSE, TXN, Deps({K1: [BEFORE], K2: [BEFORE2]})),
            id="otherwise propose txnId with merged deps below txnId",
        ),
    ],
)
def test_decision_table(
    shards: tuple[Shard, ...], replies: dict[int, RecoverOk], expected: Decision
) -> None:
    assert decide(TXN, shards, replies) == expected


recover_statuses = st.sampled_from(
    [Status.NOT_DEFINED, Status.PRE_ACCEPTED, Status.ACCEPTED, Status.ACCEPTED_INVALIDATE]
)
ids = st.sampled_from([BEFORE, BEFORE2, AFTER, LATER, Timestamp(1, 70, 1, 1)])


@st.composite
def undecided_replies(draw: st.DrawFn) -> dict[int, RecoverOk]:
    nodes = draw(st.lists(st.integers(1, 5), min_size=3, max_size=5, unique=True))
    replies = {}
    for node in nodes:
        status = draw(recover_statuses)
        proposed = draw(st.sampled_from([TXN, AFTER, LATER]))
        replies[node] = ok(
            status,
            fast=draw(st.booleans()),
            accepted=draw(st.sampled_from([B1, B2])) if status.is_proposal else BALLOT_ZERO,
            execute_at=proposed if status is Status.ACCEPTED else None,
            deps=draw(deps_of(keys(small=True), ids)),
            rejects=draw(st.booleans()),
            committed_witness=tuple(draw(st.lists(ids, max_size=2))),
            accepted_no_witness=tuple(draw(st.lists(ids, max_size=2))),
        )
    return replies


@given(undecided_replies(), st.randoms(use_true_random=False))
def test_decisions_do_not_depend_on_reply_order_and_keep_deps_below_execute_at(
    replies: dict[int, RecoverOk], rng: random.Random
) -> None:
    decision = decide(TXN, (FIVE,), replies)
    shuffled = list(replies.items())
    rng.shuffle(shuffled)
    assert decide(TXN, (FIVE,), dict(shuffled)) == decision
    if decision.action is Action.PROPOSE:
        assert decision.execute_at is not None
        assert all(dep < decision.execute_at for dep in decision.deps.txn_ids())
    if decision.action is Action.RETRY_LATER:
        assert list(decision.wait_for) == sorted(set(decision.wait_for))
        witnessed = {t for r in replies.values() for t in r.earlier_committed_witness}
        assert not witnessed & set(decision.wait_for)


@given(undecided_replies())
def test_proposals_are_decided_by_the_highest_ballot_alone(replies: dict[int, RecoverOk]) -> None:
    proposals = [r for r in replies.values() if r.status.is_proposal]
    decision = decide(TXN, (FIVE,), replies)
    if not proposals:
        assert decision.action in (Action.INVALIDATE, Action.RETRY_LATER, Action.PROPOSE)
        return
    top = max(r.accepted for r in proposals)
    winners = {(r.status, r.execute_at) for r in proposals if r.accepted == top}
    if winners == {(Status.ACCEPTED_INVALIDATE, None)}:
        assert decision == Decision(Action.INVALIDATE)
    elif len(winners) == 1:
        ((_, execute_at),) = winners
        assert (decision.action, decision.execute_at) == (Action.PROPOSE, execute_at)
    # Fast-path votes never matter once something was accepted.
    flipped = {n: replace(r, accepts_fast_path=not r.accepts_fast_path) for n, r in replies.items()}
    assert decide(TXN, (FIVE,), flipped) == decision
