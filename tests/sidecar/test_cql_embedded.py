"""Accord CQL text end to end: ``Client.execute_cql`` / ``AsyncClient.execute_cql`` and
``accord-cassandra txn --cql`` against three sidecar processes on the embedded store."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accord_cassandra.client import AsyncClient, Client, TransactionError
from accord_cassandra.cluster import LocalSidecars
from accord_cassandra.cql import CqlError
from tests.sidecar.conftest import EMBEDDED_TABLES, TOKEN

TRANSFER = """
BEGIN TRANSACTION
  LET src = (SELECT balance FROM bank.accounts WHERE id = :src);
  LET dst = (SELECT balance FROM bank.accounts WHERE id = :dst);
  SELECT src.balance, dst.balance;
  IF src.balance >= :amount THEN
    UPDATE bank.accounts SET balance = src.balance - :amount WHERE id = :src;
    UPDATE bank.accounts SET balance = dst.balance + :amount WHERE id = :dst;
  END IF
COMMIT TRANSACTION
"""


def _balances(client: Client, ids: list[str]) -> list[int | None]:
    lets = "\n".join(
        f"  LET a{i} = (SELECT balance FROM bank.accounts WHERE id = ?);" for i in range(len(ids))
    )
    select = ", ".join(f"a{i}.balance" for i in range(len(ids)))
    text = f"BEGIN TRANSACTION\n{lets}\n  SELECT {select};\nCOMMIT TRANSACTION"
    result = client.execute_cql(text, ids, schema=EMBEDDED_TABLES)
    assert result.applied and len(result.rows) == 1
    return list(result.rows[0])  # type: ignore[arg-type]


def test_bank_transfers_as_text_conserve_the_total(embedded: LocalSidecars) -> None:
    addresses = embedded.addresses()
    ids = [f"cql-{i}" for i in range(4)]
    with Client(addresses[0], token=TOKEN, timeout=30) as client:
        for account in ids:
            created = client.execute_cql(
                "BEGIN TRANSACTION\n"
                "  INSERT INTO bank.accounts (id, balance, tag) VALUES (?, 100, 0);\n"
                "COMMIT TRANSACTION",
                [account],
                schema=EMBEDDED_TABLES,
            )
            assert created.applied and created.rows == []
        assert _balances(client, ids) == [100, 100, 100, 100]
        # A transfer the source cannot pay is not applied and changes nothing.
        declined = client.execute_cql(
            TRANSFER, {"src": ids[0], "dst": ids[1], "amount": 1000}, schema=EMBEDDED_TABLES
        )
        assert not declined.applied
        assert declined.columns == ["src.balance", "dst.balance"]
        assert declined.rows == [(100, 100)]
        assert _balances(client, ids) == [100, 100, 100, 100]

    rng = random.Random(19)
    plan = []
    for _ in range(40):
        src, dst = rng.sample(ids, 2)
        plan.append({"src": src, "dst": dst, "amount": rng.randint(1, 60)})

    async def run() -> list[object]:
        clients = [AsyncClient(a, token=TOKEN, timeout=30) for a in addresses]
        gate = asyncio.Semaphore(8)

        async def one(i: int, params: dict[str, object]) -> object:
            async with gate:
                try:
                    return await clients[i % len(clients)].execute_cql(
                        TRANSFER, params, schema=EMBEDDED_TABLES
                    )
                except TransactionError as error:
                    return error

        try:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(plan)))
        finally:
            for c in clients:
                await c.close()

    outcomes = asyncio.run(run())
    applied = [o for o in outcomes if not isinstance(o, TransactionError) and o.applied]  # type: ignore[attr-defined]
    assert len(applied) >= 10, outcomes
    with Client(addresses[1], token=TOKEN, timeout=30) as client:
        final = _balances(client, ids)
    assert sum(b for b in final if b is not None) == 400, final
    assert all(b is not None and b >= 0 for b in final), final


def test_slices_increments_deletes_and_a_plain_select(embedded: LocalSidecars) -> None:
    with Client(embedded.addresses()[2], token=TOKEN, timeout=30) as client:

        def run(text: str, params: object = None) -> object:
            return client.execute_cql(
                f"BEGIN TRANSACTION\n{text}\nCOMMIT TRANSACTION",
                params,
                schema=EMBEDDED_TABLES,  # type: ignore[arg-type]
            )

        for at in range(1, 6):
            run(
                "INSERT INTO bank.ledger (account, at, transfer, amount, memo) "
                "VALUES ('cql-l', ?, 't', ?, ?);",
                [at, at * 10, f"m{at}"],
            )
        run("INSERT INTO bank.ledger (account, balance) VALUES ('cql-l', 7);")
        newest = run("SELECT at, amount, balance FROM bank.ledger WHERE account = 'cql-l' LIMIT 2;")
        # Clustered at DESC: the newest first, the static balance on every row.
        assert newest.rows == [(5, 50, 7), (4, 40, 7)]  # type: ignore[attr-defined]
        oldest = run(
            "SELECT at FROM bank.ledger WHERE account = 'cql-l' AND at > 1 ORDER BY at ASC LIMIT 2;"
        )
        assert oldest.rows == [(2,), (3,)]  # type: ignore[attr-defined]
        guarded = run(
            "LET last = (SELECT * FROM bank.ledger WHERE account = 'cql-l' LIMIT 1);\n"
            "SELECT last.amount, last.balance;\n"
            "IF last.amount = 50 AND COUNT(last) = 1 THEN\n"
            "  UPDATE bank.ledger SET balance += 5 WHERE account = 'cql-l';\n"
            "  DELETE FROM bank.ledger WHERE account = 'cql-l' AND at >= 2 AND at < 4;\n"
            "END IF"
        )
        assert guarded.applied and guarded.rows == [(50, 7)]  # type: ignore[attr-defined]
        after = run("SELECT at, balance FROM bank.ledger WHERE account = 'cql-l';")
        assert after.rows == [(5, 12), (4, 12), (1, 12)]  # type: ignore[attr-defined]
        run(
            "UPDATE bank.accounts SET balance = 1, tag = 1 WHERE id = 'cql-inc';\n"
            "UPDATE bank.receipts SET src_tag = 2 WHERE id = 19;"
        )
        run("UPDATE bank.accounts SET tag += 2, balance = balance - 1 WHERE id = 'cql-inc';")
        row = run("SELECT * FROM bank.accounts WHERE id = 'cql-inc';")
        assert row.columns == ["id", "balance", "tag"]  # type: ignore[attr-defined]
        assert row.rows == [("cql-inc", 0, 3)]  # type: ignore[attr-defined]
        run("DELETE FROM bank.accounts WHERE id = 'cql-inc';")
        assert run("SELECT * FROM bank.accounts WHERE id = 'cql-inc';").rows == []  # type: ignore[attr-defined]
        with pytest.raises(CqlError, match="unknown column 'nope'"):
            run("UPDATE bank.accounts SET nope = 1 WHERE id = 'x';")


def test_the_cli_runs_a_text_from_stdin(embedded: LocalSidecars, tmp_path: Path) -> None:
    schema = tmp_path / "tables.yaml"
    schema.write_text(yaml.safe_dump({"tables": EMBEDDED_TABLES}))
    command = [
        sys.executable,
        "-m",
        "accord_cassandra",
        "txn",
        "--address",
        embedded.addresses()[0],
        "--token",
        TOKEN,
        "--schema",
        str(schema),
    ]
    setup = (
        "BEGIN TRANSACTION INSERT INTO bank.accounts (id, balance) VALUES (?, ?); "
        "COMMIT TRANSACTION"
    )
    for account, balance in (("cli-a", 30), ("cli-b", 5)):
        done = subprocess.run(
            [*command, "--cql", "-", "--params", json.dumps([account, balance])],
            input=setup,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    text = tmp_path / "transfer.cql"
    text.write_text(TRANSFER)
    params = json.dumps({"src": "cli-a", "dst": "cli-b", "amount": 10})
    done = subprocess.run(
        [*command, "--cql", str(text), "--params", params],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["applied"] is True
    assert out["columns"] == ["src.balance", "dst.balance"]
    assert out["rows"] == [[30, 5]]
    bad = subprocess.run(
        [*command, "--cql", "-"],
        input="BEGIN TRANSACTION\n  LET x = (SELECT * FROM bank.accounts WHERE id = 'a')\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "line 3:1 unexpected end of input, expecting ';'" in bad.stderr, bad.stderr
