"""Strict-serializability checker for list-append histories (Elle's inference, see verify.py).

Each key holds a list; transactions append unique values and read whole
lists.  Because every append is unique and lists only grow, every observed
list names a *version* of its key, and the observed lists of a key must all
be prefixes of one another: the longest one fixes the version order of
everything that was ever observed.  From that order the dependencies between
committed transactions follow directly:

ww  appender of element i -> appender of element i+1
wr  appender of the last element a read saw -> the reader
rw  reader of a prefix of length i -> appender of element i+1 (the version
    it did not see); a read of the empty list -> the first appender

Reads of the longest observed list also anti-depend on every *committed*
append that was never observed: such a value must sit after the longest list
in the final version order.  Real-time edges come from the completion chain in
:mod:`accord.sim.verify_graph`.  Any cycle means no serial order, consistent
with real time, explains the reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from accord.invariants import check_not_none
from accord.sim.history import History, Operation
from accord.sim.verify_graph import RW, WR, WW, DepGraph, report_cycles
from accord.sim.verify_report import Collector, Verdict, base_stats

__all__ = ["check_list_append"]

_ObservedRead = tuple[Operation, str, tuple[Hashable, ...]]


def _as_list(value: object) -> tuple[Hashable, ...] | None:
    """An observed list as a tuple; None if the value is not a list of hashables."""
    if value is None:
        return ()
    if not isinstance(value, (tuple, list)):
        return None
    listed = tuple(value)
    try:
        # hash() is the hashability test (isinstance(v, Hashable) is an ABC check that
        # dominated the checker's profile on large histories); hashing the tuple hashes
        # every element in one C call, where a loop made one Python call per element.
        hash(listed)
    except TypeError:
        return None
    return listed


def _check_internal(op: Operation, out: Collector) -> None:
    """A txn must see its own appends and read each key consistently.

    Before the txn first reads a key we only know the suffix its own appends
    will form; after a read we know the whole list.
    """
    known: dict[str, bool] = {}
    state: dict[str, list[Hashable]] = {}
    # Own appends not yet performed: a read that already contains one saw
    # the future (values are unique, so nobody else could have appended it).
    pending: dict[str, set[Hashable]] = {}
    for m in op.mops:
        if m.kind == "append":
            pending.setdefault(m.key, set()).add(m.value)
    for m in op.mops:
        if m.kind == "append":
            state.setdefault(m.key, []).append(m.value)
            pending[m.key].discard(m.value)
            continue
        obs = check_not_none(_as_list(m.value), "read of %r is not a list", m.key)
        own = pending.get(m.key)
        early = [v for v in obs if v in own] if own else []
        if early:
            out.add(
                "internal",
                f"op {op.op_id} read {m.key!r} = {list(obs)}, containing its own later "
                f"append(s) {early}",
                (op.op_id,),
            )
        expect = state.get(m.key, [])
        if known.get(m.key, False):
            bad = list(obs) != expect
        else:
            bad = len(obs) < len(expect) or list(obs[len(obs) - len(expect) :]) != expect
        if bad:
            how = "exactly" if known.get(m.key, False) else "ending in"
            out.add(
                "internal",
                f"op {op.op_id} read {m.key!r} = {list(obs)} but its own earlier "
                f"operations imply a list {how} {expect}",
                (op.op_id,),
            )
        known[m.key] = True
        state[m.key] = list(obs)


def check_list_append(history: History) -> Verdict:
    """Check a list-append history for strict serializability; see the module docstring.

    Requires every appended value to be unique per key (else the verdict is
    ``malformed-history``).  Reports ``garbage-read``, ``G1a``, ``G1b``,
    ``internal``, ``duplicate-elements``, ``incompatible-order`` and dependency
    cycles ``G0``/``G1c``/``G-single``/``G2`` (each optionally ``-realtime``).

    Not detected: anything about appends no read ever observed beyond "they
    come after the longest observed list" (an unobserved ``info`` op is
    assumed not to have happened); keys whose observed lists are incompatible
    contribute only wr edges; ``fail``/``info`` reads are never checked.
    """
    out = Collector()
    stats = base_stats(history)

    # -- shape: unique appends, well-formed reads --------------------------------
    appender: dict[tuple[str, Hashable], Operation] = {}
    for op in history.operations:
        for m in op.mops:
            if m.kind == "put":
                out.add(
                    "malformed-history",
                    f"op {op.op_id}: 'put' in a list-append history",
                    (op.op_id,),
                )
            elif m.kind == "append":
                if not isinstance(m.value, Hashable):
                    out.add("malformed-history", f"op {op.op_id}: unhashable append", (op.op_id,))
                    continue
                prior = appender.get((m.key, m.value))
                if prior is not None:
                    # Uniqueness is what lets a value name a version; without it
                    # no inference below is sound.
                    out.add(
                        "malformed-history",
                        f"value {m.value!r} appended to {m.key!r} by op {prior.op_id} and "
                        f"again by op {op.op_id}",
                        (prior.op_id, op.op_id),
                    )
                appender[(m.key, m.value)] = op
            elif op.status == "ok" and _as_list(m.value) is None:
                out.add(
                    "malformed-history",
                    f"op {op.op_id}: read of {m.key!r} is not a list: {m.value!r}",
                    (op.op_id,),
                )
    if not out.empty:
        return out.verdict(stats)

    # -- per-read checks ---------------------------------------------------------
    reads: list[_ObservedRead] = []
    observed: set[tuple[str, Hashable]] = set()
    # Per key, values already observed whose appender exists and did not fail: a later
    # read of them (reads of a key mostly repeat one growing prefix) has nothing new to
    # report, so the per-element checks below run once per value, not once per read.
    clean: dict[str, set[Hashable]] = {}
    last_append: dict[tuple[int, str], Hashable] = {}
    for op in history.operations:
        for m in op.mops:
            if m.kind == "append":
                last_append[(op.op_id, m.key)] = m.value
    for op in history.operations:
        if op.status != "ok":
            continue  # reads of fail/info ops carry no information
        _check_internal(op, out)
        for m in op.mops:
            if m.kind != "r":
                continue
            obs = check_not_none(_as_list(m.value), "read of %r is not a list", m.key)
            reads.append((op, m.key, obs))
            if len(set(obs)) != len(obs):
                out.add(
                    "duplicate-elements",
                    f"op {op.op_id} read {m.key!r} = {list(obs)} with a repeated element",
                    (op.op_id,),
                )
            seen_clean = clean.get(m.key)
            if seen_clean is None:
                seen_clean = clean[m.key] = set()
            for v in [v for v in obs if v not in seen_clean]:
                observed.add((m.key, v))
                w = appender.get((m.key, v))
                if w is None:
                    out.add(
                        "garbage-read",
                        f"op {op.op_id} read {m.key!r} containing {v!r}, which no op appended",
                        (op.op_id,),
                    )
                elif w.status == "fail":
                    out.add(
                        "G1a",
                        f"op {op.op_id} read {m.key!r} containing {v!r}, appended by "
                        f"op {w.op_id} which failed (aborted read)",
                        (op.op_id, w.op_id),
                    )
                else:
                    seen_clean.add(v)
            if obs:
                w = appender.get((m.key, obs[-1]))
                if (
                    w is not None
                    and w is not op
                    and w.status != "fail"
                    and last_append[(w.op_id, m.key)] != obs[-1]
                ):
                    out.add(
                        "G1b",
                        f"op {op.op_id} read {m.key!r} ending in {obs[-1]!r}, an intermediate "
                        f"append of op {w.op_id} (its final append is "
                        f"{last_append[(w.op_id, m.key)]!r})",
                        (op.op_id, w.op_id),
                    )

    # -- committed set: ok ops, plus info ops whose effects were observed ---------
    committed_ids = {op.op_id for op in history.operations if op.status == "ok"}
    info_seen = {
        w.op_id for (k, v), w in appender.items() if w.status == "info" and (k, v) in observed
    }
    committed_ids |= info_seen
    committed = [op for op in history.operations if op.op_id in committed_ids]
    committed.sort(key=lambda op: op.op_id)
    graph = DepGraph([op.op_id for op in committed])
    node_of = {op.op_id: i for i, op in enumerate(committed)}
    stats["info_committed"] = len(info_seen)
    stats["committed"] = len(committed)

    # -- version orders -----------------------------------------------------------
    reads_by_key: dict[str, list[_ObservedRead]] = {}
    for r in reads:
        reads_by_key.setdefault(r[1], []).append(r)
    appends_by_key: dict[str, list[tuple[Hashable, Operation]]] = {}
    for (k, v), w in appender.items():
        appends_by_key.setdefault(k, []).append((v, w))
    stats["keys"] = len(set(reads_by_key) | set(appends_by_key))
    stats["reads"] = len(reads)
    stats["appends"] = len(appender)

    for key in sorted(reads_by_key):
        key_reads = reads_by_key[key]
        longest = max(key_reads, key=lambda r: len(r[2]))[2]  # first of max length
        conflict = next((r for r in key_reads if longest[: len(r[2])] != r[2]), None)
        ordered = conflict is None and len(set(longest)) == len(longest)
        if conflict is not None:
            holder = next(r for r in key_reads if r[2] == longest)
            out.add(
                "incompatible-order",
                f"key {key!r}: op {conflict[0].op_id} read {list(conflict[2])} and op "
                f"{holder[0].op_id} read {list(longest)}; neither is a prefix of the other",
                (conflict[0].op_id, holder[0].op_id),
            )

        def node_for(v: Hashable, k: str = key) -> int | None:
            w = appender.get((k, v))
            return None if w is None else node_of.get(w.op_id)

        if not ordered:
            # No version order: only wr (which needs none) can be inferred.
            for op, _, obs in key_reads:
                src = next((n for n in map(node_for, reversed(obs)) if n is not None), None)
                if src is not None:
                    graph.add_edge(src, node_of[op.op_id], WR, key)
            continue

        # Effective version order: observed elements whose appender committed
        # (failed/garbage elements are already reported and name no txn).
        eff = [n for n in map(node_for, longest) if n is not None]
        committed_before = [0]
        for v in longest:
            committed_before.append(committed_before[-1] + (node_for(v) is not None))
        for a, b in itertools.pairwise(eff):
            graph.add_edge(a, b, WW, key)
        full_readers: list[int] = []
        for op, _, obs in key_reads:
            reader = node_of[op.op_id]
            c = committed_before[len(obs)]
            if c > 0:
                graph.add_edge(eff[c - 1], reader, WR, key)
            if c < len(eff):
                graph.add_edge(reader, eff[c], RW, key)
            else:
                full_readers.append(reader)
        in_longest = set(longest)
        unobserved = sorted(
            {
                node_of[w.op_id]
                for v, w in appends_by_key.get(key, [])
                if v not in in_longest and w.op_id in node_of
            }
        )
        graph.add_fanout(full_readers, unobserved, key)

    graph.add_realtime([(node_of[op.op_id], op.invoked_at, op.completed_at) for op in committed])
    for kind, n in graph.edge_counts.items():
        stats[f"edges.{kind}"] = n
    stats["cyclic_components"] = report_cycles(graph, out)
    return out.verdict(stats)
