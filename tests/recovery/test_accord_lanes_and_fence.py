"""Accord mode: write lanes spread a writer's starts over instance ids, and a fenced dispatch
is refused inside its own transaction once its range lease's epoch row moved on.

Real Cassandra and three sidecars (the session's ``accord_sidecars``).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import LeaseFenceRefusedError
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.retry_node import LeaseFence
from stacksaga_store.ring.leases import StaticLeaseSource, ring_row_name
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import DeliveryOutcome, StepEvent
from stacksaga_store.saga.runtime import open_runtime
from stacksaga_store.store.model import FencingRow
from stacksaga_store.store.protection import MarkerKey
from stacksaga_store.store.states import ExecutionType, RunningStatus, TryoutStatus, step_id
from tests.recovery.conftest import T0, StackFactory, accord_recovery, recovery_overrides
from tests.recovery.test_commit_modes import DELAY, MINUTE, Steps, settled_dump, status_of
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra


def test_write_lanes_spread_starts_over_instances_and_a_pass_restores_them_all(
    open_stack: StackFactory, service_name: str, accord_sidecars: list[str]
) -> None:
    """8 starts over 4 lanes with bucket-size 1: each lane (its own instance id, Tier-3
    marker and buckets) takes 2 slots, one per bucket, so no bucket passes bucket-size; the
    Retry-Node finds every watchdog through Tier 3 and restores each saga once."""
    mode = accord_recovery(accord_sidecars)
    mode["accord"]["write-lanes"] = 4

    async def body() -> None:
        async with open_stack(**{"bucket-size": 1}, **mode) as stack:
            steps = Steps()
            orchestrator = stack.engine.orchestrator(sagas=[steps.saga()])
            txns = [await orchestrator.create("work", {}) for _ in range(8)]
            writer = stack.engine.writer
            assert len(set(writer.instance_ids)) == 4
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            dump = await settled_dump(
                stack, scope, lambda d: len(d.tier5_transactions(odd=True)) == 8
            )
            sizes = dump.tier5_sizes()
            assert set(sizes.values()) == {1}, sizes  # bucket-size 1 held in every bucket
            by_instance = Counter(instance for _, _, instance, _ in sizes)
            assert by_instance == Counter(dict.fromkeys(writer.instance_ids, 2)), by_instance
            assert dump.count("es_instances_by_recovery_window") == 4
            assert dump.count("es_buckets_by_instance") == 8
            node = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            stack.clock.advance(DELAY * MINUTE)
            report = await node.run_pass()
            assert report.failed == 0
            assert steps.runs == Counter(dict.fromkeys(txns, 1)), steps.runs
            for txn in txns:
                assert await status_of(stack, txn) is RunningStatus.PROCESS_COMPLETED

    run(body())


class PlantedFence:
    """A Retry-Node's fence that still holds by the node's own lease clock (``token`` gives
    its epoch), so only the in-transaction condition over the epoch row can refuse it."""

    def __init__(self, row: FencingRow) -> None:
        self.row = row
        self.refusals = 0

    def token(self) -> str | None:
        return None if self.refusals else f"e{self.row.epoch}"

    def fencing_row(self) -> FencingRow | None:
        return self.row

    def refused(self) -> None:
        self.refusals += 1


def _two_steps(effects: Counter[str]) -> Saga:
    def step(name: str) -> Step:
        async def execute(ctx: StepContext) -> None:
            effects[name] += 1

        return Step(name, execute)

    return Saga("fenced", (step("a"), step("b")))


@pytest.mark.parametrize("protection", ["STRICT", "RELAXED_WITH_DEDUP"])
def test_a_dispatch_whose_epoch_row_moved_on_writes_nothing(
    recovery_driver: DriverConfig, service_name: str, accord_sidecars: list[str], protection: str
) -> None:
    """The coordinator persisted epoch 2 (planted) while a dispatch of epoch 1 runs: its
    step's transaction reads the row, its condition fails, and nothing of the step outcome
    lands (status, tryout, marker), though the node's own clock says its lease still holds.
    STRICT is refused sooner: its marker lease's take carries the same condition, so step a
    does not run at all (a pause between the take and the step cannot run it twice).
    The range's epoch-2 holder then runs the saga to the end under the same condition."""
    strict = protection == "STRICT"
    overrides = recovery_overrides(service_name, **accord_recovery(accord_sidecars))
    overrides["cassandra"]["write-protection"] = {
        "default-mode": protection,
        "default-lease-duration": "2s",
    }
    settings = load_settings(**overrides)
    effects: Counter[str] = Counter()
    saga = _two_steps(effects)

    async def body() -> None:
        runtime = await open_runtime(settings, driver_config=recovery_driver)
        try:
            engine = await RecoveryEngine.open(runtime, clock=ManualClock(T0))
            orchestrator = engine.orchestrator(sagas=[saga])
            txn = await orchestrator.create(saga, {})
            instance = settings.instance
            name = ring_row_name(service_name)
            keyspace = runtime.driver_config.keyspace
            session = runtime.cql.session
            session.execute(
                f"INSERT INTO {keyspace}.es_ring_state (region, cluster, name, epoch) "
                "VALUES (%s, %s, %s, 2)",
                (instance.region, instance.cluster, name),
            )
            stale = PlantedFence(FencingRow(instance.region, instance.cluster, name, 1))
            # The refusal ends the lease, not just the step: the fence is told, the resume
            # stops with an error that says the lease is lost for good.
            with pytest.raises(LeaseFenceRefusedError) as refused:
                await orchestrator.resume(txn, fence=stale)
            assert stale.refusals == 1
            if strict:
                assert effects == Counter(), "a ran though its marker lease's take was stale"
                assert "marker lease" in str(refused.value), refused.value
            else:
                assert effects == Counter({"a": 1}), "b ran after a's outcome was refused"
            view = await orchestrator.read(txn)
            assert view.status is RunningStatus.STARTED, "the stale holder wrote its status"
            assert view.tryouts == (), "the stale holder wrote a tryout"
            marker = MarkerKey(view.key, step_id("a", ExecutionType.EXECUTE))
            left = await runtime.protection._marker(marker)  # type: ignore[attr-defined]
            # No marker at all: a STRICT lease refused with its change is dropped, so the
            # range's next holder does not wait out its TTL (LEASE_BUSY).
            assert left is None, left
            current = PlantedFence(FencingRow(instance.region, instance.cluster, name, 2))
            done = await orchestrator.resume(txn, fence=current)
            assert done.status is RunningStatus.PROCESS_COMPLETED, done
            assert effects == Counter({"a": 1 if strict else 2, "b": 1})
            await engine.close()
        finally:
            await runtime.close()

    run(body())


def test_only_a_coordinators_lease_names_an_epoch_row() -> None:
    """A static lease has no persisted epoch (nothing moves it), so its dispatches carry no
    epoch condition; a lease from a source that persists its epochs names its row."""

    class PersistingLeases(StaticLeaseSource):
        persists_epochs = True

    scope = DirectoryScope("r", "c", "svc")
    for leases, expected in (
        (StaticLeaseSource("svc", epoch=3), None),
        (PersistingLeases("svc", epoch=3), FencingRow("r", "c", ring_row_name("svc"), 3)),
    ):
        lease = leases.current()
        assert lease is not None
        assert LeaseFence(leases, lease, scope).fencing_row() == expected
        assert LeaseFence(leases, lease).fencing_row() is None


def test_two_relaxed_runs_of_one_step_record_it_once(
    open_stack: StackFactory, accord_sidecars: list[str]
) -> None:
    """RELAXED_WITH_DEDUP in the accord mode: two deliveries of one step, both past the
    marker check and both inside the step at once, both run it (the mode's trade-off); of
    their two step changes exactly one commits. The COMMITTED marker is written without a
    condition of its own: the tryout's [index free] refuses the second record."""
    runs: Counter[str] = Counter()
    inside = asyncio.Event()
    both_in = asyncio.Event()

    async def both_at_once(ctx: StepContext) -> None:
        runs["a"] += 1
        if runs["a"] == 2:
            both_in.set()
        inside.set()
        await asyncio.wait_for(both_in.wait(), 60)

    async def second(ctx: StepContext) -> None:
        runs["b"] += 1

    saga = Saga("dup", (Step("a", both_at_once), Step("b", second)))

    async def body() -> None:
        async with open_stack(**accord_recovery(accord_sidecars)) as stack:
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            txn = await orchestrator.create(saga, {})
            event = StepEvent(txn, "a")
            outcomes = await asyncio.gather(
                orchestrator.deliver(event), orchestrator.deliver(event)
            )
            assert runs == Counter({"a": 2}), runs
            assert sorted(outcomes) == sorted(
                [DeliveryOutcome.EXECUTED, DeliveryOutcome.LEASE_LOST]
            ), outcomes
            view = await orchestrator.read(txn)
            recorded = [(t.executor, t.status) for t in view.tryouts]
            assert recorded == [("a", TryoutStatus.SUCCESS)], recorded
            assert view.status is RunningStatus.IN_PROGRESS
            marker = MarkerKey(view.key, step_id("a", ExecutionType.EXECUTE))
            assert await stack.runtime.protection._marker(marker) == "COMMITTED"  # type: ignore[attr-defined]
            # A later delivery skips it: the history says a is done.
            assert await orchestrator.deliver(event) is DeliveryOutcome.STALE
            assert runs["a"] == 2

    run(body())
