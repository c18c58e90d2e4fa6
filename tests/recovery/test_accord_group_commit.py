"""Group commit of the accord mode's state changes (accord_changes.ChangeBatcher): concurrent
changes of one process share Accord transactions, and each stays whole and keeps its own
conditions (real Cassandra + the session's 3 sidecars)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from stacksaga_store.recovery.commit_modes import T1, T2, T3, T4, T5
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.store.accord_changes import (
    AccordChange,
    AccordGateway,
    AccordOutcome,
    batcher_of,
    sidecar_client,
)
from stacksaga_store.store.accord_store import StateChangeConflict
from stacksaga_store.store.states import RunningStatus
from tests.recovery.conftest import StackFactory, accord_recovery
from tests.recovery.test_commit_modes import settled_dump, status_of
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

STARTS = 48


def _saga(runs: Counter[str]) -> Saga:
    async def work(ctx: StepContext) -> None:
        runs[str(ctx.transaction_id)] += 1

    return Saga("grouped", (Step("work", work),))


def test_concurrent_state_changes_share_transactions_and_each_stays_whole(
    open_stack: StackFactory, accord_sidecars: list[str]
) -> None:
    """48 starts at once, then 48 whole sagas at once: fewer Accord transactions than state
    changes, and every saga's rows are all there (es_transaction, its watchdog; completed:
    the watchdog gone, the step run once)."""
    runs: Counter[str] = Counter()
    saga = _saga(runs)

    async def body() -> None:
        async with open_stack(**accord_recovery(accord_sidecars)) as stack:
            gateway = stack.engine.gateway
            assert gateway is not None
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            # Steady state first: each write lane's bucket registered (Tiers 1-4) once. Its
            # first starts write rows every lane shares, so they cannot share a transaction.
            for _ in stack.engine.writer.instance_ids:
                await orchestrator.create(saga, {})
            before = gateway.transactions
            created = await asyncio.gather(*(orchestrator.create(saga, {}) for _ in range(STARTS)))
            assert gateway.transactions - before < STARTS, "no two starts shared a transaction"
            assert gateway.batcher is not None and gateway.batcher.batches >= 1
            for txn in created:
                assert await status_of(stack, txn) is RunningStatus.STARTED
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            dump = await settled_dump(
                stack, scope, lambda d: set(created) <= set(d.tier5_transactions(odd=True))
            )
            assert set(created) <= set(dump.tier5_transactions(odd=True))
            before = gateway.transactions
            outcomes = await asyncio.gather(*(orchestrator.start(saga, {}) for _ in range(STARTS)))
            assert gateway.transactions - before < 2 * STARTS
            done = {o.transaction_id for o in outcomes}
            assert all(o.status is RunningStatus.PROCESS_COMPLETED for o in outcomes)
            assert Counter(runs[str(t)] for t in done) == Counter({1: STARTS})
            dump = await settled_dump(
                stack, scope, lambda d: not done & set(d.tier5_transactions(odd=True))
            )
            assert not done & set(dump.tier5_transactions(odd=True)), "a watchdog stayed"

    run(body())


def test_a_change_refused_in_a_batch_does_not_take_the_others_with_it(
    open_stack: StackFactory, accord_sidecars: list[str]
) -> None:
    """Two of 24 concurrent starts name the same transaction id: exactly one of those two is
    refused (es_transaction absent); the 23 others commit, including those that shared a
    refused batch (sent again alone)."""
    saga = _saga(Counter())
    twice = uuid.uuid4()

    async def body() -> None:
        async with open_stack(**accord_recovery(accord_sidecars)) as stack:
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            ids = [twice if i in (5, 17) else uuid.uuid4() for i in range(24)]
            results = await asyncio.gather(
                *(orchestrator.create(saga, {"i": i}, transaction_id=t) for i, t in enumerate(ids)),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(refused) == 1 and isinstance(refused[0], StateChangeConflict), results
            assert sorted(r for r in results if isinstance(r, uuid.UUID)) == sorted(set(ids))
            for txn in set(ids):
                assert await status_of(stack, txn) is RunningStatus.STARTED

    run(body())


def test_starts_in_a_fresh_window_never_race_their_buckets_upper_tiers(
    open_stack: StackFactory, accord_sidecars: list[str]
) -> None:
    """48 starts at once in a window no start wrote yet (16 write lanes): each lane's Tiers
    1-4 are registered ahead, in a transaction of their own that the lane's starts await, so
    every start takes the cached form (its condition reads the Tier-4 row) and none is
    refused for a Tier-4 row that was not there yet. Before, each lane's first start carried
    Tiers 1-4 and the lane's next starts, sent before it committed or batched with it, were
    refused and repaired (writing Tiers 1-4 again, alone)."""
    saga = _saga(Counter())

    async def body() -> None:
        async with open_stack(**accord_recovery(accord_sidecars)) as stack:
            writer = stack.engine.writer
            assert len(writer.instance_ids) > 1, "the default has write lanes"
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            created = await asyncio.gather(*(orchestrator.create(saga, {}) for _ in range(STARTS)))
            assert writer.late_repairs == 0, f"{writer.late_repairs} starts raced their Tier 4"
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            dump = await settled_dump(
                stack, scope, lambda d: set(created) <= set(d.tier5_transactions(odd=True))
            )
            assert Counter(dump.tier5_transactions(odd=True)) == Counter(dict.fromkeys(created, 1))
            # Every lane that took a start has its Tier-3 and Tier-4 rows, nothing more.
            assert dump.count("es_instances_by_recovery_window") == len(writer.instance_ids)
            assert dump.count("es_buckets_by_instance") == len(writer.instance_ids)

    run(body())


UPPER_TIERS = frozenset((T1, T2, T3, T4))


def _tables_per_change(gateway: AccordGateway) -> list[set[str]]:
    """Spy on ``gateway``'s group commit: the tables each state change mutates, one entry
    per change (several changes may share a transaction: a start of one lane beside the
    registration of another)."""
    sent: list[set[str]] = []
    batcher = batcher_of(gateway)
    commit = batcher.commit

    async def spied(change: AccordChange) -> tuple[AccordOutcome, bool]:
        txn = change.build_into(sidecar_client().Transaction(), "")
        sent.append({m.row.table for m in txn.request.mutations})
        return await commit(change)

    batcher.commit = spied  # type: ignore[method-assign]
    return sent


def test_starts_in_a_fresh_window_write_their_buckets_upper_tiers_once(
    open_stack: StackFactory, accord_sidecars: list[str]
) -> None:
    """48 starts at once in a window no start wrote yet (16 write lanes): no start's state
    change carries a Tier 1-4 row; each lane's Tiers 1-4 are written once, in a change of
    their own. A writer that let each start carry them (the registration ahead skipped)
    sent every start of a fresh bucket with the window's Tier-1 and Tier-2 rows, so no two
    starts could share a transaction and each wrote them again; the directory looks the
    same afterwards, so only counting the writes shows it."""
    saga = _saga(Counter())

    async def body() -> None:
        async with open_stack(**accord_recovery(accord_sidecars)) as stack:
            gateway = stack.engine.gateway
            assert gateway is not None
            writer = stack.engine.writer
            changes = _tables_per_change(gateway)
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            await asyncio.gather(*(orchestrator.create(saga, {}) for _ in range(STARTS)))
            assert writer.late_repairs == 0, f"{writer.late_repairs} starts raced their Tier 4"
            starts = [tables for tables in changes if T5 in tables]
            assert len(starts) == STARTS, f"{len(starts)} changes wrote a Tier-5 row"
            carrying = [tables for tables in starts if tables & UPPER_TIERS]
            assert not carrying, f"{len(carrying)} of {STARTS} starts carried Tiers 1-4"
            registrations = [tables for tables in changes if T4 in tables]
            assert len(registrations) == len(writer.instance_ids), (
                f"{len(registrations)} changes wrote Tier 4 for {len(writer.instance_ids)} lanes"
            )

    run(body())
