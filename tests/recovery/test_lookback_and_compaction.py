"""Deep historical lookback and Node-0's two gates on real Cassandra (issue tests 6, 7).

Reference: seed 000 Part 4, "Deep Historical Recovery" (lookback-days, strictly chronological,
oldest first) and "Directory Compaction" (Node-0's two-gate protocol).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.errors import RetryableStepError
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.writer import RecoveryWriter, instance_token
from stacksaga_store.ring.leases import StaticLeaseSource, split_ring
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.handoff import RetryRequest
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.states import ExecutionType, RunningStatus
from tests.recovery._helpers import DispatchRecord, RecordingDispatcher, dump_directory
from tests.recovery.conftest import StackFactory
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

MINUTE = timedelta(minutes=1)


def test_two_days_offline_lookback_recovers_everything_oldest_first(
    open_stack: StackFactory, service_name: str
) -> None:
    """Issue test 6: failures spread over two days and a New Year's midnight; the service is
    offline until the third day; one pass recovers all of them in failure order."""
    start = datetime(2031, 12, 30, 9, 0, 10, tzinfo=UTC)
    # Failure times: two on Dec 30, two on Dec 31 (the last one's W+1 is 00:00 of Jan 1, in
    # the next year's Tier-1 partition), one on Jan 1 morning.
    offsets = [
        timedelta(0),
        timedelta(hours=8, minutes=17),
        timedelta(days=1, hours=2),
        timedelta(days=1, hours=14, minutes=59, seconds=40),
        timedelta(days=1, hours=21, minutes=3),
    ]

    async def body() -> None:
        clock = ManualClock(start)
        # A lifetime longer than the outage: otherwise the oldest are quarantined, correctly.
        async with open_stack(clock=clock, lifetime="5d", restore={"delay-windows": 30}) as stack:
            order: list[str] = []
            seen: set[str] = set()

            async def call(ctx: StepContext) -> None:
                name = ctx.aggregate["name"]
                if name not in seen:
                    seen.add(name)
                    raise RetryableStepError("down for the holidays")
                order.append(name)

            saga = Saga("holiday", (Step("call", call),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            txns = []
            for index, offset in enumerate(offsets):
                clock.advance(start + offset - clock.now())
                outcome = await orchestrator.start(saga, {"name": f"saga-{index}"})
                assert outcome.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
                txns.append(outcome.transaction_id)
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            dump = await dump_directory(stack.runtime, scope)
            assert sorted(r["year"] for r in dump.rows["es_days_by_year"]) == [2031, 2031, 2032]
            assert ("2032-01-01", 0) in dump.windows()  # Dec 31 23:59:40 + 1 window

            # Offline until Jan 1, 12:00: everything is in the lookback horizon (2 days).
            clock.advance(datetime(2032, 1, 1, 12, 0, 5, tzinfo=UTC) - clock.now())
            report = await node.run_pass()
            assert report.failed == 0
            assert order == [f"saga-{index}" for index in range(len(offsets))], "oldest first"
            assert report.windows == sorted(report.windows), "strictly chronological"
            for txn in txns:
                assert (await orchestrator.read(txn)).status is RunningStatus.PROCESS_COMPLETED
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions() == []
            # Node-0 compacted every closed window and the two finished days.
            assert sorted(r["date_of_year"] for r in dump.rows["es_days_by_year"]) == ["2032-01-01"]

    run(body())


def test_node0_keeps_a_window_while_another_node_has_markers_in_it(
    open_stack: StackFactory, service_name: str
) -> None:
    """Issue test 7: Node-0 (lower half of the ring) finishes its part of a window first; the
    window stays in Tier 2 (Gate 1) until the other node's Tier-3 markers are gone, and a
    window that has not ended stays whatever Tier 3 says (Gate 2)."""

    async def body() -> None:
        async with open_stack() as stack:
            runtime, clock = stack.runtime, stack.clock
            low, high = split_ring(2)
            # Writer instances on both halves of the ring.
            writers: dict[str, list[RecoveryWriter]] = {"low": [], "high": []}
            while min(len(w) for w in writers.values()) < 2:
                instance_id = str(uuid.uuid4())
                half = "low" if low.contains(instance_token(instance_id)) else "high"
                if len(writers[half]) < 2:
                    writers[half].append(
                        RecoveryWriter(
                            directory=stack.engine.directory,
                            events=runtime.events,
                            settings=runtime.settings,
                            commit=stack.engine.commit,
                            clock=clock,
                            instance_id=instance_id,
                        )
                    )
            for writer in [*writers["low"], *writers["high"]]:
                for _ in range(3):
                    key = TransactionKey.of(runtime.settings.instance, uuid.uuid4())
                    await writer.schedule_retry(
                        RetryRequest(key, "s", ExecutionType.EXECUTE, 1, "503", clock.now())
                    )
            window = stack.engine.writer.windows.retry_window(clock.now())
            scope = DirectoryScope.of(runtime.settings.instance)
            log: list[DispatchRecord] = []
            leases = {
                "low": StaticLeaseSource(service_name, token_range=low, members=2),
                "high": StaticLeaseSource(service_name, token_range=high, members=2),
            }
            nodes: dict[str, Any] = {
                half: stack.engine.retry_node(
                    stack.engine.orchestrator(),
                    lease,
                    node_id=half,
                    dispatcher=RecordingDispatcher(half, lease, log),
                )
                for half, lease in leases.items()
            }
            assert leases["low"].current().is_node_zero  # type: ignore[union-attr]

            clock.advance(2 * MINUTE)  # the window has started and ended: Gate 2 open
            report = await nodes["low"].run_pass()
            assert report.node_zero and report.rows == 6
            assert report.compaction["gate1_blocked"] == 1
            dump = await dump_directory(runtime, scope)
            assert (window.date_of_year, window.index) in dump.windows()
            assert dump.count("es_instances_by_recovery_window") == 2  # the high half's

            report = await nodes["high"].run_pass()
            assert not report.node_zero and report.rows == 6 and report.compaction == {}
            dump = await dump_directory(runtime, scope)
            assert (window.date_of_year, window.index) in dump.windows(), "only Node-0 deletes"

            report = await nodes["low"].run_pass()
            assert report.compaction["windows_deleted"] == 1
            dump = await dump_directory(runtime, scope)
            assert dump.windows() == [] and dump.count("es_days_by_year") == 1  # today stays
            assert sorted(r.node_id for r in log) == ["high"] * 6 + ["low"] * 6

            # Gate 2: a window that has not ended is kept even with no Tier-3 marker at all.
            future = stack.engine.writer.windows.shift(window, 10)
            await stack.engine.directory.restore_window(scope, future)
            report = await nodes["low"].run_pass()
            assert report.compaction["gate2_blocked"] == 1
            # The day goes only when it is over and has no window left.
            clock.advance(timedelta(days=1))
            report = await nodes["low"].run_pass()
            assert report.compaction["windows_deleted"] == 1
            assert report.compaction["days_deleted"] == 1
            dump = await dump_directory(runtime, scope)
            assert dump.count("es_days_by_year") == 0 and dump.windows() == []

    run(body())
