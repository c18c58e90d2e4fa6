"""Sidecar clusters for the tests: real processes on loopback, stopped even when a test fails.

* ``embedded``: three sidecars on the in-memory store with a client token (module-scoped;
  starting processes costs seconds on a 2-core machine).
* ``cassandra_sidecars``: three sidecars with ``store: cassandra`` beside the shared 3-node
  Cassandra of tests/conftest.py, serving a keyspace created for this run (RF 3) and dropped
  afterwards. One set for the whole session: creating the keyspace's 16 tables (each waiting
  for schema agreement) and starting three sidecars took 19-22 s in each of the four modules
  that used them. Tests therefore keep to their own rows, receipt ids and log lines (see
  ``sidecar_log``), and each test gets the set with every sidecar serving (``all_serving``
  restarts any a test killed and did not restart). The set stops after the last test that
  uses it, not at the session's end.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from accord_cassandra.cluster import LocalSidecars, wait_serving
from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.store.schema import TABLES as SAGA_TABLES
from stacksaga_store.store.schema import create_table_cql
from tests.sidecar.saga_tables import memory_tables

SidecarsT = TypeVar("SidecarsT", bound=LocalSidecars)
TOKEN = "test-token-0123456789"
# The bank transfer as Accord CQL with bind markers (src id, dst id, amount, amount,
# src id, amount, dst id): what the CQL endpoint suites prepare through real drivers.
TRANSFER = """
    BEGIN TRANSACTION
      LET src = (SELECT balance FROM {ks}.accounts WHERE id = ?);
      LET dst = (SELECT balance FROM {ks}.accounts WHERE id = ?);
      SELECT src.balance, dst.balance;
      IF src.balance >= ? THEN
        UPDATE {ks}.accounts SET balance = src.balance - ? WHERE id = ?;
        UPDATE {ks}.accounts SET balance = dst.balance + ? WHERE id = ?;
      END IF
    COMMIT TRANSACTION"""
ACCOUNT_COLUMNS = [["balance", "bigint"], ["tag", "bigint"]]
EMBEDDED_TABLES = {
    "bank.accounts": {"partition_key": [["id", "text"]], "columns": ACCOUNT_COLUMNS},
    "bank.receipts": {
        "partition_key": [["id", "bigint"]],
        "columns": [["src_tag", "bigint"], ["dst_tag", "bigint"]],
    },
    "shop.items": {
        "partition_key": [["region", "text"], ["sku", "int"]],
        "columns": [["qty", "int"], ["name", "text"], ["photo", "blob"], ["active", "boolean"]],
    },
    # Per-account ledger rows clustered by time, the balance a static column.
    "bank.ledger": {
        "partition_key": [["account", "text"]],
        "clustering": [["at", "bigint", "desc"], ["transfer", "text", "asc"]],
        "columns": [["amount", "bigint"], ["memo", "text"]],
        "static": [["balance", "bigint"]],
    },
}
EMBEDDED_TABLES.update(memory_tables("saga"))
# Production timing. A shorter recover_delay_ms (0.5 s) looks tempting for crash tests, but
# on this 2-core machine commit latency under load with the Cassandra store is near a second,
# so the progress log then recovers live transactions wholesale (hundreds of recoveries, and
# throughput collapses) -- measured, see the report in the commit that introduced this.
TIMING: dict[str, int] = {}


def _stop(cluster: LocalSidecars) -> None:
    # SIGTERM to all at once (each drains for drain_seconds), then SIGKILL what is left:
    # every process goes, whatever happened.
    running = [s.process for s in cluster.sidecars.values() if s.process and s.alive()]
    for process in running:
        with contextlib.suppress(Exception):
            process.send_signal(signal.SIGTERM)
    for process in running:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSidecars]:
    cluster = LocalSidecars(
        tmp_path_factory.mktemp("embedded"),
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"timing": TIMING, "drain_seconds": 2},
    )
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        _stop(cluster)


@dataclass
class CassandraSidecars:
    cluster: LocalSidecars
    cassandra: CassandraHandle
    keyspace: str
    session: Any  # a cassandra-driver Session on the same Cassandra, for direct reads

    def addresses(self) -> list[str]:
        return self.cluster.addresses()

    def all_serving(self, timeout: float = 60.0) -> None:
        """Restart any sidecar a test left dead and wait until all serve."""
        for node_id, sidecar in self.cluster.sidecars.items():
            if not sidecar.alive():
                self.cluster.restart(node_id, timeout=timeout)
        deadline = time.monotonic() + timeout
        for sidecar in self.cluster.sidecars.values():
            assert wait_serving(sidecar.address, deadline), sidecar.log_tail()


def bank_schema(keyspace: str) -> list[str]:
    return [
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 3}",
        f"CREATE TABLE {keyspace}.accounts (id text PRIMARY KEY, balance bigint, tag bigint)",
        f"CREATE TABLE {keyspace}.receipts (id bigint PRIMARY KEY, src_tag bigint, dst_tag bigint)",
        f"CREATE TABLE {keyspace}.items ("
        "region text, sku int, qty int, small tinyint, name text, code ascii, seen timeuuid, "
        "PRIMARY KEY ((region, sku)))",
        # Tables Accord cannot serve must not stop the sidecar from serving the others.
        f"CREATE TABLE {keyspace}.profiles (id text PRIMARY KEY, labels map<text, int>)",
        f"CREATE TABLE {keyspace}.events (id text, at int, what text, PRIMARY KEY (id, at))",
        f"CREATE TABLE {keyspace}.ledger (account text, at bigint, transfer text, amount bigint, "
        "memo text, balance bigint static, PRIMARY KEY (account, at, transfer)) "
        "WITH CLUSTERING ORDER BY (at DESC, transfer ASC)",
        f"CREATE TABLE {keyspace}.hits (id text PRIMARY KEY, n counter)",
        # The saga store's own nine tables, served beside the bank's.
        *(create_table_cql(keyspace, table) for table in SAGA_TABLES),
    ]


@dataclass
class CqlSidecars(LocalSidecars):
    """Sidecars that also serve the CQL native-protocol endpoint, on a port of their own."""

    def __post_init__(self) -> None:
        self.extra = {**self.extra, "cql_listen": f"{self.host}:0"}


@contextlib.contextmanager
def bank_sidecars_on_cassandra(
    cassandra_cluster: CassandraHandle,
    directory: Path,
    prefix: str,
    cls: type[SidecarsT],
) -> Iterator[tuple[SidecarsT, CassandraSidecars]]:
    """Three sidecars of class ``cls`` on a fresh bank keyspace, dropped afterwards."""
    keyspace = f"{prefix}_{uuid.uuid4().hex[:10]}"
    session = cassandra_cluster.connect()
    for statement in bank_schema(keyspace):
        result = session.execute(statement, timeout=60)
        # The driver waits 10 s for the nodes to agree on the schema; loaded, they can take
        # longer, and the next statement then reaches a node without this one's keyspace.
        if not result.response_future.is_schema_agreed:
            control = session.cluster.control_connection
            assert control.wait_for_schema_agreement(wait_time=120), f"no agreement: {statement}"
    cluster = cls(
        directory,
        store="cassandra",
        cassandra={
            "contact_points": list(cassandra_cluster.contact_points),
            "port": cassandra_cluster.native_port,
            "keyspaces": [keyspace],
            "consistency": "QUORUM",
        },
        extra={"timing": TIMING, "drain_seconds": 2},
    )
    try:
        cluster.start(timeout=90)
        yield cluster, CassandraSidecars(cluster, cassandra_cluster, keyspace, session)
    finally:
        _stop(cluster)
        # A cluster the fixtures launched is deleted with its data anyway.
        if not getattr(cassandra_cluster, "disposable", False):
            with contextlib.suppress(Exception):
                session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


@dataclass
class SharedSidecars:
    """The session's set and what stops it (early, after its last test; see below)."""

    sidecars: CassandraSidecars
    stack: contextlib.ExitStack
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        self.stack.close()


@pytest.fixture(scope="session")
def shared_cassandra_sidecars(
    cassandra_cluster: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedSidecars]:
    directory = tmp_path_factory.mktemp("cassandra-sidecars")
    with contextlib.ExitStack() as stack:
        _, sidecars = stack.enter_context(
            bank_sidecars_on_cassandra(cassandra_cluster, directory, "sidecar", LocalSidecars)
        )
        yield SharedSidecars(sidecars, stack)


@pytest.fixture
def cassandra_sidecars(
    request: pytest.FixtureRequest, shared_cassandra_sidecars: SharedSidecars
) -> Iterator[CassandraSidecars]:
    """The session's Cassandra-backed sidecars, all three serving when the test starts;
    stopped after the session's last test that uses them."""
    shared = shared_cassandra_sidecars
    assert not shared.closed, "the shared sidecars were stopped after their last test"
    shared.sidecars.all_serving()
    yield shared.sidecars
    items = request.session.items
    later = items[items.index(request.node) + 1 :]
    if not any("cassandra_sidecars" in getattr(item, "fixturenames", ()) for item in later):
        # Idle, the three cost about 2% of a core (measured: 0.0067 CPU s/s each), which
        # the rest of the session would pay; the session's own close then does nothing.
        shared.close()


def log_tails(cluster: LocalSidecars, lines: int = 40) -> str:
    return "\n".join(
        f"--- sidecar {s.node_id} ({s.log_path})\n{s.log_tail(lines)}"
        for s in cluster.sidecars.values()
    )


def log_size(cluster: LocalSidecars, node_id: int) -> int:
    """Bytes in a sidecar's log so far: an offset for ``sidecar_log(..., since=)``."""
    return Path(cluster.sidecars[node_id].log_path).stat().st_size


def sidecar_log(cluster: LocalSidecars, node_id: int, since: int = 0) -> str:
    """A sidecar's log from byte ``since`` on. Every start of that sidecar appends to one
    file, so a test on the shared set reads only what its own restarts wrote."""
    with Path(cluster.sidecars[node_id].log_path).open("rb") as log:
        log.seek(since)
        return log.read().decode(errors="replace")
