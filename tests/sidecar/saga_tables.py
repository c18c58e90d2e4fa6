"""The saga store's nine tables (stacksaga_store/store/schema.py) written and read back
through the client API, each in one Accord transaction."""

from __future__ import annotations

import uuid
from typing import Any

from accord_cassandra.client import Client, Transaction
from stacksaga_store.store.schema import TABLES, Table

NOT_CLUSTERED = {"es_transaction", "es_frozen_transaction"}


def memory_tables(keyspace: str) -> dict[str, dict[str, list[list[str]]]]:
    """The nine tables in the memory store's ``tables:`` format."""
    out: dict[str, dict[str, list[list[str]]]] = {}
    for table in TABLES:
        ordered = [name for name, _ in table.clustering]
        keys = set(table.partition_key) | set(ordered)
        out[f"{keyspace}.{table.name}"] = {
            "partition_key": [[n, table.column(n).cql_type] for n in table.partition_key],
            "clustering": [
                [n, table.column(n).cql_type, (order or "asc").lower()]
                for n, order in table.clustering
            ],
            "columns": [[c.name, c.cql_type] for c in table.columns if c.name not in keys],
        }
    return out


def _sample(cql_type: str, column: str, txn_id: str) -> object:
    if column == "transaction_id":
        return txn_id
    return {
        "text": f"{column}-v",
        "int": 7,
        "bigint": 2**40,
        "timestamp": 1_700_000_000_000,
        "blob": b"\x00payload",
        "uuid": txn_id,
    }[cql_type]


def _row(table: Table, txn_id: str) -> tuple[list[object], list[object], dict[str, object]]:
    names = [name for name, _ in table.clustering]
    pk = [_sample(table.column(n).cql_type, n, txn_id) for n in table.partition_key]
    ck = [_sample(table.column(n).cql_type, n, txn_id) for n in names]
    keys = set(table.partition_key) | set(names)
    values = {
        c.name: _sample(c.cql_type, c.name, txn_id) for c in table.columns if c.name not in keys
    }
    return pk, ck, values


def write_and_read_all_nine(client: Client, keyspace: str) -> dict[str, Any]:
    """One transaction writes a row of every table; a second reads them all back (rows of
    clustered tables as slices); returns what it read, by table."""
    txn_id = str(uuid.uuid4())
    write = Transaction()
    for table in TABLES:
        pk, ck, values = _row(table, txn_id)
        write.update(keyspace, table.name, pk, ck, values=values)
    assert client.transact(write).applied
    read = Transaction()
    for table in TABLES:
        pk, ck, _ = _row(table, txn_id)
        if table.name in NOT_CLUSTERED:
            read.let(table.name, keyspace, table.name, pk)
        else:
            read.let_slice(table.name, keyspace, table.name, pk)
    result = client.transact(read)
    out: dict[str, Any] = {}
    for table in TABLES:
        pk, ck, values = _row(table, txn_id)
        if table.name in NOT_CLUSTERED:
            out[table.name] = result.rows[table.name]
            expected: Any = values
        else:
            out[table.name] = result.slices[table.name]
            names = [name for name, _ in table.clustering]
            expected = [{**dict(zip(names, ck, strict=True)), **values}]
        assert out[table.name] == expected, (table.name, out[table.name], expected)
    return out
