"""Fixtures: one keyspace and one running console (uvicorn on port 0) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accord_cassandra.launcher import CassandraHandle
from tests.console._server import RunningConsole, make_keyspace, running_console


@pytest.fixture(scope="session")
def console_keyspace(cassandra_node: CassandraHandle) -> str:
    return make_keyspace(cassandra_node)


@pytest.fixture(scope="module")
def console(cassandra_node: CassandraHandle, console_keyspace: str) -> Iterator[RunningConsole]:
    with running_console(cassandra_node, console_keyspace) as running:
        yield running
