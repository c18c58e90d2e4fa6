"""Which step failures retry (issue 16, seed: connection / timeout / database transients) and
which compensate, with the cassandra-driver's own exception classes; a classifier on the step
or the saga overrides the default."""

from __future__ import annotations

import asyncio
import errno
import socket
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import Cluster, NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.policies import FallthroughRetryPolicy, WriteType
from cassandra.query import SimpleStatement

from stacksaga_store.errors import NonRetryableStepError, RetryableStepError
from stacksaga_store.saga.classify import default_retryable, is_retryable
from stacksaga_store.saga.definition import Saga, Step, StepContext
from stacksaga_store.saga.handoff import RecordingRecoveryHandoff
from stacksaga_store.saga.runtime import StoreRuntime
from stacksaga_store.store.states import RunningStatus
from tests.stacksaga.conftest import run

Opener = Callable[..., Coroutine[Any, Any, StoreRuntime]]

TRANSIENTS: list[Exception] = [
    NoHostAvailable("Unable to connect to any servers", {"127.0.0.1:9042": OSError("refused")}),
    OperationTimedOut(errors={"127.0.0.1:9042": "timed out"}, last_host="127.0.0.1:9042"),
    WriteTimeout(
        "Coordinator node timed out",
        consistency=ConsistencyLevel.QUORUM,
        required_responses=2,
        received_responses=1,
        write_type=WriteType.SIMPLE,
    ),
    ReadTimeout("Coordinator node timed out", consistency=ConsistencyLevel.QUORUM),
    Unavailable("Cannot achieve consistency", ConsistencyLevel.QUORUM, 2, 1),
    ConnectionShutdown("Connection to 127.0.0.1:9042 was closed"),
    ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
    ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    OSError(errno.EHOSTUNREACH, "No route to host"),
    socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
    asyncio.TimeoutError(),  # noqa: UP041 - the class a step sees from asyncio.wait_for
    socket.timeout("timed out"),  # noqa: UP041 - what a socket read raises
    RetryableStepError("HTTP 503"),
]
BUSINESS: list[Exception] = [
    NonRetryableStepError("card declined"),
    ValueError("amount must be positive"),
    KeyError("sku"),
    FileNotFoundError(errno.ENOENT, "No such file"),
    RuntimeError("invariant of the payment service"),
]


@pytest.mark.parametrize("error", TRANSIENTS, ids=lambda e: type(e).__name__)
def test_transients_retry(error: Exception) -> None:
    assert default_retryable(error) is True


@pytest.mark.parametrize("error", BUSINESS, ids=lambda e: type(e).__name__)
def test_business_errors_compensate(error: Exception) -> None:
    assert default_retryable(error) is False


def test_the_step_classifier_wins_then_the_saga_one_then_the_default() -> None:
    timeout = WriteTimeout(
        "timed out", consistency=ConsistencyLevel.ONE, write_type=WriteType.SIMPLE
    )
    never: Callable[[Exception], bool | None] = lambda error: False  # noqa: E731
    values_retry: Callable[[Exception], bool | None] = lambda error: (  # noqa: E731
        True if isinstance(error, ValueError) else None
    )
    assert is_retryable(timeout, never, values_retry) is False
    assert is_retryable(ValueError("x"), None, values_retry) is True
    assert is_retryable(timeout, None, values_retry) is True  # deferred to the default
    assert is_retryable(KeyError("x"), None, values_retry) is False

    def broken(error: Exception) -> bool | None:
        raise ZeroDivisionError

    assert is_retryable(timeout, broken) is True  # a broken classifier is skipped


def _saga(name: str, errors: list[Exception], **saga_options: Any) -> tuple[Saga, list[int]]:
    calls: list[int] = []

    async def execute(ctx: StepContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]

    async def undo(ctx: StepContext) -> None:
        return None

    step_classify = saga_options.pop("step_classify", None)
    return Saga(name, (Step("call", execute, undo, classify=step_classify),), **saga_options), calls


@pytest.mark.cassandra
def test_the_orchestrator_retries_driver_transients_and_compensates_business_errors(
    open_store: Opener,
) -> None:
    recovery = RecordingRecoveryHandoff()
    driver, _ = _saga("driver", [NoHostAvailable("all hosts down", {})])
    business, _ = _saga("business", [ValueError("amount must be positive")])
    by_saga, _ = _saga(
        "by-saga",
        [ValueError("rate limited, try later")],
        classify=lambda error: isinstance(error, ValueError) or None,
    )
    by_step, _ = _saga(
        "by-step",
        [WriteTimeout("timed out", consistency=ConsistencyLevel.QUORUM, write_type=WriteType.CAS)],
        classify=lambda error: True,
        step_classify=lambda error: False,
    )

    async def body() -> None:
        runtime = await open_store()
        try:
            orchestrator = runtime.orchestrator(
                sagas=[driver, business, by_saga, by_step], recovery=recovery
            )
            statuses = {}
            for saga in (driver, business, by_saga, by_step):
                statuses[saga.name] = (await orchestrator.start(saga, {})).status
            assert statuses == {
                "driver": RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
                "business": RunningStatus.REVERT_COMPLETED,
                "by-saga": RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
                "by-step": RunningStatus.REVERT_COMPLETED,
            }
            assert len(recovery.retries()) == 2
        finally:
            await runtime.close()

    run(body())


@pytest.mark.cassandra
def test_errors_the_driver_raises_for_real_retry_unless_a_classifier_says_otherwise(
    open_store: Opener,
) -> None:
    """Not constructed instances: a step meets a contact point that refuses connections (the
    driver raises NoHostAvailable) and a QUORUM read of a replication-factor-3 keyspace on the
    one-node test cluster (the server answers Unavailable). Both retry by default; a saga
    classifier that calls Unavailable permanent makes the same error compensate."""
    recovery = RecordingRecoveryHandoff()
    raised: list[Exception] = []
    # Bound and never listening: a connection to it is refused, on loopback, at once.
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    keyspace = f"rf3_{uuid.uuid4().hex[:8]}"

    def dead_contact_point() -> None:
        cluster = Cluster(["127.0.0.1"], port=port, connect_timeout=2)
        try:
            cluster.connect()
        finally:
            cluster.shutdown()

    def step_calling(call: Callable[[], object]) -> Step:
        async def execute(ctx: StepContext) -> None:
            try:
                await asyncio.to_thread(call)
            except Exception as error:
                raised.append(error)
                raise

        return Step("call", execute)

    async def body() -> None:
        runtime = await open_store()
        session = runtime.cql.session
        # Without a retry policy: the default one retries Unavailable on the next host, and
        # with none left the step would see NoHostAvailable instead.
        quorum_read = SimpleStatement(
            f"SELECT k FROM {keyspace}.t WHERE k = 1",
            consistency_level=ConsistencyLevel.QUORUM,
            retry_policy=FallthroughRetryPolicy(),
        )
        try:
            await asyncio.to_thread(
                session.execute,
                f"CREATE KEYSPACE {keyspace} WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            )
            await asyncio.to_thread(
                session.execute, f"CREATE TABLE {keyspace}.t (k int PRIMARY KEY)"
            )
            unreachable = Saga("unreachable", (step_calling(dead_contact_point),))
            unavailable = Saga("unavailable", (step_calling(lambda: session.execute(quorum_read)),))
            overridden = Saga(
                "overridden",
                (step_calling(lambda: session.execute(quorum_read)),),
                classify=lambda error: False if isinstance(error, Unavailable) else None,
            )
            orchestrator = runtime.orchestrator(
                sagas=[unreachable, unavailable, overridden], recovery=recovery
            )
            statuses = {
                saga.name: (await orchestrator.start(saga, {})).status
                for saga in (unreachable, unavailable, overridden)
            }
            assert statuses == {
                "unreachable": RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
                "unavailable": RunningStatus.FAILED_WITH_RETRYABLE_ERROR,
                "overridden": RunningStatus.REVERT_COMPLETED,
            }
            assert [type(error) for error in raised] == [NoHostAvailable, Unavailable, Unavailable]
            assert [r.step_name for r in recovery.retries()] == ["call", "call"]
        finally:
            refused.close()
            await asyncio.to_thread(session.execute, f"DROP KEYSPACE IF EXISTS {keyspace}")
            await runtime.close()

    run(body())
