"""SidecarHost: a pump that cannot journal stops the sidecar instead of leaving it stuck, and
stop() never waits on data work that cannot finish."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from accord import Put, Timestamp, Txn, Update, WriteOp, ring_topology, sim_key
from accord.api import JournalRecord
from accord.primitives import Const
from accord_cassandra.host import SidecarHost
from accord_cassandra.journal import FileJournal
from accord_cassandra.memory_store import MemoryDataStore


class FullDisk(FileJournal):
    def append_sync(self, records: Sequence[JournalRecord]) -> None:
        raise OSError(28, "No space left on device")


def test_a_journal_failure_fails_the_host(tmp_path: Path) -> None:
    async def scenario() -> None:
        key = sim_key("k")
        host = SidecarHost(
            1,
            ring_topology([1], 1, shards_per_node=1),
            FullDisk(tmp_path, fsync=False),
            MemoryDataStore(),
            send=lambda envelope: None,
        )
        host.start()
        submitted = asyncio.create_task(
            host.submit(Txn(reads=(), update=Update((Put(key, Const(1)),))), timeout=10)
        )
        await asyncio.wait_for(host.failed.wait(), timeout=10)
        assert isinstance(host.failure, OSError) and host.failure.errno == 28
        await host.stop()
        with pytest.raises(RuntimeError, match="shutting down"):
            await submitted

    asyncio.run(scenario())


def test_a_clean_stop_is_not_a_failure(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = SidecarHost(
            1,
            ring_topology([1], 1, shards_per_node=1),
            FileJournal(tmp_path, fsync=False),
            MemoryDataStore(),
            send=lambda envelope: None,
        )
        host.start()
        await asyncio.sleep(0.05)  # a few ticks
        await host.stop()
        assert not host.failed.is_set()

    asyncio.run(scenario())


class BrokenStore(MemoryDataStore):
    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def write(self, writes: Sequence[WriteOp], execute_at: Timestamp) -> None:
        self.attempts += 1
        raise ConnectionError("the data store is unreachable")


def test_stop_cancels_data_work_that_keeps_failing(tmp_path: Path) -> None:
    # A write that can never land used to keep stop() (and so SIGTERM) waiting forever.
    async def scenario() -> None:
        store = BrokenStore()
        host = SidecarHost(
            1,
            ring_topology([1], 1, shards_per_node=1),
            FileJournal(tmp_path, fsync=False),
            store,
            send=lambda envelope: None,
        )
        host.start()
        submitted = asyncio.create_task(
            host.submit(Txn(reads=(), update=Update((Put(sim_key("k"), Const(1)),))), timeout=60)
        )
        while store.attempts < 2:  # the write failed and is being retried
            await asyncio.sleep(0.01)
        assert host.pending_data_ops() == 1
        stopping = asyncio.create_task(host.stop())
        await asyncio.wait({stopping}, timeout=30)  # never cancels stop(), unlike wait_for
        assert stopping.done(), "stop() is still waiting on the failing write"
        assert host.pending_data_ops() == 0
        submitted.cancel()
        if not stopping.done():
            stopping.cancel()

    asyncio.run(scenario())
