"""cqlsh (the ``cqlsh`` package, pinned in the dev extra) against a real Cassandra 5.0 node,
and what its own statement splitter does with Accord's ``BEGIN TRANSACTION`` text."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from accord_cassandra.launcher import CassandraHandle

TRANSFER = """\
BEGIN TRANSACTION
  LET src = (SELECT balance FROM bank.accounts WHERE id = 'alice');
  LET dst = (SELECT balance FROM bank.accounts WHERE id = 'bob');
  SELECT src.balance, dst.balance;
  IF src.balance >= 10 THEN
    UPDATE bank.accounts SET balance = src.balance - 10 WHERE id = 'alice';
    UPDATE bank.accounts SET balance = dst.balance + 10 WHERE id = 'bob';
  END IF
COMMIT TRANSACTION;
"""


def cqlsh() -> str:
    found = shutil.which("cqlsh", path=str(Path(sys.executable).parent))
    assert found, "cqlsh is not installed in this venv: make venv installs the dev extra"
    return found


def run_script(node: CassandraHandle, script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cqlsh(), node.contact_points[0], str(node.native_port), "-f", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.cassandra
def test_cqlsh_runs_a_plain_script(cassandra_node: CassandraHandle, tmp_path: Path) -> None:
    row = cassandra_node.connect().execute("SELECT cluster_name FROM system.local").one()
    script = tmp_path / "plain.cql"
    script.write_text("SELECT cluster_name FROM system.local;\n")
    result = run_script(cassandra_node, script)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert row.cluster_name in result.stdout, result.stdout
    assert "(1 rows)" in result.stdout, result.stdout


def test_cqlsh_splitter_never_closes_a_transaction() -> None:
    # cqlsh 6.2.2 (the 5.0 line) opens a block at any statement starting with BEGIN and
    # closes it only at `APPLY …;`, so `COMMIT TRANSACTION;` leaves the script "incomplete"
    # and nothing is sent: the text cannot reach any server through this cqlsh.
    # When a release learns the syntax this test fails, and the endpoint tests take over.
    with warnings.catch_warnings():
        # cqlshlib imports sre_constants, deprecated since Python 3.11.
        warnings.simplefilter("ignore", DeprecationWarning)
        from cqlshlib.cql3handling import CqlRuleSet

    statements, incomplete = CqlRuleSet.cql_split_statements(TRANSFER)
    assert incomplete
    assert len(statements) == 1
    _, still_open = CqlRuleSet.cql_split_statements("BEGIN BATCH\nAPPLY BATCH;\n")
    assert not still_open


@pytest.mark.cassandra
def test_cqlsh_reports_the_transaction_script_incomplete(
    cassandra_node: CassandraHandle, tmp_path: Path
) -> None:
    script = tmp_path / "transfer.cql"
    script.write_text(TRANSFER)
    result = run_script(cassandra_node, script)
    assert result.returncode != 0
    assert "Incomplete statement at end of file" in result.stderr, result.stderr
