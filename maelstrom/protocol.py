"""Maelstrom's wire protocol: envelopes, error codes, and validation of what arrives.

Theory of operation
-------------------
Maelstrom (jepsen-io/maelstrom, ``doc/protocol.md``) talks to a node over stdin/stdout, one
JSON object per line: ``{"src": ..., "dest": ..., "body": {...}}``. A body always has a
``type``; requests carry a ``msg_id`` that is unique per sender, and every reply carries
``in_reply_to`` naming it. Errors are bodies of type ``error`` with a numeric ``code``:
codes below 1000 are Maelstrom's own, and each is either *definite* (the operation
certainly did not happen, so the client records ``:fail``) or *indefinite* (it may have
happened: ``:info``). Sending a definite code for something that may still take effect is
a lie the checker will (rightly) punish, so the node and the harness both take the
definite/indefinite split from :data:`DEFINITE_CODES` here.

This module is pure: it turns bytes into :class:`Packet` values or raises
:class:`ProtocolError`, and turns packets back into lines. The same code parses what the
harness reads from nodes and what nodes read from Maelstrom, so the two cannot drift.

Validation is hand-written rather than pydantic: the node must run under the real
Maelstrom with only the core dependencies installed (msgpack), and node-to-node traffic,
by far the bulk of all lines, needs only the envelope checks below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from accord.invariants import fail

MAX_LINE_BYTES: Final = 1 << 20
"""Longest line either side accepts (1 MiB). Longer lines are discarded unparsed: a
Maelstrom client request is a few hundred bytes, and node-to-node Accord messages stay far
below this even with large dependency sets."""

MAX_ID_LENGTH: Final = 64
"""Longest node or client id accepted (Maelstrom's are ``n0`` or ``c123``)."""


class ErrorCode(IntEnum):
    """Maelstrom's error codes (``doc/protocol.md``, "Errors")."""

    TIMEOUT = 0
    NODE_NOT_FOUND = 1
    NOT_SUPPORTED = 10
    TEMPORARILY_UNAVAILABLE = 11
    MALFORMED_REQUEST = 12
    CRASH = 13
    ABORT = 14
    KEY_DOES_NOT_EXIST = 20
    KEY_ALREADY_EXISTS = 21
    PRECONDITION_FAILED = 22
    TXN_CONFLICT = 30


DEFINITE_CODES: Final = frozenset(
    {
        ErrorCode.NODE_NOT_FOUND,
        ErrorCode.NOT_SUPPORTED,
        ErrorCode.TEMPORARILY_UNAVAILABLE,
        ErrorCode.MALFORMED_REQUEST,
        ErrorCode.ABORT,
        ErrorCode.KEY_DOES_NOT_EXIST,
        ErrorCode.KEY_ALREADY_EXISTS,
        ErrorCode.PRECONDITION_FAILED,
        ErrorCode.TXN_CONFLICT,
    }
)
"""Codes that promise the operation never took effect. Every other code, including
unknown ones and every custom code >= 1000, is indefinite."""


def is_definite(code: int) -> bool:
    """Whether an error with ``code`` proves the operation did not happen."""
    return code in DEFINITE_CODES


def code_name(code: int) -> str:
    """Maelstrom's keyword for ``code`` (``key-does-not-exist``), or ``error-<code>``."""
    try:
        return ErrorCode(code).name.lower().replace("_", "-")
    except ValueError:
        return f"error-{code}"


class ProtocolError(Exception):
    """A line or body that breaks the protocol.

    ``src`` and ``msg_id`` are set when enough of the message was readable to address a
    reply to its sender (Maelstrom expects error 12 then); otherwise the line can only be
    logged.
    """

    def __init__(
        self,
        problem: str,
        *,
        src: str | None = None,
        msg_id: int | None = None,
        code: ErrorCode = ErrorCode.MALFORMED_REQUEST,
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.src = src
        self.msg_id = msg_id
        self.code = code


@dataclass(frozen=True, slots=True)
class Packet:
    """One message: ``body`` always has a string ``type``; ids are already validated."""

    src: str
    dest: str
    body: dict[str, Any]

    @property
    def type(self) -> str:
        kind = self.body["type"]
        if not isinstance(kind, str):
            fail("packet type %r passed parse_line", kind)
        return kind

    @property
    def msg_id(self) -> int | None:
        value = self.body.get("msg_id")
        return value if _is_int(value) else None

    @property
    def in_reply_to(self) -> int | None:
        value = self.body.get("in_reply_to")
        return value if _is_int(value) else None


def _is_int(value: object) -> bool:
    # JSON true/false decode to bool, which Python counts as int; the protocol does not.
    return isinstance(value, int) and not isinstance(value, bool)


def _node_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ProtocolError(f"{what} must be a non-empty string of at most {MAX_ID_LENGTH} chars")
    return value


def parse_line(line: bytes | str) -> Packet:
    """Parse one protocol line; raise :class:`ProtocolError` saying what is wrong.

    The error carries ``src``/``msg_id`` whenever the envelope was readable, so the caller
    can answer with error 12 instead of dropping the request silently.
    """
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"line of {len(line)} bytes exceeds MAX_LINE_BYTES={MAX_LINE_BYTES}")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"line is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(data).__name__}")
    src = _node_id(data.get("src"), "src")
    body = data.get("body")
    msg_id = body.get("msg_id") if isinstance(body, dict) else None
    reply_id = msg_id if _is_int(msg_id) else None
    try:
        dest = _node_id(data.get("dest"), "dest")
        if not isinstance(body, dict):
            raise ProtocolError("body must be a JSON object")
        kind = body.get("type")
        if not isinstance(kind, str) or not kind:
            raise ProtocolError("body.type must be a non-empty string")
        if msg_id is not None and not _is_int(msg_id):
            raise ProtocolError("body.msg_id must be an integer")
        in_reply_to = body.get("in_reply_to")
        if in_reply_to is not None and not _is_int(in_reply_to):
            raise ProtocolError("body.in_reply_to must be an integer")
    except ProtocolError as error:
        raise ProtocolError(error.problem, src=src, msg_id=reply_id) from None
    return Packet(src, dest, body)


def render(packet: Packet) -> str:
    """The packet as one protocol line, newline included (compact JSON, no NaN)."""
    return (
        json.dumps(
            {"src": packet.src, "dest": packet.dest, "body": packet.body},
            separators=(",", ":"),
            allow_nan=False,
        )
        + "\n"
    )


def error_body(code: ErrorCode | int, text: str, in_reply_to: int | None) -> dict[str, Any]:
    """An ``error`` body; ``in_reply_to`` is omitted only when the request had no msg_id."""
    body: dict[str, Any] = {"type": "error", "code": int(code), "text": text}
    if in_reply_to is not None:
        body["in_reply_to"] = in_reply_to
    return body


__all__ = [
    "DEFINITE_CODES",
    "MAX_ID_LENGTH",
    "MAX_LINE_BYTES",
    "ErrorCode",
    "Packet",
    "ProtocolError",
    "code_name",
    "error_body",
    "is_definite",
    "parse_line",
    "render",
]
