"""Schema: the seed's DDL, idempotent apply, and the check naming what is wrong.

Reference: seed 000, Part 1 Step 2 "Full Schema Script (schema.cql)".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accord_cassandra.launcher import CassandraHandle
from stacksaga_store.__main__ import EXIT_OK, EXIT_PROBLEMS, main
from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import load_settings
from stacksaga_store.store.connect import connect_sync
from stacksaga_store.store.schema import (
    TABLES,
    Severity,
    apply_schema,
    check_schema,
    create_table_cql,
)
from tests.stacksaga.conftest import SIMPLE_SCHEMA, driver_text

# Two tables of the seed's script, verbatim, to pin the generated DDL to the seed's.
SEED_TRYOUT = """
CREATE TABLE IF NOT EXISTS es_transaction_tryout (
    region          text,
    cluster         text,
    service_name    text,
    transaction_id  uuid,
    tryout_index    int,
    executor        text,
    execution_type  text,
    status          text,
    created_at      timestamp,
    PRIMARY KEY ((region, cluster, service_name, transaction_id), tryout_index)
) WITH CLUSTERING ORDER BY (tryout_index ASC);
"""
SEED_TIER5 = """
CREATE TABLE IF NOT EXISTS es_recovery_transactions_by_instance (
    region          text,
    cluster         text,
    service_name    text,
    date_of_year    text,
    minute_of_day   int,
    instance_id     text,
    bucket_index    int,
    transaction_id  uuid,
    PRIMARY KEY ((region, cluster, service_name, date_of_year, minute_of_day, instance_id, bucket_index), transaction_id)
);
"""  # noqa: E501 - verbatim from the seed


def _normalise(cql: str) -> str:
    return re.sub(r"\s+", " ", cql).replace(" ,", ",").strip().rstrip(";").strip()


def test_there_are_the_seeds_nine_tables() -> None:
    assert [table.name for table in TABLES] == [
        "es_transaction",
        "es_transaction_tryout",
        "es_frozen_transaction",
        "es_execution_markers",
        "es_days_by_year",
        "es_recovery_windows_by_day",
        "es_instances_by_recovery_window",
        "es_buckets_by_instance",
        "es_recovery_transactions_by_instance",
    ]


@pytest.mark.parametrize(
    ("table_name", "seed"),
    [("es_transaction_tryout", SEED_TRYOUT), ("es_recovery_transactions_by_instance", SEED_TIER5)],
)
def test_generated_ddl_matches_the_seed(table_name: str, seed: str) -> None:
    table = next(t for t in TABLES if t.name == table_name)
    generated = create_table_cql("ks", table).replace("ks.", "")
    assert _normalise(generated) == _normalise(seed)


@pytest.mark.cassandra
def test_apply_twice_is_a_no_op(cassandra_node: CassandraHandle, fresh_keyspace: str) -> None:
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    config = parse_driver_config(driver_text(cassandra_node, fresh_keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        first = apply_schema(session, fresh_keyspace, settings.cassandra.schema_)
        version = session.execute("SELECT schema_version FROM system.local").one()
        second = apply_schema(session, fresh_keyspace, settings.cassandra.schema_)
        again = session.execute("SELECT schema_version FROM system.local").one()
        problems = check_schema(session, fresh_keyspace, settings.cassandra.schema_)
    finally:
        cluster.shutdown()
    assert first.created_keyspace
    assert len(first.created_tables) == 9
    assert not second.changed
    assert second.created_tables == ()
    assert version == again, "the second apply changed the schema"
    assert problems == []


@pytest.mark.cassandra
def test_check_names_a_dropped_column_and_a_missing_table(
    cassandra_node: CassandraHandle, fresh_keyspace: str
) -> None:
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    config = parse_driver_config(driver_text(cassandra_node, fresh_keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, fresh_keyspace, settings.cassandra.schema_)
        session.execute(
            f"ALTER TABLE {fresh_keyspace}.es_transaction DROP restore_bucket", timeout=120
        )
        session.execute(f"DROP TABLE {fresh_keyspace}.es_days_by_year", timeout=120)
        problems = check_schema(session, fresh_keyspace, settings.cassandra.schema_)
    finally:
        cluster.shutdown()
    errors = sorted(str(p) for p in problems if p.severity is Severity.ERROR)
    assert errors == [
        "error: es_days_by_year: table is missing",
        "error: es_transaction.restore_bucket: column is missing (int)",
    ]


@pytest.mark.cassandra
def test_check_reports_a_mistyped_column(
    cassandra_node: CassandraHandle, fresh_keyspace: str
) -> None:
    settings = load_settings(cassandra={"schema": SIMPLE_SCHEMA})
    config = parse_driver_config(driver_text(cassandra_node, fresh_keyspace))
    cluster, session = connect_sync(settings, config)
    try:
        apply_schema(session, fresh_keyspace, settings.cassandra.schema_)
        session.execute(
            f"ALTER TABLE {fresh_keyspace}.es_frozen_transaction DROP reason", timeout=120
        )
        # Cassandra refuses to re-add a dropped column with another type, so mistype a new one.
        session.execute(
            f"ALTER TABLE {fresh_keyspace}.es_frozen_transaction ADD reason2 int", timeout=120
        )
        problems = check_schema(session, fresh_keyspace, settings.cassandra.schema_)
    finally:
        cluster.shutdown()
    by_column = {(p.table, p.column): p for p in problems}
    assert by_column["es_frozen_transaction", "reason"].severity is Severity.ERROR
    assert by_column["es_frozen_transaction", "reason2"].severity is Severity.WARNING


@pytest.mark.cassandra
def test_cli_schema_apply_then_check(
    cassandra_node: CassandraHandle,
    fresh_keyspace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A YAML file and a driver file found through `classpath:` next to it, as a service ships.
    (tmp_path / "stacksaga-cassandra.conf").write_text(driver_text(cassandra_node, fresh_keyspace))
    (tmp_path / "stacksaga.yaml").write_text(
        "stacksaga:\n"
        "  cassandra:\n"
        "    config: classpath:stacksaga-cassandra.conf\n"
        "    schema:\n"
        "      replication-strategy: SimpleStrategy\n"
        "      replication-factor: 1\n"
    )
    config = ["--config", str(tmp_path / "stacksaga.yaml"), "schema"]
    assert main([*config, "check"]) == EXIT_PROBLEMS
    assert "keyspace does not exist" in capsys.readouterr().out
    assert main([*config, "apply"]) == EXIT_OK
    assert main([*config, "check"]) == EXIT_OK
    assert f"keyspace {fresh_keyspace}: OK" in capsys.readouterr().out
