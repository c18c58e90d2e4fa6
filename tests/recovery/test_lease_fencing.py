"""Leases that stop work (issue 16), in process and deterministic: a Retry-Node's resume is
fenced by the range lease it dispatched under. It stops between steps once the lease is gone,
and a STRICT step whose range moved while it ran does not commit. Real Cassandra, both
protection modes; every step's side effects are counted.

The whole-process form (SIGSTOP a Retry-Node past its lease) is test_fencing_sigstop.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import LeaseFencedError, RetryableStepError
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.ring.leases import FULL_RING, Lease, RangeLeaseLost, StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import DeliveryOutcome
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.protection import MarkerKey
from stacksaga_store.store.states import ExecutionType, MarkerState, RunningStatus, step_id
from tests.recovery.conftest import T0, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

MODES = ["STRICT", "RELAXED_WITH_DEDUP"]


class MovableLeases:
    """A lease source whose range the test moves to a later epoch (another node's now)."""

    def __init__(self, service: str) -> None:
        self.lease: Lease | None = Lease(service, FULL_RING, 1, 0, 1, math.inf)
        self.in_flight = 0

    def current(self) -> Lease | None:
        return self.lease

    def move(self) -> None:
        if self.lease is not None:
            self.lease = replace(self.lease, epoch=self.lease.epoch + 1)

    def monotonic(self) -> float:
        return 0.0

    def note_in_flight(self, count: int) -> None:
        self.in_flight = count


class CountdownFence:
    """A fence that is lost after ``checks`` more calls once armed (orchestrator-level)."""

    def __init__(self) -> None:
        self.left: int | None = None

    def arm(self, checks: int) -> None:
        self.left = checks

    def token(self) -> str | None:
        if self.left is None:
            return "e1"
        if self.left == 0:
            return None
        self.left -= 1
        return "e1"

    def fencing_row(self) -> None:
        return None

    def refused(self) -> None:
        raise AssertionError("no epoch row: nothing can refuse this fence")


def _settings(service: str, mode: str, lease: str = "5s") -> Any:
    overrides = recovery_overrides(service)
    overrides["cassandra"]["write-protection"] = {
        "default-mode": mode,
        "default-lease-duration": lease,
    }
    return load_settings(**overrides)


def _saga(effects: Counter[str], failures: dict[str, int], during: dict[str, Any]) -> Saga:
    def step(name: str) -> Step:
        async def execute(ctx: StepContext) -> None:
            effects[name] += 1
            hook = during.get(name)
            if hook is not None and failures.get(name, 0) == 0:
                hook()
            if failures.get(name, 0) > 0:
                failures[name] -= 1
                raise RetryableStepError(f"{name}: HTTP 503")

        return Step(name, execute)

    return Saga("fenced", (step("a"), step("b"), step("c")))


@pytest.mark.parametrize("mode", MODES)
def test_a_resume_stops_between_steps_once_its_fence_is_lost(
    recovery_driver: DriverConfig, service_name: str, mode: str
) -> None:
    effects: Counter[str] = Counter()
    fence = CountdownFence()
    # Lost right after step a committed: STRICT checks the fence at a's lease and a's commit.
    during = {"a": lambda: fence.arm(1 if mode == "STRICT" else 0)}
    saga = _saga(effects, {"a": 1}, during)

    async def body() -> None:
        runtime = await open_runtime(_settings(service_name, mode), driver_config=recovery_driver)
        try:
            orchestrator = runtime.orchestrator(sagas=[saga], clock=ManualClock(T0))
            paused = await orchestrator.start(saga, {})
            assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            with pytest.raises(LeaseFencedError):
                await orchestrator.resume(paused.transaction_id, fence=fence)
            assert effects == Counter({"a": 2}), "b ran after the lease was gone"
            # The range's next holder finishes it; nothing runs twice.
            done = await orchestrator.resume(paused.transaction_id, fence=CountdownFence())
            assert done.status is RunningStatus.PROCESS_COMPLETED
            assert effects == Counter({"a": 2, "b": 1, "c": 1})
        finally:
            await runtime.close()

    run(body())


def test_a_strict_step_whose_range_moved_while_it_ran_does_not_commit(
    recovery_driver: DriverConfig, service_name: str
) -> None:
    effects: Counter[str] = Counter()
    fence = CountdownFence()
    during = {"a": lambda: fence.arm(0)}  # lost while a runs
    saga = _saga(effects, {}, during)

    async def body() -> None:
        runtime = await open_runtime(
            _settings(service_name, "STRICT"), driver_config=recovery_driver
        )
        try:
            orchestrator = runtime.orchestrator(sagas=[saga], clock=ManualClock(T0))
            txn = await orchestrator.create(saga, {})
            outcome = await orchestrator.resume(txn, fence=fence)
            assert outcome.note is not None and "lease of a lost" in outcome.note
            view = await orchestrator.read(txn)
            assert view.status is RunningStatus.STARTED, "the refused holder wrote its result"
            marker = MarkerKey(view.key, step_id("a", ExecutionType.EXECUTE))
            snapshot = await runtime.protection._inspect(marker)
            assert snapshot is None or snapshot.final is not MarkerState.COMMITTED
        finally:
            await runtime.close()

    run(body())


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_node_dispatch_is_fenced_by_its_range_lease(
    recovery_driver: DriverConfig, service_name: str, mode: str
) -> None:
    """The Retry-Node hands its lease to the resume: the range moves during step a; the old
    node runs neither b nor c, keeps the bucket, and the new holder completes the saga."""
    effects: Counter[str] = Counter()
    leases = MovableLeases(service_name)
    ran_before_move: list[Counter[str]] = []

    def move() -> None:
        ran_before_move.append(Counter(effects))
        leases.move()

    saga = _saga(effects, {"a": 1}, {"a": move})

    async def body() -> None:
        clock = ManualClock(T0)
        runtime = await open_runtime(_settings(service_name, mode), driver_config=recovery_driver)
        try:
            engine = await RecoveryEngine.open(runtime, clock=clock)
            orchestrator = engine.orchestrator(sagas=[saga])
            paused = await orchestrator.start(saga, {})
            assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            clock.advance(timedelta(minutes=1))
            old = engine.retry_node(orchestrator, leases, node_id="old")
            with pytest.raises(RangeLeaseLost):
                await old.run_pass()
            assert effects["b"] == 0 and effects["c"] == 0, effects
            view = await orchestrator.read(paused.transaction_id)
            if mode == "STRICT":
                # a's second run was refused its commit: the saga still waits for a retry.
                assert view.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            new = engine.retry_node(
                orchestrator, StaticLeaseSource(service_name, epoch=2), node_id="new"
            )
            report = await new.run_pass()
            assert report.rows >= 1
            view = await orchestrator.read(paused.transaction_id)
            assert view.status is RunningStatus.PROCESS_COMPLETED
            # STRICT re-runs the refused a (its commit never happened); nothing else repeats.
            assert effects == Counter({"a": 3 if mode == "STRICT" else 2, "b": 1, "c": 1})
            await engine.close()
        finally:
            await runtime.close()

    run(body())


def _held_saga(
    who: str, effects: Counter[tuple[str, str]], held: dict[str, asyncio.Event] | None = None
) -> Saga:
    """Steps a, b, c that count (step, who); with ``held``, step b signals ``inside`` and
    waits for ``release`` (the worker is stopped inside the step)."""

    def step(name: str) -> Step:
        async def execute(ctx: StepContext) -> None:
            effects[name, who] += 1
            if name == "b" and held is not None:
                held["inside"].set()
                await held["release"].wait()

        return Step(name, execute)

    return Saga("held", (step("a"), step("b"), step("c")))


def test_a_relaxed_step_whose_range_moved_while_it_ran_writes_no_stale_status(
    recovery_driver: DriverConfig, service_name: str
) -> None:
    """A's resume is inside b when its range moves and B (the new holder) finishes the saga.
    RELAXED_WITH_DEDUP has no marker lease, so B runs b too (the mode's trade-off); but A's
    result, IN_PROGRESS, must not overwrite B's PROCESS_COMPLETED: nobody would ever look at
    the saga again (B released its watchdog)."""
    effects: Counter[tuple[str, str]] = Counter()
    fence = CountdownFence()

    async def body() -> None:
        held = {"inside": asyncio.Event(), "release": asyncio.Event()}
        runtime = await open_runtime(
            _settings(service_name, "RELAXED_WITH_DEDUP"), driver_config=recovery_driver
        )
        try:
            clock = ManualClock(T0)
            node_a = runtime.orchestrator(sagas=[_held_saga("A", effects, held)], clock=clock)
            node_b = runtime.orchestrator(sagas=[_held_saga("B", effects)], clock=clock)
            txn = await node_a.create("held", {})
            resume_a = asyncio.create_task(node_a.resume(txn, fence=fence))
            await asyncio.wait_for(held["inside"].wait(), 60)
            done = await node_b.resume(txn)
            assert done.status is RunningStatus.PROCESS_COMPLETED
            fence.arm(0)  # the range moved while A was inside b
            held["release"].set()
            with contextlib.suppress(LeaseFencedError):
                outcome = await asyncio.wait_for(resume_a, 60)
                assert outcome.stopped_by is DeliveryOutcome.LEASE_LOST
            view = await node_b.read(txn)
            assert view.status is RunningStatus.PROCESS_COMPLETED, "A's stale status landed"
            assert effects == Counter({("a", "A"): 1, ("b", "A"): 1, ("b", "B"): 1, ("c", "B"): 1})
        finally:
            await runtime.close()

    run(body())


def test_a_resume_stopped_by_a_marker_lease_keeps_its_retry_row(
    recovery_driver: DriverConfig, service_name: str
) -> None:
    """STRICT: old holder A is inside b (holding b's marker lease) when the range moves. The
    new holder B's pass meets the lease (LEASE_BUSY): the saga did not move, so B keeps the
    row. A's step then finds its range gone and commits nothing: had B dropped the row, the
    saga would wait for its restore watchdog (delay-windows). B's next pass finishes it."""
    effects: Counter[tuple[str, str]] = Counter()
    fence = CountdownFence()
    failures = {"a": 1}

    async def first_a_fails(ctx: StepContext) -> None:
        effects["a", "first"] += 1
        if failures["a"]:
            failures["a"] -= 1
            raise RetryableStepError("a: HTTP 503")

    async def body() -> None:
        held = {"inside": asyncio.Event(), "release": asyncio.Event()}
        # A's marker lease outlives B's first pass by far: B must meet it, not its expiry.
        settings = _settings(service_name, "STRICT", lease="60s")
        runtime = await open_runtime(settings, driver_config=recovery_driver, lease_waits_max=0)
        clock = ManualClock(T0)
        try:
            engine = await RecoveryEngine.open(runtime, clock=clock)
            try:
                first = Saga(
                    "held", (Step("a", first_a_fails), *_held_saga("-", effects).steps[1:])
                )
                paused = await engine.orchestrator(sagas=[first]).start(first, {})
                assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
                clock.advance(timedelta(minutes=1))
                node_a = engine.orchestrator(sagas=[_held_saga("A", effects, held)])
                resume_a = asyncio.create_task(node_a.resume(paused.transaction_id, fence=fence))
                await asyncio.wait_for(held["inside"].wait(), 60)

                node_b = engine.orchestrator(sagas=[_held_saga("B", effects)])
                retry_b = engine.retry_node(
                    node_b, StaticLeaseSource(service_name, epoch=2), node_id="B"
                )
                report = await retry_b.run_pass()
                assert report.rows == 1 and report.failed == 1, report
                assert report.buckets_kept == 1 and report.buckets_dropped == 0, report

                fence.arm(0)
                held["release"].set()
                outcome = await asyncio.wait_for(resume_a, 60)
                assert outcome.stopped_by is DeliveryOutcome.LEASE_LOST

                report = await retry_b.run_pass()
                assert report.failed == 0 and report.buckets_dropped == 1, report
                view = await node_b.read(paused.transaction_id)
                assert view.status is RunningStatus.PROCESS_COMPLETED
                # A ran b but was refused its commit, so B ran it: STRICT's fence keeps the
                # step's result single, not its call (the idempotency key is the same).
                assert effects == Counter(
                    {("a", "first"): 1, ("a", "A"): 1, ("b", "A"): 1, ("b", "B"): 1, ("c", "B"): 1}
                )
            finally:
                await engine.close()
        finally:
            await runtime.close()

    run(body())
