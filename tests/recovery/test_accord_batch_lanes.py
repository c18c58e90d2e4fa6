"""Group commit along write lanes (accord_changes.ChangeBatcher), against a stand-in gateway
that holds each transaction in flight a moment and records what it wrote.

Accord runs two transactions that share a partition one after the other, so batches in
flight must not share a lane's partitions: with one shared queue every batch named every
lane, and the accord mode's starts ran at a fifth of their rate at 128 in flight. A second
transaction goes in flight only with a full batch, so under a load one transaction can
carry the batches stay large (four always in flight carried a third as much each). And the
gateway spreads transactions over the sidecars (the one a client talks to coordinates), and
keeps new ones off a sidecar that just failed."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections import Counter
from typing import Any

from accord_cassandra.client import Transaction
from accord_cassandra.v1 import client_pb2 as pb
from stacksaga_store.store.accord_changes import (
    BATCH_CHANGES_MAX,
    BATCH_GATHER_SECONDS,
    BATCH_IN_FLIGHT_MAX,
    AccordChange,
    AccordGateway,
    AccordOutcome,
    ChangeBatcher,
    CommitCrashes,
    Part,
    _Queued,
    _take,
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
    assert len({str(o.rows["p0_b"]) for o in outcomes}) == 128  # each its own row
    assert not gateway.overlaps, f"batches in flight shared lanes: {gateway.overlaps[:3]}"
    # More queued than one transaction carries: others went in flight alongside.
    assert 2 <= gateway.most_in_flight <= BATCH_IN_FLIGHT_MAX
    # 128 changes: few, full transactions (the first went alone, the process being idle).
    assert len(gateway.sizes) <= 128 // (BATCH_CHANGES_MAX // 3)
    assert sum(gateway.sizes) == 2 * 128


def _closed_loop(gateway: HoldingGateway, clients: int, each: int) -> None:
    """``clients`` callers, each committing ``each`` starts one after another (a saga
    store's request handlers): the changes come back as their transactions end."""
    lanes = iter(random.Random(11).choices(range(LANES), k=clients * each))

    async def client(batcher: ChangeBatcher, c: int) -> None:
        for i in range(each):
            lane = next(lanes)
            change = _start(gateway, c * each + i, lambda _, lane=lane: lane)
            outcome, _ = await batcher.commit(change)
            assert outcome.applied

    async def scenario() -> None:
        batcher = ChangeBatcher(gateway)  # type: ignore[arg-type]
        await asyncio.gather(*(client(batcher, c) for c in range(clients)))

    asyncio.run(scenario())
    assert sum(gateway.sizes) == 2 * clients * each
    assert not gateway.overlaps, f"batches in flight shared lanes: {gateway.overlaps[:3]}"


def test_a_load_one_transaction_carries_keeps_one_in_flight_with_large_batches() -> None:
    gateway = HoldingGateway()
    _closed_loop(gateway, clients=16, each=8)
    # 16 starts are 32 LETs, half of what one transaction carries: never a second one in
    # flight, and the callers' changes go in transactions of several each.
    assert gateway.most_in_flight == 1
    assert len(gateway.sizes) <= 16 * 8 // 4


def test_a_load_beyond_one_transaction_puts_full_batches_in_flight_alongside() -> None:
    gateway = HoldingGateway()
    _closed_loop(gateway, clients=128, each=4)
    assert gateway.most_in_flight >= 2
    # Mean of at least 12 starts (24 mutations) per transaction.
    assert sum(gateway.sizes) / len(gateway.sizes) >= 24


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
    # One alone (idle), one full batch alongside it, the rest once they are done.
    assert len(gateway.sizes) <= 4
    assert gateway.most_in_flight >= 2


def _bounded_load(gateway: HoldingGateway, in_flight: int, starts: int, gather: float) -> None:
    """``starts`` starts, ``in_flight`` at a time behind a semaphore (the recovery bench's
    and a request handler pool's pattern): a start answered frees its slot, and the next
    start reaches the batcher two passes of the loop later."""
    lanes = random.Random(13).choices(range(LANES), k=starts)

    async def scenario() -> None:
        batcher = ChangeBatcher(gateway, gather_seconds=gather)  # type: ignore[arg-type]
        slots = asyncio.Semaphore(in_flight)

        async def one(n: int) -> None:
            async with slots:
                outcome, _ = await batcher.commit(_start(gateway, n, lanes.__getitem__))
                assert outcome.applied

        await asyncio.gather(*(one(n) for n in range(starts)))

    asyncio.run(scenario())
    assert sum(gateway.sizes) == 2 * starts


def test_callers_of_an_answered_batch_come_back_into_one_batch() -> None:
    # 24 starts in flight fit one transaction (48 LETs). Sent the moment a batch is
    # answered, the queue would go without that batch's callers, and two half batches
    # would alternate (23 and 1 starts, gather_seconds=0 below); gathered, each transaction
    # after the first two carries all 24. (The bounds leave room for a few gathers cut
    # short: a loop stalled past the gather on a loaded machine sends what it has.)
    gathered = HoldingGateway()
    _bounded_load(gathered, in_flight=24, starts=24 * 10, gather=BATCH_GATHER_SECONDS)
    assert gathered.most_in_flight == 1
    steady = gathered.sizes[2:]
    assert sum(steady) / len(steady) >= 2 * 16, gathered.sizes
    at_once = HoldingGateway()
    _bounded_load(at_once, in_flight=24, starts=24 * 10, gather=0)
    steady = at_once.sizes[2:]
    assert sum(steady) / len(steady) <= 2 * 14, at_once.sizes


def test_a_partial_batch_waits_for_answered_callers_at_most_gather_seconds() -> None:
    async def scenario(comes_back: bool, gather: float) -> tuple[float, list[int]]:
        gateway = HoldingGateway(hold=0.05)
        batcher = ChangeBatcher(gateway, gather_seconds=gather)  # type: ignore[arg-type]
        answered = 0.0

        async def first() -> None:
            nonlocal answered
            await batcher.commit(_start(gateway, 0))  # alone: the process was idle
            answered = time.monotonic()
            if comes_back:
                await batcher.commit(_start(gateway, 2))

        async def second() -> float:
            await asyncio.sleep(0.01)  # queued while the first is in flight: it waits
            await batcher.commit(_start(gateway, 1))
            return time.monotonic()

        _, done = await asyncio.gather(first(), second())
        return done - answered, gateway.sizes

    # The first's caller does not come back: the second goes once the gather ends.
    waited, sizes = asyncio.run(scenario(comes_back=False, gather=0.3))
    assert sizes == [2, 2] and 0.3 <= waited < 5, (waited, sizes)
    # It comes back at once: both go together, long before the gather would have ended.
    waited, sizes = asyncio.run(scenario(comes_back=True, gather=1))
    assert sizes == [2, 4] and waited < 0.9, (waited, sizes)


def _queued(n: int, lane: int) -> _Queued:
    change = _start(None, n, lambda _: lane)
    return _Queued.of(change, None, f"c{n}_")  # type: ignore[arg-type]  # _take ignores it


def test_a_batch_takes_whole_lanes_oldest_first_and_skips_held_ones() -> None:
    # 4 changes on each of 16 lanes, queued round-robin: a batch of 32 takes 8 whole lanes
    # (the oldest), so another full batch of the other 8 can go in flight beside it.
    queue = [_queued(n, n % LANES) for n in range(4 * LANES)]
    batch, full = _take(queue, set())
    assert full and len(batch) == BATCH_CHANGES_MAX
    assert {lane for q in batch for lane in q.lanes} == {f"lane-{i}" for i in range(8)}
    rest, full = _take([q for q in queue if q not in batch], {f"lane-{i}" for i in range(8)})
    assert not full and len(rest) == BATCH_CHANGES_MAX
    assert {lane for q in rest for lane in q.lanes} == {f"lane-{i}" for i in range(8, 16)}
    # Held lanes wait, whatever their age.
    batch, full = _take(queue, {f"lane-{i}" for i in range(LANES) if i != 3})
    assert not full and {lane for q in batch for lane in q.lanes} == {"lane-3"}


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
