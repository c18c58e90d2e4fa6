"""Crash injection at every write boundary, in both commit modes (``ordered``, ``accord``).

A :class:`~stacksaga_store.recovery.commit_modes.SimulatedCrash` stops a process at a boundary:
nothing after it runs and the process's memory is abandoned (a fresh engine, with a new instance id,
plays the next process). After each crash the saga must end up recovered or correctly left
alone, never orphaned and never re-run once finished, and the directory must drain.

Reference: stacksaga_store/recovery/commit_modes.py (the tables of crash points and why each is
safe); seed 000 Part 4, "What Happens at Restore Pickup".
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.errors import RetryableStepError
from stacksaga_store.recovery.commit_modes import CrashPoint, CrashPoints, SimulatedCrash
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.retry_node import DispatchOutcome, RetryNode
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.store.states import RunningStatus
from tests.recovery._helpers import DirectoryDump, dump_directory
from tests.recovery.conftest import T0, Stack, StackFactory, one_lane
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

MINUTE = timedelta(minutes=1)
DELAY = 5  # restore delay-windows of recovery_overrides()


class Steps:
    """A one-step saga whose behaviour each test sets; counts executions per transaction."""

    def __init__(self) -> None:
        self.runs: Counter[uuid.UUID] = Counter()
        self.fail_first = False
        self.hang: asyncio.Event | None = None
        self.started = asyncio.Event()

    def saga(self) -> Saga:
        async def work(ctx: StepContext) -> None:
            self.runs[ctx.transaction_id] += 1
            self.started.set()
            if self.hang is not None:
                await self.hang.wait()
            if self.fail_first and self.runs[ctx.transaction_id] == 1:
                raise RetryableStepError("503")

        return Saga("work", (Step("work", work),))


def node_of(stack: Stack, steps: Steps, service: str) -> RetryNode:
    orchestrator = stack.engine.orchestrator(sagas=[steps.saga()])
    return stack.engine.retry_node(orchestrator, StaticLeaseSource(service))


async def drain(stack: Stack, node: RetryNode, windows: int) -> None:
    """Advance window by window, one pass each, until the directory below Tier 2 is empty."""
    scope = DirectoryScope.of(stack.runtime.settings.instance)
    for _ in range(windows):
        report = await node.run_pass()
        assert report.failed == 0
        if (await dump_directory(stack.runtime, scope)).empty_below_tier2:
            return
        stack.clock.advance(MINUTE)
    raise AssertionError(f"the directory did not drain in {windows} windows")


SETTLE_DEADLINE_S = 30.0  # accord: the commit is acknowledged before its writes land


async def settled_dump(
    stack: Stack, scope: DirectoryScope, settled: Callable[[DirectoryDump], bool]
) -> DirectoryDump:
    """The directory once ``settled`` holds of a (plain) dump, waited for generously: in the
    accord mode a client hears of a transaction before the sidecars wrote it to Cassandra.
    Past the deadline, the last dump (whose assertion then fails with its content)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_DEADLINE_S
    while True:
        dump = await dump_directory(stack.runtime, scope)
        if settled(dump) or asyncio.get_running_loop().time() > deadline:
            return dump
        await asyncio.sleep(0.2)


async def status_of(stack: Stack, txn: uuid.UUID) -> RunningStatus | None:
    key = stack.engine.writer.scope
    from stacksaga_store.store.model import TransactionKey

    record = await stack.runtime.events.read_record(
        TransactionKey(key.region, key.cluster, key.service_name, txn)
    )
    return None if record is None else record.running_status


@pytest.mark.parametrize("point", [CrashPoint.WATCHDOG_INDEXED, CrashPoint.WATCHDOG_ARMED])
def test_crash_between_watchdog_and_transaction(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any], point: CrashPoint
) -> None:
    """Watchdog (partly) written, es_transaction never: pickup drops it, runs nothing."""

    async def body() -> None:
        clock = ManualClock(T0)
        steps = Steps()
        txn = uuid.uuid4()
        async with open_stack(clock=clock, crash=CrashPoints(point), **mode) as crashed:
            orchestrator = crashed.engine.orchestrator(sagas=[steps.saga()])
            with pytest.raises(SimulatedCrash):
                await orchestrator.start("work", {}, transaction_id=txn)
        async with open_stack(clock=clock, **mode) as stack:
            assert await status_of(stack, txn) is None
            node = node_of(stack, steps, service_name)
            clock.advance(DELAY * MINUTE)
            await drain(stack, node, 3)
            outcomes = node.metrics.dispatched
            accord = "commit-mode" in mode
            if accord:
                # The start is one transaction and the crash came before it: no row at all.
                assert sum(outcomes.values()) == 0
            else:
                assert outcomes["RESTORE", DispatchOutcome.RELEASED.value] == 1
            assert steps.runs == {}

    run(body())


def test_crash_before_the_retry_pointer(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """The step failed retryably, nothing of it written yet (the pointer comes first, then
    the tryout and status; tests/recovery/test_retry_gaps.py crashes after it): to the store
    a crash mid-step, so the watchdog restores it."""

    async def body() -> None:
        clock = ManualClock(T0)
        steps = Steps()
        steps.fail_first = True
        txn = uuid.uuid4()
        crash = CrashPoints(CrashPoint.RETRY_BEFORE_POINTER)
        async with open_stack(clock=clock, crash=crash, **mode) as crashed:
            orchestrator = crashed.engine.orchestrator(sagas=[steps.saga()])
            with pytest.raises(SimulatedCrash):
                await orchestrator.start("work", {}, transaction_id=txn)
            assert await status_of(crashed, txn) is RunningStatus.STARTED
        async with open_stack(clock=clock, **mode) as stack:
            node = node_of(stack, steps, service_name)
            clock.advance(MINUTE)
            report = await node.run_pass()
            assert report.rows == 0  # no retry pointer
            clock.advance((DELAY - 1) * MINUTE)
            report = await node.run_pass()
            assert node.metrics.dispatched["RESTORE", DispatchOutcome.RESUMED.value] == 1
            assert await status_of(stack, txn) is RunningStatus.PROCESS_COMPLETED
            assert steps.runs[txn] == 2
            clock.advance(MINUTE)
            await drain(stack, node, DELAY + 3)

    run(body())


def test_crash_between_final_status_and_release(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """Ordered: PROCESS_COMPLETED written, watchdog never released: released at pickup, not
    re-run. Accord: the release is part of the last step's transaction, so the crash lost the
    step's commit with it: the watchdog restores the saga and the step runs again (it never
    committed)."""

    async def body() -> None:
        clock = ManualClock(T0)
        steps = Steps()
        txn = uuid.uuid4()
        crash = CrashPoints(CrashPoint.RELEASE_BEFORE)
        async with open_stack(clock=clock, crash=crash, **mode) as crashed:
            orchestrator = crashed.engine.orchestrator(sagas=[steps.saga()])
            with pytest.raises(SimulatedCrash):
                await orchestrator.start("work", {}, transaction_id=txn)
        accord = "commit-mode" in mode
        async with open_stack(clock=clock, **mode) as stack:
            expected = RunningStatus.STARTED if accord else RunningStatus.PROCESS_COMPLETED
            assert await status_of(stack, txn) is expected
            node = node_of(stack, steps, service_name)
            clock.advance(DELAY * MINUTE)
            await drain(stack, node, DELAY + 3)
            outcome = DispatchOutcome.RESUMED if accord else DispatchOutcome.RELEASED
            assert node.metrics.dispatched["RESTORE", outcome.value] == 1
            assert await status_of(stack, txn) is RunningStatus.PROCESS_COMPLETED
            assert steps.runs[txn] == (2 if accord else 1)

    run(body())


def test_crash_of_a_retry_node_between_rearm_and_resume(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """A Standard-Node dies mid-step; the Retry-Node restoring it dies right after re-arming
    the watchdog. The old row is then recognised as superseded, and the new watchdog restores
    the saga one delay later: never orphaned, never two watchdogs acting."""

    async def body() -> None:
        clock = ManualClock(T0)
        steps = Steps()
        steps.hang = asyncio.Event()
        txn = uuid.uuid4()
        async with open_stack(clock=clock, **mode) as standard:
            orchestrator = standard.engine.orchestrator(sagas=[steps.saga()])
            running = asyncio.create_task(orchestrator.start("work", {}, transaction_id=txn))
            await asyncio.wait_for(steps.started.wait(), 60)
            running.cancel()  # the process dies inside the step
            with pytest.raises(asyncio.CancelledError):
                await running
        steps.hang = None
        assert steps.runs[txn] == 1
        clock.advance(DELAY * MINUTE)
        crash = CrashPoints(CrashPoint.REARM_BEFORE_RESUME)
        async with open_stack(clock=clock, crash=crash, **mode) as dying:
            node = node_of(dying, steps, service_name)
            with pytest.raises(SimulatedCrash):
                await node.run_pass()
            assert await status_of(dying, txn) is RunningStatus.STARTED
        async with open_stack(clock=clock, **mode) as stack:
            node = node_of(stack, steps, service_name)
            report = await node.run_pass()
            assert report.failed == 0 and report.buckets_dropped >= 1
            if "commit-mode" in mode:
                # The move committed with the old row's delete: the old bucket is empty.
                assert sum(node.metrics.dispatched.values()) == 0
            else:
                # es_transaction.restore_* names the new row: the old one is superseded.
                assert node.metrics.dispatched["RESTORE", DispatchOutcome.GONE.value] == 1
            assert steps.runs[txn] == 1, "the superseded row did not re-run the saga"
            clock.advance(DELAY * MINUTE)
            report = await node.run_pass()
            assert node.metrics.dispatched["RESTORE", DispatchOutcome.RESUMED.value] == 1
            assert await status_of(stack, txn) is RunningStatus.PROCESS_COMPLETED
            assert steps.runs[txn] == 2
            clock.advance(MINUTE)
            await drain(stack, node, DELAY + 3)

    run(body())


def test_finished_sagas_leave_restore_buckets_that_cost_nothing_to_drop(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """Completed sagas: both modes delete each watchdog row (the seed's cell tombstones in
    odd buckets; accord: inside the last step's transaction), and the Retry-Node drops the
    empty bucket without dispatching anything."""

    async def body() -> None:
        async with open_stack(**one_lane(mode)) as stack:
            steps = Steps()
            orchestrator = stack.engine.orchestrator(sagas=[steps.saga()])
            for _ in range(5):
                outcome = await orchestrator.start("work", {})
                assert outcome.status is RunningStatus.PROCESS_COMPLETED
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            dump = await settled_dump(stack, scope, lambda d: not d.tier5_transactions(odd=True))
            assert len(dump.tier5_transactions(odd=True)) == 0
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            stack.clock.advance(DELAY * MINUTE)
            report = await node.run_pass()
            assert report.buckets_dropped == 1
            assert node.metrics.buckets_skipped == 0
            assert report.rows == 0
            dump = await settled_dump(stack, scope, lambda d: d.empty_below_tier2)
            assert dump.empty_below_tier2

    run(body())
