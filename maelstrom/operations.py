"""Client requests of the three workloads, as Accord transactions, and their replies.

Theory of operation
-------------------
Every client request becomes exactly one declarative :class:`accord.Txn`, so that Accord's
strict serializability carries over to the workload unchanged:

``read {key}``
    ``Txn(reads=(k,))``; an absent key is error 20 (key-does-not-exist), as in Maelstrom's
    ``lin-kv`` service.
``write {key, value}``
    a blind ``Put(k, Const(value))``.
``cas {key, from, to}``
    reads ``k`` and writes ``to`` under the condition ``k = from``. The transaction always
    *executes*; the client learns from its result whether the condition held, so a
    mismatch (22) or a missing key (20) is a *definite* error: the write certainly never
    happened.
``txn {txn: [[f, k, v], ...]}``
    ``r`` reads, ``w`` (txn-rw-register) overwrites, ``append`` (txn-list-append) appends to
    a list. Accord reads a snapshot at the transaction's executeAt and applies all writes
    atomically after it, so the micro-ops are compiled: every key read anywhere in the
    txn is read from the snapshot, every written key gets one ``Put`` whose value chains
    the txn's writes to that key in order (``w`` replaces, ``append`` concatenates), and
    the reply is produced by replaying the micro-ops over the snapshot. Reads therefore
    see the txn's own earlier writes, exactly as Maelstrom's reference ``txn`` semantics
    require, and the stored value equals what the replay ends with.

Keys and values are JSON integers or strings. A key ``k`` maps to the Accord key named
``json.dumps(k)``, so ``1`` and ``"1"`` stay distinct. Lists are stored as tuples.

Every request is validated here (:func:`parse_request`) and refused with error 12 and a
sentence saying what is wrong, before anything reaches Accord.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from accord import BinOp, Const, Key, Predicate, Put, ReadOf, Txn, TxnResult, Update, sim_key
from accord.invariants import fail
from maelstrom.protocol import ErrorCode

MAX_TXN_MICRO_OPS: Final = 64
"""Most micro-ops one ``txn`` request may carry (Maelstrom's default is 1 to 4)."""
MAX_STRING_LENGTH: Final = 1024
"""Longest string key or value accepted, in characters."""
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

Scalar: TypeAlias = int | str
MicroOpKind: TypeAlias = Literal["r", "w", "append"]


class RequestError(Exception):
    """A request the node refuses before it reaches Accord; ``code`` is definite."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


@dataclass(frozen=True, slots=True)
class KvRead:
    key: Scalar


@dataclass(frozen=True, slots=True)
class KvWrite:
    key: Scalar
    value: Scalar


@dataclass(frozen=True, slots=True)
class KvCas:
    key: Scalar
    expected: Scalar
    new: Scalar


@dataclass(frozen=True, slots=True)
class MicroOp:
    """One ``[f, k, v]`` of a ``txn`` request; ``value`` is None for reads."""

    f: MicroOpKind
    key: Scalar
    value: Scalar | None


@dataclass(frozen=True, slots=True)
class TxnRequest:
    mops: tuple[MicroOp, ...]

    @property
    def read_only(self) -> bool:
        return all(m.f == "r" for m in self.mops)


ClientRequest: TypeAlias = KvRead | KvWrite | KvCas | TxnRequest

CLIENT_TYPES: Final = frozenset({"read", "write", "cas", "txn"})
"""Body types this module turns into transactions."""


# ---------------------------------------------------------------------------- parsing


def _scalar(body: dict[str, Any], field: str) -> Scalar:
    if field not in body:
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"missing field {field!r}")
    return _check_scalar(body[field], field)


def _check_scalar(value: object, what: str) -> Scalar:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise RequestError(
            ErrorCode.MALFORMED_REQUEST,
            f"{what} must be an integer or a string, got {json.dumps(value)[:80]}",
        )
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"{what} does not fit in 64 bits")
    if isinstance(value, str) and len(value) > MAX_STRING_LENGTH:
        raise RequestError(
            ErrorCode.MALFORMED_REQUEST,
            f"{what} is longer than MAX_STRING_LENGTH={MAX_STRING_LENGTH}",
        )
    return value


def _micro_op(index: int, raw: object) -> MicroOp:
    where = f"txn[{index}]"
    if not isinstance(raw, list) or len(raw) != 3:
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"{where} must be a [f, key, value] array")
    f, key, value = raw
    checked_key = _check_scalar(key, f"{where} key")
    if f == "r":
        if value is not None:
            raise RequestError(ErrorCode.MALFORMED_REQUEST, f"{where}: a read's value must be null")
        return MicroOp("r", checked_key, None)
    if f in ("w", "append"):
        return MicroOp(f, checked_key, _check_scalar(value, f"{where} value"))
    raise RequestError(
        ErrorCode.MALFORMED_REQUEST,
        f'{where}: unknown micro-op {json.dumps(f)[:40]}; expected "r", "w" or "append"',
    )


def parse_request(body: dict[str, Any]) -> ClientRequest:
    """The request ``body`` (one of :data:`CLIENT_TYPES`) as a value, or RequestError(12)."""
    kind = body.get("type")
    if kind == "read":
        return KvRead(_scalar(body, "key"))
    if kind == "write":
        return KvWrite(_scalar(body, "key"), _scalar(body, "value"))
    if kind == "cas":
        return KvCas(_scalar(body, "key"), _scalar(body, "from"), _scalar(body, "to"))
    if kind == "txn":
        raw = body.get("txn")
        if not isinstance(raw, list) or not raw:
            raise RequestError(ErrorCode.MALFORMED_REQUEST, "txn must be a non-empty array")
        if len(raw) > MAX_TXN_MICRO_OPS:
            raise RequestError(
                ErrorCode.MALFORMED_REQUEST,
                f"txn has {len(raw)} micro-ops; at most MAX_TXN_MICRO_OPS={MAX_TXN_MICRO_OPS}",
            )
        return TxnRequest(tuple(_micro_op(i, m) for i, m in enumerate(raw)))
    raise RequestError(ErrorCode.NOT_SUPPORTED, f"unsupported request type {kind!r}")


def is_read_only(request: ClientRequest) -> bool:
    """Whether the request writes nothing (what ``--unsafe-local-reads`` shortcuts)."""
    return isinstance(request, KvRead) or (isinstance(request, TxnRequest) and request.read_only)


# ---------------------------------------------------------------------------- to Accord


def key_of(key: Scalar) -> Key:
    """The Accord key for a Maelstrom key (stable across processes and runs)."""
    return sim_key(json.dumps(key))


def to_txn(request: ClientRequest) -> Txn:
    """The one Accord transaction that carries out ``request``."""
    if isinstance(request, KvRead):
        return Txn(reads=(key_of(request.key),))
    if isinstance(request, KvWrite):
        return Txn(reads=(), update=Update((Put(key_of(request.key), Const(request.value)),)))
    if isinstance(request, KvCas):
        key = key_of(request.key)
        return Txn(
            reads=(key,),
            update=Update(
                (Put(key, Const(request.new)),),
                condition=(Predicate("=", ReadOf(key), Const(request.expected)),),
            ),
        )
    return _compile_txn(request)


def _compile_txn(request: TxnRequest) -> Txn:
    reads = sorted({key_of(m.key) for m in request.mops if m.f == "r"})
    # Per written key, the expression its final value is; dict order = first write order.
    values: dict[Key, Const | ReadOf | BinOp] = {}
    for mop in request.mops:
        if mop.f == "r":
            continue
        key = key_of(mop.key)
        if mop.f == "w":
            values[key] = Const(mop.value)
            continue
        current: Const | ReadOf | BinOp = values.get(key, ReadOf(key, ()))
        if isinstance(current, BinOp) and isinstance(current.right, Const):
            # Consecutive appends to one key fold into one constant suffix.
            suffix = current.right.value
            if not isinstance(suffix, tuple):
                fail("append suffix %r is not a tuple", suffix)
            values[key] = BinOp("concat", current.left, Const((*suffix, mop.value)))
        else:
            values[key] = BinOp("concat", current, Const((mop.value,)))
    update = Update(tuple(Put(k, v) for k, v in values.items())) if values else None
    return Txn(reads=tuple(reads), update=update)


# ---------------------------------------------------------------------------- replies


def _json_value(value: object) -> object:
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


def reply_body(request: ClientRequest, result: TxnResult) -> dict[str, Any]:
    """The ``*_ok`` body for an executed transaction, or a definite error body.

    Raises nothing: a result Accord computed deterministically on every replica (an
    expression error, say) becomes error 14, which is definite because such a
    transaction writes nothing.
    """
    if result.error is not None:
        return {"type": "error", "code": int(ErrorCode.ABORT), "text": result.error}
    if isinstance(request, KvRead):
        value = result.read(key_of(request.key))
        if value is None:
            return _error(ErrorCode.KEY_DOES_NOT_EXIST, f"key {request.key!r} does not exist")
        return {"type": "read_ok", "value": _json_value(value)}
    if isinstance(request, KvWrite):
        return {"type": "write_ok"}
    if isinstance(request, KvCas):
        if result.applied:
            return {"type": "cas_ok"}
        current = result.read(key_of(request.key))
        if current is None:
            return _error(ErrorCode.KEY_DOES_NOT_EXIST, f"key {request.key!r} does not exist")
        return _error(
            ErrorCode.PRECONDITION_FAILED,
            f"expected {request.expected!r}, but key {request.key!r} holds {current!r}",
        )
    return {"type": "txn_ok", "txn": _replay(request, result)}


def _replay(request: TxnRequest, result: TxnResult) -> list[list[object]]:
    state: dict[Key, object] = dict(result.reads)
    out: list[list[object]] = []
    for mop in request.mops:
        key = key_of(mop.key)
        if mop.f == "r":
            out.append(["r", mop.key, _json_value(state.get(key))])
        elif mop.f == "w":
            state[key] = mop.value
            out.append(["w", mop.key, mop.value])
        else:
            before = state.get(key)
            # Accord evaluated the same concat without error (result.error is None), so the
            # snapshot value is a tuple or absent.
            if not (before is None or isinstance(before, tuple)):
                fail("append to %r whose value %r is not a list", key, before)
            state[key] = (*(before or ()), mop.value)
            out.append(["append", mop.key, mop.value])
    return out


def _error(code: ErrorCode, text: str) -> dict[str, Any]:
    return {"type": "error", "code": int(code), "text": text}


__all__ = [
    "CLIENT_TYPES",
    "MAX_STRING_LENGTH",
    "MAX_TXN_MICRO_OPS",
    "ClientRequest",
    "KvCas",
    "KvRead",
    "KvWrite",
    "MicroOp",
    "RequestError",
    "TxnRequest",
    "is_read_only",
    "key_of",
    "parse_request",
    "reply_body",
    "to_txn",
]
