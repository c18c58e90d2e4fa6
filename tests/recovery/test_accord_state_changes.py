"""Accord mode v2: a crash just before or just after the one transaction of every state change.

Each state change of a saga (start, step success, retryable failure, freeze, admin restore,
restore re-arm) is one Accord transaction (stacksaga_store/recovery/commit_modes.py, the
accord table). :class:`~stacksaga_store.store.accord_store.CommitCrashes` stops the process
right before the transaction is sent or right after it committed. After the restart:

* es_transaction and the directory agree: a live saga has exactly one Tier-5 watchdog row,
  the one its ``restore_*`` names; a finished, parked or missing one has none; no row of
  either kind names a transaction that does not exist;
* the saga then finishes through the recovery engine alone, and a step whose commit was
  durable never runs again (counted side effects).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.errors import RetryableStepError, StepError
from stacksaga_store.recovery.commit_modes import CrashPoints
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.store.accord_store import SimulatedCommitCrash
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.protection import MarkerKey
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    PARKED_STATUSES,
    ExecutionType,
    MarkerState,
    RunningStatus,
    step_id,
)
from tests.recovery._helpers import dump_directory
from tests.recovery.conftest import T0, Stack, StackFactory, accord_recovery
from tests.recovery.test_commit_modes import DELAY, MINUTE, drain, node_of
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

AGREEMENT_DEADLINE_S = 30.0  # Accord answers before the chosen writes land in Cassandra


class Effects:
    """Counted side effects: how often each step body ran *and* how often it committed
    (the latter counted by the test from the tryout history)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.fail_first: set[str] = set()
        self.fail_always: set[str] = set()
        self.hang: asyncio.Event | None = None
        self.started = asyncio.Event()

    def saga(self) -> Saga:
        def body(name: str) -> Any:
            async def step(ctx: StepContext) -> None:
                self.runs[name] += 1
                self.started.set()
                if self.hang is not None and name == "a":
                    await self.hang.wait()
                if name in self.fail_always:
                    raise StepError(f"{name} refused")
                if name in self.fail_first and self.runs[name] == 1:
                    raise RetryableStepError("503")

            return step

        return Saga(
            "two",
            (
                Step("a", body("a"), compensate=body("undo-a")),
                Step("b", body("b")),
            ),
        )


async def agree(stack: Stack, txn: uuid.UUID) -> RunningStatus | None:
    """Wait (generously) until es_transaction and Tier 5 agree as the module says."""
    scope = DirectoryScope.of(stack.runtime.settings.instance)
    key = TransactionKey(scope.region, scope.cluster, scope.service_name, txn)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + AGREEMENT_DEADLINE_S
    while True:
        record = await stack.runtime.events.read_record(key)
        dump = await dump_directory(stack.runtime, scope)
        odd = [
            r
            for r in dump.rows.get("es_recovery_transactions_by_instance", [])
            if r["bucket_index"] % 2
        ]
        mine = [r for r in odd if r["transaction_id"] == txn]
        problem = None
        if record is None:
            if dump.tier5_transactions():
                problem = f"rows of a missing transaction: {dump.tier5_transactions()}"
        elif record.running_status in FINAL_STATUSES | PARKED_STATUSES:
            if mine:
                problem = f"{record.running_status}: a watchdog dangles: {mine}"
        else:
            path = record.restore_path
            named = [
                r
                for r in mine
                if path is not None
                and (r["date_of_year"], r["instance_id"], r["bucket_index"])
                == (path.date_of_year, path.instance_id, path.bucket)
            ]
            if len(mine) != 1 or len(named) != 1:
                problem = f"{record.running_status}: watchdog rows {mine}, restore_* {path}"
        if problem is None:
            return None if record is None else record.running_status
        if loop.time() > deadline:
            raise AssertionError(problem)
        await asyncio.sleep(0.2)


SCENARIOS = [
    # (name, label of the crashed change, the test's setup)
    ("start", "start"),
    ("step success", "step"),
    ("retryable failure", "step"),
    ("freeze", "step#3"),  # start, a succeeds (step#1), b fails (step#2), undo-a fails
    ("unfreeze", "unfreeze"),
    ("rearm", "rearm"),
]


@pytest.fixture
def accord(accord_sidecars: list[str]) -> dict[str, Any]:
    return accord_recovery(accord_sidecars)


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize(("scenario", "label"), SCENARIOS)
def test_a_crash_around_a_state_change_leaves_store_and_directory_agreeing(
    open_stack: StackFactory,
    service_name: str,
    accord: dict[str, Any],
    scenario: str,
    label: str,
    phase: str,
) -> None:
    async def body() -> None:
        clock = ManualClock(T0)
        effects = Effects()
        txn = uuid.uuid4()
        crash = CrashPoints(commits=[(label, phase)])
        if scenario == "retryable failure":
            effects.fail_first.add("a")
        if scenario in ("freeze", "unfreeze"):
            effects.fail_always.update({"b", "undo-a"})
        committed_before: Counter[str] = Counter()
        if scenario == "unfreeze":
            async with open_stack(clock=clock, **accord) as first:
                orchestrator = first.engine.orchestrator(sagas=[effects.saga()])
                outcome = await orchestrator.start("two", {}, transaction_id=txn)
                assert outcome.status is RunningStatus.FROZEN
            effects.fail_always.clear()
        if scenario == "rearm":
            effects.hang = asyncio.Event()
            async with open_stack(clock=clock, **accord) as first:
                orchestrator = first.engine.orchestrator(sagas=[effects.saga()])
                running = asyncio.create_task(orchestrator.start("two", {}, transaction_id=txn))
                await asyncio.wait_for(effects.started.wait(), 60)
                running.cancel()  # dies inside step a
                with pytest.raises(asyncio.CancelledError):
                    await running
            effects.hang = None
            clock.advance(DELAY * MINUTE)
        committed_before = await committed(open_stack, clock, accord, txn)
        async with open_stack(clock=clock, crash=crash, **accord) as crashed:
            orchestrator = crashed.engine.orchestrator(sagas=[effects.saga()])
            if scenario == "unfreeze":
                action = orchestrator.admin_restore(txn)
            elif scenario == "rearm":
                action = node_of_saga(crashed, orchestrator, service_name).run_pass()
            else:
                action = orchestrator.start("two", {}, transaction_id=txn)
            with pytest.raises(SimulatedCommitCrash):
                await action
        assert crash.commits.fired == [(label, phase)]
        runs_at_crash = Counter(effects.runs)
        async with open_stack(clock=clock, **accord) as stack:
            await agree(stack, txn)
            durable = await committed_steps(stack, txn)
            assert committed_before <= durable
            if scenario == "unfreeze" and phase == "before":
                # Still frozen: only an admin restore brings it back.
                assert await agree(stack, txn) is RunningStatus.FROZEN
                orchestrator = stack.engine.orchestrator(sagas=[effects.saga()])
                await orchestrator.admin_restore(txn)
            orchestrator = stack.engine.orchestrator(sagas=[effects.saga()])
            node = node_of_saga(stack, orchestrator, service_name)
            for _ in range(3 * DELAY + 6):
                status = await agree(stack, txn)
                if status in FINAL_STATUSES | PARKED_STATUSES or (status is None):
                    break
                stack.clock.advance(MINUTE)
                await node.run_pass()
            status = await agree(stack, txn)
            if scenario == "start" and phase == "before":
                assert status is None and effects.runs == runs_at_crash
            elif scenario == "freeze":
                assert status is RunningStatus.FROZEN
            else:
                assert status in (RunningStatus.PROCESS_COMPLETED, RunningStatus.REVERT_COMPLETED)
            # No step whose commit was durable at the crash ran again afterwards.
            for step in durable:
                assert effects.runs[step] == runs_at_crash[step], (step, effects.runs)
            stack.clock.advance(DELAY * MINUTE)
            await drain(stack, node, 2 * DELAY + 6)

    run(body())


class LaggingMarkerReads:
    """The protection's CQL session, its plain marker reads answered as they stood before
    an admin restore: a replica the restore's Accord delete has not reached yet."""

    def __init__(self, cql: Any, read: Any, stale: list[Any]) -> None:
        self.cql = cql
        self.read = read
        self.stale = stale
        self.lagged = 0

    async def execute(self, prepared: Any, params: Any, *, row_limit: int | None = None) -> Any:
        if prepared is self.read:
            self.lagged += 1
            return self.stale
        return await self.cql.execute(prepared, params, row_limit=row_limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cql, name)


def test_a_restore_is_not_refrozen_by_a_plain_read_lagging_its_marker_delete(
    open_stack: StackFactory, accord: dict[str, Any]
) -> None:
    """The unfreeze transaction deletes undo-a's FAILED marker; the client hears of its
    commit before Cassandra holds the tombstone, so the RELAXED guard's plain read can still
    answer FAILED. The restored compensation must run (an Accord read decides), not be
    skipped as "failed permanently" and frozen again."""

    async def body() -> None:
        clock = ManualClock(T0)
        effects = Effects()
        effects.fail_always.update({"b", "undo-a"})
        txn = uuid.uuid4()
        async with open_stack(clock=clock, **accord) as stack:
            orchestrator = stack.engine.orchestrator(sagas=[effects.saga()])
            outcome = await orchestrator.start("two", {}, transaction_id=txn)
            assert outcome.status is RunningStatus.FROZEN
            effects.fail_always.clear()
            protection: Any = orchestrator.protection
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            marker = MarkerKey(
                TransactionKey(scope.region, scope.cluster, scope.service_name, txn),
                step_id("a", ExecutionType.COMPENSATE),
            )
            read = protection._statement("read")
            # What a replica answers once the freeze landed (it too may land after its ack).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + AGREEMENT_DEADLINE_S
            while True:
                stale = await protection.cql.execute(read, marker.params(), row_limit=1)
                if stale or loop.time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert [row["execution_state"] for row in stale] == [MarkerState.FAILED.value]
            lagging = LaggingMarkerReads(protection.cql, read, stale)
            protection.cql = lagging
            outcome = await orchestrator.admin_restore(txn)
            assert lagging.lagged >= 1  # the guard did read the stale FAILED
            assert outcome.status is RunningStatus.REVERT_COMPLETED, outcome
            assert effects.runs["undo-a"] == 2, effects.runs

    run(body())


def node_of_saga(stack: Stack, orchestrator: Any, service: str) -> Any:
    from stacksaga_store.ring.leases import StaticLeaseSource

    return stack.engine.retry_node(orchestrator, StaticLeaseSource(service))


async def committed(
    open_stack: StackFactory, clock: ManualClock, accord: dict[str, Any], txn: uuid.UUID
) -> Counter[str]:
    async with open_stack(clock=clock, **accord) as stack:
        return await committed_steps(stack, txn)


async def committed_steps(stack: Stack, txn: uuid.UUID) -> Counter[str]:
    """Step bodies whose success is durable (a SUCCESS tryout), by body name."""
    scope = DirectoryScope.of(stack.runtime.settings.instance)
    key = TransactionKey(scope.region, scope.cluster, scope.service_name, txn)
    if await stack.runtime.events.read_record(key) is None:
        return Counter()
    view = await stack.runtime.events.read(key)
    found: Counter[str] = Counter()
    for tryout in view.tryouts:
        if tryout.status.value in ("SUCCESS", "ALREADY_COMMITTED"):
            name = tryout.executor
            found["undo-a" if tryout.execution_type.value == "COMPENSATE" else name] += 1
    return found


_ = (timedelta, node_of)
