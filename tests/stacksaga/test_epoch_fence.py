"""The ordered mode's STRICT epoch fence on real Cassandra (protection.py, "Epoch fence"): the
transaction's ``range-epoch`` row refuses an attempt of an older range-lease epoch before its
step runs, and at its commit once a later epoch claimed the transaction meanwhile."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from stacksaga_store.config.settings import ConsistencyMode
from stacksaga_store.errors import LeaseFenceRefusedError
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.protection import EPOCH_ROW, GuardOutcome, MarkerKey, epoch_text
from stacksaga_store.store.states import ExecutionType, step_id
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

Opener = Callable[..., Coroutine[Any, Any, StoreRuntime]]


async def _nothing(ctx: StepContext) -> None:
    return None


SAGA = Saga("epochs", (Step("a", _nothing), Step("b", _nothing)), domain="payment-saga")


async def _state(runtime: StoreRuntime, key: TransactionKey, step: str) -> str | None:
    current = await runtime.protection._inspect(MarkerKey(key, step))
    return None if current is None else current.state


def test_epoch_order_is_text_order() -> None:
    epochs = [0, 1, 2, 9, 10, 99, 100, 12345, 10**19]
    assert sorted(epochs, key=epoch_text) == epochs
    assert all(epoch_text(a) < epoch_text(b) for a, b in itertools.pairwise(epochs))


def test_an_older_epoch_is_refused_before_its_step_runs(open_store: Opener) -> None:
    async def body() -> None:
        runtime = await open_store()
        try:
            policy = runtime.settings.cassandra.write_protection.policy_for("payment-saga")
            assert policy.mode is ConsistencyMode.STRICT
            txn = await runtime.orchestrator(sagas=[SAGA]).create(SAGA, {})
            key = TransactionKey.of(runtime.settings.instance, txn)
            runs: Counter[tuple[str, int]] = Counter()

            async def attempt(step: str, epoch: int) -> GuardOutcome:
                async def action() -> None:
                    runs[step, epoch] += 1

                result = await runtime.protection.run(
                    MarkerKey(key, step_id(step, ExecutionType.EXECUTE)),
                    policy,
                    action,
                    result_writes=lambda _: [],
                    is_final_failure=lambda _: False,
                    fence=lambda: f"e{epoch}",
                    epoch=epoch,
                )
                return result.outcome

            assert await _state(runtime, key, EPOCH_ROW) is None
            assert await attempt("a", 2) is GuardOutcome.EXECUTED
            assert await _state(runtime, key, EPOCH_ROW) == epoch_text(2)
            with pytest.raises(LeaseFenceRefusedError):
                await attempt("b", 1)
            assert runs == Counter({("a", 2): 1}), "the refused attempt ran its step"
            marker_b = step_id("b", ExecutionType.EXECUTE)
            assert await _state(runtime, key, marker_b) is None, "its marker lease stayed"
            assert await attempt("b", 3) is GuardOutcome.EXECUTED
            assert await _state(runtime, key, EPOCH_ROW) == epoch_text(3)
            assert await _state(runtime, key, marker_b) == "COMMITTED"
        finally:
            await runtime.close()

    run(body())


def test_a_commit_is_refused_once_a_later_epoch_claimed_the_transaction(
    open_store: Opener,
) -> None:
    async def body() -> None:
        runtime = await open_store()
        try:
            policy = runtime.settings.cassandra.write_protection.policy_for("payment-saga")
            txn = await runtime.orchestrator(sagas=[SAGA]).create(SAGA, {})
            key = TransactionKey.of(runtime.settings.instance, txn)
            marker = MarkerKey(key, step_id("a", ExecutionType.EXECUTE))
            runs = 0

            async def action() -> None:
                nonlocal runs
                runs += 1
                # Meanwhile a node of epoch 2 resumes the transaction (another step's claim).
                other = MarkerKey(key, step_id("b", ExecutionType.EXECUTE))
                await runtime.protection._claim_epoch(other, 2, None)

            with pytest.raises(LeaseFenceRefusedError):
                await runtime.protection.run(
                    marker,
                    policy,
                    action,
                    result_writes=lambda _: [],
                    is_final_failure=lambda _: False,
                    fence=lambda: "e1",
                    epoch=1,
                )
            assert runs == 1
            assert await _state(runtime, key, marker.step_id) is None, "committed, or lease kept"
            assert await _state(runtime, key, EPOCH_ROW) == epoch_text(2)
        finally:
            await runtime.close()

    run(body())


def test_no_epoch_means_no_epoch_row(open_store: Opener) -> None:
    """A static lease (or none) has no persisted epoch: nothing extra is written."""

    async def body() -> None:
        runtime = await open_store()
        try:
            txn = await runtime.orchestrator(sagas=[SAGA]).start(SAGA, {})
            key = TransactionKey.of(runtime.settings.instance, txn.transaction_id)
            assert await _state(runtime, key, EPOCH_ROW) is None
        finally:
            await runtime.close()

    run(body())
