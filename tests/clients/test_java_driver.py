"""The DataStax Java driver (java-driver-core 4.x, fetched and compiled by the test setup:
tests/clients/java_driver.py) against a real Cassandra 5.0 node: the probe program connects
with a single contact point, the local DC, protocol V4, and reports JSON lines.

The sidecar's CQL endpoint (issue 19, branch wip/cqlnative) does not exist on this branch
yet; these tests prove the probe on plain Cassandra, including that Cassandra 5.0 itself
refuses the prepared ``BEGIN TRANSACTION`` the endpoint is to accept."""

from __future__ import annotations

import pytest

from accord_cassandra.launcher import CassandraHandle
from tests.clients.java_driver import run_probe

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


def _target(node: CassandraHandle) -> tuple[list[str], tuple[str, str]]:
    session = node.connect()
    local = session.execute("SELECT data_center, cluster_name, release_version FROM system.local")
    row = local.one()
    host = node.contact_points[0]
    return [host, str(node.native_port), row.data_center], (row.cluster_name, row.release_version)


def test_java_driver_plain_query(cassandra_node: CassandraHandle) -> None:
    args, expected = _target(cassandra_node)
    status, lines, stderr = run_probe([*args, "system", "plain"])
    assert status == 0, (lines, stderr)
    assert lines[0] == {"what": "connected", "protocol": "V4"}, lines
    assert lines[1]["what"] == "plain", lines
    assert lines[1]["columns"] == ["cluster_name", "release_version"]
    assert lines[1]["rows"] == [list(expected)], (lines, expected)


def test_plain_cassandra_refuses_the_prepared_transaction(
    cassandra_node: CassandraHandle,
) -> None:
    # What a 5.0 user meets today: the driver's PREPARE of the transfer is a syntax error.
    args, _ = _target(cassandra_node)
    status, lines, stderr = run_probe([*args, "bank", "transfer", "alice", "bob", "10"])
    assert status == 1, (lines, stderr)
    error = lines[-1]
    assert error["what"] == "error", lines
    assert str(error["class"]).endswith("servererrors.SyntaxError"), error
    assert "TRANSACTION" in str(error["message"]), error
