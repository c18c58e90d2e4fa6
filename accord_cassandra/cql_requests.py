"""Statements to Cassandra through cassandra-driver, awaited on the event loop.

A request may carry native protocol v5's ``now_in_seconds`` (the driver has no field for
it: :func:`now_in_seconds_handler` adds it), and a transaction's writes go in few UNLOGGED
batches (:func:`write_chunks`) under Cassandra's batch warning thresholds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from accord import Key, WriteOp
from accord.api import value_size

REQUEST_TIMEOUT_SECONDS = 10.0
"""The driver's deadline per statement: how long after its lateness check a read may still
be in flight."""

# Native protocol v5's <now_in_seconds> query parameter, carried to the protocol handler in a
# custom payload entry of this name (never sent to Cassandra).
_NOW_KEY = "accord-cassandra.now-in-seconds"
_NOW_IN_SECONDS_FLAG = 0x0100
WRITE_BATCH_PARTITIONS_MAX = 10
"""Most partitions one UNLOGGED batch of a transaction's writes names: Cassandra warns above
``unlogged_batch_across_partitions_warn_threshold`` (10 by default)."""
WRITE_BATCH_BYTES_MAX = 4096
"""Most estimated bytes (:func:`write_size`) one batch of several partitions carries:
Cassandra warns on every batch above ``batch_size_warn_threshold`` (5 KiB by default) and
refuses one above ``batch_size_fail_threshold`` (50 KiB); the estimate is above its count."""
WRITE_ROW_OVERHEAD_BYTES = 64
WRITE_CELL_OVERHEAD_BYTES = 24


def write_size(write: WriteOp) -> int:
    """An upper estimate of what Cassandra counts for ``write`` against its batch size
    thresholds: values and keys, plus per-row and per-cell metadata (timestamps, TTLs,
    liveness)."""
    value = write.value
    cells = len(value) if type(value) is tuple else 1
    keys = len(write.key.name) + value_size(write.clustering)
    return WRITE_ROW_OVERHEAD_BYTES + WRITE_CELL_OVERHEAD_BYTES * cells + value_size(value) + keys


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedWrite:
    """One write of a transaction, ready for the driver."""

    key: Key
    statement: Any
    values: list[object]
    now: int | None  # native protocol v5's now_in_seconds, None: Cassandra's own clock
    size: int  # write_size


def write_chunks(planned: Sequence[PlannedWrite]) -> list[list[PlannedWrite]]:
    """``planned`` cut into requests: writes with one ``now`` (a request has one), one
    partition's writes together (Cassandra applies them as one mutation), up to
    :data:`WRITE_BATCH_PARTITIONS_MAX` partitions and :data:`WRITE_BATCH_BYTES_MAX` bytes
    per chunk; a partition larger than that alone, split by bytes if it must."""
    groups: dict[int | None, dict[Key, list[PlannedWrite]]] = {}
    for write in planned:
        groups.setdefault(write.now, {}).setdefault(write.key, []).append(write)
    chunks: list[list[PlannedWrite]] = []
    for partitions in groups.values():
        chunk: list[PlannedWrite] = []
        keys = size = 0
        for writes in partitions.values():
            bytes_ = sum(write.size for write in writes)
            if chunk and (
                keys >= WRITE_BATCH_PARTITIONS_MAX or size + bytes_ > WRITE_BATCH_BYTES_MAX
            ):
                chunks.append(chunk)
                chunk, keys, size = [], 0, 0
            if bytes_ > WRITE_BATCH_BYTES_MAX:
                piece: list[PlannedWrite] = []
                piece_size = 0
                for write in writes:
                    if piece and piece_size + write.size > WRITE_BATCH_BYTES_MAX:
                        chunks.append(piece)
                        piece, piece_size = [], 0
                    piece.append(write)
                    piece_size += write.size
                chunks.append(piece)
                continue
            chunk += writes
            keys += 1
            size += bytes_
        if chunk:
            chunks.append(chunk)
    return chunks


def now_payload(now_in_seconds: int | None) -> dict[str, bytes] | None:
    if now_in_seconds is None:
        return None
    return {_NOW_KEY: now_in_seconds.to_bytes(8, "big", signed=True)}


async def execute(
    session: Any,
    statement: Any,
    values: Sequence[object] | None,
    now_in_seconds: int | None = None,
    warned: Callable[[Sequence[str]], None] | None = None,
) -> list[Any]:
    """Run a prepared statement (or a batch: ``values`` None) and await its rows from the
    driver's I/O thread; with ``now_in_seconds``, Cassandra takes that as the current time
    (TTLs, expiry). ``warned`` is called (on the I/O thread) with Cassandra's warnings."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[Any]] = loop.create_future()

    def done(rows: Any) -> None:
        if warned is not None:
            warnings = getattr(response, "warnings", None)
            if warnings:
                warned(list(warnings))
        loop.call_soon_threadsafe(_settle, future, list(rows or []), None)

    def failed(error: BaseException) -> None:
        loop.call_soon_threadsafe(_settle, future, None, error)

    response = session.execute_async(
        statement,
        None if values is None else list(values),
        custom_payload=now_payload(now_in_seconds),
        timeout=REQUEST_TIMEOUT_SECONDS,
    )
    response.add_callbacks(done, failed)
    return await future


async def execute_pages(
    session: Any, statement: Any, values: Sequence[object], page: int, now_in_seconds: int
) -> AsyncIterator[list[Any]]:
    """The pages (``page`` rows each) of a prepared read, fetched one at a time as the
    caller asks for the next."""
    loop = asyncio.get_running_loop()
    pages: asyncio.Queue[tuple[list[Any], BaseException | None]] = asyncio.Queue()
    bound = statement.bind(list(values))
    bound.fetch_size = page
    response = session.execute_async(
        bound, custom_payload=now_payload(now_in_seconds), timeout=REQUEST_TIMEOUT_SECONDS
    )
    # The driver calls these once per page it fetches.
    response.add_callbacks(
        lambda rows: loop.call_soon_threadsafe(pages.put_nowait, (list(rows or []), None)),
        lambda error: loop.call_soon_threadsafe(pages.put_nowait, ([], error)),
    )
    while True:
        rows, error = await pages.get()
        if error is not None:
            raise error
        yield rows
        if not response.has_more_pages:
            return
        response.start_fetching_next_page()


def now_in_seconds_handler(base: Any) -> Any:
    """``base`` (a driver protocol handler), sending an EXECUTE whose custom payload names a
    "now" with native protocol v5's ``now_in_seconds`` instead: Cassandra then computes a
    TTL'd cell's expiry, and ``TTL(col)``, from that time rather than its own clock."""
    from cassandra.protocol import (
        BatchMessage,
        ExecuteMessage,
        ProtocolVersion,
        write_int,
        write_string,
    )

    if getattr(base, "accord_now_in_seconds", False):
        return base

    class AtNow:
        """A message carrying now_in_seconds (the driver has no field for it): its body as
        the driver writes it, the flag set, the time last."""

        def __init__(self, message: Any, now: int) -> None:
            self.message = message
            self.now = now
            self.opcode = message.opcode
            self.tracing = message.tracing
            rest = {k: v for k, v in message.custom_payload.items() if k != _NOW_KEY}
            self.custom_payload = rest or None

        def send_body(self, f: Any, protocol_version: int) -> None:
            if not ProtocolVersion.uses_int_query_flags(protocol_version):
                raise ValueError(f"now_in_seconds needs protocol v5, not v{protocol_version}")
            body, flags_at = self.body(protocol_version)
            flags = int.from_bytes(body[flags_at : flags_at + 4], "big") | _NOW_IN_SECONDS_FLAG
            body[flags_at : flags_at + 4] = flags.to_bytes(4, "big")
            f.write(bytes(body))
            write_int(f, self.now)

        def body(self, protocol_version: int) -> tuple[bytearray, int]:
            """The driver's body of an EXECUTE, and where its <flags>[int] sit."""
            message = self.message
            out = io.BytesIO()
            write_string(out, message.query_id)
            if ProtocolVersion.uses_prepared_metadata(protocol_version):
                write_string(out, message.result_metadata_id)
            # <consistency>[short] <flags>[int] ... (the query parameters).
            flags_at = out.tell() + 2
            message._write_query_params(out, protocol_version)
            return bytearray(out.getvalue()), flags_at

    class BatchAtNow(AtNow):
        def body(self, protocol_version: int) -> tuple[bytearray, int]:
            """The driver's body of a BATCH: ... <consistency>[short] <flags>[int], then the
            optional <serial_consistency>[short] <timestamp>[long] <keyspace>[string]."""
            message = self.message
            out = io.BytesIO()
            message.send_body(out, protocol_version)
            tail = 4 + (2 if message.serial_consistency_level else 0)
            tail += 8 if message.timestamp is not None else 0
            if message.keyspace is not None:
                tail += 2 + len(message.keyspace.encode("utf-8"))
            body = bytearray(out.getvalue())
            return body, len(body) - tail

    class Handler(base):  # type: ignore[misc]
        accord_now_in_seconds = True

        @classmethod
        def encode_message(
            cls,
            msg: Any,
            stream_id: int,
            protocol_version: int,
            compressor: Any,
            allow_beta_protocol_version: bool,
        ) -> Any:
            payload = msg.custom_payload
            if payload and _NOW_KEY in payload:
                now = int.from_bytes(payload[_NOW_KEY], "big", signed=True)
                if isinstance(msg, ExecuteMessage):
                    msg = AtNow(msg, now)
                elif isinstance(msg, BatchMessage):
                    msg = BatchAtNow(msg, now)
            return super().encode_message(
                msg, stream_id, protocol_version, compressor, allow_beta_protocol_version
            )

    return Handler


def _settle(
    future: asyncio.Future[list[Any]], rows: list[Any] | None, error: BaseException | None
) -> None:
    if future.done():  # cancelled while the driver worked
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(rows or [])
