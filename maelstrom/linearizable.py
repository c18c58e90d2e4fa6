"""A bounded linearizability checker (Wing & Gong with Lowe's memoization), and its models.

Theory of operation
-------------------
A history of operations, each with a call time and (unless its outcome is unknown) a
return time, is *linearizable* for a sequential model if every operation can be given a
point between its call and return such that applying the operations one at a time in that
order, from the model's initial state, reproduces every observed output.

The search is the one Knossos' ``wgl`` and Porcupine use (Wing & Gong 1993; Lowe,
"Testing for linearizability", 2017; Horn & Kroening 2015). Call and return entries sit in
one list sorted by time, calls before returns at equal times (intervals are closed). The
search walks the list: at a call it tries to linearize that operation now (the model must
accept it), removing the call and its return from the list; at a return it has met an
operation that must already have been linearized, so it backtracks to the most recent
choice. A cache of (set of linearized operations, model state) pairs prunes
configurations already explored: reaching one again cannot lead anywhere new. The history
is linearizable iff the list empties.

Operations with an unknown outcome (Jepsen ``info``) never return, so they may be
linearized at any point after their call, or at the very end, which is the same as not at
all; their models accept any output.

Every search is bounded by ``max_states`` cached configurations. Past the bound the answer
is *unknown*, never a guess: the caller reports ``:valid? :unknown`` as Knossos does when
it gives up.

Models are pure: ``step(state, op)`` returns the next state or None when the operation
cannot happen in ``state``. States must be hashable. :class:`CasRegister` is Knossos'
``cas-register`` (lin-kv, checked per key); :class:`ListAppendDatabase` and
:class:`RegisterDatabase` treat a whole transactional database as one object, so
linearizability of it is strict serializability of the transactions. Such a search is
exponential in the number of mutually concurrent operations: it suits short runs with a
few clients, and answers unknown, at its bound, on long runs full of slow operations.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from accord.invariants import check_not_none, fail

DEFAULT_MAX_STATES: Final = 200_000
"""Configurations one search may cache before it answers unknown. A cas-register state is
one short string; a database state is a tuple over the keys in play (tens), so the bound
keeps a search within a few hundred MB."""

S = TypeVar("S", bound=Hashable)


@dataclass(frozen=True, slots=True)
class LinOp:
    """One operation: ``ret`` is None when its outcome is unknown (it never returned).

    ``input`` is model-specific; ``ident`` names the operation in reports (history index).
    """

    ident: int
    call: int
    ret: int | None
    input: Any

    @property
    def unknown(self) -> bool:
        return self.ret is None


class Model(Protocol[S]):
    def init(self) -> S: ...

    def step(self, state: S, op: LinOp) -> S | None: ...


@dataclass(frozen=True, slots=True)
class LinResult:
    """``valid`` is True, False, or None (unknown: the state bound was reached).

    On failure, ``stuck_on`` is the operation that could not be linearized after the
    longest linearizable prefix found (``prefix``), and ``state`` the model state there.
    """

    valid: bool | None
    explored: int
    prefix: tuple[int, ...] = ()
    stuck_on: int | None = None
    state: object = None


class _Entry:
    __slots__ = ("id", "is_call", "match", "next", "prev")

    def __init__(self, op_id: int, is_call: bool) -> None:
        self.id = op_id
        self.is_call = is_call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _build_list(ops: Sequence[LinOp]) -> _Entry:
    far = max((op.ret for op in ops if op.ret is not None), default=0)
    far = max(far, max((op.call for op in ops), default=0)) + 1
    keyed: list[tuple[int, int, int, _Entry]] = []
    for i, op in enumerate(ops):
        call, ret = _Entry(i, True), _Entry(i, False)
        call.match = ret
        # An unknown outcome returns "after everything": it may be linearized anywhere.
        keyed.append((op.call, 0, i, call))
        keyed.append((far if op.ret is None else op.ret, 1, i, ret))
    keyed.sort(key=lambda t: (t[0], t[1], t[2]))
    head = _Entry(-1, False)
    previous = head
    for _, _, _, entry in keyed:
        previous.next = entry
        entry.prev = previous
        previous = entry
    return head


def _lift(entry: _Entry) -> None:
    prev = check_not_none(entry.prev, "lifting entry %d outside the list", entry.id)
    match = check_not_none(entry.match, "lifting call %d without its return", entry.id)
    prev.next = entry.next
    if entry.next is not None:
        entry.next.prev = prev
    match_prev = check_not_none(match.prev, "return of %d outside the list", entry.id)
    match_prev.next = match.next
    if match.next is not None:
        match.next.prev = match.prev


def _unlift(entry: _Entry) -> None:
    match = check_not_none(entry.match, "unlifting call %d without its return", entry.id)
    check_not_none(match.prev, "return of %d outside the list", entry.id).next = match
    if match.next is not None:
        match.next.prev = match
    check_not_none(entry.prev, "unlifting entry %d outside the list", entry.id).next = entry
    if entry.next is not None:
        entry.next.prev = entry


class _Search(Generic[S]):
    """Best partial linearization seen so far, for the failure report."""

    __slots__ = ("depth", "prefix", "state", "stuck_on")

    def __init__(self) -> None:
        self.depth = -1
        self.prefix: tuple[int, ...] = ()
        self.stuck_on: int | None = None
        self.state: object = None


def check(
    ops: Sequence[LinOp], model: Model[S], *, max_states: int = DEFAULT_MAX_STATES
) -> LinResult:
    """Whether ``ops`` is linearizable for ``model``; unknown beyond ``max_states``."""
    if max_states < 1:
        raise ValueError("max_states must be positive")
    head = _build_list(ops)
    state = model.init()
    linearized = 0
    cache: set[tuple[int, S]] = set()
    calls: list[tuple[_Entry, S]] = []
    best: _Search[S] = _Search()
    entry = head.next
    while head.next is not None:
        # A return entry always follows every pending call.
        entry = check_not_none(entry, "the history ends in a pending call")
        if entry.is_call:
            following = model.step(state, ops[entry.id])
            if following is not None:
                candidate = linearized | (1 << entry.id)
                key = (candidate, following)
                if key not in cache:
                    if len(cache) >= max_states:
                        return LinResult(None, len(cache))
                    cache.add(key)
                    calls.append((entry, state))
                    state, linearized = following, candidate
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        # A return of an operation not yet linearized: this branch is dead.
        if len(calls) > best.depth:
            best.depth = len(calls)
            best.prefix = tuple(ops[e.id].ident for e, _ in calls)
            best.stuck_on = ops[entry.id].ident
            best.state = state
        if not calls:
            return LinResult(False, len(cache), best.prefix, best.stuck_on, best.state)
        entry, state = calls.pop()
        linearized &= ~(1 << entry.id)
        _unlift(entry)
        entry = entry.next
    return LinResult(True, len(cache))


# ---------------------------------------------------------------------------- models


ABSENT: Final = ""


class CasRegister:
    """Knossos' ``cas-register``: one register, initially absent.

    Inputs: ``("read", v)`` (v observed), ``("write", v)``, ``("cas", (from, to))``, with
    values as canonical JSON strings so 1 and "1" stay distinct. The absent register is
    :data:`ABSENT` (``""``, which no canonical JSON text equals), because None already
    means "this step is impossible".
    """

    def init(self) -> object:
        return ABSENT

    def step(self, state: object, op: LinOp) -> object:
        f: str = op.input[0]
        value: object = op.input[1]
        if f == "read":
            return state if op.unknown or state == value else None
        if f == "write":
            return value
        if not isinstance(value, tuple):
            fail("cas value %r is not (expected, new)", value)
        expected, new = value
        if state == expected:
            return new
        # A cas whose condition failed has no effect; only an unknown outcome allows it,
        # since an ok cas claims the condition held.
        return state if op.unknown else None


Micro = tuple[str, str, Any]
"""A txn micro-op ``(f, key, value)``; keys are canonical JSON strings."""

DbState = tuple[tuple[str, Any, int], ...]
"""Sorted ``(key, value, live)`` for each key that unlinearized operations still touch."""


class _Database:
    """A whole transactional database as one object, so linearizability of it is strict
    serializability of the transactions.

    The state keeps, per key, its value and how many not-yet-linearized operations touch
    it (``live``). A key whose last operation has been linearized can never matter again
    and is dropped, so states stay as small as the set of keys in play; live counts
    depend only on which operations are linearized, so dropping keys loses no
    memoization. Built from the very operations it will check.
    """

    append = False

    def __init__(self, ops: Sequence[LinOp]) -> None:
        self.touches: dict[str, int] = {}
        for op in ops:
            for key in {key for _, key, _ in op.input}:
                self.touches[key] = self.touches.get(key, 0) + 1

    def init(self) -> DbState:
        return ()

    def step(self, state: DbState, op: LinOp) -> DbState | None:
        mops: tuple[Micro, ...] = op.input
        cells = {key: (value, live) for key, value, live in state}
        working: dict[str, tuple[Any, int]] = {}
        for _, key, _ in mops:
            if key not in working:
                working[key] = cells.get(key, (() if self.append else None, self.touches[key]))
        for f, key, value in mops:
            held, live = working[key]
            if f != "r":
                working[key] = ((*held, value) if self.append else value, live)
            elif not op.unknown and held != ((value or ()) if self.append else value):
                return None
        for key, (value, live) in working.items():
            if live > 1:
                cells[key] = (value, live - 1)
            else:
                cells.pop(key, None)
        return tuple(sorted((key, value, live) for key, (value, live) in cells.items()))


class ListAppendDatabase(_Database):
    """txn-list-append: micro-ops ``("r", key, tuple | None)`` / ``("append", key, v)``."""

    append = True


class RegisterDatabase(_Database):
    """txn-rw-register: micro-ops ``("r", key, v | None)`` / ``("w", key, v)``."""


def prune_unobserved(ops: Sequence[LinOp]) -> list[LinOp]:
    """Drop unknown-outcome txns none of whose writes any completed read observed.

    Exact when written values are unique per key (both txn workloads guarantee it): in any
    linearization such a txn can move to the very end, where no read follows it, and
    conversely adding it at the end never changes a read. Dropping them keeps the search
    from trying every subset of them.
    """
    observed: set[tuple[str, Any]] = set()
    for op in ops:
        if op.unknown:
            continue
        for f, key, value in op.input:
            if f != "r" or value is None:
                continue
            if isinstance(value, tuple):
                observed.update((key, v) for v in value)
            else:
                observed.add((key, value))
    kept = []
    for op in ops:
        if op.unknown and not any(
            f != "r" and (key, value) in observed for f, key, value in op.input
        ):
            continue
        kept.append(op)
    return kept


__all__ = [
    "ABSENT",
    "DEFAULT_MAX_STATES",
    "CasRegister",
    "LinOp",
    "LinResult",
    "ListAppendDatabase",
    "Model",
    "RegisterDatabase",
    "check",
    "prune_unobserved",
]
