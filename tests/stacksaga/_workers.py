"""Code that runs in worker *processes* (each with its own driver session) for the tests of
concurrent and crashing deliveries. Imported by the forkserver before it forks the workers.

The business logic of the counted step appends one line per event to a shared file opened
with O_APPEND: single small writes to such a file never interleave between processes, so the
file is an exact, crash-proof count of how often the logic started and finished.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import load_settings
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.orchestrator import StepEvent
from stacksaga_store.saga.runtime import open_runtime

COUNTED_STEP = "reserve"
BARRIER_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class Job:
    """Everything a worker needs, as plain picklable values."""

    overrides: dict[str, Any]
    driver_text: str
    transaction_id: uuid.UUID
    domain: str
    log_path: str
    hang: bool = False
    hold_seconds: float = 0.0  # how long the business logic takes


def append_line(path: str, line: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def read_lines(path: str) -> list[str]:
    file = Path(path)
    return file.read_text().splitlines() if file.exists() else []


def counting_saga(
    domain: str,
    log_path: str,
    *,
    hang: bool = False,
    hold_seconds: float = 0.0,
    started: Event | None = None,
) -> Saga:
    """reserve (counted; optionally slow, or hanging after starting) then notify.
    ``started`` is set once the step runs, i.e. once this worker holds its lease."""

    async def reserve(ctx: StepContext) -> dict[str, Any]:
        append_line(log_path, f"start {os.getpid()}")
        if started is not None:
            started.set()
        await asyncio.sleep(hold_seconds)
        if hang:
            # Holds the lease until the test SIGKILLs this process.
            await asyncio.Event().wait()
        append_line(log_path, f"done {os.getpid()}")
        return {"reserved_by": os.getpid()}

    async def release(ctx: StepContext) -> None:
        append_line(log_path, f"release {os.getpid()}")

    async def notify(ctx: StepContext) -> None:
        return None

    return Saga(
        "counted", (Step(COUNTED_STEP, reserve, release), Step("notify", notify)), domain=domain
    )


async def _deliver(job: Job, barrier: Barrier | None, started: Event | None) -> str:
    runtime = await open_runtime(
        load_settings(**job.overrides), driver_config=parse_driver_config(job.driver_text)
    )
    try:
        orchestrator = runtime.orchestrator(
            sagas=[
                counting_saga(
                    job.domain,
                    job.log_path,
                    hang=job.hang,
                    hold_seconds=job.hold_seconds,
                    started=started,
                )
            ]
        )
        if barrier is not None:
            # Every worker is connected and prepared; release them together.
            barrier.wait(BARRIER_TIMEOUT_SECONDS)
        outcome = await orchestrator.deliver(StepEvent(job.transaction_id, COUNTED_STEP))
        return outcome.value
    finally:
        await runtime.close()


def deliver_worker(
    job: Job, barrier: Barrier | None, results: Any, started: Event | None = None
) -> None:
    """Process target: deliver the counted step once; report (pid, outcome or error)."""
    try:
        results.put((os.getpid(), asyncio.run(_deliver(job, barrier, started))))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((os.getpid(), "ERROR " + traceback.format_exc()))


def worker_context() -> ForkServerContext:
    """forkserver: a clean parent with the driver already imported, no driver threads."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context
