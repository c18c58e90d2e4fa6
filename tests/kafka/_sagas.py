"""The saga the Kafka tests run, shared by the test process and its worker processes.

Every run of a step's business logic inserts one row into ``kafka_effects`` (a fresh timeuuid
per run) *before* it returns: the table is an exact count of how often each step's logic ran,
and the rows' write times say when, relative to the step's execution marker.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from stacksaga_store.errors import NonRetryableStepError
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.store.cql import CqlSession, StatementKind

STEPS = ("reserve", "charge", "notify")
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS {keyspace}.kafka_effects ("
    " transaction_id uuid, step text, run timeuuid, worker text,"
    " PRIMARY KEY ((transaction_id), step, run))"
)


async def order_saga(cql: CqlSession, keyspace: str, *, name: str, domain: str) -> Saga:
    """reserve (undo: release) -> charge (undo: refund) -> notify. ``fail_at`` in the
    aggregate names a step whose logic fails permanently, which turns the saga around;
    ``hold`` is how long each step's logic takes."""
    insert = await cql.prepare(
        f"INSERT INTO {keyspace}.kafka_effects (transaction_id, step, run, worker) "
        "VALUES (?, ?, now(), ?)",
        kind=StatementKind.WRITE,
        table="kafka_effects",
    )

    def logic(label: str) -> Any:
        async def run(ctx: StepContext) -> dict[str, Any]:
            await cql.execute(insert, [ctx.transaction_id, label, str(os.getpid())])
            # "hold": seconds the logic takes, to keep steps in flight across a rebalance.
            await asyncio.sleep(float(ctx.aggregate.get("hold", 0)))
            if ctx.aggregate.get("fail_at") == label:
                raise NonRetryableStepError(f"{label} refused")
            return {f"{label}_by": os.getpid()}

        return run

    steps = (
        Step("reserve", logic("reserve"), logic("release")),
        Step("charge", logic("charge"), logic("refund")),
        Step("notify", logic("notify")),
    )
    return Saga(name, steps, domain=domain)
