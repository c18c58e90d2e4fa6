"""The keyspace and the seed's 9 tables: DDL, an idempotent apply, and a check.

Theory of operation
-------------------
:data:`TABLES` is the seed's ``schema.cql`` as data: columns with CQL types, the partition key,
clustering columns with their order. The DDL is generated from it (and a test compares the
generated text with the seed's), and :func:`check_schema` compares it with
``system_schema.columns`` of the live keyspace, so the two can never drift apart.

:func:`apply_schema` reads the live schema first and sends ``CREATE ... IF NOT EXISTS`` only for
what is missing. Applying twice sends no DDL at all the second time, so it does not even touch
the schema version. It never alters an existing table: a table with a missing or mistyped column
is reported (:class:`~stacksaga_store.errors.SchemaMismatchError`), because the fix (re-adding a
dropped column, migrating a type) is an operator's decision.

Both run on a plain synchronous driver session: they are one-off admin operations (CLI, test
set-up), and DDL waits for schema agreement inside the driver anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stacksaga_store.config.settings import SchemaProperties
from stacksaga_store.errors import SchemaMismatchError, check_state

__all__ = [
    "CORE_TABLES",
    "RECOVERY_TABLES",
    "TABLES",
    "ApplyReport",
    "Column",
    "SchemaProblem",
    "Severity",
    "Table",
    "apply_schema",
    "check_schema",
    "create_keyspace_cql",
    "create_table_cql",
    "schema_cql",
]

logger = logging.getLogger(__name__)

# The prefix every table shares: region, cluster and service scope all data (seed Part 1).
_SCOPE = (("region", "text"), ("cluster", "text"), ("service_name", "text"))


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    cql_type: str


@dataclass(frozen=True, slots=True)
class Table:
    """One table of the seed's schema."""

    name: str
    columns: tuple[Column, ...]
    partition_key: tuple[str, ...]
    clustering: tuple[tuple[str, str], ...] = ()  # (column, "ASC" | "DESC")
    comment: str = ""

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"{self.name} has no column {name}")

    def kind_of(self, name: str) -> tuple[str, int]:
        """(system_schema kind, position) as Cassandra reports it."""
        if name in self.partition_key:
            return "partition_key", self.partition_key.index(name)
        clustering_names = [column for column, _ in self.clustering]
        if name in clustering_names:
            return "clustering", clustering_names.index(name)
        return "regular", -1


def _table(
    name: str,
    extra: tuple[tuple[str, str], ...],
    partition_key: tuple[str, ...],
    clustering: tuple[tuple[str, str], ...] = (),
    comment: str = "",
) -> Table:
    columns = tuple(Column(n, t) for n, t in (*_SCOPE, *extra))
    return Table(name, columns, partition_key, clustering, comment)


_TXN_KEY = ("region", "cluster", "service_name", "transaction_id")

ES_TRANSACTION = _table(
    "es_transaction",
    (
        ("transaction_id", "uuid"),
        ("running_status", "text"),
        ("created_at", "timestamp"),
        ("updated_at", "timestamp"),
        ("payload", "blob"),
        ("restore_date", "text"),
        ("restore_window", "int"),
        ("restore_instance_id", "text"),
        ("restore_bucket", "int"),
    ),
    _TXN_KEY,
    comment="primary state and metadata of every saga transaction",
)
ES_TRANSACTION_TRYOUT = _table(
    "es_transaction_tryout",
    (
        ("transaction_id", "uuid"),
        ("tryout_index", "int"),
        ("executor", "text"),
        ("execution_type", "text"),
        ("status", "text"),
        ("created_at", "timestamp"),
    ),
    _TXN_KEY,
    (("tryout_index", "ASC"),),
    comment="execution history: one row per step attempt",
)
ES_FROZEN_TRANSACTION = _table(
    "es_frozen_transaction",
    (("transaction_id", "uuid"), ("frozen_at", "timestamp"), ("reason", "text")),
    _TXN_KEY,
    comment="quarantine: compensation failed, or the lifetime expired",
)
ES_EXECUTION_MARKERS = _table(
    "es_execution_markers",
    (("transaction_id", "uuid"), ("step_id", "text"), ("execution_state", "text")),
    _TXN_KEY,
    # As in the seed: no explicit CLUSTERING ORDER (ascending).
    (("step_id", ""),),
    comment="write protection: STRICT leases and committed markers",
)
_DAY = ("region", "cluster", "service_name", "date_of_year")
_WINDOW = (*_DAY, "minute_of_day")
ES_DAYS_BY_YEAR = _table(
    "es_days_by_year",
    (("year", "int"), ("date_of_year", "text")),
    ("region", "cluster", "service_name", "year"),
    (("date_of_year", "ASC"),),
    comment="recovery tier 1: active calendar dates",
)
ES_RECOVERY_WINDOWS_BY_DAY = _table(
    "es_recovery_windows_by_day",
    (("date_of_year", "text"), ("minute_of_day", "int")),
    _DAY,
    (("minute_of_day", "ASC"),),
    comment="recovery tier 2: minute windows per day",
)
ES_INSTANCES_BY_RECOVERY_WINDOW = _table(
    "es_instances_by_recovery_window",
    (
        ("date_of_year", "text"),
        ("minute_of_day", "int"),
        ("instance_id_token", "bigint"),
        ("instance_id", "text"),
    ),
    _WINDOW,
    (("instance_id_token", "ASC"), ("instance_id", "ASC")),
    comment="recovery tier 3: pod instances per window, by token",
)
ES_BUCKETS_BY_INSTANCE = _table(
    "es_buckets_by_instance",
    (
        ("date_of_year", "text"),
        ("minute_of_day", "int"),
        ("instance_id", "text"),
        ("bucket_index", "int"),
    ),
    (*_WINDOW, "instance_id"),
    (("bucket_index", "ASC"),),
    comment="recovery tier 4: bucket indexes per instance (even retry, odd restore)",
)
ES_RECOVERY_TRANSACTIONS_BY_INSTANCE = _table(
    "es_recovery_transactions_by_instance",
    (
        ("date_of_year", "text"),
        ("minute_of_day", "int"),
        ("instance_id", "text"),
        ("bucket_index", "int"),
        ("transaction_id", "uuid"),
    ),
    (*_WINDOW, "instance_id", "bucket_index"),
    # The seed declares transaction_id as a clustering column without an explicit order.
    (("transaction_id", ""),),
    comment="recovery tier 5: bounded partitions of transaction ids",
)

CORE_TABLES = (ES_TRANSACTION, ES_TRANSACTION_TRYOUT, ES_FROZEN_TRANSACTION, ES_EXECUTION_MARKERS)
RECOVERY_TABLES = (
    ES_DAYS_BY_YEAR,
    ES_RECOVERY_WINDOWS_BY_DAY,
    ES_INSTANCES_BY_RECOVERY_WINDOW,
    ES_BUCKETS_BY_INSTANCE,
    ES_RECOVERY_TRANSACTIONS_BY_INSTANCE,
)
TABLES = CORE_TABLES + RECOVERY_TABLES
check_state(len(TABLES) == 9, "the seed defines 9 tables")


def _quote(identifier: str) -> str:
    check_state(identifier.replace("_", "").isalnum(), f"bad identifier {identifier!r}")
    return identifier


def create_table_cql(keyspace: str, table: Table) -> str:
    """``CREATE TABLE IF NOT EXISTS`` text, laid out like the seed's script."""
    width = max(len(column.name) for column in table.columns) + 1
    lines = [f"    {c.name.ljust(width)}{c.cql_type}," for c in table.columns]
    partition = ", ".join(table.partition_key)
    clustering = ", ".join(name for name, _ in table.clustering)
    key = f"({partition})" + (f", {clustering}" if clustering else "")
    lines.append(f"    PRIMARY KEY ({key})")
    text = f"CREATE TABLE IF NOT EXISTS {_quote(keyspace)}.{table.name} (\n" + "\n".join(lines)
    text += "\n)"
    orders = [f"{name} {order}" for name, order in table.clustering if order]
    if orders:
        text += f" WITH CLUSTERING ORDER BY ({', '.join(orders)})"
    return text


def create_keyspace_cql(keyspace: str, schema: SchemaProperties) -> str:
    replication = ", ".join(
        f"'{key}': {value!r}" if isinstance(value, str) else f"'{key}': {value}"
        for key, value in schema.replication_map().items()
    )
    return (
        f"CREATE KEYSPACE IF NOT EXISTS {_quote(keyspace)}\n"
        f"WITH replication = {{{replication}}}\nAND durable_writes = true"
    )


def schema_cql(keyspace: str, schema: SchemaProperties) -> str:
    """The whole script (keyspace and 9 tables), e.g. for review or a DBA."""
    parts = [create_keyspace_cql(keyspace, schema)]
    parts.extend(create_table_cql(keyspace, table) for table in TABLES)
    return ";\n\n".join(parts) + ";\n"


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One difference between the live keyspace and :data:`TABLES`."""

    severity: Severity
    table: str
    column: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.table}.{self.column}" if self.column else self.table
        return f"{self.severity.value}: {where}: {self.message}"


@dataclass(frozen=True, slots=True)
class ApplyReport:
    keyspace: str
    created_keyspace: bool
    created_tables: tuple[str, ...]
    warnings: tuple[SchemaProblem, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return self.created_keyspace or bool(self.created_tables)


def _live_columns(session: Any, keyspace: str) -> dict[str, dict[str, dict[str, Any]]]:
    statement = session.prepare(
        "SELECT table_name, column_name, type, kind, position, clustering_order "
        "FROM system_schema.columns WHERE keyspace_name = ?"
    )
    tables: dict[str, dict[str, dict[str, Any]]] = {}
    for row in session.execute(statement, [keyspace]):
        record = _as_dict(row)
        tables.setdefault(record["table_name"], {})[record["column_name"]] = record
    return tables


def _as_dict(row: Any) -> dict[str, Any]:
    # Sessions from other code may use the driver's default named-tuple rows.
    return row if isinstance(row, dict) else dict(row._asdict())


def _keyspace_replication(session: Any, keyspace: str) -> dict[str, str] | None:
    statement = session.prepare(
        "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?"
    )
    row = session.execute(statement, [keyspace]).one()
    return None if row is None else dict(_as_dict(row)["replication"])


def check_schema(
    session: Any, keyspace: str, schema: SchemaProperties | None = None
) -> list[SchemaProblem]:
    """Compare the live keyspace with :data:`TABLES`; an empty list means it matches.

    Errors: missing keyspace, table or column; wrong type; wrong key role or position; wrong
    clustering order. Warnings: extra columns (ignored by the store) and, when ``schema`` is
    given, a replication map that differs from the configured one.
    """
    replication = _keyspace_replication(session, keyspace)
    if replication is None:
        return [SchemaProblem(Severity.ERROR, keyspace, None, "keyspace does not exist")]
    problems: list[SchemaProblem] = []
    if schema is not None:
        problems.extend(_replication_problems(keyspace, replication, schema))
    live = _live_columns(session, keyspace)
    for table in TABLES:
        columns = live.get(table.name)
        if columns is None:
            problems.append(SchemaProblem(Severity.ERROR, table.name, None, "table is missing"))
            continue
        problems.extend(_table_problems(table, columns))
    return problems


def _replication_problems(
    keyspace: str, live: dict[str, str], schema: SchemaProperties
) -> list[SchemaProblem]:
    wanted = {key: str(value) for key, value in schema.replication_map().items()}
    actual = {key: value.rsplit(".", 1)[-1] for key, value in live.items()}
    if actual == wanted:
        return []
    return [
        SchemaProblem(
            Severity.WARNING, keyspace, None, f"replication is {actual}, configured {wanted}"
        )
    ]


def _table_problems(table: Table, live: dict[str, dict[str, Any]]) -> list[SchemaProblem]:
    problems: list[SchemaProblem] = []
    for column in table.columns:
        found = live.get(column.name)
        if found is None:
            problems.append(
                SchemaProblem(
                    Severity.ERROR,
                    table.name,
                    column.name,
                    f"column is missing ({column.cql_type})",
                )
            )
            continue
        if found["type"] != column.cql_type:
            problems.append(
                SchemaProblem(
                    Severity.ERROR,
                    table.name,
                    column.name,
                    f"type is {found['type']}, expected {column.cql_type}",
                )
            )
        kind, position = table.kind_of(column.name)
        if (found["kind"], found["position"]) != (kind, position):
            problems.append(
                SchemaProblem(
                    Severity.ERROR,
                    table.name,
                    column.name,
                    f"is {found['kind']} #{found['position']}, expected {kind} #{position}",
                )
            )
        problems.extend(_order_problem(table, column.name, found))
    for extra in sorted(set(live) - {column.name for column in table.columns}):
        problems.append(
            SchemaProblem(Severity.WARNING, table.name, extra, "extra column, ignored by the store")
        )
    return problems


def _order_problem(table: Table, name: str, found: dict[str, Any]) -> list[SchemaProblem]:
    expected = dict(table.clustering).get(name)
    if expected is None:
        return []
    wanted = (expected or "ASC").lower()
    if str(found["clustering_order"]).lower() == wanted:
        return []
    message = f"clustering order is {found['clustering_order']}, expected {wanted}"
    return [SchemaProblem(Severity.ERROR, table.name, name, message)]


def apply_schema(session: Any, keyspace: str, schema: SchemaProperties) -> ApplyReport:
    """Create what is missing, then check; raises SchemaMismatchError on any error left."""
    created_keyspace = False
    if _keyspace_replication(session, keyspace) is None:
        logger.info("creating keyspace %s with %s", keyspace, schema.replication_map())
        session.execute(create_keyspace_cql(keyspace, schema))
        created_keyspace = True
    live = _live_columns(session, keyspace)
    created: list[str] = []
    for table in TABLES:
        if table.name not in live:
            logger.info("creating table %s.%s", keyspace, table.name)
            session.execute(create_table_cql(keyspace, table))
            created.append(table.name)
    problems = check_schema(session, keyspace, schema)
    errors = [problem for problem in problems if problem.severity is Severity.ERROR]
    if errors:
        raise SchemaMismatchError([str(problem) for problem in errors])
    return ApplyReport(
        keyspace=keyspace,
        created_keyspace=created_keyspace,
        created_tables=tuple(created),
        warnings=tuple(problems),
    )
