"""Sagas in every state, for the console's demo and tests: one ``order`` saga whose steps
fail on purpose as its aggregate says, and :func:`seed` that leaves one saga in each state.

The ``-once`` variants (``unavailable-once``, ``broken-once``) fail the first attempt only:
the demo's traffic, whose retries and restores then succeed. ``SampleWorld`` holds the
switches: a refund marked ``broken`` fails permanently (the saga
freezes), ``flaky`` retryably (REVERT_FAILED_WITH_RETRYABLE_ERROR), until ``refunds_fixed``;
a payment marked ``unavailable`` fails retryably until ``payment_fixed``. So after
``world.refunds_fixed = True`` an admin restore of the frozen saga finishes its compensation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from stacksaga_store.errors import NonRetryableStepError, RetryableStepError
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import Orchestrator, StepEvent
from stacksaga_store.store.states import ExecutionType

__all__ = ["SAMPLE_STATES", "SampleWorld", "sagas", "sample_saga", "seed", "traffic_order"]


@dataclass
class SampleWorld:
    refunds_fixed: bool = False
    payment_fixed: bool = False
    calls: list[str] = field(default_factory=list)


def sample_saga(world: SampleWorld) -> Saga:
    async def reserve(ctx: StepContext) -> dict[str, Any]:
        world.calls.append(f"reserve {ctx.transaction_id}")
        ctx.revert_hints["reserved"] = True
        return {"reservation": f"R-{ctx.transaction_id.hex[:6]}"}

    async def release(ctx: StepContext) -> None:
        world.calls.append(f"release {ctx.transaction_id}")

    async def charge(ctx: StepContext) -> dict[str, Any]:
        world.calls.append(f"charge {ctx.transaction_id}")
        mode = ctx.aggregate.get("payment")
        if (mode == "unavailable" and not world.payment_fixed) or (
            mode == "unavailable-once" and ctx.attempt == 1
        ):
            raise RetryableStepError("payment provider: HTTP 503 Service Unavailable")
        return {"payment_id": f"P-{ctx.idempotency_key[:8]}"}

    async def refund(ctx: StepContext) -> None:
        world.calls.append(f"refund {ctx.transaction_id}")
        mode = ctx.aggregate.get("refund")
        if (mode == "broken" and not world.refunds_fixed) or (
            mode == "broken-once" and ctx.attempt == 1
        ):
            raise NonRetryableStepError("payment provider: refund endpoint returned 500")
        if mode == "flaky" and not world.refunds_fixed:
            raise RetryableStepError("payment provider: refund timed out")

    async def ship(ctx: StepContext) -> dict[str, Any]:
        world.calls.append(f"ship {ctx.transaction_id}")
        if ctx.aggregate.get("address") == "nowhere":
            raise NonRetryableStepError("shipping: address does not exist")
        return {"tracking": f"T-{ctx.transaction_id.hex[:8]}"}

    async def cancel(ctx: StepContext) -> None:
        world.calls.append(f"cancel {ctx.transaction_id}")

    return Saga(
        "order",
        (
            Step("inventory", reserve, release),
            Step("payment", charge, refund),
            Step("shipping", ship, cancel),
        ),
        domain="payment-saga",
    )


# state label -> the status the seeded saga has
SAMPLE_STATES = {
    "started": "STARTED",
    "running": "IN_PROGRESS",
    "retrying": "FAILED_WITH_RETRYABLE_ERROR",
    "compensating": "COMPENSATING",
    "restoring": "REVERT_FAILED_WITH_RETRYABLE_ERROR",
    "frozen": "FROZEN",
    "completed": "PROCESS_COMPLETED",
    "reverted": "REVERT_COMPLETED",
}

_ORDER = {"item": "book", "quantity": 1, "amount_cents": 2599, "address": "1 Main St"}


async def seed(orchestrator: Orchestrator, *, frozen: int = 1) -> dict[str, uuid.UUID]:
    """One saga per :data:`SAMPLE_STATES` label (``frozen`` of them frozen: ``frozen``,
    ``frozen-2``, ...); returns label -> transaction id. The orchestrator must have
    :func:`sample_saga` registered and no Retry-Node acting on its sagas meanwhile."""
    ids: dict[str, uuid.UUID] = {}
    ids["completed"] = (await orchestrator.start("order", _ORDER)).transaction_id
    ids["reverted"] = (
        await orchestrator.start("order", {**_ORDER, "address": "nowhere"})
    ).transaction_id
    for n in range(frozen):
        label = "frozen" if n == 0 else f"frozen-{n + 1}"
        ids[label] = (
            await orchestrator.start("order", {**_ORDER, "address": "nowhere", "refund": "broken"})
        ).transaction_id
    ids["restoring"] = (
        await orchestrator.start("order", {**_ORDER, "address": "nowhere", "refund": "flaky"})
    ).transaction_id
    ids["retrying"] = (
        await orchestrator.start("order", {**_ORDER, "payment": "unavailable"})
    ).transaction_id
    ids["started"] = await orchestrator.create("order", _ORDER)
    running = await orchestrator.create("order", _ORDER)
    await orchestrator.deliver(StepEvent(running, "inventory", ExecutionType.EXECUTE))
    ids["running"] = running
    compensating = await orchestrator.create("order", {**_ORDER, "address": "nowhere"})
    for step in ("inventory", "payment", "shipping"):
        await orchestrator.deliver(StepEvent(compensating, step, ExecutionType.EXECUTE))
    ids["compensating"] = compensating
    return ids


def traffic_order(n: int) -> dict[str, Any]:
    """The demo's n-th order: mostly fine; every 7th retried once, every 11th compensated,
    every 23rd frozen until an admin restores it (then its refund succeeds)."""
    order = dict(_ORDER)
    if n % 23 == 22:
        order.update(address="nowhere", refund="broken-once")
    elif n % 11 == 10:
        order.update(address="nowhere")
    elif n % 7 == 6:
        order.update(payment="unavailable-once")
    return order


def sagas() -> list[Saga]:
    """``--sagas stacksaga_store.console.sample:sagas``: the sample saga with its refunds
    working, so a console process can restore the seeded frozen sagas."""
    return [sample_saga(SampleWorld(refunds_fixed=True))]
