"""Recovery on by default (issue 16): the documented ``open_runtime`` + ``runtime.orchestrator``
writes the restore watchdog and the retry pointer and retries a failed step through the
engine's own Retry-Node, with no wiring by the user; ``recovery=False`` opts out, loudly."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import stacksaga_store
from accord_cassandra.cluster import metrics_of
from stacksaga_store.clock import ManualClock
from stacksaga_store.config.driver import DriverConfig
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import RetryableStepError
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.service import RecoveryService
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.handoff import NoRecoveryHandoff
from stacksaga_store.store.states import RunningStatus
from tests.recovery._helpers import dump_directory
from tests.recovery.conftest import T0
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

TIER5 = "es_recovery_transactions_by_instance"


def test_documented_runtime_retries_a_failed_step_without_user_wiring(
    recovery_driver: DriverConfig, make_settings: Any
) -> None:
    settings: StackSagaSettings = make_settings()
    clock = ManualClock(T0)
    attempts: list[int] = []

    async def charge(ctx: StepContext) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise RetryableStepError("HTTP 503 from the payment service")

    saga = Saga("pay", (Step("charge", charge),))

    async def body() -> None:
        runtime = await stacksaga_store.open_runtime(
            settings,
            driver_config=recovery_driver,
            clock=clock,
            idle_seconds=0.05,
            metrics_listen="127.0.0.1:0",
        )
        try:
            orchestrator = runtime.orchestrator(sagas=[saga])
            assert not isinstance(orchestrator.recovery, NoRecoveryHandoff)
            outcome = await orchestrator.start(saga, {"amount": 5})
            assert outcome.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR
            scope = DirectoryScope.of(settings.instance)
            rows = (await dump_directory(runtime, scope)).rows[TIER5]
            buckets = sorted(r["bucket_index"] % 2 for r in rows)
            assert buckets == [0, 1], rows  # one retry pointer (even), one watchdog (odd)
            view = await orchestrator.read(outcome.transaction_id)
            assert view.record.restore_path is not None

            clock.advance(timedelta(minutes=2))  # W+1 is now readable
            deadline = asyncio.get_running_loop().time() + 60
            while (await orchestrator.read(outcome.transaction_id)).status is not (
                RunningStatus.PROCESS_COMPLETED
            ):
                assert asyncio.get_running_loop().time() < deadline, "never retried"
                await asyncio.sleep(0.05)
            assert attempts == [1, 2]

            # The engine's metrics are served where it says: the retry shows up there.
            service = runtime.recovery
            assert isinstance(service, RecoveryService)
            address = service.metrics_address
            assert address is not None and not address.endswith(":0"), address
            resumed = 'stacksaga_recovery_dispatch_total{kind="RETRY",outcome="RESUMED"}'
            while (await asyncio.to_thread(metrics_of, address)).get(resumed, 0) < 1:
                assert asyncio.get_running_loop().time() < deadline, "retry not counted"
                await asyncio.sleep(0.05)
        finally:
            await runtime.close()
        with pytest.raises(ConnectionRefusedError):
            metrics_of(address)  # closing the runtime stopped the server

    run(body())


def test_opting_out_logs_a_warning_and_writes_no_watchdog(
    recovery_driver: DriverConfig, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings: StackSagaSettings = make_settings()

    async def noop(ctx: StepContext) -> None:
        return None

    saga = Saga("noop", (Step("only", noop),))

    async def body() -> None:
        with caplog.at_level(logging.WARNING):
            runtime = await stacksaga_store.open_runtime(
                settings, driver_config=recovery_driver, recovery=False
            )
        try:
            with caplog.at_level(logging.WARNING):
                orchestrator = runtime.orchestrator(sagas=[saga])
            assert isinstance(orchestrator.recovery, NoRecoveryHandoff)
            outcome = await orchestrator.start(saga, {})
            view = await orchestrator.read(outcome.transaction_id)
            assert view.record.restore_path is None
        finally:
            await runtime.close()

    run(body())
    messages = [r.getMessage() for r in caplog.records]
    assert any("recovery engine disabled" in m for m in messages), messages
    assert any("orchestrator without a recovery engine" in m for m in messages), messages
