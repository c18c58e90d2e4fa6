"""Accord CQL text on the real-Cassandra sidecars: the schema read from Cassandra's own
metadata (as the sidecars read it), bank transfers as ``BEGIN TRANSACTION`` text with bound
values, totals conserved, rows as Cassandra stores them."""

from __future__ import annotations

import asyncio
import random

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from accord_cassandra.client import AsyncClient, Client, TransactionError
from accord_cassandra.cql import CqlResult
from accord_cassandra.datastore import tables_from_cluster
from accord_cassandra.schema import Catalog
from tests.sidecar.conftest import CassandraSidecars

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


def test_transfers_as_text_on_cassandra(cassandra_sidecars: CassandraSidecars) -> None:
    ks = cassandra_sidecars.keyspace
    session = cassandra_sidecars.session
    unusable: dict[str, str] = {}
    schema = Catalog(tables_from_cluster(session.cluster.metadata, [ks], unusable), unusable)
    transfer = f"""
        BEGIN TRANSACTION
          LET src = (SELECT balance FROM {ks}.accounts WHERE id = ?);
          LET dst = (SELECT balance FROM {ks}.accounts WHERE id = ?);
          SELECT src.balance, dst.balance;
          IF src.balance >= ? THEN
            UPDATE {ks}.accounts SET balance = src.balance - ? WHERE id = ?;
            UPDATE {ks}.accounts SET balance = dst.balance + ? WHERE id = ?;
            INSERT INTO {ks}.ledger (account, at, transfer, amount) VALUES (?, ?, ?, ?);
          END IF
        COMMIT TRANSACTION"""
    ids = [f"cqlc-{i}" for i in range(3)]
    addresses = cassandra_sidecars.addresses()
    with Client(addresses[0], timeout=60) as client:
        for account in ids:
            client.execute_cql(
                f"BEGIN TRANSACTION INSERT INTO {ks}.accounts (id, balance, tag) "
                "VALUES (:id, 50, 0); COMMIT TRANSACTION",
                {"id": account},
                schema=schema,
            )
    rng = random.Random(5)
    plan = []
    for n in range(12):
        src, dst = rng.sample(ids, 2)
        amount = rng.randint(1, 30)
        plan.append([src, dst, amount, amount, src, amount, dst, src, n, f"t{n}", -amount])

    async def run() -> list[CqlResult | TransactionError]:
        clients = [AsyncClient(a, timeout=60) for a in addresses]

        async def one(i: int, params: list[object]) -> CqlResult | TransactionError:
            try:
                return await clients[i % 3].execute_cql(transfer, params, schema=schema)
            except TransactionError as error:
                return error

        try:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(plan)))
        finally:
            for c in clients:
                await c.close()

    outcomes = asyncio.run(run())
    applied = [n for n, o in enumerate(outcomes) if isinstance(o, CqlResult) and o.applied]
    assert applied, outcomes
    read = SimpleStatement(
        f"SELECT balance FROM {ks}.accounts WHERE id = %s",
        consistency_level=ConsistencyLevel.QUORUM,
    )
    balances = {i: session.execute(read, (i,)).one().balance for i in ids}
    assert sum(balances.values()) == 150, balances
    with Client(addresses[1], timeout=60) as client:
        ledger = client.execute_cql(
            f"BEGIN TRANSACTION SELECT at, amount FROM {ks}.ledger WHERE account = ? "
            "ORDER BY at ASC; COMMIT TRANSACTION",
            [ids[0]],
            schema=schema,
        )
    debits = [n for n in applied if plan[n][0] == ids[0]]
    assert [at for at, _ in ledger.rows] == debits
    assert all(amount == -plan[at][2] for at, amount in ledger.rows)
