"""Client-observed transaction histories, as recorded by the simulator and judged by the checkers.

Theory of operation
-------------------
A history is what the *clients* saw, nothing more: every transaction a client
invoked, when it was invoked and acknowledged (in virtual microseconds), whether
it was acknowledged, and the micro-operations it carried.  The checkers in
:mod:`accord.sim.verify` never look at replica state; they only ask whether some
serial order of the committed transactions explains every value the clients
read while respecting real time.  Keeping the history independent of the
protocol is what makes the check meaningful: a bug in the protocol cannot
hide in a bug-compatible reading of its own internals.

Outcomes follow Jepsen's convention:

``ok``
    the transaction committed and the client received the result; its reads
    are the values it observed and ``completed_at`` is when the ack arrived.
``fail``
    the transaction definitely did not take effect (for example it was
    rejected before anything could be applied); its reads carry no
    information.
``info``
    the outcome is unknown (timeout, crashed coordinator, the simulation
    ended while it was in flight).  It may or may not have taken effect, so
    it has no completion time: it may take effect arbitrarily late.

Micro-operations are ``r`` (read), ``append`` (list-append workloads: append a
unique int to the list stored at a key) and ``put`` (register workloads:
overwrite the key).  A read's ``value`` is what was observed, or ``None`` when
unknown (``fail``/``info`` operations, or not yet completed).

:class:`HistoryRecorder` is the small state machine the simulator drives:
``invoke`` at submission, ``complete`` at acknowledgement, ``history`` at the
end (anything still pending becomes ``info``).

JSON form: :meth:`History.to_json` produces plain dicts/lists; tuples become
JSON arrays, and :meth:`History.from_json` turns every JSON array back into a
tuple (recursively), because the checkers need hashable, immutable values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

__all__ = [
    "History",
    "HistoryRecorder",
    "MicroOp",
    "MicroOpKind",
    "OpStatus",
    "Operation",
]

OpStatus = Literal["ok", "fail", "info"]
MicroOpKind = Literal["r", "append", "put"]

_STATUSES: frozenset[str] = frozenset(("ok", "fail", "info"))
_KINDS: frozenset[str] = frozenset(("r", "append", "put"))
JSON_FORMAT = "accord-history/1"


@dataclass(frozen=True, slots=True)
class MicroOp:
    """One read or write inside a transaction.

    ``value`` for ``"r"``: the observed value (list-append: ``tuple[int, ...]``,
    with ``None`` or ``()`` meaning the empty list; registers: the register
    value) or ``None`` when unknown.  For ``"append"``: the int appended.  For
    ``"put"``: the new register value.
    """

    kind: MicroOpKind
    key: str
    value: object

    def __post_init__(self) -> None:
        # Fail at construction: a mistyped kind would otherwise be silently
        # ignored by a checker and weaken the verdict.
        if self.kind not in _KINDS:
            raise ValueError(f"unknown micro-op kind {self.kind!r}")
        if not isinstance(self.key, str):
            raise TypeError(f"micro-op key must be str, got {type(self.key).__name__}")


@dataclass(frozen=True, slots=True)
class Operation:
    """One client transaction: invocation, outcome and its micro-ops in program order."""

    op_id: int
    process: int
    invoked_at: int
    completed_at: int | None
    status: OpStatus
    mops: tuple[MicroOp, ...]

    def __post_init__(self) -> None:
        # These invariants are what the real-time reasoning relies on; a
        # history violating them is a recorder bug, not a database anomaly.
        if self.status not in _STATUSES:
            raise ValueError(f"op {self.op_id}: unknown status {self.status!r}")
        if self.status == "info":
            if self.completed_at is not None:
                raise ValueError(f"op {self.op_id}: info operations have no completion time")
        elif self.completed_at is None:
            raise ValueError(f"op {self.op_id}: {self.status} operation needs completed_at")
        elif self.completed_at < self.invoked_at:
            raise ValueError(f"op {self.op_id}: completed_at precedes invoked_at")

    @property
    def is_ok(self) -> bool:
        return self.status == "ok"


def _freeze(value: object) -> object:
    """JSON arrays back to tuples (recursively) so values stay hashable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: object) -> object:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class History:
    """An immutable history; operations are kept in the order given (normally by op_id)."""

    operations: tuple[Operation, ...]
    _by_id: Mapping[int, Operation] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        by_id: dict[int, Operation] = {}
        for op in self.operations:
            if op.op_id in by_id:
                raise ValueError(f"duplicate op_id {op.op_id}")
            by_id[op.op_id] = op
        # Frozen dataclass: the index is derived state, set once here.
        object.__setattr__(self, "_by_id", by_id)

    def __len__(self) -> int:
        return len(self.operations)

    def by_id(self, op_id: int) -> Operation:
        """The operation with this id (KeyError if absent)."""
        return self._by_id[op_id]

    def ok_ops(self) -> tuple[Operation, ...]:
        """Operations acknowledged as committed, in history order."""
        return tuple(op for op in self.operations if op.status == "ok")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (tuples become lists)."""
        return {
            "format": JSON_FORMAT,
            "operations": [
                {
                    "op_id": op.op_id,
                    "process": op.process,
                    "invoked_at": op.invoked_at,
                    "completed_at": op.completed_at,
                    "status": op.status,
                    "mops": [[m.kind, m.key, _thaw(m.value)] for m in op.mops],
                }
                for op in self.operations
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> History:
        """Inverse of :meth:`to_json`; every JSON array in a value becomes a tuple."""
        fmt = data.get("format", JSON_FORMAT)
        if fmt != JSON_FORMAT:
            raise ValueError(f"unsupported history format {fmt!r}")
        ops: list[Operation] = []
        for raw in data["operations"]:
            mops = []
            for entry in raw["mops"]:
                kind, key, value = entry
                mops.append(MicroOp(kind=kind, key=key, value=_freeze(value)))
            completed = raw["completed_at"]
            ops.append(
                Operation(
                    op_id=int(raw["op_id"]),
                    process=int(raw["process"]),
                    invoked_at=int(raw["invoked_at"]),
                    completed_at=None if completed is None else int(completed),
                    status=cast("OpStatus", raw["status"]),
                    mops=tuple(mops),
                )
            )
        return cls(tuple(ops))


@dataclass(slots=True)
class _Pending:
    process: int
    invoked_at: int
    mops: tuple[MicroOp, ...]


class HistoryRecorder:
    """Builds a :class:`History` as the simulator invokes and completes transactions.

    Op ids are assigned densely from 0 in invocation order.  At most one
    operation may be in flight per process, which mirrors a client that waits
    for each answer; an ``info`` completion frees the process (the simulator
    decides whether it reuses the id).
    """

    __slots__ = ("_done", "_in_flight", "_next_id", "_pending")

    def __init__(self) -> None:
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self._in_flight: dict[int, int] = {}  # process -> op_id
        self._done: dict[int, Operation] = {}

    def invoke(self, process: int, mops: Sequence[MicroOp], now: int) -> int:
        """Record an invocation at virtual time ``now``; returns the new op id."""
        if process in self._in_flight:
            raise ValueError(
                f"process {process} already has op {self._in_flight[process]} in flight"
            )
        op_id = self._next_id
        self._next_id += 1
        self._pending[op_id] = _Pending(process, now, tuple(mops))
        self._in_flight[process] = op_id
        return op_id

    def complete(
        self, op_id: int, status: OpStatus, mops: Sequence[MicroOp] | None, now: int
    ) -> None:
        """Record the outcome of ``op_id``.

        ``mops`` carries the observed read values (``None`` keeps the invoked
        micro-ops); it must match the invocation's kinds and keys one for one,
        since a reordered or different transaction would make the check
        meaningless.  For ``info`` the completion time is dropped: an unknown
        outcome may take effect at any later time.
        """
        pending = self._pending.get(op_id)
        if pending is None:
            raise ValueError(f"op {op_id} is not in flight")
        final = pending.mops if mops is None else tuple(mops)
        # Validate before mutating: a rejected completion leaves the op
        # pending, so it still ends up in the history (as info).
        if [(m.kind, m.key) for m in final] != [(m.kind, m.key) for m in pending.mops]:
            raise ValueError(f"op {op_id}: completion micro-ops differ from the invocation's")
        if status not in _STATUSES:
            raise ValueError(f"op {op_id}: unknown status {status!r}")
        if status != "info" and now < pending.invoked_at:
            raise ValueError(f"op {op_id}: completed before it was invoked")
        del self._pending[op_id]
        del self._in_flight[pending.process]
        self._done[op_id] = Operation(
            op_id=op_id,
            process=pending.process,
            invoked_at=pending.invoked_at,
            completed_at=None if status == "info" else now,
            status=status,
            mops=final,
        )

    def pending(self) -> tuple[int, ...]:
        """Op ids still in flight, ascending."""
        return tuple(sorted(self._pending))

    def history(self) -> History:
        """Snapshot of everything so far; operations still in flight become ``info``."""
        ops = dict(self._done)
        for op_id, p in self._pending.items():
            ops[op_id] = Operation(
                op_id=op_id,
                process=p.process,
                invoked_at=p.invoked_at,
                completed_at=None,
                status="info",
                mops=p.mops,
            )
        return History(tuple(ops[i] for i in sorted(ops)))
