"""``stacksaga-store retry-node`` as a real process (issue 16): SIGTERM mid-bucket finishes the
dispatches in flight, hands the bucket back whole (not 100% dispatched: never dropped), and
exits 0; its RecoveryMetrics are served over HTTP in Prometheus format while it runs."""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from accord_cassandra.cluster import metrics_of
from stacksaga_store.clock import ManualClock
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.recovery.writer import instance_token
from stacksaga_store.ring.leases import StaticLeaseSource
from stacksaga_store.saga.definition import SagaPayload
from tests.recovery._cli_sagas import sagas
from tests.recovery._helpers import bulk_load_retry_bucket, dump_directory, statuses
from tests.recovery._processes import children, write_config
from tests.recovery._worker import read_lines
from tests.recovery.conftest import StackFactory, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

ROWS = 300
CONCURRENCY = 8


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_sigterm_finishes_in_flight_dispatches_keeps_the_bucket_and_exits_0(
    open_stack: StackFactory,
    service_name: str,
    recovery_driver_text: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = tmp_path / "steps.log"
    monkeypatch.setenv("STACKSAGA_TEST_STEP_LOG", str(log))
    recovery = {"bucket-size": 10_000, "concurrency": CONCURRENCY}
    config = write_config(
        tmp_path / "config", recovery_overrides(service_name, **recovery), recovery_driver_text
    )
    now = datetime.now(UTC)
    windows = WindowMath(1)
    window = windows.shift(windows.window_at(now), -1)  # readable now, by the process too
    writer_instance = str(uuid.uuid4())
    txns = [uuid.uuid4() for _ in range(ROWS)]

    async def body() -> None:
        async with open_stack(clock=ManualClock(now), **recovery) as stack:
            scope = DirectoryScope.of(stack.runtime.settings.instance)
            await asyncio.to_thread(
                bulk_load_retry_bucket,
                stack.runtime,
                scope,
                date_of_year=window.date_of_year,
                minute_of_day=windows.minute_of_day(window),
                instance_id=writer_instance,
                instance_id_token=instance_token(writer_instance),
                transaction_ids=txns,
                payload=SagaPayload("slow", ("work",), {}, {}).encode(),
                created_at=now,
            )
            argv = [
                sys.executable,
                "-m",
                "stacksaga_store",
                "--config",
                str(config),
                "--log-level",
                "INFO",
                "retry-node",
                "--sagas",
                "tests.recovery._cli_sagas:sagas",
                "--node-id",
                "retry-cli",
                "--metrics-listen",
                "127.0.0.1:0",
            ]
            with children(tmp_path) as group:
                node = group.start("retry-node", argv)
                node.wait_for_output("metrics on ", 90)
                found = re.search(r"metrics on (\S+:\d+)", node.output())
                assert found is not None
                wait_for(lambda: len(read_lines(log)) >= 4 * CONCURRENCY, 120, "dispatches")
                scraped = await asyncio.to_thread(metrics_of, found.group(1))
                assert scraped["stacksaga_recovery_cycles_total"] >= 1
                returncode = node.terminate(timeout=60)
                assert returncode == 0, node.output()[-3000:]
                assert "stopped; 0 dispatches in flight" in node.output()
            lines = read_lines(log)
            started = Counter(line.split()[1] for line in lines if line.startswith("start "))
            ended = Counter(line.split()[1] for line in lines if line.startswith("end "))
            assert started == ended, "a dispatch in flight at SIGTERM was cut short"
            assert 0 < len(started) < ROWS, "SIGTERM came mid-bucket"

            dump = await dump_directory(stack.runtime, scope)
            assert dump.tier5_sizes() == {
                (window.date_of_year, windows.minute_of_day(window), writer_instance, 0): ROWS
            }, "the bucket was not 100% dispatched: it must survive whole"
            assert dump.count("es_buckets_by_instance") == 1

            # The range's next holder finishes the bucket; nothing that finished runs again.
            orchestrator = stack.engine.orchestrator(sagas=sagas())
            retry = stack.engine.retry_node(orchestrator, StaticLeaseSource(service_name))
            report = await retry.run_pass()
            assert report.failed == 0 and report.buckets_dropped == 1
            lines = read_lines(log)
            ended = Counter(line.split()[1] for line in lines if line.startswith("end "))
            assert set(ended) == {str(t) for t in txns}
            assert max(ended.values()) == 1, "a step that finished before SIGTERM ran again"
            assert await asyncio.to_thread(statuses, stack.runtime, scope, txns) == {
                "PROCESS_COMPLETED": ROWS
            }

    run(body())


def test_a_bad_sagas_argument_is_a_configuration_error() -> None:
    from stacksaga_store.__main__ import EXIT_CONFIG, main

    assert main(["retry-node", "--sagas", "no_such_module_here:sagas"]) == EXIT_CONFIG
    assert main(["retry-node", "--sagas", "tests.recovery._cli_sagas"]) == EXIT_CONFIG


def test_sigterm_while_the_node_is_still_connecting_exits_0(
    service_name: str,
    recovery_driver_text: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kubernetes can stop a pod that has not finished starting: the signal is caught from the
    first line the process prints, before it connects, and it still ends cleanly."""
    monkeypatch.setenv("STACKSAGA_TEST_STEP_LOG", str(tmp_path / "steps.log"))
    config = write_config(
        tmp_path / "config", recovery_overrides(service_name), recovery_driver_text
    )
    argv = [
        sys.executable,
        "-m",
        "stacksaga_store",
        "--config",
        str(config),
        "--log-level",
        "INFO",
        "retry-node",
        "--sagas",
        "tests.recovery._cli_sagas:sagas",
        "--node-id",
        "retry-early",
    ]
    with children(tmp_path) as group:
        node = group.start("retry-node", argv)
        node.wait_for_output("retry-node retry-early connecting", 90)
        returncode = node.terminate(timeout=60)
        assert returncode == 0, node.output()[-3000:]
        assert "retry-node retry-early stopped" in node.output()
