"""The CQL endpoint in front of a real Cassandra 5.0 node that runs PasswordAuthenticator:
the driver's login passes through to Cassandra, and Cassandra's verdict decides whether the
connection may run transactions. The Accord side is a stand-in runner, so this checks the
endpoint's gate, not Accord (tests/sidecar/test_cql_native.py runs real transactions)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import threading
from collections.abc import Iterator

import pytest
from cassandra import InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import WhiteListRoundRobinPolicy

from accord_cassandra.launcher import ClusterSpec, LocalCluster
from accord_cassandra.native.endpoint import CqlEndpoint, Failure
from accord_cassandra.schema import Catalog
from accord_cassandra.v1 import client_pb2
from tests.conftest import NODE_IP_ENV, jvm_options_for_tests

CATALOG = Catalog.from_mapping(
    {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}}
)
TXN = (
    "BEGIN TRANSACTION\n"
    "  LET a = (SELECT balance FROM bank.accounts WHERE id = 'alice');\n"
    "  SELECT a.balance;\n"
    "COMMIT TRANSACTION"
)
REACHED = "stand-in runner: the transaction reached Accord"


def _auth_node_ip() -> str:
    # Beside the session's single node (same /24, +10), so parallel suites keep apart.
    return str(ipaddress.IPv4Address(os.environ.get(NODE_IP_ENV, "127.0.1.1")) + 10)


@pytest.fixture(scope="module")
def password_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        nodes=1,
        first_ip=_auth_node_ip(),
        cluster_name="accord_auth",
        password_auth=True,
        extra_jvm_options=jvm_options_for_tests(1),
    )
    cluster = LocalCluster(spec, tmp_path_factory.mktemp("cassandra-auth"))
    cluster.disposable = True
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop(clean=True)


class _Endpoint:
    """The endpoint on its own event loop thread, as the sidecar runs it."""

    def __init__(self, upstream: str) -> None:
        self.calls: list[client_pb2.TransactRequest] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.endpoint = CqlEndpoint("127.0.0.1:0", upstream)
        self.address = self._call(self._start())

    async def _runner(self, request: client_pb2.TransactRequest) -> client_pb2.TransactResponse:
        self.calls.append(request)
        raise Failure("invalid", REACHED)

    async def _start(self) -> str:
        address = await self.endpoint.bind()
        await self.endpoint.start(CATALOG, self._runner)
        return address

    def _call(self, coro: object) -> str:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.endpoint.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def endpoint(password_node: LocalCluster) -> Iterator[_Endpoint]:
    running = _Endpoint(f"{password_node.contact_points[0]}:{password_node.native_port}")
    try:
        yield running
    finally:
        running.stop()


def _driver(address: str, credentials: tuple[str, str] | None) -> Cluster:
    host, _, port = address.rpartition(":")
    return Cluster(
        [host],
        port=int(port),
        protocol_version=4,
        execution_profiles={
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                load_balancing_policy=WhiteListRoundRobinPolicy([host])
            )
        },
        auth_provider=PlainTextAuthProvider(*credentials) if credentials else None,
        connect_timeout=20,
        control_connection_timeout=20,
    )


def test_the_launcher_logs_in_to_a_password_node(password_node: LocalCluster) -> None:
    session = password_node.connect()
    row = session.execute("SELECT role, is_superuser FROM system_auth.roles").one()
    assert row is not None and row.role == "cassandra" and row.is_superuser


def test_cassandra_refuses_a_wrong_password_through_the_endpoint(endpoint: _Endpoint) -> None:
    driver = _driver(endpoint.address, ("cassandra", "not-the-password"))
    try:
        with pytest.raises(NoHostAvailable) as refused:
            driver.connect()
    finally:
        driver.shutdown()
    # Cassandra's own words, relayed: the endpoint did not decide this itself.
    assert re.search(r"Provided username \S* ?and/or password are incorrect", str(refused.value))
    assert endpoint.calls == []


def test_no_credentials_get_cassandras_challenge(endpoint: _Endpoint) -> None:
    driver = _driver(endpoint.address, None)
    try:
        with pytest.raises(NoHostAvailable) as refused:
            driver.connect()
    finally:
        driver.shutdown()
    # The driver says so when the server answered STARTUP with AUTHENTICATE.
    assert "Remote end requires authentication" in str(refused.value)
    assert endpoint.calls == []


def test_a_logged_in_connection_queries_cassandra_and_reaches_accord(endpoint: _Endpoint) -> None:
    driver = _driver(endpoint.address, ("cassandra", "cassandra"))
    try:
        session = driver.connect()
        row = session.execute("SELECT release_version FROM system.local").one()
        assert row is not None and str(row.release_version).startswith("5.0")
        with pytest.raises(InvalidRequest, match=REACHED):
            session.execute(TXN)
    finally:
        driver.shutdown()
    assert len(endpoint.calls) == 1
