"""Group commit along write lanes (accord_changes.ChangeBatcher), against a stand-in gateway
that holds each transaction in flight a moment and records what it wrote.

Accord runs two transactions that share a partition one after the other, so batches in
flight must not share a lane's partitions: with one shared queue every batch named every
lane, and the accord mode's starts ran at a fifth of their rate at 128 in flight. And the
gateway spreads transactions over the sidecars (the one a client talks to coordinates), and
keeps new ones off a sidecar that just failed."""

from __future__ import annotations

import asyncio
import random
import socket
from collections import Counter
from typing import Any

from accord_cassandra.client import Transaction
from accord_cassandra.v1 import client_pb2 as pb
from stacksaga_store.store.accord_changes import (
    BATCH_CHANGES_MAX,
    BATCH_IN_FLIGHT_MAX,
    AccordChange,
    AccordGateway,
    AccordOutcome,
    ChangeBatcher,
    CommitCrashes,
    Part,
)
from tests.sidecar.test_client_errors import fake_sidecar

LANES = 16


class HoldingGateway:
    """Answers every transaction applied after ``hold`` seconds; notes the lanes (the
    partitions' ``lane-N`` prefixes) of the transactions in flight at once."""

    def __init__(self, hold: float = 0.01) -> None:
        self.hold = hold
        self.in_flight: list[frozenset[str]] = []
        self.overlaps: list[tuple[frozenset[str], frozenset[str]]] = []
        self.sizes: list[int] = []
        self.most_in_flight = 0
        self.batcher: ChangeBatcher | None = None

    async def transact(self, build: Any) -> AccordOutcome:
        request = build().request
        lanes = frozenset(
            m.row.partition_key[0].text.split("/")[0]
            for m in request.mutations
            if m.row.partition_key[0].text.startswith("lane-")
        )
        self.overlaps += [(lanes, other) for other in self.in_flight if lanes & other]
        self.in_flight.append(lanes)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        self.sizes.append(len(request.mutations))
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.in_flight.remove(lanes)
        rows = {let.name: {"ok": let.name} for let in request.lets}
        return AccordOutcome(True, rows)


def _start(gateway: Any, n: int, lane_of: Any = None) -> AccordChange:
    """A start-like change of lane ``n % LANES`` (or ``lane_of(n)``): it reads its lane's
    Tier-4 row and writes a row of its lane's Tier-5 partition and its own es_transaction
    row."""
    lane = f"lane-{n % LANES if lane_of is None else lane_of(n)}"

    def build(txn: Any, tag: str) -> None:
        txn.let(f"{tag}b", "ks", "t4", f"{lane}/t4")
        txn.update("ks", "t5", f"{lane}/t5", (n,), v=n)
        txn.update("ks", "es_transaction", f"saga-{n}", v=n)

    change = AccordChange(gateway, "start", CommitCrashes())
    change.add(Part("start", build, lane=lane))
    return change


def _run(gateway: HoldingGateway, changes: int) -> list[AccordOutcome]:
    # Lanes in no particular order: changes reach the batcher as their sagas get there.
    lanes = random.Random(7).choices(range(LANES), k=changes)

    async def scenario() -> list[AccordOutcome]:
        batcher = ChangeBatcher(gateway)  # type: ignore[arg-type]
        results = await asyncio.gather(
            *(batcher.commit(_start(gateway, n, lanes.__getitem__)) for n in range(changes))
        )
        return [outcome for outcome, _ in results]

    return asyncio.run(scenario())


def test_batches_in_flight_never_share_a_lane_and_stay_large() -> None:
    gateway = HoldingGateway()
    outcomes = _run(gateway, 128)
    assert all(o.applied for o in outcomes)
    # Each change sees its own LET under its own name, nothing of the others'.
    assert all(set(o.rows) == {"p0_b"} and o.rows["p0_b"] for o in outcomes)
    assert not gateway.overlaps, f"batches in flight shared lanes: {gateway.overlaps[:3]}"
    assert gateway.most_in_flight == BATCH_IN_FLIGHT_MAX
    # 128 changes in ~BATCH_IN_FLIGHT_MAX lanes-disjoint streams: few, full transactions.
    assert len(gateway.sizes) <= 128 // (BATCH_CHANGES_MAX // 3)
    assert sum(gateway.sizes) == 2 * 128


def test_changes_without_a_lane_still_share_transactions() -> None:
    gateway = HoldingGateway()

    async def scenario() -> None:
        batcher = ChangeBatcher(gateway)  # type: ignore[arg-type]

        def freeze(n: int) -> AccordChange:
            def build(txn: Any, tag: str) -> None:
                txn.update("ks", "es_transaction", f"saga-{n}", v=n)

            change = AccordChange(gateway, "freeze", CommitCrashes())
            change.add(Part("freeze", build))
            return change

        await asyncio.gather(*(batcher.commit(freeze(n)) for n in range(64)))

    asyncio.run(scenario())
    assert sum(gateway.sizes) == 64
    assert len(gateway.sizes) < 64
    assert gateway.most_in_flight == BATCH_IN_FLIGHT_MAX


def test_a_lane_always_joins_the_same_group_and_lanes_spread_evenly() -> None:
    batcher = ChangeBatcher(HoldingGateway())  # type: ignore[arg-type]
    gateway = HoldingGateway()
    lanes = random.Random(3).choices(range(LANES), k=8 * LANES)
    groups: dict[int, set[int]] = {}
    for lane in [*range(LANES), *lanes]:
        change = _start(gateway, 0, lambda _, lane=lane: lane)
        groups.setdefault(lane, set()).add(batcher.group_of(change))
    assert all(len(g) == 1 for g in groups.values()), groups
    assert Counter(g for (g,) in groups.values()) == Counter(
        dict.fromkeys(range(BATCH_IN_FLIGHT_MAX), LANES // BATCH_IN_FLIGHT_MAX)
    )


def _closed_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _build() -> Transaction:
    t = Transaction()
    t.update("ks", "t", "k", v=1)
    return t


def test_transactions_go_to_the_sidecars_in_turn_and_skip_one_that_just_failed() -> None:
    seen: Counter[str] = Counter()

    def answering(name: str) -> Any:
        async def applied(request: bytes, context: Any) -> bytes:
            seen[name] += 1
            return pb.TransactResponse(txn_id=name, applied=True).SerializeToString()

        return applied

    async def scenario() -> int:
        async with fake_sidecar(answering("a")) as a, fake_sidecar(answering("b")) as b:
            gateway = AccordGateway([a, b], timeout=5)
            for _ in range(10):
                await gateway.transact(_build)
            assert seen == Counter({"a": 5, "b": 5})
            seen.clear()
            failing = AccordGateway([_closed_address(), a, b], timeout=5)
            for _ in range(12):
                assert (await failing.transact(_build)).applied
            return failing.retries

    assert asyncio.run(scenario()) == 1  # only the first went to the closed port
    # The first went on to a; the other 11 take a and b in turn, the closed one skipped.
    assert seen == Counter({"a": 7, "b": 5})
