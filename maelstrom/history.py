"""Jepsen-style histories: what the harness records, writes, reads back and checks.

Theory of operation
-------------------
A history is a list of :class:`Event` values in the order they happened, exactly as Jepsen
records them: each client operation appears twice, once as ``invoke`` and once as its
completion, ``ok`` (it happened, with the observed value), ``fail`` (it certainly did not)
or ``info`` (unknown: it may have happened, at any time after its invocation). A process
has at most one operation in flight; after an ``info`` it never completes anything again
(the harness gives the thread a fresh process number, as Jepsen does). Nemesis events
(partitions) have the process ``"nemesis"`` and are ignored by checkers.

Values follow Maelstrom's workloads, in JSON form:

* ``lin-kv``: ``[key, v]`` (``jepsen.independent`` tuples); ``v`` is the value for a read
  or write, ``[from, to]`` for a cas, ``None`` in a read's invocation.
* ``txn-*``: the micro-ops ``[[f, key, v], ...]``; reads are ``None`` until completed.

:func:`pair` folds the events into :class:`Operation` values (one per invocation) for the
checkers. :func:`to_edn_lines` renders the history as Jepsen's ``history.edn`` so it can be
re-checked by Knossos or Elle elsewhere; :func:`to_json` / :func:`from_json` are the
lossless form this package reads back (``python -m maelstrom.harness --recheck``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from maelstrom.edn import Keyword, dumps

EventType: TypeAlias = Literal["invoke", "ok", "fail", "info"]
Process: TypeAlias = int | str
NEMESIS: Final = "nemesis"
JSON_FORMAT: Final = "maelstrom-history/1"
_TYPES: Final = frozenset({"invoke", "ok", "fail", "info"})
TXN_WORKLOADS: Final = frozenset({"txn-list-append", "txn-rw-register"})
WORKLOADS: Final = frozenset({"lin-kv", *TXN_WORKLOADS})


@dataclass(frozen=True, slots=True)
class Event:
    """One history entry. ``time`` is nanoseconds since the test started."""

    index: int
    type: EventType
    f: str
    value: Any
    time: int
    process: Process
    error: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise ValueError(f"event {self.index}: unknown type {self.type!r}")


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation and its completion. ``value`` is the completion's value for ``ok``
    and the invocation's otherwise; ``completed`` is None for ``info`` (never returned)."""

    index: int
    process: int
    f: str
    status: Literal["ok", "fail", "info"]
    value: Any
    invoked: int
    completed: int | None


def pair(events: Iterable[Event]) -> list[Operation]:
    """Client operations in invocation order; an invocation with no completion is info."""
    open_ops: dict[int, Event] = {}
    done: dict[int, Operation] = {}
    for event in events:
        process = event.process
        if not isinstance(process, int):
            continue
        if event.type == "invoke":
            if process in open_ops:
                raise ValueError(f"event {event.index}: process {process} already has an op")
            open_ops[process] = event
            continue
        invoke = open_ops.pop(process, None)
        if invoke is None:
            raise ValueError(f"event {event.index}: completion without an invocation")
        if event.f != invoke.f:
            raise ValueError(f"event {event.index}: completes {invoke.f} with {event.f}")
        status = event.type
        done[invoke.index] = Operation(
            invoke.index,
            process,
            invoke.f,
            status,
            event.value if status == "ok" else invoke.value,
            invoke.time,
            None if status == "info" else event.time,
        )
    for invoke in open_ops.values():
        done[invoke.index] = Operation(
            invoke.index, int(invoke.process), invoke.f, "info", invoke.value, invoke.time, None
        )
    return [done[i] for i in sorted(done)]


# ---------------------------------------------------------------------------- JSON


def to_json(workload: str, events: Sequence[Event]) -> dict[str, Any]:
    """A JSON-able document holding the workload name and every event."""
    return {
        "format": JSON_FORMAT,
        "workload": workload,
        "events": [
            {
                "index": e.index,
                "type": e.type,
                "f": e.f,
                "value": e.value,
                "time": e.time,
                "process": e.process,
                **({"error": list(e.error)} if e.error is not None else {}),
            }
            for e in events
        ],
    }


def from_json(document: Mapping[str, Any]) -> tuple[str, list[Event]]:
    """The workload and events of a :func:`to_json` document; ValueError if malformed."""
    if document.get("format") != JSON_FORMAT:
        raise ValueError(f"not a {JSON_FORMAT} document")
    workload = document.get("workload")
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}")
    events = []
    for raw in document["events"]:
        error = raw.get("error")
        events.append(
            Event(
                index=int(raw["index"]),
                type=raw["type"],
                f=str(raw["f"]),
                value=raw["value"],
                time=int(raw["time"]),
                process=raw["process"],
                error=None if error is None else (str(error[0]), str(error[1])),
            )
        )
    return str(workload), events


def load(path: str) -> tuple[str, list[Event]]:
    with open(path, encoding="utf-8") as handle:
        return from_json(json.load(handle))


# ---------------------------------------------------------------------------- EDN


def _edn_value(workload: str, value: Any) -> Any:
    if workload in TXN_WORKLOADS and isinstance(value, list):
        return [[Keyword(m[0]), m[1], m[2]] for m in value]
    return value


def to_edn_lines(workload: str, events: Sequence[Event]) -> list[str]:
    """``history.edn`` lines: one Jepsen op map per line, as Jepsen writes them."""
    lines = []
    for e in events:
        entry: dict[Keyword, Any] = {
            Keyword("index"): e.index,
            Keyword("type"): Keyword(e.type),
            Keyword("f"): Keyword(e.f),
            Keyword("value"): _edn_value(workload, e.value),
            Keyword("time"): e.time,
            Keyword("process"): e.process if isinstance(e.process, int) else Keyword(e.process),
        }
        if e.error is not None:
            entry[Keyword("error")] = [Keyword(e.error[0]), e.error[1]]
        lines.append(dumps(entry))
    return lines


__all__ = [
    "NEMESIS",
    "TXN_WORKLOADS",
    "WORKLOADS",
    "Event",
    "EventType",
    "Operation",
    "from_json",
    "load",
    "pair",
    "to_edn_lines",
    "to_json",
]
