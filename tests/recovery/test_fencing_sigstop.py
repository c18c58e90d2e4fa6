"""Leases that stop work, with real processes (issue 16): Retry-Node A (a process) resumes a
3-step saga and is SIGSTOPped between steps a and b, past its lease; the coordinator evicts it
and gives node B (this process) the ring; B resumes the saga and A is SIGCONTed while B is
inside step b. A's resume is fenced: it stops before b (unfenced, RELAXED_WITH_DEDUP ran b a
second time, beside B). Every step's effect is counted: none runs twice, in both modes."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import RetryableStepError
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient
from stacksaga_store.ring.server import Leadership, RingCoordinator
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.states import RunningStatus
from tests.recovery._processes import children
from tests.recovery._worker import fenced_saga, read_lines
from tests.recovery.conftest import T0, accord_recovery, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

LEASE_SECONDS = 4.0
TTL_SECONDS = 2


async def wait_until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@asynccontextmanager
async def coordinator(runtime: StoreRuntime) -> AsyncIterator[RingCoordinator]:
    leadership = Leadership(
        runtime.cql,
        runtime.driver_config.keyspace,
        region=runtime.settings.instance.region,
        cluster=runtime.settings.instance.cluster,
        holder="solo",
        ttl_seconds=TTL_SECONDS,
    )
    server = RingCoordinator(
        leadership=leadership, coordinator_id="solo", lease_seconds=LEASE_SECONDS
    )
    await server.start("127.0.0.1:0")
    try:
        yield server
    finally:
        await server.stop(resign=True)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (T: stopped)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize(
    ("commit_mode", "mode", "lease_clock"),
    [
        ("ordered", "STRICT", "running"),
        ("ordered", "RELAXED_WITH_DEDUP", "running"),
        ("accord", "STRICT", "running"),
        ("accord", "RELAXED_WITH_DEDUP", "running"),
        ("accord", "RELAXED_WITH_DEDUP", "frozen"),
        ("ordered", "STRICT", "frozen"),
    ],
)
def test_a_sigstopped_retry_node_does_not_run_a_step_again_after_waking(
    recovery_driver_text: str,
    recovery_driver: DriverConfig,
    service_name: str,
    tmp_path: Path,
    mode: str,
    commit_mode: str,
    lease_clock: str,
    request: pytest.FixtureRequest,
) -> None:
    """In accord mode (real Cassandra + the session's 3 sidecars) A's dispatch also carries
    the coordinator's epoch row, so each of its state changes is refused in-transaction once
    the range moved; the effects counted are the same in both commit modes.

    ``frozen``: A's lease clock stood still while it was stopped (a suspended VM), so A
    believes its lease holds and runs b beside B (RELAXED_WITH_DEDUP runs a duplicate by
    design). Only the in-transaction epoch condition then refuses A's b: without it A's b
    commits first, B's is refused by the marker, and A runs c on a range it lost. The
    refusal ends A's lease: b runs on A exactly once, and A drops the lease.

    ``ordered``/``STRICT``/``frozen``: A stops just after it acquired b's marker lease, before
    it claimed the transaction's epoch row; both its range lease and its marker lease run out
    while it is stopped, and B claims the row for the new epoch, takes the marker and runs b.
    Woken, A still believes its lease: only the epoch row refuses it (without the claim A ran
    b a second time, its commit refused only afterwards by the marker)."""
    log = str(tmp_path / "steps.log")
    frozen = lease_clock == "frozen"
    strict = mode == "STRICT"
    pause_in = "_claim_epoch" if frozen and commit_mode == "ordered" else "_drive"
    accord = (
        accord_recovery(request.getfixturevalue("accord_sidecars"))
        if commit_mode == "accord"
        else {}
    )

    async def first_attempt_fails(ctx: StepContext) -> None:
        raise RetryableStepError("HTTP 503")

    async def body() -> None:
        overrides = recovery_overrides(service_name, concurrency=2, **accord)
        overrides["instance"]["cluster"] = f"cluster-{uuid.uuid4().hex[:8]}"
        overrides["cassandra"]["write-protection"] = {
            "default-mode": mode,
            "default-lease-duration": "5s",
        }
        settings = load_settings(**overrides)
        runtime = await open_runtime(settings, driver_config=recovery_driver)
        clock = ManualClock(T0)
        engine = await RecoveryEngine.open(runtime, clock=clock)
        try:
            failing = Saga(
                "fenced",
                (Step("a", first_attempt_fails), *fenced_saga(log, "test").steps[1:]),
            )
            paused = await engine.orchestrator(sagas=[failing]).start(failing, {})
            assert paused.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            txn = str(paused.transaction_id)
            clock.advance(timedelta(minutes=1))  # the retry pointer's window is readable
            async with coordinator(runtime) as server:
                await wait_until(lambda: server.is_leader, 10, "leadership")
                job = {
                    "kind": "fenced_saga",
                    "overrides": overrides,
                    "driver_text": recovery_driver_text,
                    "clock": (T0 + timedelta(minutes=1)).isoformat(),
                    "log": log,
                    "coordinator": f"127.0.0.1:{server.port}",
                    "node_id": "node-a",
                    "frozen_clock": frozen,
                    "pause_in": pause_in,
                }
                with children(tmp_path) as group:
                    node_a = group.worker("node-a", job)
                    await wait_until(
                        lambda: f"a {txn} node-a" in read_lines(log), 90, "A ran step a"
                    )
                    await wait_until(lambda: process_state(node_a.pid) == "T", 30, "A stopped at b")
                    client = CoordinatorLeaseClient(
                        [f"127.0.0.1:{server.port}"], node_id="node-b", service_name=service_name
                    )
                    client.start()
                    # B's step b takes 1 s (well inside B's lease): A wakes while B is in it.
                    saga_b = fenced_saga(log, "node-b", b_seconds=3.0 if frozen else 1.0)
                    orchestrator_b = engine.orchestrator(sagas=[saga_b])
                    node_b = engine.retry_node(orchestrator_b, client, node_id="node-b")
                    stop = asyncio.Event()
                    runner = asyncio.create_task(node_b.run(stop=stop, idle_seconds=0.1))
                    try:
                        await wait_until(
                            lambda: f"b {txn} node-b" in read_lines(log), 120, "B inside b"
                        )
                        assert process_state(node_a.pid) == "T", "A woke too early"
                        node_a.process.send_signal(signal.SIGCONT)  # the pid, not the group
                        await wait_until(
                            lambda: (
                                "stopped between steps" in node_a.output()
                                or "refused by the store" in node_a.output()
                                or f"b {txn} node-a" in read_lines(log)
                            ),
                            60,
                            "A fenced (or running b)",
                        )
                        if frozen:
                            await wait_until(
                                lambda: (
                                    "refused by the store" in node_a.output()
                                    or f"c {txn} node-a" in read_lines(log)
                                    or (strict and f"b {txn} node-a" in read_lines(log))
                                ),
                                60,
                                "A refused (or A running b under STRICT, or c)",
                            )
                        await wait_until(
                            lambda: any(line.startswith(f"c {txn}") for line in read_lines(log)),
                            60,
                            "step c",
                        )
                        if frozen:
                            # Past the end of A's lease on its own (stopped) clock: until then
                            # a node that kept its refused lease dispatched the saga again.
                            await asyncio.sleep(LEASE_SECONDS + 1)
                        a_output = node_a.output()
                    finally:
                        stop.set()
                        await runner
                        await client.stop()
            view = await orchestrator_b.read(paused.transaction_id)
            assert view.status is RunningStatus.PROCESS_COMPLETED
        finally:
            await engine.close()
            await runtime.close()
        effects = Counter(
            tuple(line.split()[::2]) for line in read_lines(log) if txn in line
        )  # (step, node)
        if frozen and mode == "RELAXED_WITH_DEDUP":
            # The one duplicate RELAXED_WITH_DEDUP admits: A's stopped clock let it run b
            # beside B. Its state change was refused by the epoch condition, and that refusal
            # ended A's lease: A stopped and never dispatched under that epoch again (kept,
            # the lease let A re-run b after each refusal until its own clock ended it).
            assert effects.pop(("b", "node-a"), 0) == 1, effects
        assert (effects["a", "node-a"], effects["b", "node-b"]) == (1, 1), effects
        # c runs once, on whichever node holds the range by then: A, once it dropped its
        # refused lease, asks the coordinator again and may get the saga's range back.
        assert Counter(step for step, _ in effects.elements()) == Counter("abc"), effects
        if frozen:
            assert "refused by the store" in a_output, a_output

    run(body())
