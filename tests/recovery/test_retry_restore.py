"""Retry and Restore end to end on real Cassandra, with a manual clock (issue tests 1, 3, 8).

Reference: seed 000 Part 4, "Feature 1: Retry", "Feature 2: Restore", "What Happens at Restore
Pickup", "Bounded Partitions: The Instance-Level Bucketing Strategy".
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stacksaga_store.errors import RetryableStepError
from stacksaga_store.recovery.commit_modes import CrashPoint
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.retry_node import DispatchOutcome
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.store.states import RunningStatus, TryoutStatus
from tests.recovery._helpers import TIERS, dump_directory
from tests.recovery.conftest import StackFactory
from tests.recovery.test_commit_modes import settled_dump
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

MINUTE = timedelta(minutes=1)


def test_retryable_twice_then_success_is_retried_from_w_plus_1(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """Issue test 1: two retryable failures, each retried from the window after it (both
    commit modes)."""

    async def body() -> None:
        async with open_stack(**mode) as stack:
            attempts: list[tuple[int, Any]] = []

            async def charge(ctx: StepContext) -> dict[str, Any]:
                attempts.append((ctx.attempt, stack.clock.now()))
                if len(attempts) <= 2:
                    raise RetryableStepError("HTTP 503 from the payment service")
                return {"charged": True}

            saga = Saga("pay", (Step("charge", charge),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            windows = stack.engine.writer.windows
            scope = DirectoryScope.of(stack.runtime.settings.instance)

            outcome = await orchestrator.start(saga, {"amount": 5})
            assert outcome.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            failed_window = windows.window_at(stack.clock.now())
            dump = await dump_directory(stack.runtime, scope)
            tier5 = dump.rows["es_recovery_transactions_by_instance"]
            retry_rows = [r for r in tier5 if r["bucket_index"] % 2 == 0]
            assert [(r["date_of_year"], r["minute_of_day"]) for r in retry_rows] == [
                (failed_window.date_of_year, windows.minute_of_day(windows.shift(failed_window, 1)))
            ]

            # W+1 has not started: readers never touch it.
            report = await node.run_pass()
            assert report.rows == 0 and len(attempts) == 1

            stack.clock.advance(MINUTE)
            report = await node.run_pass()
            assert report.dispatched == 1 and report.buckets_dropped == 1
            assert len(attempts) == 2
            view = await orchestrator.read(outcome.transaction_id)
            assert view.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR

            stack.clock.advance(MINUTE)
            report = await node.run_pass()
            assert report.dispatched == 1
            view = await orchestrator.read(outcome.transaction_id)
            assert view.status is RunningStatus.PROCESS_COMPLETED
            assert [t.status for t in view.tryouts] == [
                TryoutStatus.RETRYABLE_ERROR,
                TryoutStatus.RETRYABLE_ERROR,
                TryoutStatus.SUCCESS,
            ]
            # Each retry ran in the window after the failure that scheduled it.
            assert [windows.distance(failed_window, windows.window_at(t)) for _, t in attempts] == [
                0,
                1,
                2,
            ]
            # Retry buckets and their markers are gone; the watchdog was released at completion.
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions() == []
            assert dump.count("es_instances_by_recovery_window") == 1  # the restore window's

            # When the restore window comes, nothing is re-run and the directory empties.
            stack.clock.advance(10 * MINUTE)
            report = await node.run_pass()
            assert len(attempts) == 3
            dump = await dump_directory(stack.runtime, scope)
            assert dump.empty_below_tier2

    run(body())


def test_completed_saga_whose_watchdog_delete_failed_is_not_rerun(
    open_stack: StackFactory, service_name: str
) -> None:
    """Issue test 3: the watchdog outlived its saga; pickup checks the status and deletes it."""

    async def body() -> None:
        async with open_stack() as stack:
            runs: list[uuid.UUID] = []

            async def ship(ctx: StepContext) -> None:
                runs.append(ctx.transaction_id)

            saga = Saga("ship", (Step("ship", ship),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            scope = DirectoryScope.of(stack.runtime.settings.instance)

            # The release is lost (network blip at completion) but the saga completed.
            stack.crash.arm(CrashPoint.RELEASE_BEFORE)
            with pytest.raises(BaseException, match="release-before"):
                await orchestrator.start(saga, {})
            assert len(runs) == 1
            txn = runs[0]
            assert (await orchestrator.read(txn)).status is RunningStatus.PROCESS_COMPLETED
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions(odd=True) == [txn]

            stack.clock.advance(6 * MINUTE)
            report = await node.run_pass()
            assert report.dispatched == 1
            assert node.metrics.dispatched["RESTORE", DispatchOutcome.RELEASED.value] == 1
            assert runs == [txn]  # not re-run
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions() == []
            assert dump.empty_below_tier2

    run(body())


def test_bucket_rollover_keeps_tier5_partitions_within_bucket_size(
    open_stack: StackFactory, service_name: str
) -> None:
    """Issue test 8: at bucket-size 3, odd (restore) and even (retry) buckets roll over."""

    async def body() -> None:
        async with open_stack(**{"bucket-size": 3}) as stack:

            async def fail(ctx: StepContext) -> None:
                raise RetryableStepError("down")

            async def fine(ctx: StepContext) -> None:
                return None

            failing = Saga("failing", (Step("call", fail),))
            passing = Saga("passing", (Step("call", fine),))
            orchestrator = stack.engine.orchestrator(sagas=[failing, passing])
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            for _ in range(7):
                await orchestrator.start(failing, {})
            for _ in range(4):
                await orchestrator.start(passing, {})
            dump = await dump_directory(stack.runtime, scope)
            sizes = dump.tier5_sizes()
            assert max(sizes.values()) <= 3
            buckets = sorted({key[3] for key in sizes})
            # 7 retries: even buckets 0, 2, 4 (3+3+1). 11 starts took odd slots 0..10, i.e.
            # buckets 1, 3, 5, 7; the 4 finished sagas (slots 7..10) deleted their rows, so
            # live rows remain in 1, 3, 5 while Tier 4 still lists 7.
            assert [b for b in buckets if b % 2 == 0] == [0, 2, 4]
            assert [b for b in buckets if b % 2 == 1] == [1, 3, 5]
            assert sum(n for k, n in sizes.items() if k[3] % 2 == 0) == 7
            assert sum(n for k, n in sizes.items() if k[3] % 2 == 1) == 7
            tier4 = sorted(r["bucket_index"] for r in dump.rows["es_buckets_by_instance"])
            assert tier4 == [0, 1, 2, 3, 4, 5, 7]

    run(body())


def test_virtual_clusters_never_share_directory_partitions(
    open_stack: StackFactory, service_name: str
) -> None:
    """Seed "Scaling: Virtual Clusters": same tables, same service name, different
    ``stacksaga.instance.cluster``: each cluster's Retry-Node sees only its own pointers."""

    async def body() -> None:
        async def fail(ctx: StepContext) -> None:
            raise RetryableStepError("503")

        saga = Saga("vc", (Step("call", fail),))
        seen: dict[str, int] = {}
        async with (
            open_stack(cluster="cell-1") as one,
            open_stack(clock=one.clock, cluster="cell-2") as two,
        ):
            for stack, count in ((one, 2), (two, 3)):
                orchestrator = stack.engine.orchestrator(sagas=[saga])
                for _ in range(count):
                    await orchestrator.start(saga, {})
            one.clock.advance(MINUTE)
            for name, stack in (("cell-1", one), ("cell-2", two)):
                orchestrator = stack.engine.orchestrator(sagas=[saga])
                node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
                seen[name] = (await node.run_pass()).rows
        assert seen == {"cell-1": 2, "cell-2": 3}

    run(body())


def test_a_failure_just_before_midnight_is_retried_in_window_0_of_the_next_day(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """Seed scenario (midnight rollover), both commit modes: a retryable failure at 23:59:30
    puts its pointer in window 0 of the next day (a new Tier-1 date, a new Tier-2 day), and a
    pass there resumes the saga; its restore watchdog, released at completion, re-runs
    nothing."""
    from stacksaga_store.clock import ManualClock

    async def body() -> None:
        clock = ManualClock(datetime(2031, 3, 12, 23, 59, 30, tzinfo=UTC))
        async with open_stack(clock=clock, **mode) as stack:
            runs: list[datetime] = []

            async def book(ctx: StepContext) -> None:
                runs.append(clock.now())
                if len(runs) == 1:
                    raise RetryableStepError("503")

            saga = Saga("book", (Step("book", book),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            outcome = await orchestrator.start(saga, {})
            assert outcome.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            # Accord: the pass reads Tiers 1-4 plainly; wait until the pointer's change landed
            # (a client hears of a commit before the replicas wrote it to Cassandra).
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            await settled_dump(
                stack,
                scope,
                lambda d: bool(d.tier5_transactions(odd=False)) and d.count(TIERS[0]) > 0,
            )
            clock.advance(MINUTE)  # 00:00:30 on the 13th
            report = await node.run_pass()
            assert report.dispatched == 1, report
            view = await orchestrator.read(outcome.transaction_id)
            assert view.status is RunningStatus.PROCESS_COMPLETED
            assert [t.date().isoformat() for t in runs] == ["2031-03-12", "2031-03-13"]
            clock.advance(10 * MINUTE)
            await node.run_pass()
            assert len(runs) == 2
            assert (await dump_directory(stack.runtime, scope)).empty_below_tier2

    run(body())
