"""Tables the recovery engine adds beyond the seed's nine, and how they are created.

* ``es_ring_state`` (store keyspace): the ring coordinator's leadership row (LWT with a TTL)
  and one fencing-epoch row per service ring; see :mod:`stacksaga_store.ring.server`.
* ``es_watchdog_ledger`` and ``es_watchdog_bucket_live``: the side ledger of the first
  ``accord`` commit mode, in a keyspace of its own. No longer written or read: the accord mode
  now commits each saga state change over the seed's own tables
  (:mod:`stacksaga_store.recovery.commit_modes`); kept so existing deployments' schema
  tooling still knows the tables, which can be dropped.

Creation is idempotent (``IF NOT EXISTS``), like :func:`stacksaga_store.store.schema.apply_schema`.
"""

from __future__ import annotations

import logging
from typing import Any

from stacksaga_store.config.settings import SchemaProperties
from stacksaga_store.store.schema import (
    Column,
    Table,
    create_keyspace_cql,
    create_table_cql,
)

__all__ = [
    "ACCORD_TABLES",
    "COORDINATION_TABLES",
    "ES_RING_STATE",
    "ES_WATCHDOG_BUCKET_LIVE",
    "ES_WATCHDOG_LEDGER",
    "apply_accord_schema",
    "apply_coordination_schema",
    "default_accord_keyspace",
]

logger = logging.getLogger(__name__)


def _columns(*pairs: tuple[str, str]) -> tuple[Column, ...]:
    return tuple(Column(name, cql_type) for name, cql_type in pairs)


ES_RING_STATE = Table(
    "es_ring_state",
    _columns(
        ("region", "text"),
        ("cluster", "text"),
        ("name", "text"),
        ("holder", "text"),
        ("term", "bigint"),
        ("epoch", "bigint"),
    ),
    ("region", "cluster"),
    (("name", "ASC"),),
    comment="ring coordinator: leadership (name='leader', TTL) and epochs (name='ring:<svc>')",
)
ES_WATCHDOG_LEDGER = Table(
    "es_watchdog_ledger",
    _columns(
        ("region", "text"),
        ("cluster", "text"),
        ("service_name", "text"),
        ("transaction_id", "uuid"),
        ("restore_date", "text"),
        ("restore_window", "int"),
        ("restore_instance_id", "text"),
        ("restore_bucket", "int"),
    ),
    ("region", "cluster", "service_name", "transaction_id"),
    comment="accord commit mode: the live watchdog of each transaction (Accord-only)",
)
ES_WATCHDOG_BUCKET_LIVE = Table(
    "es_watchdog_bucket_live",
    _columns(
        ("region", "text"),
        ("cluster", "text"),
        ("service_name", "text"),
        ("date_of_year", "text"),
        ("minute_of_day", "int"),
        ("instance_id", "text"),
        ("bucket_index", "int"),
        ("live", "bigint"),
    ),
    (
        "region",
        "cluster",
        "service_name",
        "date_of_year",
        "minute_of_day",
        "instance_id",
        "bucket_index",
    ),
    comment="accord commit mode: live watchdogs per odd bucket (Accord-only)",
)
COORDINATION_TABLES = (ES_RING_STATE,)
ACCORD_TABLES = (ES_WATCHDOG_LEDGER, ES_WATCHDOG_BUCKET_LIVE)


def default_accord_keyspace(keyspace: str) -> str:
    return f"{keyspace}_accord"


def _apply(
    session: Any, keyspace: str, schema: SchemaProperties, tables: tuple[Table, ...]
) -> list[str]:
    session.execute(create_keyspace_cql(keyspace, schema))
    created = []
    for table in tables:
        # IF NOT EXISTS: applying twice is a no-op; the seed's tables use the same idiom.
        session.execute(create_table_cql(keyspace, table))
        created.append(table.name)
    return created


def apply_coordination_schema(session: Any, keyspace: str, schema: SchemaProperties) -> list[str]:
    """``es_ring_state`` in the store keyspace (created if missing)."""
    return _apply(session, keyspace, schema, COORDINATION_TABLES)


def apply_accord_schema(session: Any, accord_keyspace: str, schema: SchemaProperties) -> list[str]:
    """The accord commit mode's keyspace and tables; create them before starting sidecars
    (a sidecar reads the keyspace's tables once, at start-up)."""
    logger.info("accord keyspace %s: ensuring %d tables", accord_keyspace, len(ACCORD_TABLES))
    return _apply(session, accord_keyspace, schema, ACCORD_TABLES)
