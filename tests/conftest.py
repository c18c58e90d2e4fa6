"""Real Cassandra for the tests: a single node and a 3-node cluster, started on demand.

Both are session-scoped and launched by accord_cassandra.launcher only when a test
asks for them. They live on different loopback addresses, so both can run at once and
neither test set waits for the other's restarts:

- ``cassandra_node``: one node on 127.0.1.1 (``ACCORD_CASSANDRA_NODE_IP`` moves it);
- ``cassandra_cluster``: three nodes on 127.0.0.1-3 (``ACCORD_CASSANDRA_CLUSTER_FIRST_IP``).

To reuse a Cassandra that is already running instead:

- ``ACCORD_CASSANDRA_CONTACT_POINTS=127.0.0.1[:port],...`` replaces ``cassandra_node``;
- ``ACCORD_CASSANDRA_CLUSTER_CONTACT_POINTS=...`` replaces ``cassandra_cluster`` (CQL only:
  tests that stop a node then fail, they are not skipped);
- ``ACCORD_CASSANDRA_CLUSTER_DIR=<base dir of launcher up --nodes 3>`` attaches to a cluster
  the launcher CLI started, with node control; it is left running afterwards.

A Cassandra that does not start is an error in every test that needs it, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from accord_cassandra.launcher import (
    CassandraHandle,
    ClusterSpec,
    ExternalCluster,
    LauncherError,
    LocalCluster,
    parse_contact_points,
)

# Hypothesis's too_slow health check and per-example deadline time the machine, not the
# code: with several suites sharing two cores, input generation took over a second and
# failed tests/unit that pass on a quiet machine. Property tests assert properties only.
settings.register_profile(
    "shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-machine")

NODE_CONTACT_POINTS_ENV = "ACCORD_CASSANDRA_CONTACT_POINTS"
CLUSTER_CONTACT_POINTS_ENV = "ACCORD_CASSANDRA_CLUSTER_CONTACT_POINTS"
CLUSTER_DIR_ENV = "ACCORD_CASSANDRA_CLUSTER_DIR"
NODE_IP_ENV = "ACCORD_CASSANDRA_NODE_IP"
CLUSTER_FIRST_IP_ENV = "ACCORD_CASSANDRA_CLUSTER_FIRST_IP"
# C1 only, no C2: in a test session's short life C2's compiler threads cost more CPU than
# their code saves. Measured on 2 cores: a node start took 7 s of JVM CPU instead of 12-15 s,
# and 13,800 CQL requests (inserts, reads, LWTs) 12-16 s instead of 35-41 s. Tests only:
# the benchmarks' long runs keep the stock tiered JIT.
TEST_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def jvm_options_for_tests(nodes: int) -> dict[int, list[str]]:
    return {index: list(TEST_JVM_OPTIONS) for index in range(1, nodes + 1)}


def _external(env: str) -> ExternalCluster | None:
    text = os.environ.get(env)
    if not text:
        return None
    ips, port = parse_contact_points(text)
    return ExternalCluster(ips, port)


def _launched(
    tmp_path_factory: pytest.TempPathFactory, name: str, spec: ClusterSpec
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(spec, tmp_path_factory.mktemp(name))
    cluster.disposable = True
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop(clean=True)


def _attached(base_dir: str) -> Iterator[LocalCluster]:
    cluster = LocalCluster.attach(Path(base_dir).expanduser())
    if cluster.running() != list(cluster.spec.indexes):
        raise LauncherError(f"{CLUSTER_DIR_ENV}={base_dir}: not every node is running")
    try:
        yield cluster
    finally:
        cluster.close_sessions()
        cluster.detach()


@pytest.fixture(scope="session")
def cassandra_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraHandle]:
    """One Cassandra 5.0 node (contact_points, native_port, connect(), node control)."""
    external = _external(NODE_CONTACT_POINTS_ENV)
    if external is not None:
        yield external
        external.close_sessions()
        return
    spec = ClusterSpec(
        nodes=1,
        first_ip=os.environ.get(NODE_IP_ENV, "127.0.1.1"),
        cluster_name="accord_node",
        extra_jvm_options=jvm_options_for_tests(1),
    )
    yield from _launched(tmp_path_factory, "cassandra-node", spec)


@pytest.fixture(scope="session")
def cassandra_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraHandle]:
    """Three Cassandra 5.0 nodes; stop_node(i)/start_node(i) for i in 1..3."""
    external = _external(CLUSTER_CONTACT_POINTS_ENV)
    if external is not None:
        yield external
        external.close_sessions()
        return
    if os.environ.get(CLUSTER_DIR_ENV):
        yield from _attached(os.environ[CLUSTER_DIR_ENV])
        return
    spec = ClusterSpec(
        nodes=3,
        first_ip=os.environ.get(CLUSTER_FIRST_IP_ENV, "127.0.0.1"),
        cluster_name="accord_cluster",
        extra_jvm_options=jvm_options_for_tests(3),
    )
    yield from _launched(tmp_path_factory, "cassandra-cluster", spec)
