"""FileJournal: what was appended comes back, a torn tail is dropped, damage is refused.

The crash model is SIGKILL: the kernel keeps every byte a ``write`` put in the page cache,
so a crash can only cut the file short, somewhere inside the last append. Every such cut
must replay the records before it; anything else (a bad frame with good frames after it)
is corruption, and the sidecar must refuse to start rather than forget promises.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.api import CommandSnapshot, HlcFloor, JournalRecord
from accord.primitives import (
    BALLOT_ZERO,
    EMPTY_DEPS,
    Const,
    Key,
    Put,
    Route,
    Status,
    Timestamp,
    Txn,
    Update,
)
from accord_cassandra.journal import FileJournal, JournalCorrupt, _frame_bytes
from tests.unit.strategies import identical, journal_records

KEY = Key(12345, "bank.accounts:616c696365")


def snapshot(
    hlc: int, status: Status = Status.PRE_ACCEPTED, payload: object = 1
) -> CommandSnapshot:
    txn = Txn(reads=(KEY,), update=Update((Put(KEY, Const(payload)),)))
    txn_id = Timestamp(1, hlc, 1, 1)
    return CommandSnapshot(
        txn_id=txn_id,
        status=status,
        txn=txn,
        route=Route(KEY, (KEY,)),
        promised=BALLOT_ZERO,
        accepted=BALLOT_ZERO,
        execute_at=txn_id if status.has_execute_at else None,
        deps=EMPTY_DEPS,
        writes=None,
        result=None,
        fast_vote=True,
        key_hint=None,
    )


def open_journal(directory: Path, **options: object) -> FileJournal:
    return FileJournal(directory, fsync=False, **options)  # type: ignore[arg-type]


def replay_of(directory: Path, **options: object) -> list[JournalRecord]:
    journal = open_journal(directory, **options)
    try:
        return journal.replay()
    finally:
        journal.close()


def same(a: list[JournalRecord], b: list[JournalRecord]) -> bool:
    return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------------- round trips


def test_append_then_replay_after_reopen(tmp_path: Path) -> None:
    first = [HlcFloor(100), snapshot(1), snapshot(2, Status.ACCEPTED)]
    second = [snapshot(1, Status.COMMITTED), HlcFloor(200)]
    journal = open_journal(tmp_path)
    assert journal.replay() == []
    journal.append_sync(first)
    journal.close()
    journal = open_journal(tmp_path)
    assert same(journal.replay(), first)
    journal.append_sync(second)
    journal.append_sync([])  # nothing to write: no frame, no sync
    journal.close()
    assert same(replay_of(tmp_path), first + second)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(journal_records, max_size=3), max_size=3))
def test_any_records_survive_a_reopen(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[JournalRecord]]
) -> None:
    directory = tmp_path_factory.mktemp("journal")
    journal = open_journal(directory)
    for batch in batches:
        journal.append_sync(batch)
    journal.close()
    assert same(replay_of(directory), [r for b in batches for r in b])


def test_fsync_is_counted_once_per_batch(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path, fsync=True)
    asyncio.run(journal.append([snapshot(1), snapshot(2), HlcFloor(5)]))
    asyncio.run(journal.append([]))
    journal.append_sync([snapshot(3)])
    assert (journal.syncs, journal.appended) == (2, 4)
    assert journal.sync_seconds > 0
    journal.close()


# ---------------------------------------------------------------------------- torn tails


def _write(directory: Path, batches: list[list[JournalRecord]]) -> list[int]:
    """Append each batch; return the file size after each."""
    journal = open_journal(directory)
    sizes = []
    for batch in batches:
        journal.append_sync(batch)
        sizes.append(journal.path.stat().st_size)
    journal.close()
    return sizes


@pytest.mark.parametrize(
    "last",
    [
        pytest.param([snapshot(9, Status.COMMITTED)], id="one-frame"),
        pytest.param([snapshot(9), HlcFloor(900), snapshot(10)], id="group-of-three"),
        # A user's blob that is itself a well-formed journal frame: a cut after it must not
        # be mistaken for "a good frame after a bad one".
        pytest.param(
            [snapshot(9, payload=b"\x00" * 7 + _frame_bytes(snapshot(77), 0) + b"\x00" * 7)],
            id="frame-inside-a-value",
        ),
    ],
)
def test_a_cut_anywhere_in_the_last_append_replays_what_came_before(
    tmp_path: Path, last: list[JournalRecord]
) -> None:
    before = [HlcFloor(100), snapshot(1), snapshot(2, Status.ACCEPTED)]
    source = tmp_path / "source"
    kept_size, full_size = _write(source, [before, last])
    data = (source / "journal.log").read_bytes()
    frame_ends = _frame_ends(data)
    for cut in range(kept_size, full_size):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / "journal.log").write_bytes(data[:cut])
        journal = open_journal(directory)
        # Whole frames before the cut come back (a group is one write, but a prefix of it
        # was never acknowledged, so keeping it is as harmless as dropping it).
        whole = sum(1 for end in frame_ends if kept_size < end <= cut)
        assert same(journal.replay(), before + last[:whole]), cut
        survivor = max([kept_size, *(e for e in frame_ends if e <= cut)])
        assert journal.path.stat().st_size == survivor, "the torn tail is truncated"
        journal.append_sync([HlcFloor(5000)])
        journal.close()
        assert same(replay_of(directory), [*before, *last[:whole], HlcFloor(5000)])
        shutil.rmtree(directory)


def _frame_ends(data: bytes) -> list[int]:
    ends, offset = [], 0
    while offset < len(data):
        offset += 8 + int.from_bytes(data[offset : offset + 4], "big")
        ends.append(offset)
    return ends


# ---------------------------------------------------------------------------- corruption


@pytest.mark.parametrize(
    ("frame", "where"),
    [(0, "payload"), (1, "payload"), (1, "crc"), (1, "length"), (0, "length-huge")],
)
def test_damage_before_the_last_frame_is_refused(tmp_path: Path, frame: int, where: str) -> None:
    records = [snapshot(1), snapshot(2), snapshot(3), HlcFloor(7)]
    _write(tmp_path, [records])
    path = tmp_path / "journal.log"
    data = bytearray(path.read_bytes())
    start = ([0, *_frame_ends(bytes(data))])[frame]
    if where == "payload":
        data[start + 8 + 5] ^= 0x40
    elif where == "crc":
        data[start + 4] ^= 0x01
    elif where == "length":
        data[start + 3] ^= 0x01
    else:
        data[start : start + 4] = (2**31).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match=rf"journal.log: damaged frame at byte {start}\b"):
        open_journal(tmp_path)
    assert path.read_bytes() == bytes(data), "a refused journal is left untouched"


# ---------------------------------------------------------------------------- compaction


def test_compaction_keeps_the_latest_snapshot_per_txn_and_the_highest_floor(
    tmp_path: Path,
) -> None:
    history: list[JournalRecord] = []
    for round_, status in enumerate(
        [Status.PRE_ACCEPTED, Status.ACCEPTED, Status.COMMITTED, Status.APPLIED]
    ):
        for hlc in (1, 2, 3):
            if hlc == 3 and status >= Status.COMMITTED:
                continue  # txn 3 stops at ACCEPTED
            history.append(snapshot(hlc, status, payload=round_))
        history.append(HlcFloor([500, 900, 300, 800][round_]))
    _write(tmp_path, [history])
    before = (tmp_path / "journal.log").stat().st_size
    journal = open_journal(tmp_path, compact_bytes=1)
    expected = [
        HlcFloor(900),
        snapshot(1, Status.APPLIED, payload=3),
        snapshot(2, Status.APPLIED, payload=3),
        snapshot(3, Status.ACCEPTED, payload=1),
    ]
    assert same(journal.replay(), expected)
    assert (tmp_path / "journal.log").stat().st_size < before
    assert not (tmp_path / "journal.compact").exists()
    journal.append_sync([snapshot(3, Status.COMMITTED, payload=9)])
    journal.close()
    # What the compacted file holds is what a reopen (without compaction) replays.
    replayed = replay_of(tmp_path)
    assert same(replayed, [*expected, snapshot(3, Status.COMMITTED, payload=9)])


def test_a_small_journal_is_not_compacted(tmp_path: Path) -> None:
    records = [snapshot(1), snapshot(1, Status.ACCEPTED), HlcFloor(3), HlcFloor(2)]
    _write(tmp_path, [records])
    assert same(replay_of(tmp_path), records)


def test_a_file_that_is_not_a_journal_is_not_dropped_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Random bytes hold no valid frame, so all of them go; a log line must say so and how
    # many (before: truncated to 0 bytes without a word).
    import random

    (tmp_path / "journal.log").write_bytes(random.Random(7).randbytes(4096))
    with caplog.at_level("WARNING", logger="accord_cassandra.journal"):
        journal = FileJournal(tmp_path, fsync=False)
    journal.close()
    assert journal.records == [] and journal.truncated_bytes == 4096
    assert [r.getMessage() for r in caplog.records if "dropping 4096 bytes" in r.getMessage()]


def test_an_awaited_append_is_on_disk_in_order_and_a_failed_one_raises(tmp_path: Path) -> None:
    """The event loop's append returns only after the writer thread wrote the records,
    appends land in the order they were awaited, a write that fails raises in the caller,
    and a closed journal refuses appends."""

    async def scenario() -> None:
        journal = open_journal(tmp_path)
        written = [snapshot(hlc) for hlc in range(1, 6)]
        for record in written:
            await journal.append([record])
            # Durable (here: written, fsync off) before the await returned.
            assert journal.appended == written.index(record) + 1
        # The caller's own thread never wrote: the writer thread did.
        assert journal._writer is not None and journal._writer.is_alive()

        def failing(records: object) -> None:
            raise OSError(28, "No space left on device")

        journal.append_sync = failing  # type: ignore[method-assign]
        with pytest.raises(OSError, match="No space"):
            await journal.append([snapshot(9)])
        journal.close()
        with pytest.raises(RuntimeError, match="closed"):
            await journal.append([snapshot(10)])
        assert replay_of(tmp_path) == written

    asyncio.run(scenario())
