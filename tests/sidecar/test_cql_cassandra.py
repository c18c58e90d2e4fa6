"""Accord CQL text on the real-Cassandra sidecars: the schema read from Cassandra's own
metadata (as the sidecars read it), bank transfers as ``BEGIN TRANSACTION`` text with bound
values, totals conserved, rows as Cassandra stores them."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from accord_cassandra.client import AsyncClient, Client, TransactionError
from accord_cassandra.cql import CqlResult
from accord_cassandra.datastore import tables_from_cluster
from accord_cassandra.schema import Catalog
from tests.sidecar.conftest import CassandraSidecars

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


def read_through(client: Client, text: str, params: list[object], schema: Catalog) -> CqlResult:
    """A read-only transaction, retried while it times out (a loaded machine): idempotent."""
    deadline = time.monotonic() + 180
    while True:
        try:
            return client.execute_cql(text, params, schema=schema)
        except TransactionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


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
    unknown = [
        n for n, o in enumerate(outcomes) if isinstance(o, TransactionError) and not o.definite
    ]
    totals = (
        f"BEGIN TRANSACTION LET a = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        f"LET b = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        f"LET c = (SELECT balance FROM {ks}.accounts WHERE id = ?); "
        "SELECT a.balance, b.balance, c.balance; COMMIT TRANSACTION"
    )
    with Client(addresses[1], timeout=60) as client:
        # Through Accord: a strict-serializable snapshot, every acknowledged transfer in it.
        through = read_through(client, totals, ids, schema).rows[0]
        assert sum(through) == 150, (through, outcomes)  # type: ignore[arg-type]
        ledger = read_through(
            client,
            f"BEGIN TRANSACTION SELECT at, amount FROM {ks}.ledger WHERE account = ? "
            "ORDER BY at ASC; COMMIT TRANSACTION",
            [ids[0]],
            schema,
        )
    debited = {at for at, _ in ledger.rows}
    assert {n for n in applied if plan[n][0] == ids[0]} <= debited, (ledger.rows, outcomes)
    assert debited <= {n for n in applied + unknown if plan[n][0] == ids[0]}
    assert all(amount == -plan[at][2] for at, amount in ledger.rows)  # type: ignore[index]
    # Read directly, Cassandra catches up with what the sidecars answered (replicas apply
    # after the client has its answer), then agrees with it.
    read = SimpleStatement(
        f"SELECT balance FROM {ks}.accounts WHERE id = %s",
        consistency_level=ConsistencyLevel.QUORUM,
    )
    deadline = time.monotonic() + 60
    with Client(addresses[2], timeout=60) as client:
        while True:
            again = read_through(client, totals, ids, schema).rows[0]
            assert sum(again) == 150, again  # type: ignore[arg-type]
            direct = tuple(session.execute(read, (i,)).one().balance for i in ids)
            if direct == again or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert direct == again, (direct, again, through)
