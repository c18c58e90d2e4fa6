"""Saga definitions for ``stacksaga-store retry-node --sagas tests.recovery._cli_sagas:sagas``:
one slow step that logs ``start <txn>`` and ``end <txn>`` to ``$STACKSAGA_TEST_STEP_LOG``, so
a test counts dispatches that began and ones that finished (O_APPEND, exact across kills)."""

from __future__ import annotations

import asyncio
import os

from stacksaga_store.saga.definition import Saga, Step, StepContext
from tests.recovery._worker import append_line

STEP_SECONDS = 0.3


def sagas() -> list[Saga]:
    log = os.environ["STACKSAGA_TEST_STEP_LOG"]

    async def work(ctx: StepContext) -> None:
        append_line(log, f"start {ctx.transaction_id}")
        await asyncio.sleep(STEP_SECONDS)
        append_line(log, f"end {ctx.transaction_id}")

    return [Saga("slow", (Step("work", work),))]
