"""The README demo: a 3-step order saga (inventory, payment, shipping) on a real Cassandra.

:func:`run_demo` applies the schema to a ``stacksaga_demo`` keyspace and runs four orders:

1. success: every step runs, PROCESS_COMPLETED;
2. compensation: shipping rejects the address, payment is refunded and the stock released in
   reverse order, REVERT_COMPLETED;
3. frozen: shipping fails and then the refund fails too, so the saga is FROZEN with a reason;
   the payment provider is "fixed" and an admin restore finishes the compensation;
4. retry: payment answers 503, the saga is handed to the recovery engine, which the runtime
   runs by default (restore watchdog, retry pointer at the next window, a Retry-Node); the
   demo's clock jumps two windows ahead and the Retry-Node completes it with the same
   idempotency key.

Each transaction is then read back with its tryout history. The payment domain runs STRICT
(LWT leases), the rest RELAXED_WITH_DEDUP. The downstream services are in-memory fakes; the
saga state is all in Cassandra. Output goes to the ``out`` callable (the CLI passes print).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from stacksaga_store.clock import ManualClock, SystemClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings, load_settings
from stacksaga_store.errors import NonRetryableStepError, RetryableStepError
from stacksaga_store.recovery.service import open_runtime
from stacksaga_store.saga.definition import Saga, SagaPayload, Step, StepContext
from stacksaga_store.saga.orchestrator import Orchestrator, SagaOutcome
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.model import TransactionView
from stacksaga_store.store.schema import apply_schema
from stacksaga_store.store.states import FINAL_STATUSES, PARKED_STATUSES

__all__ = ["DemoWorld", "describe", "order_saga", "run_demo"]

DEMO_KEYSPACE = "stacksaga_demo"
Out = Callable[[str], None]


@dataclass
class DemoWorld:
    """The downstream services the saga talks to, as in-memory fakes with failure switches."""

    stock: dict[str, int] = field(default_factory=lambda: {"book": 10})
    charges: dict[str, int] = field(default_factory=dict)  # idempotency key -> cents
    refunds: set[str] = field(default_factory=set)
    shipments: list[str] = field(default_factory=list)
    payment_unavailable_times: int = 0  # answer 503 this many more times
    refunds_broken: bool = False
    log: list[str] = field(default_factory=list)


def order_saga(world: DemoWorld) -> Saga:
    """inventory -> payment -> shipping, each with a compensation."""

    async def reserve(ctx: StepContext) -> dict[str, Any]:
        item, quantity = ctx.aggregate["item"], ctx.aggregate["quantity"]
        if world.stock.get(item, 0) < quantity:
            raise NonRetryableStepError(f"out of stock: {item}")
        world.stock[item] -= quantity
        ctx.revert_hints["reserved"] = {"item": item, "quantity": quantity}
        world.log.append(f"inventory: reserved {quantity} x {item}")
        return {"reservation": f"R-{ctx.transaction_id.hex[:6]}"}

    async def release(ctx: StepContext) -> None:
        hint = ctx.revert_hints["reserved"]
        world.stock[hint["item"]] += hint["quantity"]
        world.log.append(f"inventory: released {hint['quantity']} x {hint['item']}")

    async def charge(ctx: StepContext) -> dict[str, Any]:
        if world.payment_unavailable_times > 0:
            world.payment_unavailable_times -= 1
            raise RetryableStepError("payment provider: HTTP 503 Service Unavailable")
        # The provider deduplicates on the idempotency key, as real payment APIs do.
        world.charges.setdefault(ctx.idempotency_key, ctx.aggregate["amount_cents"])
        ctx.revert_hints["charge_key"] = ctx.idempotency_key
        world.log.append(
            f"payment: charged {ctx.aggregate['amount_cents']} (attempt {ctx.attempt})"
        )
        return {"payment_id": f"P-{ctx.idempotency_key[:8]}"}

    async def refund(ctx: StepContext) -> None:
        if world.refunds_broken:
            raise NonRetryableStepError("payment provider: refund endpoint returned 500")
        world.refunds.add(ctx.revert_hints["charge_key"])
        world.log.append("payment: refunded")

    async def ship(ctx: StepContext) -> dict[str, Any]:
        if ctx.aggregate["address"] == "nowhere":
            raise NonRetryableStepError("shipping: address does not exist")
        world.shipments.append(str(ctx.transaction_id))
        world.log.append("shipping: parcel booked")
        return {"tracking": f"T-{ctx.transaction_id.hex[:8]}"}

    async def cancel_shipment(ctx: StepContext) -> None:
        world.log.append("shipping: cancelled")

    return Saga(
        "order",
        (
            Step("inventory", reserve, release),
            Step("payment", charge, refund),
            Step("shipping", ship, cancel_shipment),
        ),
        domain="payment-saga",
    )


def demo_settings(region: str = "demo-region") -> StackSagaSettings:
    return load_settings(
        cassandra={
            "read-consistency-level": "LOCAL_QUORUM",
            "write-consistency-level": "LOCAL_QUORUM",
            "write-protection": {
                "default-mode": "RELAXED_WITH_DEDUP",
                "domains": {"payment-saga": {"mode": "STRICT", "lease-duration": "5s"}},
            },
            "schema": {"replication-strategy": "SimpleStrategy", "replication-factor": 1},
        },
        instance={"region": region, "cluster": "demo-cluster", "service-name": "order-service"},
    )


def describe(view: TransactionView) -> list[str]:
    """A transaction and its tryout history as lines of text."""
    record = view.record
    lines = [
        f"transaction {record.key.transaction_id}  status={record.running_status.value}",
        f"  created {record.created_at.isoformat()}  updated {record.updated_at.isoformat()}",
    ]
    for tryout in view.tryouts:
        lines.append(
            f"  #{tryout.tryout_index:<2} {tryout.executor:<10} {tryout.execution_type.value:<14}"
            f" {tryout.status.value}"
        )
    if view.frozen is not None:
        lines.append(f"  frozen at {view.frozen.frozen_at.isoformat()}: {view.frozen.reason}")
    return lines


async def run_demo(contact_points: list[tuple[str, int]], out: Out) -> int:
    """Run the four orders against the given Cassandra; returns 0 if all ended as expected."""
    settings = demo_settings()
    driver_config = DriverConfig(
        contact_points=tuple(contact_points),
        local_datacenter="datacenter1",
        session_keyspace=DEMO_KEYSPACE,
        request_timeout=timedelta(seconds=10),
        origin="<demo>",
    )
    loop = asyncio.get_running_loop()
    report = await loop.run_in_executor(None, _apply, settings, driver_config)
    out(f"schema: keyspace {DEMO_KEYSPACE}, created tables: {len(report)}")
    # A manual clock (from now) so order 4's retry window comes without a minute's wait.
    clock = ManualClock(SystemClock().now())
    runtime = await open_runtime(settings, driver_config=driver_config, clock=clock)
    try:
        world = DemoWorld()
        orchestrator = runtime.orchestrator(sagas=[order_saga(world)])
        results = await _orders(orchestrator, world, clock, out)
    finally:
        await runtime.close()
    expected = ["PROCESS_COMPLETED", "REVERT_COMPLETED", "REVERT_COMPLETED", "PROCESS_COMPLETED"]
    ok = [outcome.status.value for outcome in results] == expected
    out(f"\nCassandra statements sent: {runtime.cql.counts.snapshot()['by_kind']}")
    out("demo " + ("finished as expected" if ok else "did NOT end as expected"))
    return 0 if ok else 1


def _apply(settings: StackSagaSettings, driver_config: DriverConfig) -> tuple[str, ...]:
    cluster, session = connect_sync(settings, driver_config)
    try:
        return apply_schema(
            session, driver_config.keyspace, settings.cassandra.schema_
        ).created_tables
    finally:
        cluster.shutdown()


async def _orders(
    orchestrator: Orchestrator, world: DemoWorld, clock: ManualClock, out: Out
) -> list[SagaOutcome]:
    order = {"item": "book", "quantity": 2, "amount_cents": 2599, "address": "1 Main St"}
    results: list[SagaOutcome] = []

    out("\n== 1. success ==")
    results.append(await _show(orchestrator, world, out, await orchestrator.start("order", order)))

    out("\n== 2. shipping rejects the address: compensation in reverse ==")
    bad_address = {**order, "address": "nowhere"}
    results.append(
        await _show(orchestrator, world, out, await orchestrator.start("order", bad_address))
    )

    out("\n== 3. ...and the refund fails too: FROZEN, then an admin restore ==")
    world.refunds_broken = True
    frozen = await orchestrator.start("order", bad_address)
    await _show(orchestrator, world, out, frozen)
    world.refunds_broken = False
    out("-- refund endpoint fixed; admin restore --")
    results.append(
        await _show(
            orchestrator, world, out, await orchestrator.admin_restore(frozen.transaction_id)
        )
    )

    out("\n== 4. payment answers 503: the recovery engine retries it ==")
    world.payment_unavailable_times = 1
    paused = await orchestrator.start("order", order)
    await _show(orchestrator, world, out, paused)
    view = await orchestrator.read(paused.transaction_id)
    out(f"-- restore watchdog at {view.record.restore_path}; retry pointer at the next window")
    out("-- demo clock jumps two windows ahead; the runtime's Retry-Node picks the saga up --")
    clock.advance(timedelta(minutes=2))  # windows of 1 minute (the default)
    results.append(await _show(orchestrator, world, out, await _settled(orchestrator, paused)))
    out(
        f"\nstock left: {world.stock}; charges: {len(world.charges)}; "
        f"refunds: {len(world.refunds)}; shipments: {len(world.shipments)}"
    )
    return results


async def _settled(orchestrator: Orchestrator, paused: SagaOutcome) -> SagaOutcome:
    """Waits (60 s at most) until the Retry-Node drove the saga to a final or parked status."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        view = await orchestrator.read(paused.transaction_id)
        settled = view.status in FINAL_STATUSES or view.status in PARKED_STATUSES
        if settled or asyncio.get_running_loop().time() > deadline:
            payload = SagaPayload.decode(view.record.payload)
            return SagaOutcome(
                paused.transaction_id, view.status, payload.aggregate, payload.last_error
            )
        await asyncio.sleep(0.1)


async def _show(
    orchestrator: Orchestrator, world: DemoWorld, out: Out, outcome: SagaOutcome
) -> SagaOutcome:
    for line in world.log:
        out(f"  service> {line}")
    world.log.clear()
    out(
        f"outcome: {outcome.status.value}"
        + (f" ({outcome.last_error})" if outcome.last_error else "")
    )
    for line in describe(await orchestrator.read(outcome.transaction_id)):
        out(line)
    return outcome
