"""Binary form of messages and journal records: msgpack arrays with explicit integer tags.

The format is :mod:`accord.codec.walk`'s (its docstring describes it field by field): every
message, the :class:`~accord.messages.Envelope` and every journal record is ``[tag, field,
...]`` with tags from :data:`MESSAGE_TAGS` and :data:`RECORD_TAGS`. This module produces and
accepts exactly the bytes that walk does, but does the work in msgspec's C code:

* **Decoding** runs one typed msgspec decoder over a mirror of every tagged class (a
  ``msgspec.Struct`` with ``array_like=True``, its tag, no defaults and
  ``forbid_unknown_fields``): tags, array lengths, exact msgpack types, ``Status`` codes and
  signed 64-bit integers (:data:`~accord.primitives.timestamp.Int64`, also on the fields of
  ``Timestamp`` and ``Key``) are all checked there, and the result is built into the real
  classes with their own constructors, so every invariant they check still holds.
  Transactions, results and writes arrive as ``msgspec.Raw``, with a bounded cache by their
  bytes: a replica receives the same transaction in PreAccept, Accept, Commit and Apply and
  decodes it once. A transaction's expressions,
  writes, predicates, slices and bounds are msgspec Structs (tagged by their kind), so a
  second typed decoder builds them directly; the transaction is vouched for only when its
  bytes are exactly what encoding the decoded parts gives back (a trailing field left off,
  which a default would fill, or an integer in a wider form goes to the walk), when every
  value passes the walk's checks (see ``Value`` below) and every expression is within
  :data:`MAX_EXPR_DEPTH`. Writes and results are decoded likewise through mirrors of
  ``WriteOp`` and ``TxnResult`` (a result holding a ``PartitionRead`` goes to the walk).
  The bytes a part was vouched for are remembered as its encoding, so a replica journals
  what it received without encoding it again.
* **Anything the fast path refuses** (any msgspec error, a RecursionError from hostile
  nesting, an invariant a constructor checks, a key twice in Deps) is handed to the walk,
  which names the problem and where (``Apply.route.keys[1]``) exactly as before, or decodes
  it if the walk accepts it: the fast path decides nothing alone, so decoding is never more
  lenient than the walk (tests/unit/test_codec_fast.py compares the two on mutated input).
* **Encoding** checks the exact type (and 64-bit range) of every top-level field, encodes
  ``Deps`` from its sorted items through an ``enc_hook``, and embeds transactions, results
  and writes as ``msgspec.Raw`` produced by the walk, cached by object identity (they are
  immutable and sent to every replica); anything it cannot vouch for goes to the walk, which
  refuses it with the same error as before.
* ``Value`` (None, bool, int, float, str, bytes, tuples of values) is the one type msgspec
  cannot express: its unions cannot hold both ``str`` and ``bytes`` (nor two array types),
  and an untyped msgspec decode turns arrays into lists. In the structs a value is typed
  ``object``, which msgspec decodes untyped; :func:`_wire_value` then turns every list into
  a tuple and refuses what the walk's ``_value`` refuses (another type, an integer outside
  64 bits, tuples deeper than :data:`MAX_VALUE_DEPTH`), and the struct's own checks run
  again on the tuples (``_settle``). Read answers still meet values only in the walk. A
  ``float`` travels as msgpack float64, which msgspec and msgpack both write.

Limits: input and output at most :data:`MAX_MESSAGE_BYTES`; values :data:`MAX_VALUE_DEPTH`
tuples deep; expressions :data:`MAX_EXPR_DEPTH` deep; integers signed 64-bit. Every failure
is a :class:`CodecError` naming the problem.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, Final, Union, cast, get_type_hints

import msgspec

from accord.api import JournalRecord
from accord.codec import walk
from accord.codec.walk import (
    CODEC_VERSION,
    ENVELOPE_TAG,
    INT64_MAX,
    INT64_MIN,
    MAX_EXPR_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_VALUE_DEPTH,
    MESSAGE_TAGS,
    RECORD_TAGS,
    CodecError,
)
from accord.invariants import AccordError
from accord.messages import Envelope, Message
from accord.primitives import (
    BinOp,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Deps,
    Expr,
    Item,
    Key,
    MakeTuple,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    Route,
    RowOf,
    Slice,
    SliceOf,
    StaticOf,
    Status,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    Write,
    WriteOp,
    WriteScope,
)
from accord.primitives.timestamp import Int64
from accord.primitives.txn import MAX_BATCH_PARTS

_NIL: Final = b"\xc0"
_CACHE_ENTRIES: Final = 4096
"""Most transactions (results, writes) each cache holds before it starts afresh."""
_CACHES: Final[dict[int, tuple[dict[int, tuple[object, msgspec.Raw]], dict[bytes, object]]]] = {}

# ---------------------------------------------------------------------------- embedded parts


def _enc_hook(obj: object) -> object:
    if type(obj) is Deps:
        return tuple(obj.items())
    raise TypeError(f"{type(obj).__name__} has no wire form")


_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


class _Part:
    """A field type msgspec carries as ``Raw``: the walk encodes it, ``fast`` (when given)
    or else the walk decodes it, each cached. Whatever ``fast`` refuses the walk decodes,
    and names the problem of if it refuses it too."""

    def __init__(
        self,
        codec: walk._Codec[Any],
        optional: bool,
        fast: Callable[[bytes], object] | None = None,
    ) -> None:
        self.codec = codec
        self.optional = optional
        self.fast = fast
        # One pair of caches per codec, shared by its optional and required parts, since a
        # transaction decoded from a PreAccept is journaled in a record's optional field.
        self.encoded, self.decoded = _CACHES.setdefault(id(codec), ({}, {}))

    def encode(self, value: object) -> object:
        if value is None and self.optional:
            return None
        hit = self.encoded.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        raw = msgspec.Raw(_ENCODER.encode(self.codec.encode(value)))
        self._remember(value, raw)
        return raw

    def _remember(self, value: object, raw: msgspec.Raw) -> None:
        if len(self.encoded) >= _CACHE_ENTRIES:
            self.encoded.clear()
        # Holding the value keeps its id from being reused while the entry lives.
        self.encoded[id(value)] = (value, raw)

    def decode(self, raw: msgspec.Raw) -> object:
        data = bytes(raw)
        if data == _NIL and self.optional:
            return None
        hit = self.decoded.get(data)
        if hit is not None:
            return hit
        value = None
        if self.fast is not None:
            try:
                value = self.fast(data)
            except _REFUSED:
                value = None
            else:
                # ``fast`` vouches only for bytes that are exactly the value's encoding, so
                # sending or journaling what arrived needs no encoding at all.
                self._remember(value, msgspec.Raw(data))
        if value is None:
            value = self.codec.decode(walk._unpack(data))
        if len(self.decoded) >= _CACHE_ENTRIES:
            self.decoded.clear()
        self.decoded[data] = value
        return value


_WIRE_DEPS: Final = tuple[tuple[Key, tuple[Timestamp, ...]], ...]


def _deps(pairs: tuple[tuple[Key, tuple[Timestamp, ...]], ...]) -> Deps:
    by_key = dict(pairs)
    if len(by_key) != len(pairs):
        raise CodecError("a key appears twice in Deps")
    return Deps.of(by_key)


def _route(pair: tuple[Key, tuple[Key, ...]] | None) -> Route | None:
    return None if pair is None else Route(*pair)


def _is_int(value: object) -> bool:
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def _exactly(cls: type[Any], optional: bool = False) -> Callable[[object], bool]:
    if optional:
        return lambda value: value is None or type(value) is cls
    return lambda value: type(value) is cls


def _route_wire(route: Route | None) -> object:
    return None if route is None else (route.home_key, route.keys)


# One entry per declared field type: (msgspec type of the wire form, check before encoding,
# conversion before encoding or None, conversion after decoding or None).
_Field = tuple[object, Callable[[object], bool], Callable[[Any], object] | None, Any]


def _part(
    codec: walk._Codec[Any],
    check: Callable[[object], bool],
    optional: bool,
    fast: Callable[[bytes], object] | None = None,
) -> _Field:
    part = _Part(codec, optional, fast)
    # Not ``Raw | None``: msgspec's unions take no Raw, so an absent part is a Raw nil.
    return (msgspec.Raw, check, part.encode, part.decode)


def _is_tuple(value: object) -> bool:
    return type(value) is tuple


def _are_timestamps(value: object) -> bool:
    return type(value) is tuple and all(type(item) is Timestamp for item in value)


# ---------------------------------------------------------------------------- transactions


class _WireTxn(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A transaction as it travels: ``update`` has no default, so ``[reads]`` is refused
    as the walk refuses it; ``returns`` (codec version 3) and ``parts`` (version 4) may be
    left off."""

    reads: tuple[Key, ...]
    update: Update | None
    returns: tuple[Expr, ...] = ()
    parts: tuple[_WireTxn, ...] = ()


_TXN_DECODER: Final = msgspec.msgpack.Decoder(_WireTxn)
_SCALARS: Final = frozenset({type(None), bool, str, bytes, float})


class _Refused(Exception):
    """The fast path will not vouch for these bytes: the walk decides (and names why)."""


def _wire_value(value: object, depth: int = 0) -> object:
    """``value`` as the walk would decode it: a decoded array (a list) becomes a tuple;
    the same kinds, 64-bit range and :data:`MAX_VALUE_DEPTH` as the walk's ``_value``."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        if not INT64_MIN <= cast("int", value) <= INT64_MAX:
            raise _Refused
        return value
    if kind is list or kind is tuple:
        if depth >= MAX_VALUE_DEPTH:
            raise _Refused
        return tuple([_wire_value(item, depth + 1) for item in cast("list[object]", value)])
    raise _Refused


def _wire_clustering(values: tuple[object, ...]) -> tuple[object, ...]:
    for item in values:
        if type(item) not in _SCALARS:
            break
    else:
        return values  # the usual case: nothing to check beyond the types
    return tuple([_wire_value(item) for item in values])


def _settle(node: Any, **fields: object) -> None:
    """Put the walk's form of decoded values into ``node`` (only the decoder holds it yet)
    and, if anything changed, run its own checks again on what it now holds."""
    changed = False
    for name, value in fields.items():
        if value is not getattr(node, name):
            msgspec.structs.force_setattr(node, name, value)
            changed = True
    if changed and hasattr(node, "__post_init__"):
        node.__post_init__()


def _wire_bound(bound: Bound | None) -> None:
    if bound is not None:
        _settle(bound, value=_wire_value(bound.value))


def _wire_slice(selected: Slice) -> None:
    _wire_bound(selected.lower)
    _wire_bound(selected.upper)
    _settle(selected, prefix=_wire_clustering(selected.prefix))


def _wire_expr(expr: object, depth: int = 0) -> None:
    """Check a decoded expression as the walk would: depth, then every value in it."""
    if depth >= MAX_EXPR_DEPTH:
        raise _Refused
    kind = type(expr)
    if kind is BinOp:
        binop = cast("BinOp", expr)
        _wire_expr(binop.left, depth + 1)
        _wire_expr(binop.right, depth + 1)
    elif kind is Const:
        _settle(expr, value=_wire_value(cast("Const", expr).value))
    elif kind is ReadOf:
        _settle(expr, default=_wire_value(cast("ReadOf", expr).default))
    elif kind is Item:
        _wire_expr(cast("Item", expr).value, depth + 1)
    elif kind is MakeTuple:
        for item in cast("MakeTuple", expr).items:
            _wire_expr(item, depth + 1)
    elif kind is RowOf:
        row = cast("RowOf", expr)
        _settle(row, clustering=_wire_clustering(row.clustering), default=_wire_value(row.default))
    elif kind is SliceOf or kind is CountOf:
        _wire_slice(cast("SliceOf", expr).slice)
    elif kind is not StaticOf:
        raise _Refused


def _wire_write(write: Write) -> None:
    kind = type(write)
    if kind is Put or kind is PutStatic:
        _wire_expr(cast("Put", write).value)
    elif kind is PutRow:
        row = cast("PutRow", write)
        _settle(row, clustering=_wire_clustering(row.clustering))
        _wire_expr(row.value)
    elif kind is DeleteRow:
        deleted = cast("DeleteRow", write)
        _settle(deleted, clustering=_wire_clustering(deleted.clustering))
    elif kind is DeleteRange:
        ranged = cast("DeleteRange", write)
        _wire_bound(ranged.lower)
        _wire_bound(ranged.upper)
        _settle(ranged, prefix=_wire_clustering(ranged.prefix))
    elif kind is not Delete and kind is not DeletePartition:
        raise _Refused


def _fast_txn(data: bytes) -> Txn:
    """A transaction by msgspec's typed decoding straight into its expression and write
    structs, vouched for only if the bytes are exactly what encoding it gives back (so
    a trailing field left off, which a struct's default would fill, an operator spelled
    as a string or an integer in a wider form than needed all go to the walk), and every
    value and depth is what the walk accepts. A batch's parts are checked likewise; more
    than MAX_BATCH_PARTS, or a part with parts, go to the walk, which refuses them."""
    wire = _TXN_DECODER.decode(data)
    if len(wire.parts) > MAX_BATCH_PARTS:
        raise _Refused
    if _ENCODER.encode(_canonical_txn(wire)) != data:
        raise _Refused
    return _built_txn(wire)


def _canonical_txn(wire: _WireTxn) -> tuple[object, ...]:
    if wire.parts:
        return (wire.reads, wire.update, wire.returns, [_canonical_txn(p) for p in wire.parts])
    return (wire.reads, wire.update, wire.returns) if wire.returns else (wire.reads, wire.update)


def _built_txn(wire: _WireTxn) -> Txn:
    if wire.parts:
        if any(part.parts for part in wire.parts):
            raise _Refused
        return Txn(wire.reads, wire.update, wire.returns, tuple(map(_built_txn, wire.parts)))
    update, returns = wire.update, wire.returns
    for expr in returns:
        _wire_expr(expr)
    if update is not None:
        for write in update.writes:
            _wire_write(write)
        for predicate in update.condition:
            _wire_expr(predicate.left)
            if predicate.right is not None:
                _wire_expr(predicate.right)
    return Txn(wire.reads, update, returns)


class _WireWriteOp(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A computed write as it travels: the version-2 fields, then those version 3 added,
    left off from the last one still at its default."""

    key: Key
    value: object
    delete: bool
    scope: WriteScope = WriteScope.ROW
    clustering: tuple[object, ...] = ()
    lower: Bound | None = None
    upper: Bound | None = None
    ttl: Int64 | None = None


_WRITE_OP_DEFAULTS: Final = (WriteScope.ROW, (), None, None, None)
_WRITE_OPS_DECODER: Final = msgspec.msgpack.Decoder(tuple[_WireWriteOp, ...])


def _write_op_fields(op: _WireWriteOp) -> tuple[object, ...]:
    fields = msgspec.structs.astuple(op)
    length = len(fields)
    while length > 3 and fields[length - 1] == _WRITE_OP_DEFAULTS[length - 4]:
        length -= 1
    return fields if length == len(fields) else fields[:length]


def _fast_write_ops(data: bytes) -> tuple[WriteOp, ...]:
    """Computed writes by msgspec's typed decoding, vouched for as :func:`_fast_txn`
    vouches for a transaction."""
    wire = _WRITE_OPS_DECODER.decode(data)
    if _ENCODER.encode([_write_op_fields(op) for op in wire]) != data:
        raise _Refused
    ops = []
    for op in wire:
        _wire_bound(op.lower)
        _wire_bound(op.upper)
        ops.append(
            WriteOp(
                op.key,
                _wire_value(op.value),
                op.delete,
                op.scope,
                _wire_clustering(op.clustering),
                op.lower,
                op.upper,
                op.ttl,
            )
        )
    return tuple(ops)


class _WireResult(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A client result as it travels (``returned``, of version 3, left off when empty, and
    ``parts``, of version 4, likewise). A read that is a ``PartitionRead`` (three elements)
    is refused here: the walk has it."""

    reads: tuple[tuple[Key, object], ...]
    applied: bool
    error: str | None = None
    returned: tuple[object, ...] = ()
    parts: tuple[_WireResult, ...] = ()


_RESULT_DECODER: Final = msgspec.msgpack.Decoder(_WireResult)


def _canonical_result(wire: _WireResult) -> tuple[object, ...]:
    fields: tuple[object, ...] = (wire.reads, wire.applied, wire.error)
    if wire.parts:
        return (*fields, wire.returned, [_canonical_result(p) for p in wire.parts])
    return (*fields, wire.returned) if wire.returned else fields


def _built_result(wire: _WireResult) -> TxnResult:
    reads = tuple([(key, _wire_value(value)) for key, value in wire.reads])
    returned = tuple([_wire_value(v) for v in wire.returned])
    parts = tuple(map(_built_result, wire.parts))
    return TxnResult(reads, wire.applied, wire.error, returned, parts)


def _fast_result(data: bytes) -> TxnResult:
    """A client result by msgspec's typed decoding, vouched for as :func:`_fast_txn`
    vouches for a transaction (a part with parts of its own goes to the walk)."""
    wire = _RESULT_DECODER.decode(data)
    if len(wire.parts) > MAX_BATCH_PARTS or any(part.parts for part in wire.parts):
        raise _Refused
    if _ENCODER.encode(_canonical_result(wire)) != data:
        raise _Refused
    return _built_result(wire)


_ROUTE_WIRE: Final = tuple[Key, tuple[Key, ...]]
_FIELDS: Final[Mapping[object, _Field]] = {
    int: (Int64, _is_int, None, None),
    bool: (bool, _exactly(bool), None, None),
    Status: (Status, _exactly(Status), None, None),
    Timestamp: (Timestamp, _exactly(Timestamp), None, None),
    Timestamp | None: (Timestamp | None, _exactly(Timestamp, optional=True), None, None),
    tuple[Timestamp, ...]: (tuple[Timestamp, ...], _are_timestamps, None, None),
    Key | None: (Key | None, _exactly(Key, optional=True), None, None),
    Route: (_ROUTE_WIRE, _exactly(Route), _route_wire, _route),
    Route | None: (_ROUTE_WIRE | None, _exactly(Route, optional=True), _route_wire, _route),
    Deps: (_WIRE_DEPS, _exactly(Deps), None, _deps),
    Txn: _part(walk._TXN, _exactly(Txn), False, _fast_txn),
    Txn | None: _part(walk._TXN, _exactly(Txn, optional=True), True, _fast_txn),
    TxnResult: _part(walk._RESULT, _exactly(TxnResult), False, _fast_result),
    TxnResult | None: _part(walk._RESULT, _exactly(TxnResult, optional=True), True, _fast_result),
    tuple[WriteOp, ...]: _part(walk._WRITE_OPS, _is_tuple, False, _fast_write_ops),
    tuple[WriteOp, ...] | None: _part(
        walk._WRITE_OPS, lambda v: v is None or type(v) is tuple, True, _fast_write_ops
    ),
    # Read answers: not cached (each replica's differ); values checked by the walk.
    tuple[tuple[Key, object], ...]: (
        msgspec.Raw,
        _is_tuple,
        lambda values: msgspec.Raw(_ENCODER.encode(walk._READS.encode(values))),
        lambda raw: walk._READS.decode(walk._unpack(bytes(raw))),
    ),
}

# ---------------------------------------------------------------------------- schemas


class _Schema:
    """How one tagged class maps onto its mirror struct."""

    def __init__(self, cls: type[Any], tag: int, fields: list[tuple[str, _Field]]) -> None:
        self.cls = cls
        self.tag = tag
        self.mirror: type[msgspec.Struct] = msgspec.defstruct(
            f"_Wire{cls.__name__}",
            [(name, field[0]) for name, field in fields],
            array_like=True,
            tag=tag,
            forbid_unknown_fields=True,
            frozen=True,
        )
        names = [name for name, _ in fields]
        self.get: Callable[[Any], tuple[object, ...]] = (
            operator.attrgetter(*names) if len(names) > 1 else lambda obj: (getattr(obj, names[0]),)
        )
        self.checks = tuple((i, f[1]) for i, (_, f) in enumerate(fields))
        self.to_wire = tuple((i, f[2]) for i, (_, f) in enumerate(fields) if f[2] is not None)
        self.from_wire = tuple((i, f[3]) for i, (_, f) in enumerate(fields) if f[3] is not None)

    def wire(self, obj: Any) -> list[object] | None:
        """``[tag, field, ...]`` ready for msgspec, or None if a field is not exactly typed."""
        values = [self.tag, *self.get(obj)]
        for index, check in self.checks:
            if not check(values[index + 1]):
                return None
        for index, convert in self.to_wire:
            values[index + 1] = convert(values[index + 1])
        return values

    def build(self, mirror: msgspec.Struct) -> Any:
        if not self.from_wire:
            return self.cls(*msgspec.structs.astuple(mirror))
        values = list(msgspec.structs.astuple(mirror))
        for index, convert in self.from_wire:
            values[index] = convert(values[index])
        return self.cls(*values)


def _schema(cls: type[Any], tag: int) -> _Schema:
    hints = get_type_hints(cls)
    return _Schema(cls, tag, [(name, _FIELDS[hints[name]]) for name in walk.field_names(cls)])


_MESSAGES: Final = {cls: _schema(cls, tag) for cls, tag in MESSAGE_TAGS.items()}
_RECORDS: Final = {cls: _schema(cls, tag) for cls, tag in RECORD_TAGS.items()}
_BY_MIRROR: Final = {s.mirror: s for s in (*_MESSAGES.values(), *_RECORDS.values())}
_MESSAGE_UNION: Final[Any] = Union[tuple(s.mirror for s in _MESSAGES.values())]  # noqa: UP007
_WireEnvelope = msgspec.defstruct(
    "_WireEnvelope",
    [("src", Int64), ("dest", Int64), ("body", _MESSAGE_UNION)],
    array_like=True,
    tag=ENVELOPE_TAG,
    forbid_unknown_fields=True,
    frozen=True,
)


_MESSAGE_DECODER: Final = msgspec.msgpack.Decoder(
    Union[_WireEnvelope, _MESSAGE_UNION]  # noqa: UP007
)
_RECORD_DECODER: Final = msgspec.msgpack.Decoder(
    Union[tuple(s.mirror for s in _RECORDS.values())]  # noqa: UP007
)

# ---------------------------------------------------------------------------- top level


def _packed(wire: list[object]) -> bytes | None:
    try:
        data = _ENCODER.encode(wire)
    except (TypeError, ValueError, OverflowError, CodecError, RecursionError):
        return None
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError(f"encoded size {len(data)} exceeds MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    return data


def _message_wire(message: object) -> list[object] | None:
    if type(message) is Envelope:
        schema = _MESSAGES.get(type(message.body))
        body = None if schema is None else schema.wire(message.body)
        if body is None or not (_is_int(message.src) and _is_int(message.dest)):
            return None
        return [ENVELOPE_TAG, message.src, message.dest, body]
    schema = _MESSAGES.get(type(message))
    return None if schema is None else schema.wire(message)


def _checked_input(data: bytes) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if memoryview(data).nbytes > MAX_MESSAGE_BYTES:
        size = memoryview(data).nbytes
        raise CodecError(f"input of {size} bytes exceeds MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")


# Whatever the fast path may meet on hostile input; each sends the input to the walk.
_REFUSED: Final = (
    msgspec.MsgspecError,
    AccordError,
    ValueError,
    TypeError,
    RecursionError,
    _Refused,
)


def _encoded(wire: Callable[[], list[object] | None]) -> bytes | None:
    """The fast path's bytes, or None to let the walk encode (or name the problem, with
    the whole path: a part's own error knows only the path within the part)."""
    try:
        fields = wire()
    except CodecError:
        return None
    return None if fields is None else _packed(fields)


def encode_message(message: Envelope | Message) -> bytes:
    """The bytes of a message, or of an envelope carrying one."""
    data = _encoded(lambda: _message_wire(message))
    return walk.encode_message(message) if data is None else data


def _envelope_head(src: int, dest: int) -> bytes:
    # An envelope is the msgpack array [ENVELOPE_TAG, src, dest, body]: a fixarray of 4,
    # three integers, then the body's own bytes, which do not depend on the address.
    return b"\x94" + _ENCODER.encode((ENVELOPE_TAG, src, dest))[1:]


def readdress(data: bytes, src: int, dest: int, new_dest: int) -> bytes:
    """The bytes of ``Envelope(src, new_dest, body)`` from those of ``Envelope(src, dest,
    body)`` (``encode_message`` of either gives exactly these bytes): a message sent to
    several replicas is encoded once. :class:`CodecError` if ``data`` is not an envelope
    from ``src`` to ``dest``."""
    if not (_is_int(src) and _is_int(dest) and _is_int(new_dest)):
        raise CodecError("an envelope's addresses are 64-bit integers")
    head = _envelope_head(src, dest)
    if not data.startswith(head):
        raise CodecError(f"not the bytes of an envelope from {src} to {dest}")
    out = _envelope_head(src, new_dest) + data[len(head) :]
    if len(out) > MAX_MESSAGE_BYTES:
        raise CodecError(f"encoded size {len(out)} exceeds MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    return out


def decode_message(data: bytes) -> Envelope | Message:
    """The message or envelope ``data`` encodes; :class:`CodecError` if it is malformed."""
    _checked_input(data)
    try:
        top: Any = _MESSAGE_DECODER.decode(data)
        if type(top) is _WireEnvelope:
            wire: Any = top  # (narrowed to a bare Struct otherwise)
            body = _BY_MIRROR[type(wire.body)].build(wire.body)
            return Envelope(wire.src, wire.dest, body)
        return cast("Message", _BY_MIRROR[type(top)].build(top))
    except _REFUSED:
        return walk.decode_message(data)


def encode_record(record: JournalRecord) -> bytes:
    """The bytes of one journal record."""
    schema = _RECORDS.get(type(record))
    data = None if schema is None else _encoded(lambda: schema.wire(record))
    return walk.encode_record(record) if data is None else data


def decode_record(data: bytes) -> JournalRecord:
    """The journal record ``data`` encodes; :class:`CodecError` if it is malformed."""
    _checked_input(data)
    try:
        top = _RECORD_DECODER.decode(data)
        return cast("JournalRecord", _BY_MIRROR[type(top)].build(top))
    except _REFUSED:
        return walk.decode_record(data)


__all__ = [
    "CODEC_VERSION",
    "ENVELOPE_TAG",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_EXPR_DEPTH",
    "MAX_MESSAGE_BYTES",
    "MAX_VALUE_DEPTH",
    "MESSAGE_TAGS",
    "RECORD_TAGS",
    "CodecError",
    "decode_message",
    "decode_record",
    "encode_message",
    "encode_record",
    "readdress",
]
