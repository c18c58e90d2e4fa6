"""The clustered bank: per-account ledger rows clustered by time, the balance a static column.

A transfer reads both accounts' balances (a slice LIMIT 1 carries the static row), checks
the source covers it, and in one transaction updates both balances and appends a ledger row
to each partition under the transfer's id. Afterwards every balance must equal the sum of
its ledger rows, and every acknowledged transfer must appear exactly once in both ledgers;
a transfer whose outcome was unknown may appear once or not at all, never half.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accord_cassandra.client import AsyncClient, Transaction, TransactionError

INITIAL = 1_000
# Codes after which a worker tries the next sidecar: it looked dead or too slow to answer.
UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_SENT")


@dataclass
class Ledger:
    addresses: list[str]
    keyspace: str
    accounts: list[str]
    token: str | None = None
    seed: int = 1
    acked: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    timeout: float = 30.0
    # (monotonic time, sidecar address) of every transfer answered with a result.
    answered: list[tuple[float, str]] = field(default_factory=list)

    def client(self, index: int) -> AsyncClient:
        address = self.addresses[index % len(self.addresses)]
        return AsyncClient(address, token=self.token, timeout=self.timeout)

    async def setup(self) -> None:
        client = self.client(0)
        try:
            for account in self.accounts:
                t = Transaction()
                t.update(self.keyspace, "ledger", account, balance=INITIAL)
                t.update(self.keyspace, "ledger", account, (0, "open"), amount=INITIAL, memo="open")
                assert (await client.transact(t)).applied
        finally:
            await client.close()

    def transfer_txn(self, name: str, src: str, dst: str, amount: int, at: int) -> Transaction:
        t = Transaction()
        s = t.let_slice("s", self.keyspace, "ledger", src, limit=1)
        d = t.let_slice("d", self.keyspace, "ledger", dst, limit=1)
        t.where(s["balance"] >= amount)
        t.update(self.keyspace, "ledger", src, balance=s["balance"] - amount)
        t.update(self.keyspace, "ledger", dst, balance=d["balance"] + amount)
        t.update(self.keyspace, "ledger", src, (at, name), amount=-amount, memo=dst)
        t.update(self.keyspace, "ledger", dst, (at, name), amount=amount, memo=src)
        return t

    async def worker(
        self,
        index: int,
        transfers: int | None = None,
        until: Callable[[], bool] | None = None,
        addresses: Sequence[str] | None = None,
    ) -> None:
        """``transfers`` transfers (or until ``until()``), starting on sidecar ``index`` (mod
        n) of ``addresses`` (default: all) and moving to the next one whenever a sidecar
        looks unreachable."""
        rng = random.Random(self.seed * 1000 + index)
        targets = list(addresses or self.addresses)
        clients: dict[int, AsyncClient] = {}
        slot, failures, n = index, 0, 0
        try:
            while (transfers is None or n < transfers) and not (until is not None and until()):
                src, dst = rng.sample(self.accounts, 2)
                amount = rng.randint(1, 300)
                name = f"w{index}-{n}"
                at = 1 + index * 100_000 + n
                n += 1
                where = slot % len(targets)
                if where not in clients:
                    clients[where] = AsyncClient(
                        targets[where], token=self.token, timeout=self.timeout
                    )
                try:
                    result = await clients[where].transact(
                        self.transfer_txn(name, src, dst, amount, at)
                    )
                except TransactionError as error:
                    # A definite error wrote nothing (a refused connection among them);
                    # any other may or may not have committed.
                    (self.refused if error.definite else self.unknown).add(name)
                    self.errors.append(f"{name}: {error.code} {error.message}")
                    if error.code in UNREACHABLE:
                        slot, failures = slot + 1, failures + 1
                        await asyncio.sleep(min(0.5, 0.02 * 2**failures) * rng.uniform(0.5, 1))
                    continue
                failures = 0
                self.answered.append((time.monotonic(), targets[where]))
                if result.error:
                    self.errors.append(f"{name}: {result.error}")
                if result.applied:
                    self.acked[name] = (src, dst, amount)
                else:
                    self.refused.add(name)
        finally:
            for client in clients.values():
                await client.close()

    async def run(
        self,
        workers: int,
        transfers: int | None = None,
        until: Callable[[], bool] | None = None,
        *,
        addresses: Sequence[str] | None = None,
        first_worker: int = 0,
    ) -> None:
        """``workers`` workers; worker ids (and so transfer names) start at ``first_worker``."""
        await asyncio.gather(
            *(self.worker(first_worker + i, transfers, until, addresses) for i in range(workers))
        )

    async def audit(self, index: int = 0) -> dict[str, tuple[int | None, list[dict[str, object]]]]:
        """Each account's balance and ledger rows, read in one transaction at sidecar
        ``index`` (mod n)."""
        client = self.client(index)
        try:
            t = Transaction()
            for account in self.accounts:
                t.let_slice(account, self.keyspace, "ledger", account)
            result = await client.transact(t)
        finally:
            await client.close()
        out: dict[str, tuple[int | None, list[dict[str, object]]]] = {}
        for account in self.accounts:
            statics = result.rows[account] or {}
            balance = statics.get("balance")
            out[account] = (balance if isinstance(balance, int) else None, result.slices[account])
        return out

    @staticmethod
    def books(
        audit: dict[str, tuple[int | None, list[dict[str, object]]]],
    ) -> dict[str, tuple[int | None, list[tuple[str, int]]]]:
        """Each account's balance and sorted (transfer, amount) rows: comparable to a read
        straight from Cassandra."""
        return {
            account: (balance, sorted((str(r["transfer"]), int(r["amount"])) for r in rows))  # type: ignore[call-overload]
            for account, (balance, rows) in audit.items()
        }

    def problems(self, audit: dict[str, tuple[int | None, list[dict[str, object]]]]) -> list[str]:
        found: list[str] = []
        seen: dict[str, list[tuple[str, int]]] = {}
        total = 0
        for account, (balance, rows) in audit.items():
            amounts = [r["amount"] for r in rows]
            ledger_sum = sum(a for a in amounts if isinstance(a, int))
            if balance != ledger_sum:
                found.append(f"{account}: balance {balance} != ledger sum {ledger_sum}")
            total += balance or 0
            for r in rows:
                name = str(r["transfer"])
                if name != "open":
                    seen.setdefault(name, []).append((account, int(r["amount"])))  # type: ignore[call-overload]
        if total != INITIAL * len(self.accounts):
            found.append(f"total {total} != {INITIAL * len(self.accounts)}")
        for name, (src, dst, amount) in self.acked.items():
            if sorted(seen.get(name, [])) != sorted([(src, -amount), (dst, amount)]):
                found.append(f"acknowledged {name} appears as {seen.get(name)}")
        for name, entries in seen.items():
            if name in self.refused:
                found.append(f"refused {name} appears as {entries}")
            elif name not in self.acked and len(entries) != 2:
                found.append(f"unknown {name} appears half: {entries}")
        return found
