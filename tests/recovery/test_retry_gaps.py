"""Three ways a retry pointer went missing in ``ordered`` mode, each leaving a saga to its
restore watchdog (``delay-windows`` later, 10 h by default) instead of a retry in its next
window (issue 16). Each test failed before its fix and says which:

* a crash between the retryable failure's writes: the pointer was written last, after the
  failed tryout and the status; it now goes first (``Orchestrator._on_failure``);
* a pointer that lands just as its bucket is dropped: sent (timestamped) before a Retry-Node's
  partition tombstone, applied after it, so the row is shadowed; the writer, seeing the ack
  after the window started, now writes the pointer again into a window no reader has read;
* clock skew with ``read-grace`` 0: a reader whose clock runs ahead walked and dropped W+1
  while a writer still put its pointer there; readers now lag window starts by at least
  ``READ_GRACE_FLOOR``.

Real Cassandra (tests/conftest.py's node), manual clocks; one saga of one step that fails
once (``Steps.fail_first``). The retry pointers are the same in both commit modes, and so
are the fixes: each test runs in both (the issue asks that accord mode, too, retries
within the next window).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.recovery.commit_modes import CrashPoints
from stacksaga_store.recovery.directory import BucketRef, DirectoryScope
from stacksaga_store.recovery.retry_node import DispatchOutcome
from stacksaga_store.recovery.windows import READ_GRACE_FLOOR
from stacksaga_store.store.accord_store import SimulatedCommitCrash
from stacksaga_store.store.states import RunningStatus, TryoutStatus
from tests.recovery.conftest import StackFactory, one_lane
from tests.recovery.test_commit_modes import MINUTE, Steps, drain, node_of, status_of
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

# Window W is 12:00; its retry window W+1 starts at 12:01.
W_PLUS_1 = datetime.fromisoformat("2031-03-12T12:01:00+00:00")
RESUMED = ("RETRY", DispatchOutcome.RESUMED.value)


class Killed(BaseException):
    """The process stops here (like SIGKILL: a BaseException, so nothing swallows it)."""


def crash_after(
    store: Any, method: str, when: Callable[[tuple[Any, ...], dict[str, Any]], bool]
) -> None:
    """Make ``store.method`` stop the process right after a call ``when`` picks is durable."""
    original: Callable[..., Awaitable[Any]] = getattr(store, method)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if when(args, kwargs):
            raise Killed(method)
        return result

    setattr(store, method, wrapper)


@pytest.mark.parametrize("after", ["failed tryout", "retry status"])
def test_a_crash_after_a_retryable_failure_is_retried_in_the_next_window(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any], after: str
) -> None:
    """Before the fix the pointer came after both writes: crashed after either, the pass at
    W+1 found no row and the saga waited ``delay-windows``."""

    async def body() -> None:
        clock = ManualClock(W_PLUS_1 - 30 * timedelta(seconds=1))
        steps = Steps()
        steps.fail_first = True
        txn = uuid.uuid4()
        accord = "commit-mode" in mode
        # Accord: the failure is one transaction (pointer, tryout, status); the crash comes
        # right after it, and before it would be a crash mid-step (the watchdog's case).
        crash = CrashPoints(commits=[("step", "after")]) if accord else None
        async with open_stack(clock=clock, crash=crash, **mode) as crashed:
            store = crashed.runtime.events
            if accord:
                pass
            elif after == "failed tryout":
                crash_after(
                    store,
                    "append_tryout",
                    lambda _, kw: kw.get("status") is TryoutStatus.RETRYABLE_ERROR,
                )
            else:
                crash_after(
                    store,
                    "write_state",
                    lambda args, _: args[1] is RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
                )
            orchestrator = crashed.engine.orchestrator(sagas=[steps.saga()])
            with pytest.raises(SimulatedCommitCrash if accord else Killed):
                await orchestrator.start("work", {}, transaction_id=txn)
        assert steps.runs[txn] == 1
        async with open_stack(clock=clock, **mode) as stack:
            node = node_of(stack, steps, service_name)
            clock.advance(MINUTE)  # 12:01:30: W+1 is readable
            await node.run_pass()
            assert node.metrics.dispatched[RESUMED] == 1, dict(node.metrics.dispatched)
            assert await status_of(stack, txn) is RunningStatus.PROCESS_COMPLETED
            assert steps.runs[txn] == 2
            await drain(stack, node, 8)  # the watchdog was released at completion

    run(body())


def test_a_pointer_landing_as_its_bucket_is_dropped_is_retried_a_window_later(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """Saga ``first`` puts W+1's bucket on the map; saga ``late``'s pointer to the same
    bucket is sent at 12:00:59 but applied only after the Retry-Node, at 12:01:30, walked
    W+1 (resuming ``first``) and dropped the bucket. Before the fix the writer re-registered
    Tiers 1-4 only: the row itself was shadowed by the tombstone, and ``late`` was not
    retried at W+2 (nor ever before its watchdog)."""

    async def body() -> None:
        clock = ManualClock(W_PLUS_1 - timedelta(seconds=2))
        steps = Steps()
        steps.fail_first = True
        first, late = uuid.uuid4(), uuid.uuid4()
        async with open_stack(clock=clock, **one_lane(mode)) as stack:
            directory = stack.engine.writer.directory
            sent = asyncio.Event()
            dropped = asyncio.Event()
            original = directory.insert_entry

            accord = "commit-mode" in mode

            async def in_flight(
                scope: DirectoryScope, bucket: BucketRef, txn: uuid.UUID, **kw: Any
            ) -> None:
                if txn != late or bucket.bucket_index % 2 == 1 or dropped.is_set():
                    await original(scope, bucket, txn, **kw)
                    return
                if accord:
                    # The failure's transaction, held on its way: committed after the drop.
                    sent.set()
                    await dropped.wait()
                    await original(scope, bucket, txn, **kw)
                    return
                # Timestamped now, applied after the drop: a write stuck on the network.
                stamp = time.time_ns() // 1000
                sent.set()
                await dropped.wait()
                prepared = directory.statement("t5_put")
                cql = f"{prepared.statement.query_string} USING TIMESTAMP {stamp}"
                params = [*directory._bucket_params(scope, bucket), txn]
                session = stack.runtime.cql.session
                await asyncio.to_thread(lambda: session.execute(session.prepare(cql), params))

            directory.insert_entry = in_flight  # type: ignore[method-assign]
            orchestrator = stack.engine.orchestrator(sagas=[steps.saga()])
            await orchestrator.start("work", {}, transaction_id=first)
            clock.advance(timedelta(seconds=1))  # 12:00:59
            starting = asyncio.create_task(orchestrator.start("work", {}, transaction_id=late))
            await asyncio.wait_for(sent.wait(), 60)
            node = node_of(stack, steps, service_name)
            clock.advance(timedelta(seconds=31))  # 12:01:30
            report = await node.run_pass()
            assert report.buckets_dropped >= 1 and steps.runs[first] == 2
            dropped.set()
            await asyncio.wait_for(starting, 60)
            assert await status_of(stack, late) is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            assert stack.engine.writer.late_repairs >= 1
            clock.advance(MINUTE)  # 12:02:30: W+2 is readable
            await node.run_pass()
            assert await status_of(stack, late) is RunningStatus.PROCESS_COMPLETED
            assert steps.runs[late] == 2
            await drain(stack, node, 8)

    run(body())


def test_a_reader_clock_ahead_of_a_writer_with_read_grace_0(
    open_stack: StackFactory, service_name: str, mode: dict[str, Any]
) -> None:
    """The Retry-Node's clock runs 2 s ahead of the Standard-Node's (``read-grace`` 0, the
    default). At writer time 12:00:58 saga ``first`` fails (pointer at W+1); at reader time
    12:01:01 a pass runs; at writer time 12:00:59 saga ``second`` fails (pointer at W+1,
    early by the writer's clock). Before the fix the pass walked W+1, resumed ``first`` and
    dropped the bucket with its Tier-4 row, so ``second``'s row was never found again."""
    skew = timedelta(seconds=2)
    assert skew < READ_GRACE_FLOOR

    async def body() -> None:
        writer_clock = ManualClock(W_PLUS_1 - timedelta(seconds=2))
        reader_clock = ManualClock(writer_clock.now() + skew)
        steps = Steps()
        steps.fail_first = True
        first, second = uuid.uuid4(), uuid.uuid4()
        async with (
            open_stack(clock=writer_clock, **mode) as writer,
            open_stack(clock=reader_clock, **mode) as reader,
        ):
            orchestrator = writer.engine.orchestrator(sagas=[steps.saga()])
            await orchestrator.start("work", {}, transaction_id=first)
            node = node_of(reader, steps, service_name)
            writer_clock.advance(timedelta(seconds=1))
            reader_clock.advance(timedelta(seconds=1))
            await node.run_pass()  # reader 12:01:01, writer 12:00:59
            await orchestrator.start("work", {}, transaction_id=second)
            assert writer.engine.writer.late_repairs == 0  # early, by the writer's clock
            for clock in (writer_clock, reader_clock):
                clock.advance(MINUTE)  # reader 12:02:01: W+1 and its grace are past
            await node.run_pass()
            assert node.metrics.dispatched[RESUMED] == 2, dict(node.metrics.dispatched)
            for txn in (first, second):
                assert await status_of(reader, txn) is RunningStatus.PROCESS_COMPLETED
                assert steps.runs[txn] == 2
            await drain(reader, node, 8)

    run(body())
