"""The validating walk: messages and journal records as msgpack arrays with integer tags.

Theory of operation:

* Every message, the :class:`~accord.messages.Envelope` and every journal record is a
  msgpack array ``[tag, field, ...]``: ``tag`` is a small integer from the explicit tables
  :data:`MESSAGE_TAGS` and :data:`RECORD_TAGS` (never a class name, never pickle), followed
  by the fields in declaration order. An envelope is ``[1, src, dest, [tag, ...]]``. Tags
  are part of the durable journal format: never reuse or renumber one.
* Nested structures are arrays of their fields in declaration order: a ``Timestamp`` is
  ``[epoch, hlc, flags, node]``, a ``Key`` ``[token, name]``, ``Deps``
  ``[[key, [txn_id, ...]], ...]``; a ``Status`` is its integer; optional fields are nil.
  Expressions and writes start with a kind (``Const`` 0, ``ReadOf`` 1, ``BinOp`` 2,
  ``Item`` 3, ``MakeTuple`` 4, ``RowOf`` 5, ``SliceOf`` 6, ``CountOf`` 7, ``StaticOf`` 8;
  ``Put`` 0, ``Delete`` 1, ``PutRow`` 2, ``PutStatic`` 3, ``DeleteRow`` 4, ``DeleteRange`` 5,
  ``DeletePartition`` 6; selections ``RowAt`` 0, ``Slice`` 1, ``StaticAt`` 2); operators
  are small integers. A read answer is ``[key, value]`` (a row at ``()``) or
  ``[key, [[selection, value], ...], error]`` (a ``PartitionRead``). Fields added in
  :data:`CODEC_VERSION` 3 trail the version-2 ones and are left off at their defaults.
* A user :data:`~accord.primitives.Value` maps onto msgpack's own types (nil, bool, int,
  float as float 64, str as str, bytes as bin, tuple as array), so tuple, bytes and str,
  and bool, int and float, stay distinct. Only exact types are accepted: a list, enum or
  NamedTuple value has no wire form.
* Integers anywhere are signed 64-bit. Input is limited to :data:`MAX_MESSAGE_BYTES`;
  values nest at most :data:`MAX_VALUE_DEPTH` tuples deep and expressions at most
  :data:`MAX_EXPR_DEPTH` nodes deep, so decoding hostile bytes is bounded in time, memory
  and recursion.
* Decoding checks every tag, length and type against the schema and raises
  :class:`CodecError` naming the problem and where it is; no ``KeyError`` or ``TypeError``
  escapes. Encoding applies the same checks, so it never produces bytes that would not
  decode back to an equal value of the same types.

It encodes :mod:`accord.api`'s journal records as well as :mod:`accord.messages`, so it sits
above both (pyproject's layers contract), not inside ``accord.messages``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any, Final, Generic, TypeVar, cast, get_args, get_type_hints

import msgpack

from accord import messages
from accord.api import Durable, HlcFloor, JournalRecord
from accord.invariants import AccordError, check_state
from accord.local.command import CommandSnapshot
from accord.messages import Envelope, Message
from accord.primitives import (
    BinOp,
    Bound,
    Comparison,
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
    Operator,
    PartitionRead,
    Predicate,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    Route,
    RowAt,
    RowOf,
    Selection,
    Slice,
    SliceOf,
    StaticAt,
    StaticOf,
    Status,
    Timestamp,
    Txn,
    TxnId,
    TxnResult,
    Update,
    Value,
    Write,
    WriteOp,
    WriteScope,
)
from accord.primitives.txn import MAX_BATCH_PARTS

CODEC_VERSION: Final = 4
"""The wire and journal format's version (the sidecars' peer batches carry it and refuse
another). Version 3 (partitions of rows) adds selections, the row, slice, count and static
expressions, the row, static, range and partition writes, TTLs, ``Txn.returns``,
``TxnResult.returned`` and ``PartitionRead`` answers, all as new kinds or trailing fields:
every version-2 message and journal record decodes unchanged (journals need no migration),
and anything a version-2 node could describe encodes to the same bytes as before. Version 4
(batches) adds ``Txn.parts`` and ``TxnResult.parts`` as trailing fields, so every version-3
record decodes unchanged (no parts) and anything without parts encodes as version 3 did."""
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""Largest encoded message or record, in bytes (16 MiB); larger input is refused unread."""
MAX_VALUE_DEPTH: Final = 32
"""Most tuples a value may nest: ``()`` has depth 1, ``((),)`` depth 2."""
MAX_EXPR_DEPTH: Final = 32
"""Most expression nodes on a path from the root of an expression to a leaf."""
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
ENVELOPE_TAG: Final = 1


class CodecError(AccordError):
    """Bytes that are not a well-formed message or record, or an object with no wire form.

    ``problem`` says what is wrong and ``path`` where (``PreAccept.txn.reads[2]``).
    """

    def __init__(self, problem: str, path: tuple[str, ...] = ()) -> None:
        self.problem = problem
        self.path = path
        where = ""
        for step in path:
            where += step if step[:1] in (".", "[") or not where else f".{step}"
        super().__init__(f"{problem} (at {where.lstrip('.')})" if where else problem)

    def within(self, step: str) -> CodecError:
        """The same problem, one step further from where it was found."""
        return CodecError(self.problem, (step, *self.path))


T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec(Generic[T]):
    encode: Callable[[T], object]
    decode: Callable[[object], T]


# ---------------------------------------------------------------------------- building blocks


def _exact(value: object, cls: type[T]) -> T:
    # Exact types only: True is not 1, a Key is not a tuple, a Status is not an int.
    if type(value) is not cls:
        raise CodecError(f"expected {cls.__name__}, got {type(value).__name__}")
    return value


def _array(wire: object, what: str, length: int | None = None) -> tuple[object, ...]:
    # Unpacking uses use_list=False, so every msgpack array arrives as a tuple.
    if type(wire) is not tuple:
        raise CodecError(f"expected {what} (an array), got {type(wire).__name__}")
    if length is not None and len(wire) != length:
        raise CodecError(f"expected {what} of {length} elements, got {len(wire)}")
    return wire


def _tag(fields: tuple[object, ...], what: str) -> int:
    if not fields or type(fields[0]) is not int:
        got = type(fields[0]).__name__ if fields else "nothing"
        raise CodecError(f"expected {what} to start with an integer tag, got {got}")
    return fields[0]


def _int(value: object) -> int:
    number = _exact(value, int)
    if not INT64_MIN <= number <= INT64_MAX:
        raise CodecError(f"integer {number} does not fit in a signed 64-bit integer")
    return number


def _construct(cls: Callable[..., T], *args: object) -> T:
    """Build a validated object from decoded fields, reporting its own checks as ours."""
    try:
        return cls(*args)
    except (AccordError, ValueError, TypeError) as error:
        raise CodecError(f"invalid {getattr(cls, '__name__', cls)}: {error}") from None


def _value(value: object, depth: int = 0) -> Value:
    """Check ``value`` is a wire-safe Value; used both ways since arrays arrive as tuples."""
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is bytes or kind is float:
        return value
    if kind is int:
        return _int(value)
    if kind is tuple:
        if depth >= MAX_VALUE_DEPTH:
            raise CodecError(f"value nests more than MAX_VALUE_DEPTH={MAX_VALUE_DEPTH} tuples")
        items = cast("tuple[object, ...]", value)
        # A tuple of scalars (a key, a row's values) is wire-safe as it is: checked in one
        # pass, not rebuilt item by item (the codec's most frequent value on a sidecar).
        for item in items:
            item_kind = type(item)
            if item_kind is str or item_kind is bytes or item is None or item_kind is bool:
                continue
            if item_kind is float:
                continue
            if item_kind is int and INT64_MIN <= cast("int", item) <= INT64_MAX:
                continue
            break
        else:
            return items
        return tuple(_value(item, depth + 1) for item in items)
    raise CodecError(
        f"{kind.__name__} is not a value (None, bool, int, float, str, bytes or tuple)"
    )


def _scalar(cls: type[T]) -> _Codec[T]:
    return _Codec(lambda value: _exact(value, cls), lambda wire: _exact(wire, cls))


def _each(values: tuple[Any, ...], convert: Callable[[Any], T]) -> list[T]:
    out = []
    for index, value in enumerate(values):
        try:
            out.append(convert(value))
        except CodecError as error:
            raise error.within(f"[{index}]") from None
    return out


def _tuple_of(item: _Codec[T], what: str) -> _Codec[tuple[T, ...]]:
    def encode(values: tuple[T, ...]) -> list[object]:
        return _each(_exact(values, tuple), item.encode)

    return _Codec(encode, lambda wire: tuple(_each(_array(wire, what), item.decode)))


def _optional(item: _Codec[T]) -> _Codec[T | None]:
    return _Codec(
        lambda value: None if value is None else item.encode(value),
        lambda wire: None if wire is None else item.decode(wire),
    )


def _field(name: str, convert: Callable[[Any], T], value: object) -> T:
    try:
        return convert(value)
    except CodecError as error:
        raise error.within(f".{name}") from None


def field_names(cls: type[Any]) -> list[str]:
    """The fields a class is built from, in order: a NamedTuple's, a Struct's or a
    dataclass's init fields."""
    names = getattr(cls, "_fields", None) or getattr(cls, "__struct_fields__", None)
    if names is not None:
        return list(names)
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _struct(cls: type[T], **fields: _Codec[Any]) -> _Codec[T]:
    """An array of the named fields, which must be exactly the class's own init fields."""
    declared = field_names(cls)
    check_state(list(declared) == list(fields), "codec of %s needs %s", cls.__name__, declared)
    items = tuple(fields.items())

    def encode(obj: T) -> list[object]:
        _exact(obj, cls)
        return [_field(name, codec.encode, getattr(obj, name)) for name, codec in items]

    def decode(wire: object) -> T:
        values = _array(wire, cls.__name__, len(items))
        decoded = [_field(n, c.decode, w) for (n, c), w in zip(items, values, strict=True)]
        return _construct(cls, *decoded)

    return _Codec(encode, decode)


def _extended_struct(cls: type[T], since_v1: int, **fields: _Codec[Any]) -> _Codec[T]:
    """Like :func:`_struct` for a class that gained fields after its first ``since_v1``
    (those of codec version 2): encoding drops the trailing fields still at their defaults,
    so an object a version-2 peer could describe encodes exactly as version 2 did, and
    decoding takes any length from ``since_v1`` up."""
    declared = [f for f in dataclasses.fields(cast("type[Any]", cls)) if f.init]
    check_state(
        [f.name for f in declared] == list(fields), "codec of %s needs %s", cls.__name__, declared
    )
    items = tuple(fields.items())
    defaults = [f.default for f in declared]

    def encode(obj: T) -> list[object]:
        _exact(obj, cls)
        values = [getattr(obj, name) for name, _ in items]
        length = len(values)
        while length > since_v1 and values[length - 1] == defaults[length - 1]:
            length -= 1
        return [
            _field(name, codec.encode, value)
            for (name, codec), value in zip(items[:length], values[:length], strict=True)
        ]

    def decode(wire: object) -> T:
        values = _array(wire, cls.__name__)
        if not since_v1 <= len(values) <= len(items):
            raise CodecError(
                f"expected {cls.__name__} of {since_v1} to {len(items)} elements, got {len(values)}"
            )
        decoded = [_field(n, c.decode, w) for (n, c), w in zip(items, values, strict=False)]
        return _construct(cls, *decoded)

    return _Codec(encode, decode)


# ---------------------------------------------------------------------------- primitives

_INT: Final = _Codec(_int, _int)
_BOOL: Final = _scalar(bool)
_STR: Final = _scalar(str)
_VALUE: Final[_Codec[Value]] = _Codec(_value, _value)
_KEY: Final = _struct(Key, token=_INT, name=_STR)
_KEYS: Final = _tuple_of(_KEY, "Keys")


def _clustering(wire: object) -> tuple[Value, ...]:
    return tuple(_each(_array(wire, "a clustering key"), _value))


_CLUSTERING: Final[_Codec[tuple[Value, ...]]] = _Codec(
    lambda ck: _each(_exact(ck, tuple), _value), _clustering
)
_BOUND: Final = _optional(_struct(Bound, value=_VALUE, inclusive=_scalar(bool)))
_LIMIT: Final = _optional(_Codec(_int, _int))
_TTL: Final = _optional(_Codec(_int, _int))
_SLICE: Final = _struct(
    Slice,
    key=_KEY,
    prefix=_CLUSTERING,
    lower=_BOUND,
    upper=_BOUND,
    reverse=_scalar(bool),
    limit=_LIMIT,
)
_ROW_AT, _SLICE_KIND, _STATIC_AT = 0, 1, 2


def _encode_selection(selection: Selection) -> list[object]:
    if type(selection) is RowAt:
        return [_ROW_AT, _KEY.encode(selection.key), _CLUSTERING.encode(selection.clustering)]
    if type(selection) is Slice:
        return [_SLICE_KIND, *cast("list[object]", _SLICE.encode(selection))]
    if type(selection) is StaticAt:
        return [_STATIC_AT, _KEY.encode(selection.key)]
    raise CodecError(f"expected a selection, got {type(selection).__name__}")


def _decode_selection(wire: object) -> Selection:
    kind = _tag(_array(wire, "a selection"), "a selection")
    fields = _array(wire, "a selection")[1:]
    if kind == _ROW_AT:
        key, clustering = _array(fields, "RowAt", 2)
        return _construct(RowAt, _KEY.decode(key), _field("clustering", _clustering, clustering))
    if kind == _SLICE_KIND:
        return _SLICE.decode(fields)
    if kind == _STATIC_AT:
        (key,) = _array(fields, "StaticAt", 1)
        return StaticAt(_KEY.decode(key))
    raise CodecError(f"unknown selection kind {kind}")


_SELECTION: Final[_Codec[Selection]] = _Codec(_encode_selection, _decode_selection)


def _encode_timestamp(ts: Timestamp) -> list[int]:
    # Written out, not a _struct: Deps carry many timestamps.
    _exact(ts, Timestamp)
    return [_int(ts.epoch), _int(ts.hlc), _int(ts.flags), _int(ts.node)]


def _decode_timestamp(wire: object) -> Timestamp:
    epoch, hlc, flags, node = _array(wire, "Timestamp", 4)
    return Timestamp(_int(epoch), _int(hlc), _int(flags), _int(node))


def _decode_status(wire: object) -> Status:
    code = _int(wire)
    try:
        return Status(code)
    except ValueError:
        raise CodecError(f"unknown status {code}") from None


def _encode_deps(deps: Deps) -> list[object]:
    _exact(deps, Deps)
    return [[_KEY.encode(key), _TIMESTAMPS.encode(ids)] for key, ids in deps.items()]


def _decode_deps(wire: object) -> Deps:
    by_key: dict[Key, tuple[TxnId, ...]] = {}

    def entry(item: object) -> None:
        key_wire, ids_wire = _array(item, "a Deps entry", 2)
        key = _KEY.decode(key_wire)
        if key in by_key:
            raise CodecError(f"key {key.name!r} appears twice")
        by_key[key] = _TIMESTAMPS.decode(ids_wire)

    _each(_array(wire, "Deps"), entry)
    return Deps(by_key)


_STATUS: Final = _Codec(lambda status: int(_exact(status, Status)), _decode_status)
_TIMESTAMP: Final = _Codec(_encode_timestamp, _decode_timestamp)
_TIMESTAMPS: Final = _tuple_of(_TIMESTAMP, "Timestamps")
_DEPS: Final = _Codec(_encode_deps, _decode_deps)
_ROUTE: Final = _struct(Route, home_key=_KEY, keys=_KEYS)

# ---------------------------------------------------------------------------- transactions


def _operators(members: type[IntEnum], names: tuple[str, ...], what: str) -> _Codec[Any]:
    """Operators as their codes, the values of ``members`` and positions in ``names``
    (append only: codes are durable). An expression holds the member (its constructor
    turns a symbol into one); decoding gives the symbol, which the constructor turns back."""
    check_state(
        [m.value for m in members] == list(range(len(names)))
        and [getattr(m, "symbol", None) for m in members] == list(names),
        "%s codes and symbols disagree",
        what,
    )

    def encode(op: object) -> int:
        if type(op) is not members:
            raise CodecError(f"unknown {what} {op!r}")
        return int(op)

    def decode(wire: object) -> str:
        if type(wire) is not int or not 0 <= wire < len(names):
            raise CodecError(f"unknown {what} code {wire!r}")
        return names[wire]

    return _Codec(encode, decode)


_BINARY: Final = _operators(Operator, ("+", "-", "concat"), "operator")
_COMPARE: Final = _operators(
    Comparison, ("=", "!=", "<", "<=", ">", ">=", "is_null", "not_null"), "comparison"
)
_CONST, _READ_OF, _BIN_OP, _ITEM, _MAKE_TUPLE = 0, 1, 2, 3, 4
_ROW_OF, _SLICE_OF, _COUNT_OF, _STATIC_OF = 5, 6, 7, 8
_PUT, _DELETE, _PUT_ROW, _PUT_STATIC, _DELETE_ROW, _DELETE_RANGE, _DELETE_PARTITION = range(7)
# A new kind of expression or write must get a wire form here before anything can send it.
check_state(
    set(get_args(Expr))
    == {Const, ReadOf, BinOp, Item, MakeTuple, RowOf, SliceOf, CountOf, StaticOf}
    and set(get_args(Write))
    == {Put, Delete, PutRow, PutStatic, DeleteRow, DeleteRange, DeletePartition},
    "the codec does not know every kind of expression and write",
)


def _depth_checked(depth: int) -> None:
    if depth >= MAX_EXPR_DEPTH:
        raise CodecError(f"expression nests deeper than MAX_EXPR_DEPTH={MAX_EXPR_DEPTH}")


def _encode_expr(expr: Expr, depth: int = 0) -> list[object]:
    _depth_checked(depth)

    def child(inner: Expr) -> list[object]:
        return _encode_expr(inner, depth + 1)

    if type(expr) is Const:
        return [_CONST, _field("value", _value, expr.value)]
    if type(expr) is ReadOf:
        return [_READ_OF, _KEY.encode(expr.key), _field("default", _value, expr.default)]
    if type(expr) is BinOp:
        left, right = _field("left", child, expr.left), _field("right", child, expr.right)
        return [_BIN_OP, _BINARY.encode(expr.op), left, right]
    if type(expr) is Item:
        return [_ITEM, _field("value", child, expr.value), _field("index", _int, expr.index)]
    if type(expr) is MakeTuple:
        items = _field("items", lambda i: _each(_exact(i, tuple), child), expr.items)
        return [_MAKE_TUPLE, items]
    if type(expr) is RowOf:
        clustering = _field("clustering", _CLUSTERING.encode, expr.clustering)
        return [_ROW_OF, _KEY.encode(expr.key), clustering, _field("default", _value, expr.default)]
    if type(expr) is SliceOf:
        return [_SLICE_OF, _field("slice", _SLICE.encode, expr.slice)]
    if type(expr) is CountOf:
        return [_COUNT_OF, _field("slice", _SLICE.encode, expr.slice)]
    if type(expr) is StaticOf:
        return [_STATIC_OF, _KEY.encode(expr.key)]
    raise CodecError(f"expected an expression, got {type(expr).__name__}")


def _decode_expr(wire: object, depth: int = 0) -> Expr:
    _depth_checked(depth)

    def child(inner: object) -> Expr:
        return _decode_expr(inner, depth + 1)

    kind = _tag(_array(wire, "an expression"), "an expression")
    if kind == _CONST:
        (value,) = _array(wire, "Const", 2)[1:]
        return Const(_field("value", _value, value))
    if kind == _READ_OF:
        key, default = _array(wire, "ReadOf", 3)[1:]
        return ReadOf(_KEY.decode(key), _field("default", _value, default))
    if kind == _BIN_OP:
        op, left, right = _array(wire, "BinOp", 4)[1:]
        operands = _field("left", child, left), _field("right", child, right)
        return _construct(BinOp, _BINARY.decode(op), *operands)
    if kind == _ITEM:
        value, index = _array(wire, "Item", 3)[1:]
        return Item(_field("value", child, value), _field("index", _int, index))
    if kind == _MAKE_TUPLE:
        (items,) = _array(wire, "MakeTuple", 2)[1:]
        return MakeTuple(tuple(_field("items", lambda i: _each(_array(i, "items"), child), items)))
    if kind == _ROW_OF:
        key, clustering, default = _array(wire, "RowOf", 4)[1:]
        return _construct(
            RowOf,
            _KEY.decode(key),
            _field("clustering", _clustering, clustering),
            _field("default", _value, default),
        )
    if kind in (_SLICE_OF, _COUNT_OF):
        (selected,) = _array(wire, "SliceOf", 2)[1:]
        cls = SliceOf if kind == _SLICE_OF else CountOf
        return cls(_field("slice", _SLICE.decode, selected))
    if kind == _STATIC_OF:
        (key,) = _array(wire, "StaticOf", 2)[1:]
        return StaticOf(_KEY.decode(key))
    raise CodecError(f"unknown expression kind {kind}")


def _encode_write(write: Write) -> list[object]:
    key = _KEY.encode(write.key)
    if type(write) is Put:
        return [_PUT, key, _field("value", _encode_expr, write.value)]
    if type(write) is Delete:
        return [_DELETE, key]
    if type(write) is PutRow:
        clustering = _field("clustering", _CLUSTERING.encode, write.clustering)
        value = _field("value", _encode_expr, write.value)
        return [_PUT_ROW, key, clustering, value, _field("ttl", _TTL.encode, write.ttl)]
    if type(write) is PutStatic:
        value = _field("value", _encode_expr, write.value)
        return [_PUT_STATIC, key, value, _field("ttl", _TTL.encode, write.ttl)]
    if type(write) is DeleteRow:
        return [_DELETE_ROW, key, _field("clustering", _CLUSTERING.encode, write.clustering)]
    if type(write) is DeleteRange:
        return [
            _DELETE_RANGE,
            key,
            _field("prefix", _CLUSTERING.encode, write.prefix),
            _field("lower", _BOUND.encode, write.lower),
            _field("upper", _BOUND.encode, write.upper),
        ]
    if type(write) is DeletePartition:
        return [_DELETE_PARTITION, key]
    raise CodecError(f"expected a write, got {type(write).__name__}")


def _decode_write(wire: object) -> Write:
    kind = _tag(_array(wire, "a write"), "a write")
    if kind == _PUT:
        key, value = _array(wire, "Put", 3)[1:]
        return Put(_KEY.decode(key), _field("value", _decode_expr, value))
    if kind == _DELETE:
        (key,) = _array(wire, "Delete", 2)[1:]
        return Delete(_KEY.decode(key))
    if kind == _PUT_ROW:
        key, clustering, value, ttl = _array(wire, "PutRow", 5)[1:]
        return _construct(
            PutRow,
            _KEY.decode(key),
            _field("clustering", _clustering, clustering),
            _field("value", _decode_expr, value),
            _field("ttl", _TTL.decode, ttl),
        )
    if kind == _PUT_STATIC:
        key, value, ttl = _array(wire, "PutStatic", 4)[1:]
        return _construct(
            PutStatic,
            _KEY.decode(key),
            _field("value", _decode_expr, value),
            _field("ttl", _TTL.decode, ttl),
        )
    if kind == _DELETE_ROW:
        key, clustering = _array(wire, "DeleteRow", 3)[1:]
        return _construct(
            DeleteRow, _KEY.decode(key), _field("clustering", _clustering, clustering)
        )
    if kind == _DELETE_RANGE:
        key, prefix, lower, upper = _array(wire, "DeleteRange", 5)[1:]
        return _construct(
            DeleteRange,
            _KEY.decode(key),
            _field("prefix", _clustering, prefix),
            _field("lower", _BOUND.decode, lower),
            _field("upper", _BOUND.decode, upper),
        )
    if kind == _DELETE_PARTITION:
        (key,) = _array(wire, "DeletePartition", 2)[1:]
        return DeletePartition(_KEY.decode(key))
    raise CodecError(f"unknown write kind {kind}")


_EXPR: Final[_Codec[Expr]] = _Codec(_encode_expr, _decode_expr)
_PREDICATE: Final = _struct(Predicate, op=_COMPARE, left=_EXPR, right=_optional(_EXPR))
_UPDATE: Final = _struct(
    Update,
    writes=_tuple_of(_Codec(_encode_write, _decode_write), "writes"),
    condition=_tuple_of(_PREDICATE, "Predicates"),
)


def _parts_of(item: _Codec[T], what: str) -> _Codec[tuple[T, ...]]:
    """A batch's parts: at most MAX_BATCH_PARTS, refused before any is decoded."""

    def decode(wire: object) -> tuple[T, ...]:
        values = _array(wire, what)
        if len(values) > MAX_BATCH_PARTS:
            raise CodecError(f"{len(values)} {what} exceed MAX_BATCH_PARTS={MAX_BATCH_PARTS}")
        return tuple(_each(values, item.decode))

    return _Codec(lambda values: _each(_exact(values, tuple), item.encode), decode)


def _no_parts(wire: object) -> tuple[()]:
    if _array(wire, "parts"):
        raise CodecError("a batch's part holds parts of its own")
    return ()


def _encode_no_parts(parts: tuple[()]) -> list[object]:
    if _exact(parts, tuple):
        raise CodecError("a batch's part holds parts of its own")
    return []


# A batch's part is a transaction (and a result's, a result) without parts: decoding
# never nests deeper than one batch, whatever the input.
_NO_PARTS: Final[_Codec[tuple[()]]] = _Codec(_encode_no_parts, _no_parts)
_TXN_FIELDS: Final[dict[str, _Codec[Any]]] = {
    "reads": _KEYS,
    "update": _optional(_UPDATE),
    "returns": _tuple_of(_EXPR, "returns"),
}
_TXN_PART: Final = _extended_struct(Txn, 2, **_TXN_FIELDS, parts=_NO_PARTS)
_TXN: Final = _extended_struct(Txn, 2, **_TXN_FIELDS, parts=_parts_of(_TXN_PART, "parts"))
_SCOPE: Final = _Codec(
    lambda scope: _int(int(_exact(scope, WriteScope))),
    lambda wire: _construct(WriteScope, _int(wire)),
)
_WRITE_OPS: Final = _tuple_of(
    _extended_struct(
        WriteOp,
        3,
        key=_KEY,
        value=_VALUE,
        delete=_BOOL,
        scope=_SCOPE,
        clustering=_CLUSTERING,
        lower=_BOUND,
        upper=_BOUND,
        ttl=_TTL,
    ),
    "WriteOps",
)
_SELECTED: Final = _tuple_of(
    _Codec(
        lambda pair: [
            _field("selection", _SELECTION.encode, _array(pair, "a selection result", 2)[0]),
            _field("value", _value, pair[1]),
        ],
        lambda wire: (
            _field("selection", _SELECTION.decode, _array(wire, "a selection result", 2)[0]),
            _field("value", _value, cast("tuple[object, ...]", wire)[1]),
        ),
    ),
    "selection results",
)


def _encode_read(pair: tuple[Key, Value]) -> list[object]:
    # [key, value]: a row at (); [key, results, error]: a PartitionRead.
    key, value = _array(pair, "a (Key, value) pair", 2)
    encoded_key = _KEY.encode(cast("Key", key))
    if type(value) is PartitionRead:
        results = _field("results", _SELECTED.encode, value.results)
        return [encoded_key, results, _field("error", _optional(_STR).encode, value.error)]
    return [encoded_key, _field("value", _value, value)]


def _decode_read(wire: object) -> tuple[Key, Value]:
    fields = _array(wire, "a (Key, value) pair")
    if len(fields) == 3:
        key, results, error = fields
        return _KEY.decode(key), PartitionRead(
            _field("results", _SELECTED.decode, results),
            _field("error", _optional(_STR).decode, error),
        )
    key, value = _array(wire, "a (Key, value) pair", 2)
    return _KEY.decode(key), _field("value", _value, value)


_READS: Final = _tuple_of(_Codec(_encode_read, _decode_read), "reads")
_RESULT_FIELDS: Final[dict[str, _Codec[Any]]] = {
    "reads": _READS,
    "applied": _BOOL,
    "error": _optional(_STR),
    "returned": _tuple_of(_VALUE, "returned"),
}
_RESULT_PART: Final = _extended_struct(TxnResult, 3, **_RESULT_FIELDS, parts=_NO_PARTS)
_RESULT: Final = _extended_struct(
    TxnResult, 3, **_RESULT_FIELDS, parts=_parts_of(_RESULT_PART, "parts")
)

# ---------------------------------------------------------------------------- tag tables


# Every field's codec follows from its declared type, so a field added to a message is
# carried automatically, and a field of a type missing here stops the import.
_BY_TYPE: Final[Mapping[object, _Codec[Any]]] = {
    int: _INT,
    bool: _BOOL,
    Status: _STATUS,
    Timestamp: _TIMESTAMP,
    Timestamp | None: _optional(_TIMESTAMP),
    tuple[Timestamp, ...]: _TIMESTAMPS,
    Txn: _TXN,
    Txn | None: _optional(_TXN),
    Route: _ROUTE,
    Route | None: _optional(_ROUTE),
    Key | None: _optional(_KEY),
    Deps: _DEPS,
    tuple[WriteOp, ...]: _WRITE_OPS,
    tuple[WriteOp, ...] | None: _optional(_WRITE_OPS),
    TxnResult: _RESULT,
    TxnResult | None: _optional(_RESULT),
    tuple[tuple[Key, object], ...]: _READS,
    Message: _Codec(
        lambda body: _encode_tagged(body, _MESSAGE_BY_TAG, "a message"),
        lambda wire: _decode_tagged(wire, _MESSAGE_BY_TAG, "a message"),
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    tag: int
    cls: type[Any]
    codec: _Codec[Any]


def _schema(cls: type[Any], tag: int) -> _Schema:
    hints = get_type_hints(cls)
    names = field_names(cls)
    for name in names:
        check_state(hints[name] in _BY_TYPE, "no codec for %s.%s", cls.__name__, name)
    return _Schema(tag, cls, _struct(cls, **{name: _BY_TYPE[hints[name]] for name in names}))


# Wire and journal tags: never reuse or renumber one. Requests 10-29, replies 30-49.
# fmt: off
_MESSAGE_TAGS: Final[dict[type[Any], int]] = {
    messages.PreAccept: 10, messages.Accept: 11, messages.AcceptInvalidate: 12,
    messages.Commit: 13, messages.Apply: 14, messages.CommitInvalidate: 15,
    messages.InformDurable: 16, messages.BeginRecovery: 17, messages.BeginInvalidation: 18,
    messages.OutcomeDurable: 19, messages.CheckStatus: 20,
    messages.PreAcceptOk: 30, messages.Nack: 31, messages.AcceptOk: 32,
    messages.AcceptInvalidateOk: 33, messages.CommitOk: 34, messages.Insufficient: 35,
    messages.ReadOk: 36, messages.ReadRedundant: 37, messages.ApplyOk: 38,
    messages.RecoverOk: 39, messages.InvalidateOk: 40, messages.CheckStatusOk: 41,
}
# fmt: on
_MESSAGE_BY_TAG: Final[dict[int, _Schema]] = {
    tag: _schema(cls, tag) for cls, tag in _MESSAGE_TAGS.items()
}
_TOP_BY_TAG: Final = {ENVELOPE_TAG: _schema(Envelope, ENVELOPE_TAG), **_MESSAGE_BY_TAG}
_RECORD_BY_TAG: Final = {
    100: _schema(CommandSnapshot, 100),
    101: _schema(HlcFloor, 101),
    102: _schema(Durable, 102),
}
_ANY_BY_TAG: Final = {**_TOP_BY_TAG, **_RECORD_BY_TAG}
_BY_CLASS: Final = {s.cls: s for s in _ANY_BY_TAG.values()}
check_state(len(_BY_CLASS) == len(_ANY_BY_TAG) == 27, "codec tags or classes are not unique")

MESSAGE_TAGS: Final[Mapping[type[Any], int]] = dict(_MESSAGE_TAGS)
"""The wire tag of every message class (``Envelope`` is :data:`ENVELOPE_TAG`)."""
RECORD_TAGS: Final[Mapping[type[Any], int]] = {s.cls: t for t, s in _RECORD_BY_TAG.items()}
"""The journal tag of every record class."""

# ---------------------------------------------------------------------------- top level


def _encode_tagged(obj: object, table: Mapping[int, _Schema], what: str) -> list[object]:
    schema = _BY_CLASS.get(type(obj))
    if schema is None or table.get(schema.tag) is not schema:
        raise CodecError(f"{type(obj).__name__} is not {what}")
    return [
        schema.tag,
        *cast("list[object]", _field(schema.cls.__name__, schema.codec.encode, obj)),
    ]


def _decode_tagged(wire: object, table: Mapping[int, _Schema], what: str) -> Any:
    fields = _array(wire, what)
    tag = _tag(fields, what)
    schema = table.get(tag)
    if schema is None:
        other = _ANY_BY_TAG.get(tag)
        if other is None:
            raise CodecError(f"unknown {what.removeprefix('a ')} tag {tag}")
        raise CodecError(f"tag {tag} belongs to {other.cls.__name__}, which is not {what}")
    return _field(schema.cls.__name__, schema.codec.decode, fields[1:])


def _pack(wire: list[object]) -> bytes:
    try:
        data = msgpack.packb(wire, use_bin_type=True)
    except (ValueError, TypeError, OverflowError) as error:  # unreachable after validation
        raise CodecError(f"cannot pack: {error}") from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError(f"encoded size {len(data)} exceeds MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    return data


def _unpack(data: bytes) -> object:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_MESSAGE_BYTES:
        raise CodecError(f"input of {size} bytes exceeds MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}")
    if size == 0:
        raise CodecError("empty input")
    try:
        return cast("object", msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True))
    except msgpack.ExtraData:
        raise CodecError("trailing bytes after the encoded object") from None
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise CodecError(f"malformed msgpack: {error}") from None


def encode_message(message: Envelope | Message) -> bytes:
    """The bytes of a message, or of an envelope carrying one."""
    return _pack(_encode_tagged(message, _TOP_BY_TAG, "a message"))


def decode_message(data: bytes) -> Envelope | Message:
    """The message or envelope ``data`` encodes; :class:`CodecError` if it is malformed."""
    return cast("Envelope | Message", _decode_tagged(_unpack(data), _TOP_BY_TAG, "a message"))


def encode_record(record: JournalRecord) -> bytes:
    """The bytes of one journal record."""
    return _pack(_encode_tagged(record, _RECORD_BY_TAG, "a journal record"))


def decode_record(data: bytes) -> JournalRecord:
    """The journal record ``data`` encodes; :class:`CodecError` if it is malformed."""
    return cast("JournalRecord", _decode_tagged(_unpack(data), _RECORD_BY_TAG, "a journal record"))


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
]
