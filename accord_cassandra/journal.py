"""The sidecar's durable journal: an append-only local file with group commit.

Why a local file: every protocol reply that promises something waits for the journal, so
its latency is on every transaction's critical path. An fsync of an appended block on
local disk costs about a millisecond (measured by ``bench``/the closing note), with many
records per fsync under load (group commit), where a Cassandra write would add a network
round trip and a quorum, and SQLite's WAL adds page management for what is a pure log.

Format: a sequence of frames ``[u32 length][u32 crc32][payload]`` (big-endian), the payload
being one record in the accord codec (:func:`accord.codec.encode_record`). A
crash can leave a torn final frame; replay stops there and truncates it, since nothing in a
torn frame was ever acknowledged (the fsync had not returned). A bad frame *followed by good
ones* is corruption, and the sidecar refuses to start rather than forget promises.

The CRC is seeded with the frame's own file offset. Payloads carry client values verbatim
(a blob can hold any bytes, including a well-formed frame), and telling a torn tail from
corruption means looking for good frames after a bad one: with the offset in the CRC, bytes
inside a value never pass for a frame, so a crash that cuts the file just after such a
value is still a torn tail and not a journal the sidecar refuses to open.

On open, a journal larger than ``compact_bytes`` is rewritten with only the latest
snapshot of each transaction and the highest HLC floor (write, fsync, rename, fsync dir).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accord.api import AsyncJournal, CommandSnapshot, Durable, HlcFloor, JournalRecord
from accord.codec import CodecError, decode_record, encode_record
from accord_cassandra.errors import AccordCassandraError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")
MAX_RECORD_BYTES = 16 * 1024 * 1024


class JournalCorrupt(AccordCassandraError, RuntimeError):
    """The journal has a damaged frame before its end: refusing to guess."""


class FileJournal:
    """Append-only, fsync'd journal of one sidecar's protocol state."""

    def __init__(
        self, directory: Path, *, compact_bytes: int = 256 * 1024 * 1024, fsync: bool = True
    ) -> None:
        self.directory = directory
        self.path = directory / "journal.log"
        self.compact_bytes = compact_bytes
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self.truncated_bytes = 0
        self.records = self._load()
        if self.path.exists() and self.path.stat().st_size > compact_bytes:
            self._compact()
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held for the process lifetime
        self._size = self.path.stat().st_size  # where the next frame starts (its CRC seed)
        self.syncs = 0
        self.sync_seconds = 0.0
        self.appended = 0
        # Appends run in order on a thread of their own (the host awaits each): the fsync
        # must not block the event loop. A bare queue and a future the thread settles, not
        # an executor: the default one's submit (context copy, thread-count checks) showed
        # in a saturated sidecar's profile, and a ThreadPoolExecutor's per-call future
        # (a Condition, its chaining to an asyncio future) cost more than the handoff.
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ replay

    def _load(self) -> list[JournalRecord]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        records: list[JournalRecord] = []
        offset = 0
        good_end = 0
        while offset < len(data):
            record, next_offset = self._frame(data, offset)
            if record is None:
                if self._has_good_frame_after(data, offset):
                    raise JournalCorrupt(
                        f"{self.path}: damaged frame at byte {offset} before the end"
                    )
                break
            records.append(record)
            offset = good_end = next_offset
        if good_end < len(data):
            # A torn tail from a crash mid-append: it was never acknowledged. Said out loud,
            # with its size: a file that is not a journal at all also ends up here.
            logger.warning(
                "%s: dropping %d bytes after the last valid frame (byte %d of %d): a torn "
                "tail from a crash, or not a journal written by this sidecar",
                self.path,
                len(data) - good_end,
                good_end,
                len(data),
            )
            self.truncated_bytes = len(data) - good_end
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)
                os.fsync(handle.fileno())
        return records

    @staticmethod
    def _frame(data: bytes, offset: int) -> tuple[JournalRecord | None, int]:
        if offset + _HEADER.size > len(data):
            return None, offset
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        end = start + length
        if length > MAX_RECORD_BYTES or end > len(data):
            return None, offset
        payload = data[start:end]
        if _crc(payload, offset) != crc:
            return None, offset
        try:
            return decode_record(payload), end
        except CodecError:
            return None, offset

    def _has_good_frame_after(self, data: bytes, offset: int) -> bool:
        # Scan forward for any intact frame; cheap because this only runs on a bad frame.
        for candidate in range(offset + 1, max(offset + 1, len(data) - _HEADER.size)):
            record, _ = self._frame(data, candidate)
            if record is not None:
                return True
        return False

    def _compact(self) -> None:
        latest: dict[object, CommandSnapshot] = {}
        durable: dict[object, None] = {}
        floor = 0
        for record in self.records:
            if isinstance(record, HlcFloor):
                floor = max(floor, record.value)
            elif isinstance(record, Durable):
                durable.update(dict.fromkeys(record.txn_ids))
            else:
                latest[record.txn_id] = record
        kept: list[JournalRecord] = [HlcFloor(floor), *latest.values()]
        ids = tuple(r.txn_id for r in latest.values() if r.txn_id in durable)
        if ids:
            # After the snapshots, as when first written: restore marks known commands.
            kept.append(Durable(ids))
        temporary = self.path.with_suffix(".compact")
        with open(temporary, "wb") as handle:
            handle.write(_frames(kept, 0))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        _fsync_directory(self.directory)
        self.records = kept

    # ------------------------------------------------------------------ append

    def append_sync(self, records: Sequence[JournalRecord]) -> None:
        """Write ``records`` and make them durable before returning (one fsync)."""
        if not records:
            return
        data = memoryview(_frames(records, self._size))
        written = 0
        while written < len(data):  # an unbuffered write may be short
            written += self._file.write(data[written:]) or 0
        self._size += len(data)
        if self.fsync:
            started = time.perf_counter()
            os.fsync(self._file.fileno())
            self.sync_seconds += time.perf_counter() - started
            self.syncs += 1
        self.appended += len(records)

    async def append(self, records: Sequence[JournalRecord]) -> None:
        """Write ``records`` and return once they are durable (raising what the write
        raised). A caller cancelled while it waits does not stop the write."""
        if not records:
            return
        if self._closed:
            raise RuntimeError(f"{self.path}: the journal is closed")
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="journal", daemon=True)
            self._writer.start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._requests.put(_Request(records, done, loop))
        await done

    def _write_loop(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                self.append_sync(request.records)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting caller
                request.loop.call_soon_threadsafe(_settle, request.done, error)
            else:
                request.loop.call_soon_threadsafe(_settle, request.done, None)

    def replay(self) -> list[JournalRecord]:
        return list(self.records)

    def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._requests.put(None)  # after every append already queued
            self._writer.join()
        self._file.close()


@dataclass(frozen=True)
class _Request:
    records: Sequence[JournalRecord]
    done: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():  # its caller was cancelled; the write still happened (or failed)
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


# The sidecar's journal is the awaited form of accord.api's Journal (checked by mypy).
_JOURNAL: type[AsyncJournal] = FileJournal


def _crc(payload: bytes, offset: int) -> int:
    return zlib.crc32(payload, zlib.crc32(offset.to_bytes(8, "big")))


def _frame_bytes(record: JournalRecord, offset: int) -> bytes:
    """One frame for ``record``, to be written at byte ``offset`` of the file."""
    payload = encode_record(record)
    return _HEADER.pack(len(payload), _crc(payload, offset)) + payload


def _frames(records: Sequence[JournalRecord], offset: int) -> bytes:
    frames = []
    for record in records:
        frame = _frame_bytes(record, offset)
        frames.append(frame)
        offset += len(frame)
    return b"".join(frames)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
