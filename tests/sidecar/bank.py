"""A bank workload against real sidecar processes, recorded as a checkable history.

Accounts are rows ``(id) -> (balance, tag)``. Every transfer reads both accounts, moves
``amount`` if the source can pay, writes each account's new balance with a tag unique to
that write, and writes a *receipt* row ``(transfer id) -> (source tag, target tag)`` with
the tags it read. That gives two independent judges:

* the client-observed history, judged by accord's strict-serializability checker
  (:func:`accord.sim.verify.check_bank`: wr/rw/real-time cycles, lost updates, garbage
  reads, totals on every consistent snapshot);
* the final state, judged by :func:`verify_ledger`: the receipt of every acknowledged
  transfer exists and names exactly the versions the client was told it read (a transfer
  applied twice would have overwritten it with its own first write's tags, one never
  applied has none); the receipts chain every account's versions from the initial one to
  the final one with no version superseded twice; final balances equal the initial ones
  plus the committed transfers, each counted once.

Outcomes follow the client API: a definite error or a declined transfer wrote nothing
(``fail``; NOT_SENT, a refused connection, among them); DEADLINE_EXCEEDED/UNAVAILABLE may
or may not have committed (``info``), and the
receipts then say which.
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accord.sim.history import History, HistoryRecorder, MicroOp
from accord.sim.verify import Verdict, check_bank
from accord_cassandra.client import AsyncClient, Transaction, TransactionError

MAX_LETS = 64


def now_micros() -> int:
    return time.monotonic_ns() // 1000


@dataclass
class Transfer:
    transfer_id: int
    source: str
    target: str
    amount: int
    status: str = "pending"  # ok | declined | failed | info
    # The (balance, tag) values the client was told it read, when acknowledged.
    read_source: tuple[int, int] | None = None
    read_target: tuple[int, int] | None = None

    @property
    def tags(self) -> tuple[int, int]:
        return 2 * self.transfer_id + 1, 2 * self.transfer_id + 2


@dataclass
class Commit:
    at: float  # time.monotonic()
    address: str
    seconds: float


@dataclass
class Bank:
    addresses: list[str]
    keyspace: str
    accounts: list[str]
    initial: int = 100
    token: str | None = None
    seed: int = 1
    audit_share: float = 0.15
    timeout: float = 20.0
    first_transfer: int = 1  # transfer ids (receipt keys) start here: runs sharing a table differ
    recorder: HistoryRecorder = field(default_factory=HistoryRecorder)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    _next_transfer: int = 0
    _clients: dict[str, AsyncClient] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._next_transfer = self.first_transfer

    # ------------------------------------------------------------------ clients

    def client(self, address: str) -> AsyncClient:
        if address not in self._clients:
            self._clients[address] = AsyncClient(address, token=self.token, timeout=self.timeout)
        return self._clients[address]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    # ------------------------------------------------------------------ setup

    async def setup(self, deadline_seconds: float = 30.0) -> None:
        """Every account at ``initial`` with tag 0, written through Accord (rows written
        by Accord carry executeAt-derived timestamps, so plain CQL writes would lose)."""
        t = Transaction()
        for account in self.accounts:
            t.update(self.keyspace, "accounts", account, balance=self.initial, tag=0)
        await self._until_done(lambda client: client.transact(t), deadline_seconds)

    async def _until_done(self, call: Callable[[AsyncClient], object], seconds: float) -> object:
        deadline = time.monotonic() + seconds
        attempt = 0
        while True:
            address = self.addresses[attempt % len(self.addresses)]
            attempt += 1
            try:
                return await call(self.client(address))  # type: ignore[misc]
            except TransactionError as error:
                if error.definite or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ load

    def transfer_txn(self, transfer: Transfer) -> Transaction:
        ks = self.keyspace
        tag_source, tag_target = transfer.tags
        t = Transaction()
        src = t.let("src", ks, "accounts", transfer.source)
        dst = t.let("dst", ks, "accounts", transfer.target)
        t.where(src["balance"] >= transfer.amount)
        t.update(
            ks,
            "accounts",
            transfer.source,
            balance=src["balance"] - transfer.amount,
            tag=tag_source,
        )
        t.update(
            ks,
            "accounts",
            transfer.target,
            balance=dst["balance"] + transfer.amount,
            tag=tag_target,
        )
        t.update(ks, "receipts", transfer.transfer_id, src_tag=src["tag"], dst_tag=dst["tag"])
        return t

    async def run(
        self,
        workers: int,
        until: Callable[[], bool],
        *,
        addresses: Sequence[str] | None = None,
        first_process: int = 0,
    ) -> None:
        """``workers`` clients until ``until()``; client i starts on address i (mod n) and
        moves to the next one when its sidecar is unreachable."""
        targets = list(addresses or self.addresses)
        await asyncio.gather(
            *(self._worker(first_process + i, until, targets) for i in range(workers))
        )

    async def _worker(self, process: int, until: Callable[[], bool], targets: list[str]) -> None:
        rng = random.Random(self.seed * 1000 + process)
        slot = process
        failures = 0
        while not until():
            address = targets[slot % len(targets)]
            if rng.random() < self.audit_share:
                await self._audit_op(process, address)
                continue
            transfer = self._new_transfer(rng)
            if await self._transfer_op(process, address, transfer):
                failures = 0
                continue
            # Unreachable or no outcome: try the next sidecar, backing off while none answers.
            slot += 1
            failures += 1
            await asyncio.sleep(min(0.5, 0.02 * 2**failures) * rng.uniform(0.5, 1.0))

    def _new_transfer(self, rng: random.Random) -> Transfer:
        source, target = rng.sample(self.accounts, 2)
        transfer = Transfer(self._next_transfer, source, target, rng.randint(1, 30))
        self._next_transfer += 1
        self.transfers[transfer.transfer_id] = transfer
        return transfer

    async def _transfer_op(self, process: int, address: str, transfer: Transfer) -> bool:
        """One transfer; False when the sidecar looked unreachable (move to another)."""
        tag_source, tag_target = transfer.tags
        unknown = (
            MicroOp("r", transfer.source, None),
            MicroOp("r", transfer.target, None),
            MicroOp("put", transfer.source, (None, tag_source)),
            MicroOp("put", transfer.target, (None, tag_target)),
        )
        op_id = self.recorder.invoke(process, unknown, now_micros())
        started = time.monotonic()
        try:
            result = await self.client(address).transact(self.transfer_txn(transfer))
        except TransactionError as error:
            self.errors[error.code] += 1
            transfer.status = "failed" if error.definite else "info"
            self.recorder.complete(
                op_id, "fail" if error.definite else "info", unknown, now_micros()
            )
            return error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_SENT")
        finished = time.monotonic()
        if not result.applied:
            assert result.error is None, result.error
            transfer.status = "declined"  # wrote nothing: a definite failure to the history
            self.recorder.complete(op_id, "fail", unknown, now_micros())
            self.commits.append(Commit(finished, address, finished - started))
            return True
        src, dst = result.rows["src"], result.rows["dst"]
        assert src is not None and dst is not None, result
        transfer.read_source = (int(src["balance"]), int(src["tag"]))  # type: ignore[call-overload]
        transfer.read_target = (int(dst["balance"]), int(dst["tag"]))  # type: ignore[call-overload]
        transfer.status = "ok"
        observed = (
            MicroOp("r", transfer.source, transfer.read_source),
            MicroOp("r", transfer.target, transfer.read_target),
            MicroOp(
                "put", transfer.source, (transfer.read_source[0] - transfer.amount, tag_source)
            ),
            MicroOp(
                "put", transfer.target, (transfer.read_target[0] + transfer.amount, tag_target)
            ),
        )
        self.recorder.complete(op_id, "ok", observed, now_micros())
        self.commits.append(Commit(finished, address, finished - started))
        return True

    async def _audit_op(self, process: int, address: str) -> dict[str, tuple[int, int]] | None:
        names = sorted(self.accounts)
        unknown = tuple(MicroOp("r", a, None) for a in names)
        op_id = self.recorder.invoke(process, unknown, now_micros())
        t = Transaction()
        for account in names:
            t.let(account, self.keyspace, "accounts", account)
        try:
            result = await self.client(address).transact(t)
        except TransactionError as error:
            self.errors[error.code] += 1
            self.recorder.complete(
                op_id, "fail" if error.definite else "info", unknown, now_micros()
            )
            return None
        values = {a: _balance(result.rows[a]) for a in names}
        self.recorder.complete(
            op_id, "ok", tuple(MicroOp("r", a, values[a]) for a in names), now_micros()
        )
        return values

    # ------------------------------------------------------------------ after the load

    async def audit(self, process: int = 1_000_000) -> dict[str, tuple[int, int]]:
        """Every account's (balance, tag) through a sidecar, recorded in the history."""
        deadline = time.monotonic() + 30
        attempt = 0
        while True:
            address = self.addresses[attempt % len(self.addresses)]
            values = await self._audit_op(process + attempt, address)
            if values is not None:
                return values
            attempt += 1
            assert time.monotonic() < deadline, f"no audit succeeded: {self.errors}"
            await asyncio.sleep(0.2)

    async def read_receipts(self, ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """Receipts through a sidecar (at most 64 LETs per transaction)."""
        found: dict[int, tuple[int, int]] = {}
        for start in range(0, len(ids), MAX_LETS):
            chunk = ids[start : start + MAX_LETS]
            t = Transaction()
            for transfer_id in chunk:
                t.let(f"r{transfer_id}", self.keyspace, "receipts", transfer_id)
            result = await self._until_done(
                functools.partial(AsyncClient.transact, transaction=t), 30
            )
            for transfer_id in chunk:
                row = result.rows[f"r{transfer_id}"]  # type: ignore[attr-defined]
                if row is not None:
                    found[transfer_id] = (int(row["src_tag"]), int(row["dst_tag"]))
        return found

    def history(self) -> History:
        return self.recorder.history()

    def verdict(self) -> Verdict:
        return check_bank(self.history(), self.accounts, dict.fromkeys(self.accounts, self.initial))

    def statuses(self) -> Counter[str]:
        return Counter(t.status for t in self.transfers.values())

    def latency_ms(self) -> tuple[float, float]:
        seconds = sorted(c.seconds for c in self.commits)
        if not seconds:
            return float("nan"), float("nan")
        p99 = seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))]
        return 1000 * statistics.median(seconds), 1000 * p99


def _balance(row: dict[str, object] | None) -> tuple[int, int]:
    assert row is not None, "an account row vanished"
    return int(row["balance"]), int(row["tag"])  # type: ignore[call-overload]


def verify_ledger(
    bank: Bank,
    final: dict[str, tuple[int, int]],
    receipts: dict[int, tuple[int, int]],
) -> list[str]:
    """Problems with the final state, judged by the receipts (empty when all is well)."""
    problems: list[str] = []
    committed: dict[int, tuple[int, int]] = {}
    for transfer_id, transfer in sorted(bank.transfers.items()):
        receipt = receipts.get(transfer_id)
        if transfer.status == "ok":
            assert transfer.read_source is not None and transfer.read_target is not None
            told = (transfer.read_source[1], transfer.read_target[1])
            if receipt is None:
                problems.append(f"acknowledged transfer {transfer_id} is lost: no receipt")
            elif receipt != told:
                problems.append(
                    f"transfer {transfer_id} read tags {told} but its receipt says {receipt}: "
                    "applied more than once, or at another point than acknowledged"
                )
        elif transfer.status in ("declined", "failed") and receipt is not None:
            problems.append(f"{transfer.status} transfer {transfer_id} has a receipt {receipt}")
        if receipt is not None:
            committed[transfer_id] = receipt
    for stray in sorted(set(receipts) - set(bank.transfers)):
        problems.append(f"receipt {stray} belongs to no transfer")
    # Version chains: (account, tag read) -> tag written, from every committed transfer.
    successor: dict[tuple[str, int], int] = {}
    balance = dict.fromkeys(bank.accounts, bank.initial)
    for transfer_id, (source_tag, target_tag) in sorted(committed.items()):
        transfer = bank.transfers[transfer_id]
        for account, read_tag, written_tag in (
            (transfer.source, source_tag, transfer.tags[0]),
            (transfer.target, target_tag, transfer.tags[1]),
        ):
            previous = successor.setdefault((account, read_tag), written_tag)
            if previous != written_tag:
                problems.append(
                    f"{account} version {read_tag} was superseded twice "
                    f"(tags {previous} and {written_tag}): a lost update"
                )
        balance[transfer.source] -= transfer.amount
        balance[transfer.target] += transfer.amount
    for account in bank.accounts:
        tag, seen = 0, {0}
        while (account, tag) in successor:
            tag = successor[(account, tag)]
            if tag in seen:
                problems.append(f"{account}: the version chain loops at tag {tag}")
                break
            seen.add(tag)
        writes = {t for (a, _), t in successor.items() if a == account}
        if final[account][1] != tag:
            problems.append(f"{account}: final tag {final[account][1]}, chain ends at {tag}")
        if not writes <= seen:
            problems.append(
                f"{account}: committed writes {sorted(writes - seen)} are off the chain"
            )
        if final[account][0] != balance[account]:
            problems.append(
                f"{account}: final balance {final[account][0]}, committed transfers "
                f"add up to {balance[account]}"
            )
    return problems
