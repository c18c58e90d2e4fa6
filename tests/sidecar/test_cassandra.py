"""Three sidecars beside a real 3-node Cassandra (RF 3, QUORUM): bank transfers under load,
with one sidecar SIGKILLed, then all three, and every acknowledged transfer checked.

Each test runs its own accounts and transfer ids in the session's keyspace (the sidecars
are shared with other modules: tests/sidecar/conftest.py). Judges (see
bank.py): accord's strict-serializability checker on the client history; receipts read
straight from Cassandra at QUORUM that prove each acknowledged transfer applied exactly once
and nothing was lost; totals read both through a sidecar and from Cassandra directly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import time
from collections.abc import Awaitable, Callable

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from accord import Key, RowAt, Timestamp, WriteOp
from accord_cassandra.client import Client, Transaction, TransactionError
from accord_cassandra.cluster import metrics_of
from accord_cassandra.datastore import (
    HLC_BASE_MICROS,
    CassandraDataStore,
    tables_from_cluster,
)
from accord_cassandra.schema import Catalog
from tests.sidecar.bank import Bank, Commit, verify_ledger
from tests.sidecar.conftest import CassandraSidecars, log_size, log_tails, sidecar_log

pytestmark = pytest.mark.cassandra

ACCOUNTS = 8
# Transfer ids (receipt keys) per bank: each test's bank starts at its own multiple of this,
# so the receipts a test reads back are its own whatever ran before on the shared keyspace.
TRANSFER_ID_SPAN = 1_000_000


def direct_accounts(sidecars: CassandraSidecars, bank: Bank) -> dict[str, tuple[int, int]]:
    names = ", ".join(f"'{a}'" for a in bank.accounts)
    statement = SimpleStatement(
        f"SELECT id, balance, tag FROM {sidecars.keyspace}.accounts WHERE id IN ({names})",
        consistency_level=ConsistencyLevel.QUORUM,
    )
    return {row.id: (row.balance, row.tag) for row in sidecars.session.execute(statement)}


def direct_receipts(sidecars: CassandraSidecars, bank: Bank) -> dict[int, tuple[int, int]]:
    statement = SimpleStatement(
        f"SELECT id, src_tag, dst_tag FROM {sidecars.keyspace}.receipts",
        consistency_level=ConsistencyLevel.QUORUM,
        fetch_size=5000,
    )
    low, high = bank.first_transfer, bank.first_transfer + TRANSFER_ID_SPAN
    assert max(bank.transfers, default=low) < high, "the bank ran past its id span"
    return {
        row.id: (row.src_tag, row.dst_tag)
        for row in sidecars.session.execute(statement)
        if low <= row.id < high
    }


async def settle(
    sidecars: CassandraSidecars, bank: Bank, seconds: float = 60.0
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Audit through the sidecars until Cassandra, read directly, shows the same rows twice
    in a row: transactions with unknown outcomes may still be recovering for a while."""
    deadline = time.monotonic() + seconds
    previous = None
    while True:
        audited = await bank.audit()
        direct = await asyncio.to_thread(direct_accounts, sidecars, bank)
        if audited == direct and direct == previous:
            return audited, direct
        previous = direct
        assert time.monotonic() < deadline, f"no quiescence: {audited} vs {direct}"
        await asyncio.sleep(0.5)


def judge(sidecars: CassandraSidecars, bank: Bank, final: dict[str, tuple[int, int]]) -> None:
    """Every judge's verdict at once, with the evidence saved next to the sidecars' logs."""
    receipts = direct_receipts(sidecars, bank)
    problems = []
    total = sum(balance for balance, _ in final.values())
    if total != ACCOUNTS * bank.initial:
        problems.append(f"total {total}, expected {ACCOUNTS * bank.initial}")
    verdict = bank.verdict()
    if not verdict.valid:
        problems.append(verdict.summary())
    problems.extend(verify_ledger(bank, final, receipts))
    if problems:
        evidence = sidecars.cluster.directory / f"evidence-{bank.accounts[0]}.json"
        evidence.write_text(
            json.dumps(
                {
                    "history": bank.history().to_json(),
                    "transfers": [vars(t) for t in bank.transfers.values()],
                    "final": final,
                    "receipts": {str(k): v for k, v in receipts.items()},
                },
                default=str,
            )
        )
        context = f"statuses={bank.statuses()} errors={dict(bank.errors)} evidence={evidence}"
        raise AssertionError("\n".join([*problems[:30], context]))


def run_scenario(
    sidecars: CassandraSidecars,
    bank: Bank,
    script: Callable[[Callable[[], bool]], Awaitable[None]],
    workers: int = 6,
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Set up the accounts, run ``workers`` clients while ``script`` does its faults, stop
    the clients when it returns, then settle."""

    async def main() -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
        stopped = False
        try:
            await bank.setup()
            load = asyncio.create_task(bank.run(workers, lambda: stopped))
            try:
                await script(lambda: load.done())
            finally:
                stopped = True
                await load
            return await settle(sidecars, bank)
        finally:
            await bank.close()

    try:
        return asyncio.run(main())
    except BaseException:
        print(log_tails(sidecars.cluster))
        raise


async def until(condition: Callable[[], bool], *, seconds: float) -> None:
    """Wait, polling, until ``condition`` holds or ``seconds`` pass (then the test's own
    assertions say what did not happen)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def new_bank(sidecars: CassandraSidecars, name: str, first_transfer: int, seed: int) -> Bank:
    return Bank(
        sidecars.addresses(),
        sidecars.keyspace,
        [f"{name}{i}" for i in range(ACCOUNTS)],
        seed=seed,
        first_transfer=first_transfer,
    )


# ---------------------------------------------------------------------------- tests


def test_concurrent_transfers_are_conserved_and_strictly_serializable(
    cassandra_sidecars: CassandraSidecars,
) -> None:
    sidecars = cassandra_sidecars
    bank = new_bank(sidecars, "plain", 1_000_000, seed=11)

    async def script(_: Callable[[], bool]) -> None:
        # Progress, not speed: run until 40 transfers committed (a loaded CI machine may
        # need far longer than an idle one); only a stuck cluster reaches the deadline.
        await until(lambda: bank.statuses()["ok"] >= 40, seconds=180)

    audited, direct = run_scenario(sidecars, bank, script, workers=8)
    assert bank.statuses()["ok"] >= 40, bank.statuses()
    assert audited == direct
    judge(sidecars, bank, direct)
    p50, p99 = bank.latency_ms()
    print(f"cassandra store: {bank.statuses()} commit p50={p50:.1f}ms p99={p99:.1f}ms")


def test_sigkill_one_sidecar_mid_load(cassandra_sidecars: CassandraSidecars) -> None:
    sidecars = cassandra_sidecars
    bank = new_bank(sidecars, "kill1", 2_000_000, seed=22)
    victim = 2
    victim_address = sidecars.cluster.sidecars[victim].address
    others = [a for a in sidecars.addresses() if a != victim_address]
    marks: dict[str, float] = {}

    async def script(_: Callable[[], bool]) -> None:
        await until(lambda: bank.statuses()["ok"] >= 10, seconds=120)
        marks["kill"] = time.monotonic()
        sidecars.cluster.sidecars[victim].kill()
        # Dead, it writes no more: what follows in its log is the restart's alone.
        marks["log_offset"] = log_size(sidecars.cluster, victim)
        await until(lambda: len(committed_while_down()) >= 5, seconds=120)
        marks["restart"] = time.monotonic()
        await asyncio.to_thread(sidecars.cluster.restart, victim, 60.0)
        marks["serving"] = time.monotonic()
        # Clients that fled the dead sidecar stay where they went; send some to it again,
        # until it has committed a few (it first learns what it missed) or time is up.
        give_up = time.monotonic() + 120

        def caught_up() -> bool:
            return len(committed_by_victim()) >= 5 or time.monotonic() > give_up

        await bank.run(2, caught_up, addresses=[victim_address], first_process=100)

    def committed_while_down() -> list[Commit]:
        return [c for c in bank.commits if c.at > marks["kill"] + 0.5 and c.address in others]

    def committed_by_victim() -> list[Commit]:
        return [c for c in bank.commits if c.at > marks["serving"] and c.address == victim_address]

    audited, direct = run_scenario(sidecars, bank, script)
    assert audited == direct
    judge(sidecars, bank, direct)
    while_down = [
        c
        for c in bank.commits
        if marks["kill"] + 0.5 < c.at < marks["restart"] and c.address in others
    ]
    assert len(while_down) >= 5, f"the others committed only {len(while_down)} while one was down"
    after = committed_by_victim()
    assert len(after) >= 5, f"the restarted sidecar committed only {len(after)}"
    catch_up = after[0].at - marks["serving"]
    log = sidecar_log(sidecars.cluster, victim, since=int(marks["log_offset"]))
    replayed = [int(n) for n in re.findall(r"replayed=(\d+)", log)]
    assert len(replayed) == 1 and replayed[0] > 0, f"the restart replayed no journal: {replayed}"
    # It caught up: what it reads is what Cassandra holds, and nothing is left pending on it.
    with Client(victim_address, timeout=30) as client:
        t = Transaction()
        for account in bank.accounts:
            t.let(account, sidecars.keyspace, "accounts", account)
        rows = client.transact(t).rows
    assert {a: (r["balance"], r["tag"]) for a, r in rows.items() if r} == direct
    restart = marks["serving"] - marks["restart"]
    print(
        f"kill one: {bank.statuses()} committed while down={len(while_down)}, "
        f"by the restarted one={len(after)}, restart took {restart:.1f}s, "
        f"its first commit {catch_up:.1f}s after that"
    )


# With one of three sidecars dead the other two are a quorum: the kill may cost a timeout
# (a re-send, a recovery delay, a writer takeover), not tens of seconds. Before the
# recovering replica wrote the recovered outcome itself, the survivors answered nothing for
# 12.0-25.6 s (4 runs; 17-45 s seen elsewhere); since, 1.3-6.7 s (6 runs), and 1.6-1.8 s
# over the embedded store, where every replica writes. Right after the kill test before it
# the survivors had learned a long recover delay from its load: 5.9-8.4 s here, 10.8 s in a
# CI run. Since the transport tells the node that the dead peer cannot be reached, its
# transactions are recovered after the floor: 1.2 s in both such runs.
KILL_GAP_BOUND_SECONDS = 10.0
ANSWERS_AFTER_KILL = 60


def longest_gap(times: list[float], start: float) -> float:
    """The longest time without an answer from ``start`` to the last answer."""
    points = [start, *sorted(t for t in times if t > start)]
    return max(b - a for a, b in itertools.pairwise(points)) if len(points) > 1 else 0.0


def test_one_dead_sidecar_costs_the_survivors_only_a_short_gap(
    cassandra_sidecars: CassandraSidecars,
) -> None:
    sidecars = cassandra_sidecars
    bank = new_bank(sidecars, "gap", 4_000_000, seed=44)
    victim = 2
    victim_address = sidecars.cluster.sidecars[victim].address
    marks: dict[str, float] = {}

    def answered_after_kill() -> list[float]:
        return [c.at for c in bank.commits if c.at > marks["kill"] and c.address != victim_address]

    async def script(_: Callable[[], bool]) -> None:
        await until(lambda: len(bank.commits) >= 20, seconds=120)
        marks["kill"] = time.monotonic()
        sidecars.cluster.sidecars[victim].kill()
        # Progress, not time: a number of answers from the survivors (hang guard 180 s).
        await until(lambda: len(answered_after_kill()) >= ANSWERS_AFTER_KILL, seconds=180)

    try:
        audited, direct = run_scenario(sidecars, bank, script, workers=8)
    finally:
        sidecars.all_serving()
    assert audited == direct
    judge(sidecars, bank, direct)
    answers = answered_after_kill()
    assert len(answers) >= ANSWERS_AFTER_KILL, f"only {len(answers)} answers after the kill"
    gap = longest_gap(answers, marks["kill"])
    print(f"kill gap: longest {gap:.1f}s without an answer, {bank.statuses()}")
    assert gap <= KILL_GAP_BOUND_SECONDS, f"the survivors answered nothing for {gap:.1f}s"


def test_sigkill_all_sidecars_at_once_mid_load(cassandra_sidecars: CassandraSidecars) -> None:
    sidecars = cassandra_sidecars
    bank = new_bank(sidecars, "killall", 3_000_000, seed=33)
    marks: dict[str, float] = {}

    async def script(_: Callable[[], bool]) -> None:
        await until(lambda: bank.statuses()["ok"] >= 10, seconds=120)
        marks["kill"] = time.monotonic()
        processes = [s.process for s in sidecars.cluster.sidecars.values() if s.process]
        for process in processes:  # SIGKILL all three before waiting for any
            process.send_signal(signal.SIGKILL)
        for process in processes:
            await asyncio.to_thread(process.wait, 10)
        marks["restart"] = time.monotonic()
        for node_id in sidecars.cluster.sidecars:
            await asyncio.to_thread(sidecars.cluster.sidecars[node_id].start)
        await asyncio.to_thread(sidecars.cluster.wait_all, 60.0)
        marks["serving"] = time.monotonic()
        # Load goes on until the restarted cluster has committed a few (each sidecar first
        # recovers what the crash left in flight), or time is up.
        give_up = time.monotonic() + 120
        while len(committed_after()) < 10 and time.monotonic() < give_up:
            await asyncio.sleep(0.2)

    def committed_after() -> list[Commit]:
        return [c for c in bank.commits if c.at > marks["serving"]]

    audited, direct = run_scenario(sidecars, bank, script)
    assert audited == direct
    judge(sidecars, bank, direct)
    after = committed_after()
    assert len(after) >= 10, f"only {len(after)} commits after the restart"
    catch_up = after[0].at - marks["serving"]
    info = bank.statuses()["info"]
    print(
        f"kill all: {bank.statuses()} commits after restart={len(after)}, unknown outcomes={info}, "
        f"restart took {marks['serving'] - marks['restart']:.1f}s, "
        f"first commit {catch_up:.1f}s after that"
    )


def test_unusable_tables_are_named_and_the_rest_serves(
    cassandra_sidecars: CassandraSidecars,
) -> None:
    sidecars = cassandra_sidecars
    address = sidecars.addresses()[0]
    ks = sidecars.keyspace
    # Counted from here: the shared sidecars may have retried for earlier tests' faults.
    retries = {n: _data_retries(s.metrics_address) for n, s in sidecars.cluster.sidecars.items()}
    with Client(address, timeout=30) as client:
        for table, key, reason in (
            ("profiles", "p1", "map<text, int>"),
            ("events", "e1", "clustering"),
        ):
            t = Transaction()
            t.let("x", ks, table, key)
            with pytest.raises(TransactionError) as caught:
                client.transact(t)
            assert caught.value.code == "INVALID_ARGUMENT"
            assert f"{ks}.{table}" in caught.value.message and reason in caught.value.message
        # A composite partition key and narrow types work end to end.
        write = Transaction().update(ks, "items", ("eu", 1), qty=2_147_483_646, small=126)
        assert client.transact(write).applied
        bump = Transaction()
        item = bump.let("item", ks, "items", ("eu", 1))
        bump.update(ks, "items", ("eu", 1), qty=item["qty"] + 1, small=item["small"] + 1)
        assert client.transact(bump).applied
        # One more would overflow int and tinyint: the transaction fails, nothing is written,
        # and the row stays usable (no replica is stuck retrying a write Cassandra refuses).
        result = client.transact(bump)
        assert not result.applied and result.error and "items.qty (int)" in result.error
        check = Transaction()
        check.let("item", ks, "items", ("eu", 1))
        row = client.transact(check).rows["item"]
        assert row is not None and (row["qty"], row["small"]) == (2_147_483_647, 127)
    after = {n: _data_retries(s.metrics_address) for n, s in sidecars.cluster.sidecars.items()}
    assert after == retries, f"data retries {retries} -> {after}"


def _data_retries(metrics_address: str) -> float:
    return metrics_of(metrics_address)["accord_data_retries_total"]


def test_the_store_is_last_write_wins_by_execute_at(
    cassandra_sidecars: CassandraSidecars,
) -> None:
    # Replays (recovery, every replica writing the same outcome) must change nothing, and an
    # older write landing late must lose to a newer one. A read simply reads the table: a
    # transaction's writes reach it only once its outcome is chosen (docs/accord.md).
    sidecars = cassandra_sidecars
    ks = sidecars.keyspace
    cluster = sidecars.session.cluster
    catalog = Catalog(tables_from_cluster(cluster.metadata, [ks]))
    # The store judges a read's lateness by its clock: this test's timestamps are its now.
    store = CassandraDataStore(
        sidecars.session, catalog, clock=lambda: HLC_BASE_MICROS / 1e6 + 10_000
    )
    key = catalog.table(ks, "accounts").key(["lww"])
    fresh = catalog.table(ks, "accounts").key(["never-written"])

    def at(micros: int) -> Timestamp:
        return Timestamp(1, HLC_BASE_MICROS + 10_000_000_000 + micros, 1, 1)

    async def read(*keys: Key) -> dict[Key, object]:
        asked = list(keys or [key])
        read = await store.read([RowAt(k) for k in asked], at(1_000))
        return {k: read[k].get(RowAt(k)) for k in asked}

    async def scenario() -> None:
        assert await read(fresh) == {fresh: None}
        await store.write([WriteOp(key, (5, 1))], at(20))
        assert await read(key, fresh) == {key: (5, 1), fresh: None}
        await store.write([WriteOp(key, (6, 2))], at(25))
        await store.write([WriteOp(key, (5, 1))], at(20))  # a late replay of the older one
        assert await read() == {key: (6, 2)}
        await store.write([WriteOp(key, None, delete=True)], at(30))
        assert await read() == {key: None}
        await store.write([WriteOp(key, (6, 2))], at(25))
        assert await read() == {key: None}
        await store.write([WriteOp(key, (None, None))], at(40))
        assert await read() == {key: (None, None)}

    asyncio.run(scenario())


def test_deletes_through_the_sidecars(cassandra_sidecars: CassandraSidecars) -> None:
    sidecars = cassandra_sidecars
    ks = sidecars.keyspace
    first, second = sidecars.addresses()[:2]
    with Client(first, timeout=30) as one, Client(second, timeout=30) as other:
        assert one.transact(Transaction().update(ks, "accounts", "gone", balance=1, tag=0)).applied
        assert other.transact(Transaction().delete(ks, "accounts", "gone")).applied
        read = Transaction()
        read.let("row", ks, "accounts", "gone")
        assert one.transact(read).rows == {"row": None}
        bump = Transaction()
        row = bump.let("row", ks, "accounts", "gone")
        bump.where(row["balance"].is_null())
        bump.update(ks, "accounts", "gone", balance=7)
        result = other.transact(bump)
        assert result.applied and result.rows == {"row": None}
        assert one.transact(read).rows == {"row": {"balance": 7, "tag": None}}
