"""Real crashes (SIGKILL of separate processes) around the recovery engine (issue tests 2, 4).

Reference: seed 000 Part 4, "Feature 2: Restore" (the dead-man's switch) and "Safe Shutdown:
No Transaction Lost on Pod Kill" (a bucket is dropped only when 100% dispatched; execution
markers make committed steps no-ops on re-invocation).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.recovery.writer import instance_token
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import SagaPayload
from stacksaga_store.store.states import RunningStatus
from tests.recovery._helpers import (
    bulk_load_retry_bucket,
    committed_markers,
    dump_directory,
    statuses,
)
from tests.recovery._processes import children
from tests.recovery._worker import bulk_saga, order_saga, read_lines
from tests.recovery.conftest import T0, StackFactory, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

MINUTE = timedelta(minutes=1)
BULK_ROWS = 5000


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_sigkilled_standard_node_is_restored_after_the_delay_windows(
    open_stack: StackFactory,
    service_name: str,
    recovery_driver_text: str,
    tmp_path: Path,
) -> None:
    """Issue test 2: the process running a saga dies mid-saga (after inventory, inside
    payment); after delay-windows a Retry-Node restores it and it completes; inventory, which
    committed before the crash, is not executed again."""
    log = str(tmp_path / "steps.log")
    job = {
        "kind": "saga",
        "overrides": recovery_overrides(service_name, restore={"delay-windows": 3}),
        "driver_text": recovery_driver_text,
        "clock": T0.isoformat(),
        "log": log,
    }
    with children(tmp_path) as group:
        worker = group.worker("standard-node", job)
        wait_for(lambda: any(line.startswith("hang ") for line in read_lines(log)), 90, "hang")
        worker.kill()
    lines = read_lines(log)
    txn = uuid.UUID(next(line.split()[1] for line in lines if line.startswith("hang ")))

    async def body() -> None:
        async with open_stack(restore={"delay-windows": 3}) as stack:
            saga = order_saga(log, hang_in_payment=False)
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            view = await orchestrator.read(txn)
            assert view.status is RunningStatus.IN_PROGRESS
            old_path = view.record.restore_path
            assert old_path is not None

            # Before the watchdog's window nothing happens.
            stack.clock.advance(2 * MINUTE)
            report = await node.run_pass()
            assert report.rows == 0
            stack.clock.advance(MINUTE)
            report = await node.run_pass()
            assert report.dispatched == 1

            view = await orchestrator.read(txn)
            assert view.status is RunningStatus.PROCESS_COMPLETED
            executed = Counter(line.split()[0] for line in read_lines(log) if str(txn) in line)
            assert executed["inventory"] == 1  # committed before the crash: not run again
            assert executed["payment"] == 2  # started before the crash, run again on restore
            assert executed["shipping"] == 1
            # The restore re-armed a new watchdog first, released at completion.
            assert view.record.restore_path not in (None, old_path)
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions() == []
            stack.clock.advance(5 * MINUTE)
            await node.run_pass()
            dump = await dump_directory(stack.runtime, scope)
            assert dump.empty_below_tier2

    run(body())


def test_sigkilled_retry_node_mid_bucket_loses_nothing(
    open_stack: StackFactory,
    service_name: str,
    recovery_driver_text: str,
    tmp_path: Path,
) -> None:
    """Issue test 4: a Retry-Node dies in the middle of a 5,000-row bucket. The bucket is not
    dropped; another node finishes it; no step whose marker committed runs again."""
    log = str(tmp_path / "work.log")
    overrides = recovery_overrides(service_name, **{"bucket-size": 10_000, "concurrency": 64})
    writer_instance = str(uuid.uuid4())
    txns = [uuid.uuid4() for _ in range(BULK_ROWS)]
    windows = WindowMath(1)
    window = windows.shift(windows.window_at(T0), 1)

    async def body() -> None:
        async with open_stack(**{"bucket-size": 10_000, "concurrency": 64}) as stack:
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            payload = SagaPayload("bulk", ("work",), {}, {}).encode()
            await asyncio.to_thread(
                bulk_load_retry_bucket,
                stack.runtime,
                scope,
                date_of_year=window.date_of_year,
                minute_of_day=windows.minute_of_day(window),
                instance_id=writer_instance,
                instance_id_token=instance_token(writer_instance),
                transaction_ids=txns,
                payload=payload,
                created_at=T0,
            )
            job = {
                "kind": "retry_node",
                "overrides": overrides,
                "driver_text": recovery_driver_text,
                "clock": (T0 + MINUTE).isoformat(),
                "log": log,
            }
            with children(tmp_path) as group:
                first = group.worker("retry-node-a", job)
                wait_for(lambda: len(read_lines(log)) > 1000, 180, "1,000 executions")
                first.kill()
            executed_by_first = [line for line in read_lines(log) if line.startswith("work ")]
            assert len(executed_by_first) < BULK_ROWS, "killed mid-bucket"

            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_sizes() == {
                (window.date_of_year, windows.minute_of_day(window), writer_instance, 0): BULK_ROWS
            }, "the bucket survived the kill, whole"
            assert dump.count("es_buckets_by_instance") == 1
            committed = await asyncio.to_thread(
                committed_markers, stack.runtime, scope, txns, "work:EXECUTE"
            )
            # Most of what had started committed before the kill (up to `concurrency` were
            # still in flight when it came).
            assert len(committed) >= 500

            # Another Retry-Node (this process) finishes the bucket.
            stack.clock.advance(MINUTE)
            orchestrator = stack.engine.orchestrator(sagas=[bulk_saga(log)])
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            report = await node.run_pass()
            assert report.rows == BULK_ROWS and report.failed == 0
            assert report.buckets_dropped == 1

            counts = Counter(
                line.split()[1] for line in read_lines(log) if line.startswith("work ")
            )
            assert set(counts) == {str(t) for t in txns}, "every saga's step ran"
            rerun = [t for t in committed if counts[str(t)] != 1]
            assert rerun == [], "a step whose marker had committed ran again"
            assert await asyncio.to_thread(statuses, stack.runtime, scope, txns) == {
                "PROCESS_COMPLETED": BULK_ROWS
            }
            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_transactions() == [] and dump.count("es_buckets_by_instance") == 0

    run(body())
