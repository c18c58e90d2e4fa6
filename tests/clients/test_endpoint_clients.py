"""The Java driver and cqlsh against the sidecars' CQL endpoint (cql_listen) on three real
Cassandra 5.0 nodes: a prepared BEGIN TRANSACTION transfer and a plain query from the Java
driver, checked in Cassandra; a plain query from cqlsh."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from accord_cassandra.client import Client, TransactionError
from accord_cassandra.datastore import tables_from_cluster
from accord_cassandra.launcher import CassandraHandle
from accord_cassandra.schema import Catalog
from tests.clients.java_driver import run_probe
from tests.clients.test_cqlsh import TRANSFER, cqlsh
from tests.sidecar.conftest import CassandraSidecars, CqlSidecars, bank_sidecars_on_cassandra

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


@pytest.fixture(scope="module")
def sidecars(
    cassandra_cluster: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CqlSidecars, CassandraSidecars]]:
    directory = tmp_path_factory.mktemp("cql-clients")
    with bank_sidecars_on_cassandra(cassandra_cluster, directory, "cqlcli", CqlSidecars) as pair:
        yield pair


def _schema(sidecars: CassandraSidecars) -> Catalog:
    unusable: dict[str, str] = {}
    metadata = sidecars.session.cluster.metadata
    return Catalog(tables_from_cluster(metadata, [sidecars.keyspace], unusable), unusable)


def _through_accord(address: str, text: str, params: list[object], schema: Catalog) -> list:
    deadline = time.monotonic() + 180
    with Client(address, timeout=60) as client:
        while True:
            try:
                return list(client.execute_cql(text, params, schema=schema).rows)
            except TransactionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)


def test_java_driver_through_the_endpoint(
    sidecars: tuple[CqlSidecars, CassandraSidecars],
) -> None:
    cluster, bank = sidecars
    ks, schema = bank.keyspace, _schema(bank)
    src, dst = f"j-{uuid.uuid4().hex[:8]}", f"j-{uuid.uuid4().hex[:8]}"
    address = cluster.addresses()[0]
    for account, balance in ((src, 100), (dst, 5)):
        _through_accord(
            address,
            f"BEGIN TRANSACTION INSERT INTO {ks}.accounts (id, balance, tag) VALUES (?, ?, 0); "
            "COMMIT TRANSACTION",
            [account, balance],
            schema,
        )
    local = bank.session.execute("SELECT data_center, cluster_name FROM system.local").one()
    endpoint = cluster.sidecars[1].cql_address
    host, _, port = endpoint.rpartition(":")
    status, lines, stderr = run_probe([host, port, local.data_center, ks, "both", src, dst, "30"])
    assert status == 0, (lines, stderr)
    by_what = {str(line["what"]): line for line in lines}
    transfer = by_what["transfer"]
    assert transfer["rows"], transfer
    row = dict(zip(transfer["columns"], transfer["rows"][0], strict=True))  # type: ignore[arg-type]
    assert row["[applied]"] is True, transfer
    assert sorted(v for k, v in row.items() if k != "[applied]") == [5, 100], transfer
    assert by_what["plain"]["rows"][0][0] == local.cluster_name, by_what["plain"]
    # Through Accord at once; in Cassandra once the replicas applied it.
    totals = (
        f"BEGIN TRANSACTION LET a = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        f"LET b = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        "SELECT a.balance, b.balance; COMMIT TRANSACTION"
    )
    assert _through_accord(cluster.addresses()[2], totals, [src, dst], schema) == [(70, 35)]
    read = SimpleStatement(
        f"SELECT id, balance FROM {ks}.accounts WHERE id IN (%s, %s)",
        consistency_level=ConsistencyLevel.QUORUM,
    )
    deadline = time.monotonic() + 60
    while True:
        direct = {r.id: r.balance for r in bank.session.execute(read, (src, dst))}
        if direct == {src: 70, dst: 35} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert direct == {src: 70, dst: 35}


def test_cqlsh_plain_query_through_the_endpoint(
    sidecars: tuple[CqlSidecars, CassandraSidecars], tmp_path: Path
) -> None:
    cluster, bank = sidecars
    table = f"{bank.keyspace}.events"
    bank.session.execute(f"INSERT INTO {table} (id, at, what) VALUES ('cqlsh', 1, 'seen')")
    script = tmp_path / "plain.cql"
    script.write_text(f"SELECT what FROM {table} WHERE id = 'cqlsh';\n")
    host, _, port = cluster.sidecars[2].cql_address.rpartition(":")
    result = subprocess.run(
        [cqlsh(), host, port, "-f", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "seen" in result.stdout and "(1 rows)" in result.stdout, result.stdout


def test_accord_cassandra_cqlsh_runs_the_transfer_script(
    sidecars: tuple[CqlSidecars, CassandraSidecars], tmp_path: Path
) -> None:
    # The bank transfer, as a script file, through the wrapper (plain cqlsh 6.2.2
    # reports it incomplete: test_cqlsh.py).
    cluster, bank = sidecars
    ks, schema = bank.keyspace, _schema(bank)
    src, dst = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    for account, balance in ((src, 100), (dst, 5)):
        _through_accord(
            cluster.addresses()[0],
            f"BEGIN TRANSACTION INSERT INTO {ks}.accounts (id, balance, tag) VALUES (?, ?, 0); "
            "COMMIT TRANSACTION",
            [account, balance],
            schema,
        )
    script = tmp_path / "transfer.cql"
    script.write_text(
        TRANSFER.replace("bank.", f"{ks}.")
        .replace("'alice'", f"'{src}'")
        .replace("'bob'", f"'{dst}'")
    )
    host, _, port = cluster.sidecars[1].cql_address.rpartition(":")
    wrapper = shutil.which("accord-cassandra", path=str(Path(sys.executable).parent))
    assert wrapper, "accord-cassandra is not installed in this venv"
    result = subprocess.run(
        [wrapper, "cqlsh", host, port, "-f", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Incomplete statement" not in result.stderr, result.stderr
    lines = [line.split("|") for line in result.stdout.splitlines() if "|" in line]
    assert [c.strip() for c in lines[0]] == ["[applied]", "src.balance", "dst.balance"]
    assert [c.strip() for c in lines[1]] == ["True", "100", "5"], result.stdout
    totals = (
        f"BEGIN TRANSACTION LET a = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        f"LET b = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        "SELECT a.balance, b.balance; COMMIT TRANSACTION"
    )
    assert _through_accord(cluster.addresses()[2], totals, [src, dst], schema) == [(90, 15)]
