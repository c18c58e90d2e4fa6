"""Worker processes the recovery tests SIGKILL: ``python -m tests.recovery._worker job.json``.

Jobs (a JSON object):

* ``{"kind": "saga", ...}``: a Standard-Node starts the 3-step ``order`` saga, whose second
  step hangs after logging ``hang``, until the test kills the process mid-saga;
* ``{"kind": "retry_node", ...}``: a Retry-Node (whole ring, no coordinator) runs passes over
  the directory with the ``bulk`` saga until killed;
* ``{"kind": "coordinated", ...}``: a Retry-Node on a lease from the coordinator at
  ``coordinator``, dispatching with :class:`LoggingDispatcher` (the pause test SIGSTOPs it);
* ``{"kind": "fenced_saga", ...}``: the same, dispatching the 3-step ``fenced`` saga for real;
  it SIGSTOPs itself at the first step boundary after step ``a`` (:class:`PauseAtStepBoundary`).

Every step appends one line per execution to the job's log file with O_APPEND (single small
writes never interleave between processes), so the file counts executions exactly, even
across a SIGKILL. Both jobs use a manual clock frozen at ``clock`` (ISO text).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import load_settings
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.runtime import open_runtime


def append_line(path: str, line: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def read_lines(path: str | Path) -> list[str]:
    file = Path(path)
    return file.read_text().splitlines() if file.exists() else []


def order_saga(log: str, *, hang_in_payment: bool) -> Saga:
    """inventory -> payment -> shipping; each logs ``<step> <txn> <pid>``."""

    def step(name: str, hang: bool = False) -> Step:
        async def execute(ctx: StepContext) -> dict[str, Any]:
            append_line(log, f"{name} {ctx.transaction_id} {os.getpid()}")
            if hang:
                append_line(log, f"hang {ctx.transaction_id} {os.getpid()}")
                await asyncio.Event().wait()  # until SIGKILL
            return {name: "done"}

        async def compensate(ctx: StepContext) -> None:
            append_line(log, f"undo-{name} {ctx.transaction_id} {os.getpid()}")

        return Step(name, execute, compensate)

    return Saga("order", (step("inventory"), step("payment", hang_in_payment), step("shipping")))


class LoggingDispatcher:
    """Logs ``dispatch <txn> <instance> <node> <monotonic> <epoch> <valid_until>`` when a
    dispatch *starts*, then takes ``seconds``. CLOCK_MONOTONIC is machine-wide on Linux, so
    times logged by different processes compare."""

    def __init__(self, node_id: str, leases: Any, log: str, seconds: float) -> None:
        self.node_id = node_id
        self.leases = leases
        self.log = log
        self.seconds = seconds

    async def dispatch(self, entry: Any) -> Any:
        from stacksaga_store.recovery.retry_node import DispatchOutcome

        lease = self.leases.current()
        epoch, valid_until = (lease.epoch, lease.valid_until) if lease else (-1, 0.0)
        append_line(
            self.log,
            f"dispatch {entry.transaction_id} {entry.bucket.instance_id} {self.node_id} "
            f"{time.monotonic():.6f} {epoch} {valid_until:.6f}",
        )
        await asyncio.sleep(self.seconds)
        return DispatchOutcome.RESUMED


def fenced_saga(log: str, node_id: str, after_a: Any = None, b_seconds: float = 0.0) -> Saga:
    """a -> b -> c; each logs ``<step> <txn> <node_id>`` as it starts; ``after_a()`` runs after
    a's effect; b then takes ``b_seconds``."""

    def step(name: str) -> Step:
        async def execute(ctx: StepContext) -> None:
            append_line(log, f"{name} {ctx.transaction_id} {node_id}")
            if name == "a" and after_a is not None:
                after_a()
            if name == "b" and b_seconds:
                await asyncio.sleep(b_seconds)

        return Step(name, execute)

    return Saga("fenced", (step("a"), step("b"), step("c")))


class PauseAtStepBoundary:
    """A lease source proxy: once ``arm()`` ran, the next lease check made by the orchestrator
    between two steps (``Orchestrator._drive``) SIGSTOPs this process, so the test controls
    the pause point exactly: after step a committed, before step b. ``pause_in``
    ``_claim_epoch``: the check write protection makes after b's STRICT marker lease was
    acquired, just before it claims the transaction's epoch row (ordered mode)."""

    def __init__(self, inner: Any, frozen_clock: bool = False, pause_in: str = "_drive") -> None:
        self.inner = inner
        self.pause_in = pause_in
        self.armed = False
        # frozen_clock: after the pause, the lease seen before it and a monotonic clock that
        # stood still meanwhile (a suspended VM's), so only the epoch row can tell it moved.
        self.frozen_clock = frozen_clock
        self.frozen: Any = None
        self.stopped_for = 0.0
        # The Retry-Node names the epoch row (the accord mode's in-transaction fence) only for
        # a source that persists its epochs: the proxy must not hide that its coordinator does.
        self.persists_epochs = bool(getattr(inner, "persists_epochs", False))

    def arm(self) -> None:
        self.armed = True

    def current(self) -> Any:
        # current() <- LeaseFence.token() <- Orchestrator._drive
        if self.armed and sys._getframe(2).f_code.co_name == self.pause_in:
            self.armed = False
            before, lease = float(self.inner.monotonic()), self.inner.current()
            os.kill(os.getpid(), signal.SIGSTOP)
            if self.frozen_clock:
                self.frozen, self.stopped_for = lease, float(self.inner.monotonic()) - before
        if self.frozen is not None:
            return self.frozen
        return self.inner.current()

    def monotonic(self) -> float:
        return float(self.inner.monotonic()) - self.stopped_for

    def note_in_flight(self, count: int) -> None:
        self.inner.note_in_flight(count)

    def drop(self, epoch: int) -> None:
        # The store refused the epoch: the node knows now, whatever its stopped clock says.
        self.frozen = None
        drop = getattr(self.inner, "drop", None)
        if callable(drop):
            drop(epoch)


def bulk_saga(log: str) -> Saga:
    """One step that logs ``work <txn> <pid>``: the 5,000-row bucket test."""

    async def work(ctx: StepContext) -> None:
        append_line(log, f"work {ctx.transaction_id} {os.getpid()}")

    return Saga("bulk", (Step("work", work),))


async def main(job: dict[str, Any]) -> None:
    settings = load_settings(**job["overrides"])
    runtime = await open_runtime(
        settings, driver_config=parse_driver_config(job["driver_text"], "<worker>")
    )
    clock = ManualClock(datetime.fromisoformat(job["clock"]))
    engine = await RecoveryEngine.open(runtime, clock=clock)
    try:
        if job["kind"] == "saga":
            saga = order_saga(job["log"], hang_in_payment=True)
            orchestrator = engine.orchestrator(sagas=[saga])
            append_line(job["log"], f"started {os.getpid()}")
            await orchestrator.start(saga, {"order": 1})
        elif job["kind"] == "retry_node":
            saga = bulk_saga(job["log"])
            orchestrator = engine.orchestrator(sagas=[saga])
            leases = StaticLeaseSource(settings.instance.service_name)
            node = engine.retry_node(orchestrator, leases, node_id=f"worker-{os.getpid()}")
            append_line(job["log"], f"started {os.getpid()}")
            stop = asyncio.Event()
            await node.run(stop=stop, idle_seconds=0.2)
        elif job["kind"] == "coordinated":
            from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient

            client = CoordinatorLeaseClient(
                [job["coordinator"]],
                node_id=job["node_id"],
                service_name=settings.instance.service_name,
            )
            client.start()
            dispatcher = LoggingDispatcher(job["node_id"], client, job["log"], job["seconds"])
            node = engine.retry_node(
                engine.orchestrator(), client, node_id=job["node_id"], dispatcher=dispatcher
            )
            append_line(job["log"], f"started {os.getpid()}")
            await node.run(stop=asyncio.Event(), idle_seconds=0.1)
        elif job["kind"] == "fenced_saga":
            from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient

            logging.basicConfig(level=logging.INFO, stream=sys.stdout)
            client = CoordinatorLeaseClient(
                [job["coordinator"]],
                node_id=job["node_id"],
                service_name=settings.instance.service_name,
            )
            client.start()
            pausing = PauseAtStepBoundary(
                client, bool(job.get("frozen_clock")), job.get("pause_in", "_drive")
            )
            saga = fenced_saga(job["log"], job["node_id"], pausing.arm)
            node = engine.retry_node(
                engine.orchestrator(sagas=[saga]), pausing, node_id=job["node_id"]
            )
            append_line(job["log"], f"started {os.getpid()}")
            await node.run(stop=asyncio.Event(), idle_seconds=0.1)
        else:
            raise SystemExit(f"unknown job kind {job['kind']!r}")
    finally:
        await engine.close()
        await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
