"""The in-repo checkers for the three workloads, and how verdicts combine.

Theory of operation
-------------------
Each workload gets the strongest check that is still sound:

``lin-kv``
    Knossos' ``independent`` linearizability: the history is split by key and each key is
    checked against a compare-and-set register (:class:`maelstrom.linearizable.CasRegister`)
    with the memoized Wing & Gong search. Reads that failed are dropped (Maelstrom records
    an indefinite read as ``:fail``, since reads are idempotent); unknown writes and cas
    stay, with no return.
``txn-list-append``
    Elle's inference, already in :func:`accord.sim.verify.check_list_append`: version
    orders from list prefixes, ww/wr/rw and real-time edges, cycles named G0, G1c,
    G-single, G2 (with ``-realtime`` variants), plus G1a, G1b, internal and
    incompatible-order. Real-time edges make it a strict-serializability check.
``txn-rw-register``
    :func:`accord.sim.verify.check_registers` (Elle-style inference, sound but unable to
    order blind writes) *and* a whole-database linearizability search
    (:class:`maelstrom.linearizable.RegisterDatabase`), which is complete but bounded. The
    history is invalid if either finds a violation, and unknown if the search gave up.

The external check is Porcupine (:mod:`maelstrom.porcupine_driver`). :func:`combine`
folds both into one ``valid?``: false if either says false, unknown if either is unknown,
true only when both say true; a disagreement is reported explicitly, because on the
histories CI produces the two must agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from accord.sim.history import History as AccordHistory
from accord.sim.history import MicroOp as AccordMicroOp
from accord.sim.history import Operation as AccordOperation
from accord.sim.verify import Verdict, check_list_append, check_registers
from maelstrom.history import Event, Operation, pair
from maelstrom.linearizable import (
    DEFAULT_MAX_STATES,
    CasRegister,
    LinOp,
    LinResult,
    RegisterDatabase,
    check,
    prune_unobserved,
)

MAX_REPORTED_KEYS: Final = 5
"""Failing keys described in a lin-kv report; the count covers all of them."""

Valid = bool | None
"""True, False, or None for Jepsen's ``:unknown``."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One checker's verdict: ``valid`` (True/False/None=unknown), a one-line
    ``summary`` and structured ``details`` for results.edn/json."""

    checker: str
    valid: Valid
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def _canonical(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# ---------------------------------------------------------------------------- lin-kv


def lin_kv_ops(operations: Sequence[Operation]) -> dict[str, list[LinOp]]:
    """Per canonical key, the operations a linearizability check must place."""
    by_key: dict[str, list[LinOp]] = {}
    for op in operations:
        if op.status == "fail":
            continue
        key, value = op.value
        if op.f == "read":
            if op.status != "ok":
                continue  # an unknown read constrains nothing
            lin_input: tuple[str, Any] = ("read", _canonical(value))
        elif op.f == "write":
            lin_input = ("write", _canonical(value))
        elif op.f == "cas":
            lin_input = ("cas", (_canonical(value[0]), _canonical(value[1])))
        else:
            raise ValueError(f"op {op.index}: {op.f!r} is not a lin-kv operation")
        by_key.setdefault(_canonical(key), []).append(
            LinOp(op.index, op.invoked, op.completed, lin_input)
        )
    return by_key


def check_lin_kv(events: Sequence[Event], *, max_states: int = DEFAULT_MAX_STATES) -> CheckResult:
    """Per-key linearizability of a lin-kv history (cas-register model)."""
    by_key = lin_kv_ops(pair(events))
    failures: list[dict[str, Any]] = []
    unknown: list[str] = []
    explored = 0
    for key in sorted(by_key):
        result: LinResult = check(by_key[key], CasRegister(), max_states=max_states)
        explored += result.explored
        if result.valid is None:
            unknown.append(key)
        elif not result.valid:
            failures.append(
                {
                    "key": key,
                    "stuck-on-op": result.stuck_on,
                    "linearized-prefix": list(result.prefix[-10:]),
                    "state": result.state,
                }
            )
    details: dict[str, Any] = {
        "keys": len(by_key),
        "configurations": explored,
        "failures": failures[:MAX_REPORTED_KEYS],
        "failed-keys": len(failures),
        "unknown-keys": unknown[:MAX_REPORTED_KEYS],
    }
    name = "linearizable-per-key"
    if failures:
        first = failures[0]
        summary = (
            f"{len(failures)} of {len(by_key)} keys not linearizable; key {first['key']}: "
            f"op {first['stuck-on-op']} cannot follow state {first['state']}"
        )
        return CheckResult(name, False, summary, details)
    if unknown:
        return CheckResult(
            name, None, f"{len(unknown)} keys exceeded max_states={max_states}", details
        )
    return CheckResult(name, True, f"{len(by_key)} keys linearizable", details)


# ---------------------------------------------------------------------------- txn


def to_accord_history(workload: str, operations: Sequence[Operation]) -> AccordHistory:
    """The history in :mod:`accord.sim.history` form, for the Elle-style checkers."""
    append = workload == "txn-list-append"
    converted = []
    for op in operations:
        mops = []
        for f, key, value in op.value:
            name = _canonical(key)
            if f == "r":
                seen = value if op.status == "ok" else None
                if append and seen is not None:
                    seen = tuple(seen)
                mops.append(AccordMicroOp("r", name, seen))
            elif f == "append":
                mops.append(AccordMicroOp("append", name, value))
            else:
                mops.append(AccordMicroOp("put", name, value))
        converted.append(
            AccordOperation(
                op_id=op.index,
                process=op.process,
                invoked_at=op.invoked,
                completed_at=op.completed,
                status=op.status,
                mops=tuple(mops),
            )
        )
    return AccordHistory(tuple(converted))


def txn_lin_ops(operations: Sequence[Operation]) -> list[LinOp]:
    """Whole-database operations (failed ones dropped) for the linearizability search."""
    ops = []
    for op in operations:
        if op.status == "fail":
            continue
        mops = []
        for f, key, value in op.value:
            if f == "r" and op.status == "ok" and isinstance(value, list):
                value = tuple(value)
            mops.append((f, _canonical(key), value if op.status == "ok" or f != "r" else None))
        ops.append(LinOp(op.index, op.invoked, op.completed, tuple(mops)))
    return ops


def _verdict_result(name: str, verdict: Verdict) -> CheckResult:
    details: dict[str, Any] = {
        "anomaly-types": list(verdict.anomaly_names),
        "anomalies": [
            {"name": a.name, "explanation": a.explanation, "ops": list(a.op_ids)}
            for a in verdict.anomalies
        ],
        "stats": dict(verdict.stats),
    }
    summary = verdict.summary().splitlines()[0]
    return CheckResult(name, verdict.valid, summary, details)


def check_txn_list_append(events: Sequence[Event]) -> CheckResult:
    """Strict serializability of a list-append history, Elle-style."""
    history = to_accord_history("txn-list-append", pair(events))
    return _verdict_result("elle-list-append", check_list_append(history))


def check_txn_rw_register(
    events: Sequence[Event], *, max_states: int = DEFAULT_MAX_STATES
) -> CheckResult:
    """Register inference plus a bounded whole-database linearizability search."""
    operations = pair(events)
    inferred = _verdict_result(
        "elle-rw-register",
        check_registers(to_accord_history("txn-rw-register", operations), {}),
    )
    candidates = prune_unobserved(txn_lin_ops(operations))
    searched = check(candidates, RegisterDatabase(candidates), max_states=max_states)
    details = {
        "anomaly-types": inferred.details["anomaly-types"],
        "inference": {"valid?": inferred.valid, **inferred.details},
        "search": {
            "valid?": searched.valid,
            "configurations": searched.explored,
            "stuck-on-op": searched.stuck_on,
        },
    }
    name = "rw-register"
    if inferred.valid is False:
        return CheckResult(name, False, inferred.summary, details)
    if searched.valid is False:
        return CheckResult(
            name, False, f"not serializable: op {searched.stuck_on} has no place", details
        )
    if searched.valid is None:
        return CheckResult(name, None, f"search exceeded max_states={max_states}", details)
    return CheckResult(name, True, "strict serializable", details)


def check_in_repo(
    workload: str, events: Sequence[Event], *, max_states: int = DEFAULT_MAX_STATES
) -> CheckResult:
    """The in-repo verdict for ``workload``."""
    if workload == "lin-kv":
        return check_lin_kv(events, max_states=max_states)
    if workload == "txn-list-append":
        return check_txn_list_append(events)
    if workload == "txn-rw-register":
        return check_txn_rw_register(events, max_states=max_states)
    raise ValueError(f"unknown workload {workload!r}")


def combine(results: Sequence[CheckResult]) -> Valid:
    """Jepsen's merge of ``:valid?``: false beats unknown beats true."""
    values = [r.valid for r in results]
    if any(v is False for v in values):
        return False
    if any(v is None for v in values):
        return None
    return True


def agree(results: Sequence[CheckResult]) -> bool:
    """Whether every checker that reached a verdict reached the same one."""
    decided = {r.valid for r in results if r.valid is not None}
    return len(decided) <= 1


__all__ = [
    "CheckResult",
    "Valid",
    "agree",
    "check_in_repo",
    "check_lin_kv",
    "check_txn_list_append",
    "check_txn_rw_register",
    "combine",
    "lin_kv_ops",
    "to_accord_history",
    "txn_lin_ops",
]
