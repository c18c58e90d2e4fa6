"""Admission control: a slot is held while its transaction is in the protocol, waiters are
served oldest first without walking every waiter on each release, and a burst beyond what
a key can finish is refused at once (RESOURCE_EXHAUSTED: definite, nothing submitted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from accord import Key, NodeConfig, Put, Txn, Update, ring_topology, sim_key
from accord.primitives import Const
from accord_cassandra.host import Admission, Overloaded, SidecarHost
from accord_cassandra.journal import FileJournal
from accord_cassandra.memory_store import MemoryDataStore


def test_a_slot_stays_taken_until_the_node_answers_not_until_the_caller_gives_up(
    tmp_path: Path,
) -> None:
    """Before: a caller's timeout freed its slot while its transaction was still in the
    protocol, so a burst put ever more undecided transactions on a hot key (at 10,500
    concurrent, thousands, recovered one by one for minutes afterwards)."""

    async def scenario() -> None:
        key = sim_key("hot")
        # Node 1 of 3 whose messages go nowhere: no quorum, so its transaction stays in
        # the protocol until the node's own client timeout (1 s) answers "unknown".
        host = SidecarHost(
            1,
            ring_topology([1, 2, 3], 3, shards_per_node=1),
            FileJournal(tmp_path, fsync=False),
            MemoryDataStore(),
            send=lambda envelope: None,
            config=NodeConfig(client_timeout_micros=1_000_000),
            admission=Admission(per_key=1),
        )
        host.start()
        txn = Txn(reads=(), update=Update((Put(key, Const(1)),)))
        with pytest.raises(TimeoutError):
            await host.submit(txn, timeout=0.2)
        assert host.admission.in_flight == {key: 1}, "the caller left, the txn did not"
        # A second transaction on the key waits for that slot; it is refused, definitely,
        # while the first is still in the protocol.
        with pytest.raises(Overloaded, match="no slot freed"):
            await host.submit(txn, timeout=0.4)
        deadline = asyncio.get_running_loop().time() + 10
        while host.admission.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert host.admission.in_flight == {}, "the node's answer frees the slot"
        assert host.pending_clients() == 0
        await host.stop()

    asyncio.run(scenario())


def test_releases_look_only_at_the_waiters_they_can_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every release walked the whole list of waiters (and each timeout rebuilt
    it), quadratic in a burst: 2,000 waiters on one key cost ~2 million checks."""
    checks = 0
    fits = Admission._fits

    def counted(self: Admission, keys: tuple[Key, ...]) -> bool:
        nonlocal checks
        checks += 1
        return fits(self, keys)

    monkeypatch.setattr(Admission, "_fits", counted)
    waiters = 2_000

    async def scenario() -> list[int]:
        admission = Admission(per_key=1, max_waiting=10_000, max_waiting_per_key=10_000)
        hot = (sim_key("hot"),)
        order: list[int] = []

        async def one(i: int) -> None:
            await admission.enter(hot, timeout=60)
            order.append(i)
            await asyncio.sleep(0)
            admission.leave(hot)

        await asyncio.gather(*(one(i) for i in range(waiters)))
        return order

    order = asyncio.run(scenario())
    assert order == list(range(waiters)), "oldest first"
    assert checks < 10 * waiters, checks


def test_waiters_that_another_key_blocks_do_not_hold_up_the_rest() -> None:
    async def scenario() -> list[str]:
        admission = Admission(per_key=1)
        a, b = sim_key("a"), sim_key("b")
        granted: list[str] = []
        await admission.enter((b,), timeout=1)  # b is busy

        async def wait(name: str, keys: tuple[Key, ...]) -> None:
            await admission.enter(keys, timeout=5)
            granted.append(name)

        await admission.enter((a,), timeout=1)  # a is busy too
        both = asyncio.create_task(wait("a+b", (a, b)))
        only_a = asyncio.create_task(wait("a", (a,)))
        await asyncio.sleep(0.01)
        admission.leave((a,))  # a frees: the older waiter still needs b, the younger fits
        await asyncio.sleep(0.01)
        assert granted == ["a"]
        admission.leave((a,))
        admission.leave((b,))
        await asyncio.wait_for(both, 1)
        await only_a
        return granted

    assert asyncio.run(scenario()) == ["a", "a+b"]


def test_a_key_refuses_waiters_beyond_its_bound_at_once() -> None:
    async def scenario() -> None:
        admission = Admission(per_key=1, max_waiting_per_key=2)
        hot = (sim_key("hot"),)
        await admission.enter(hot, timeout=1)
        waiting = [asyncio.create_task(admission.enter(hot, timeout=5)) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert admission.waiting == 2
        with pytest.raises(Overloaded, match="2 waiting"):
            await admission.enter(hot, timeout=5)
        admission.leave(hot)
        await asyncio.wait_for(waiting[0], 1)
        admission.leave(hot)
        await asyncio.wait_for(waiting[1], 1)
        admission.leave(hot)
        assert admission.in_flight == {} and admission.waiting == 0

    asyncio.run(scenario())


def test_a_submission_the_node_refuses_gives_its_slot_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = SidecarHost(
            1,
            ring_topology([1], 1, shards_per_node=1),
            FileJournal(tmp_path, fsync=False),
            MemoryDataStore(),
            send=lambda envelope: None,
        )

        def refuse(request_id: int, txn: Txn) -> None:
            raise ValueError("refused by the node")

        host.node.submit = refuse  # type: ignore[method-assign,assignment]
        host.start()
        txn = Txn(reads=(), update=Update((Put(sim_key("k"), Const(1)),)))
        with pytest.raises(ValueError, match="refused by the node"):
            await host.submit(txn, timeout=1)
        await asyncio.sleep(0)  # the done callback
        assert host.admission.in_flight == {} and host.pending_clients() == 0
        await host.stop()

    asyncio.run(scenario())
