"""The Standard-Node writer on real Cassandra: identity, token, writes per start, and the
``directory show`` command.

Reference: seed 000 Part 4, "Bounded Partitions" (fresh instance_id per process, token of
instance_id in Tier 3) and "The Full Lifecycle Pseudocode" (Tier 1-4 upserts are idempotent).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.recovery.directory import BucketKind
from stacksaga_store.recovery.writer import instance_token, new_instance_id
from stacksaga_store.store.states import RunningStatus
from tests.recovery._processes import REPO_ROOT, write_config
from tests.recovery.conftest import StackFactory, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra


def test_instance_token_equals_cassandras_token(open_stack: StackFactory) -> None:
    """instance_id_token is what ``SELECT token(instance_id)`` returns, for any text."""
    ids = [new_instance_id() for _ in range(20)] + ["ключ", "pod-\u00e9", "x" * 200, "🙂"]

    async def body() -> None:
        async with open_stack() as stack:
            session = stack.runtime.cql.session
            table = f"{stack.runtime.driver_config.keyspace}.token_probe_{uuid.uuid4().hex[:6]}"
            session.execute(f"CREATE TABLE {table} (k text PRIMARY KEY)", timeout=120)
            try:
                for value in ids:
                    session.execute(f"INSERT INTO {table} (k) VALUES (%s)", [value])
                rows = session.execute(f"SELECT k, token(k) AS t FROM {table}")
                found = {row["k"]: row["t"] for row in rows}
            finally:
                session.execute(f"DROP TABLE {table}", timeout=120)
            assert found == {value: instance_token(value) for value in ids}

    run(body())


def test_a_start_costs_two_writes_in_steady_state(open_stack: StackFactory) -> None:
    """Tier 1-4 once per (window, instance, bucket); then Tier 5 + es_transaction per start."""

    async def body() -> None:
        async with open_stack(**{"bucket-size": 1000}) as stack:
            from stacksaga_store.saga.definition import Saga, Step, StepContext

            async def noop(ctx: StepContext) -> None:
                return None

            saga = Saga("noop", (Step("noop", noop),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            counts = stack.runtime.cql.counts
            await orchestrator.create(saga, {})
            first = counts.snapshot()["by_table"]
            assert first["write:es_days_by_year"] == 1
            assert first["write:es_buckets_by_instance"] == 1
            counts.reset()
            for _ in range(20):
                await orchestrator.create(saga, {})
            assert counts.mutations == 40
            assert counts.snapshot()["by_table"] == {
                "write:es_recovery_transactions_by_instance": 20,
                "write:es_transaction": 20,
            }
            # A restart is a new instance with its own buckets, counting from slot 0 again.
            writer = stack.engine.writer
            window = writer.windows.restore_window(stack.clock.now(), 5)
            assert writer.allocate(window, BucketKind.RESTORE).bucket_index == 1
            assert writer.instance_id != new_instance_id()

    run(body())


def test_directory_show_prints_the_live_tree(
    open_stack: StackFactory, service_name: str, recovery_driver_text: str, tmp_path: Path
) -> None:
    """``python -m stacksaga_store directory show`` (console script ``stacksaga-store``)."""
    now = ManualClock(datetime.now(UTC))

    async def body() -> None:
        async with open_stack(clock=now) as stack:
            from stacksaga_store.errors import RetryableStepError
            from stacksaga_store.saga.definition import Saga, Step, StepContext

            async def fail(ctx: StepContext) -> None:
                raise RetryableStepError("503")

            saga = Saga("show", (Step("call", fail),))
            orchestrator = stack.engine.orchestrator(sagas=[saga])
            for _ in range(3):
                outcome = await orchestrator.start(saga, {})
                assert outcome.status is RunningStatus.FAILED_WITH_RETRYABLE_ERROR

    run(body())
    config = write_config(tmp_path, recovery_overrides(service_name), recovery_driver_text)
    result = subprocess.run(
        [sys.executable, "-m", "stacksaga_store", "--config", str(config), "directory", "show"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"directory of test-region/test-cluster/{service_name}")
    assert any("bucket 0 RETRY: 3 rows" in line for line in lines)
    assert any("bucket 1 RESTORE: 3 rows" in line for line in lines)
    assert lines[-1].startswith("total: ") and "6 rows" in lines[-1]
