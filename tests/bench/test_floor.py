"""The floor suite's parts that need no cluster: the open loop's schedule accounting and
the null sidecar's refusal of every request but the conditional set it models, and the
run-queue wait the suite reports beside CPU."""

from __future__ import annotations

import asyncio

import pytest

from bench.null_sidecar import NotConditionalSet, parse
from bench.workload import LoadError, conditional_set, open_loop_calls, transfer


def test_open_loop_starts_rate_times_seconds_operations_whatever_they_take() -> None:
    started: list[int] = []

    async def slow(index: int) -> bool:
        started.append(index)
        # Slower than the interval: a closed loop of 1 would start far fewer.
        await asyncio.sleep(0.05)
        if index % 5 == 0:
            raise LoadError("planted")
        return index % 2 == 0

    result = asyncio.run(open_loop_calls(slow, rate=200, seconds=0.25))
    assert result.issued == 50 and result.skipped == 0
    assert sorted(started) == list(range(50))
    assert result.errors == {"planted": 10}
    assert result.applied + result.declined == 40
    assert len(result.start_lag_ms) == 50


def test_open_loop_refuses_a_rate_of_zero() -> None:
    async def never(index: int) -> bool:
        return True

    with pytest.raises(ValueError, match="positive rate"):
        asyncio.run(open_loop_calls(never, rate=0, seconds=1))


def test_null_sidecar_reads_the_conditional_set() -> None:
    request = conditional_set("acct1", 1500, 10, "ks_null").request.SerializeToString()
    assert parse(request, frozenset({"ks_null"})) == ("row", "ks_null", "acct1", 10, 1500)


def test_null_sidecar_refuses_anything_else() -> None:
    moved = transfer("a", "b", 1, "ks_null").request.SerializeToString()
    with pytest.raises(NotConditionalSet, match="1 LET"):
        parse(moved, frozenset({"ks_null"}))
    elsewhere = conditional_set("acct1", 1, 0, "other").request.SerializeToString()
    with pytest.raises(NotConditionalSet, match="serves"):
        parse(elsewhere, frozenset({"ks_null"}))


def test_run_queue_wait_counts_live_threads_only() -> None:
    import os
    import subprocess

    from bench.workload import run_queue_seconds

    child = subprocess.Popen(["true"])
    child.wait()
    assert run_queue_seconds([child.pid]) == 0.0  # gone: nothing to read
    first = run_queue_seconds([os.getpid()])
    assert first >= 0.0
    assert run_queue_seconds([os.getpid(), child.pid]) >= first


def test_floor_summary_takes_the_median_run_queue_wait() -> None:
    from bench.floor import summarise

    def row(servers: float, cassandra: float) -> dict[str, object]:
        return {
            "system": "s",
            "phase": "rate",
            "level": 50.0,
            "ops_per_second": 50.0,
            "latency_ms": {"p50": 1.0, "p99": 2.0},
            "errors": {},
            "cores_used": 1.0,
            "load_average": 1.0,
            "cpu_ms_per_op": dict.fromkeys(
                ("servers", "servers_above_idle", "cassandra_above_idle", "client"), 1.0
            ),
            "run_queue_ms_per_op": {"servers": servers, "cassandra": cassandra, "client": 0.0},
        }

    summary = summarise([row(10.0, 1.0), row(30.0, 3.0), row(20.0, 2.0)])[("s", "rate", 50.0)]
    assert (summary["queue_servers"], summary["queue_cassandra"]) == (20.0, 2.0)
