"""The CQL native protocol v4 frame codec, sans I/O (native_protocol_v4.spec of apache/cassandra).

A frame is a 9-byte header ``version flags stream opcode length`` and ``length`` bytes of
body. :class:`FrameDecoder` cuts a byte stream into :class:`Frame` objects and reports what it
cannot accept as :class:`BadFrame` (the error to answer, and whether the stream can still be
framed after it). The helpers below read and write the spec's notations ([int], [string],
[bytes], [value], [string map], ...) and build the responses the endpoint answers itself.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from accord_cassandra.errors import AccordCassandraError

V4 = 4
RESPONSE = 0x80
HEADER = struct.Struct(">BBhBI")
HEADER_BYTES = HEADER.size
# Cassandra's default native_transport_max_frame_size is 16 MiB.
MAX_FRAME_BYTES = 16 * 1024 * 1024

# Header flags.
COMPRESSED = 0x01
TRACING = 0x02
CUSTOM_PAYLOAD = 0x04
WARNING = 0x08
USE_BETA = 0x10

# Opcodes.
ERROR = 0x00
STARTUP = 0x01
READY = 0x02
AUTHENTICATE = 0x03
OPTIONS = 0x05
SUPPORTED = 0x06
QUERY = 0x07
RESULT = 0x08
PREPARE = 0x09
EXECUTE = 0x0A
REGISTER = 0x0B
EVENT = 0x0C
BATCH = 0x0D
AUTH_CHALLENGE = 0x0E
AUTH_RESPONSE = 0x0F
AUTH_SUCCESS = 0x10
REQUEST_OPCODES = frozenset(
    {STARTUP, OPTIONS, QUERY, PREPARE, EXECUTE, REGISTER, BATCH, AUTH_RESPONSE}
)
RESPONSE_OPCODES = frozenset(
    {ERROR, READY, AUTHENTICATE, SUPPORTED, RESULT, EVENT, AUTH_CHALLENGE, AUTH_SUCCESS}
)

# Error codes.
SERVER_ERROR = 0x0000
PROTOCOL_ERROR = 0x000A
AUTHENTICATION_ERROR = 0x0100
UNAVAILABLE = 0x1000
OVERLOADED = 0x1001
WRITE_TIMEOUT = 0x1100
SYNTAX_ERROR = 0x2000
UNAUTHORIZED = 0x2100
INVALID = 0x2200
UNPREPARED = 0x2500

# RESULT kinds.
VOID = 0x0001
ROWS = 0x0002
SET_KEYSPACE = 0x0003
PREPARED = 0x0004
SCHEMA_CHANGE = 0x0005

# Query flags (QUERY, EXECUTE).
Q_VALUES = 0x01
Q_SKIP_METADATA = 0x02
Q_PAGE_SIZE = 0x04
Q_PAGING_STATE = 0x08
Q_SERIAL_CONSISTENCY = 0x10
Q_TIMESTAMP = 0x20
Q_NAMES = 0x40

# [value] lengths below zero.
NULL = -1
NOT_SET = -2


class Malformed(AccordCassandraError, ValueError):
    """A body that does not hold what its opcode says (truncated, a bad length, ...)."""


@dataclass(frozen=True)
class Frame:
    version: int
    flags: int
    stream: int
    opcode: int
    body: bytes

    def encode(self) -> bytes:
        return encode_frame(self.version, self.flags, self.stream, self.opcode, self.body)


@dataclass(frozen=True)
class BadFrame:
    """A frame refused before its body was read: answer ``code``/``message`` on ``stream``;
    ``fatal``: the byte stream cannot be framed any further (close after answering)."""

    stream: int
    code: int
    message: str
    fatal: bool


def encode_frame(version: int, flags: int, stream: int, opcode: int, body: bytes) -> bytes:
    return HEADER.pack(version, flags, stream, opcode, len(body)) + body


def unsupported_version_message(version: int) -> str:
    # The wording drivers look for to fall back to an older version (Cassandra's own).
    return f"Invalid or unsupported protocol version ({version}); supported versions are (4/v4)"


class FrameDecoder:
    """Frames out of a byte stream, fed in pieces. Only version 4 requests are accepted; a
    frame over ``max_frame_bytes`` is refused and its body skipped, so the connection
    goes on."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, *, requests: bool = True) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.requests = requests
        self._buffer = bytearray()
        self._skip = 0  # body bytes of a refused frame still to discard
        self.closed = False  # a fatal error was reported: nothing more is read

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (or still to skip)."""
        return len(self._buffer) + self._skip

    def feed(self, data: bytes) -> Iterator[Frame | BadFrame]:
        if self.closed:
            return
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        self._buffer += data
        while not self.closed:
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                self._skip -= dropped
                del self._buffer[:dropped]
                if self._skip:
                    return
            if len(self._buffer) < HEADER_BYTES:
                return
            version, flags, stream, opcode, length = HEADER.unpack_from(self._buffer)
            direction = version & RESPONSE
            number = version & 0x7F
            expected_direction = 0 if self.requests else RESPONSE
            if number != V4:
                # The body of another version may not even be framed like this: answer in
                # v4 (as Cassandra does for a version it does not speak) and stop.
                self.closed = True
                yield BadFrame(stream, PROTOCOL_ERROR, unsupported_version_message(number), True)
                return
            if direction != expected_direction:
                self.closed = True
                kind = "response" if direction else "request"
                yield BadFrame(stream, PROTOCOL_ERROR, f"a {kind} frame sent to this side", True)
                return
            if length > self.max_frame_bytes:
                del self._buffer[:HEADER_BYTES]
                self._skip = length
                yield BadFrame(
                    stream,
                    PROTOCOL_ERROR,
                    f"frame body of {length} bytes exceeds the limit of "
                    f"{self.max_frame_bytes} bytes",
                    False,
                )
                continue
            if len(self._buffer) < HEADER_BYTES + length:
                return
            body = bytes(self._buffer[HEADER_BYTES : HEADER_BYTES + length])
            del self._buffer[: HEADER_BYTES + length]
            yield Frame(version, flags, stream, opcode, body)

    def eof(self) -> BadFrame | None:
        """The peer stopped sending: a frame cut short, if one was."""
        if self.closed or (not self._buffer and not self._skip):
            return None
        self.closed = True
        stream = HEADER.unpack_from(self._buffer)[2] if len(self._buffer) >= HEADER_BYTES else 0
        return BadFrame(
            stream,
            PROTOCOL_ERROR,
            f"the connection ended inside a frame ({self.pending} bytes of it unread)",
            True,
        )


class Reader:
    """Reads the spec's notations from a body; :class:`Malformed` past its end."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.body):
            raise Malformed(
                f"truncated body: {n} bytes wanted at offset {self.at} of {len(self.body)}"
            )
        out = self.body[self.at : self.at + n]
        self.at += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def short(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self.take(8))[0])

    def string(self) -> str:
        return self._text(self.take(self.short()))

    def long_string(self) -> str:
        n = self.int32()
        if n < 0:
            raise Malformed(f"a [long string] of negative length {n}")
        return self._text(self.take(n))

    def blob(self) -> bytes | None:
        n = self.int32()
        return None if n < 0 else self.take(n)

    def value(self) -> bytes | int | None:
        """A [value]: its bytes, None (null) or NOT_SET."""
        n = self.int32()
        if n == NULL:
            return None
        if n == NOT_SET:
            return NOT_SET
        if n < 0:
            raise Malformed(f"a [value] of length {n}")
        return self.take(n)

    def short_bytes(self) -> bytes:
        return self.take(self.short())

    def string_list(self) -> list[str]:
        return [self.string() for _ in range(self.short())]

    def string_map(self) -> dict[str, str]:
        return {self.string(): self.string() for _ in range(self.short())}

    def string_multimap(self) -> dict[str, list[str]]:
        return {self.string(): self.string_list() for _ in range(self.short())}

    def bytes_map(self) -> dict[str, bytes | None]:
        return {self.string(): self.blob() for _ in range(self.short())}

    def done(self) -> None:
        if self.at != len(self.body):
            raise Malformed(f"{len(self.body) - self.at} bytes left over after the body")

    @staticmethod
    def _text(data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise Malformed(f"a [string] that is not UTF-8: {error}") from None


class Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, data: bytes) -> Writer:
        self.parts.append(data)
        return self

    def byte(self, n: int) -> Writer:
        return self.raw(struct.pack(">B", n))

    def short(self, n: int) -> Writer:
        return self.raw(struct.pack(">H", n))

    def int32(self, n: int) -> Writer:
        return self.raw(struct.pack(">i", n))

    def string(self, text: str) -> Writer:
        data = text.encode("utf-8")
        if len(data) > 0xFFFF:
            data = data[:0xFFFF]
        return self.short(len(data)).raw(data)

    def long_string(self, text: str) -> Writer:
        data = text.encode("utf-8")
        return self.int32(len(data)).raw(data)

    def blob(self, data: bytes | None) -> Writer:
        if data is None:
            return self.int32(NULL)
        return self.int32(len(data)).raw(data)

    def short_bytes(self, data: bytes) -> Writer:
        return self.short(len(data)).raw(data)

    def string_list(self, items: Sequence[str]) -> Writer:
        self.short(len(items))
        for item in items:
            self.string(item)
        return self

    def string_map(self, items: Mapping[str, str]) -> Writer:
        self.short(len(items))
        for key, value in items.items():
            self.string(key).string(value)
        return self

    def string_multimap(self, items: Mapping[str, Sequence[str]]) -> Writer:
        self.short(len(items))
        for key, values in items.items():
            self.string(key).string_list(values)
        return self

    def build(self) -> bytes:
        return b"".join(self.parts)


@dataclass
class QueryParameters:
    """The <query_parameters> of QUERY and EXECUTE; ``values`` positional, or ``names``
    for each value when sent by name."""

    consistency: int
    flags: int
    values: list[bytes | int | None]
    names: list[str] | None
    page_size: int | None = None
    paging_state: bytes | None = None
    serial_consistency: int | None = None
    timestamp: int | None = None

    @property
    def skip_metadata(self) -> bool:
        return bool(self.flags & Q_SKIP_METADATA)


def read_query_parameters(reader: Reader) -> QueryParameters:
    consistency = reader.short()
    flags = reader.byte()
    values: list[bytes | int | None] = []
    names: list[str] | None = None
    if flags & Q_VALUES:
        count = reader.short()
        if flags & Q_NAMES:
            names = []
            for _ in range(count):
                names.append(reader.string())
                values.append(reader.value())
        else:
            values = [reader.value() for _ in range(count)]
    params = QueryParameters(consistency, flags, values, names)
    if flags & Q_PAGE_SIZE:
        params.page_size = reader.int32()
    if flags & Q_PAGING_STATE:
        params.paging_state = reader.blob()
    if flags & Q_SERIAL_CONSISTENCY:
        params.serial_consistency = reader.short()
    if flags & Q_TIMESTAMP:
        params.timestamp = reader.int64()
    return params


def read_query(body: bytes) -> tuple[str, QueryParameters]:
    reader = Reader(body)
    text = reader.long_string()
    params = read_query_parameters(reader)
    reader.done()
    return text, params


def read_prepare(body: bytes) -> str:
    reader = Reader(body)
    text = reader.long_string()
    # v4 has nothing after the query; v5 adds flags, which this endpoint does not speak.
    reader.done()
    return text


def read_execute(body: bytes) -> tuple[bytes, QueryParameters]:
    reader = Reader(body)
    statement = reader.short_bytes()
    params = read_query_parameters(reader)
    reader.done()
    return statement, params


def read_batch_texts(body: bytes) -> list[str]:
    """The query strings of a BATCH (prepared ids are skipped)."""
    reader = Reader(body)
    reader.byte()  # type
    texts = []
    for _ in range(reader.short()):
        kind = reader.byte()
        if kind == 0:
            texts.append(reader.long_string())
        elif kind == 1:
            reader.short_bytes()
        else:
            raise Malformed(f"a BATCH query of kind {kind} (0: string, 1: prepared id)")
        for _ in range(reader.short()):
            reader.value()
    return texts


def error_body(code: int, message: str, extra: bytes = b"") -> bytes:
    return Writer().int32(code).string(message).raw(extra).build()


def error_frame(stream: int, code: int, message: str, extra: bytes = b"") -> bytes:
    return encode_frame(V4 | RESPONSE, 0, stream, ERROR, error_body(code, message, extra))


def unprepared_frame(stream: int, statement: bytes, message: str) -> bytes:
    return error_frame(stream, UNPREPARED, message, Writer().short_bytes(statement).build())


def write_timeout_frame(stream: int, consistency: int, message: str) -> bytes:
    # <cl><received><blockfor><writeType>: CAS, the type drivers do not retry on their own
    # (the outcome of a Paxos write is unknown too).
    extra = Writer().short(consistency).int32(0).int32(1).string("CAS").build()
    return error_frame(stream, WRITE_TIMEOUT, message, extra)


def read_error(body: bytes) -> tuple[int, str]:
    reader = Reader(body)
    return reader.int32(), reader.string()
