"""Register and bank checkers (see :mod:`accord.sim.verify` for the overall theory).

Registers are overwritten, so unlike list-append an observed value says which
write it came from but nothing about the writes before it.  What *is* sound:

* a read of value v came from the only op that ever put v (when exactly one
  did), giving a ``wr`` edge; a value nobody put (and not the initial value)
  is a ``garbage-read``; a value only failed ops put is ``G1a``; a value a
  writer later overwrote within the same txn is ``G1b``;
* read-modify-write: if committed T read version V of k (before writing k
  itself) and then put k, T's write is the *immediate* successor of V in any
  serial order (T is atomic).  So every other txn that read V precedes T
  (``rw``), and two such T are a ``lost-update``;
* the initial version precedes every write, so a read of the initial value
  precedes every committed write of that key (``rw``);
* real-time edges.

Blind writes have no inferable order, so a stale read of a *non-initial*
version that a blind write overwrote, write skew over blind writes and G0
among blind writes are *not* detected.  Values that are not unique (several
puts of the same value, or a put of the initial value) make reads of that
value ambiguous, and ambiguous reads produce no edge at all.  Precision is
therefore lost, never soundness.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

from accord.sim.history import History, Operation
from accord.sim.verify_graph import WR, DepGraph, report_cycles
from accord.sim.verify_report import Collector, Verdict, base_stats

__all__ = ["check_bank", "check_registers"]

InitialMatcher = Callable[[str, object], bool]
_INITIAL = -1  # version "writer" of the initial value

# (reader, key, value) of a read that preceded the reader's own writes to key
_ExternalRead = tuple[Operation, str, Hashable]


def _external_reads(op: Operation, out: Collector) -> tuple[list[_ExternalRead], set[str]]:
    """The op's first reads of keys it had not yet touched, and keys it read then wrote.

    Also reports ``internal`` anomalies: once a txn has read or written a
    key, later reads of that key within the txn must return the same/own value.
    """
    state: dict[str, object] = {}
    external: list[_ExternalRead] = []
    read_first: set[str] = set()
    rmw: set[str] = set()
    for m in op.mops:
        if m.kind == "put":
            if m.key in read_first:
                rmw.add(m.key)
            state[m.key] = m.value
            continue
        if m.key in state:
            if m.value != state[m.key]:
                out.add(
                    "internal",
                    f"op {op.op_id} read {m.key!r} = {m.value!r} after its own "
                    f"read/write established {state[m.key]!r}",
                    (op.op_id,),
                )
        else:
            external.append((op, m.key, m.value))
            read_first.add(m.key)
        state[m.key] = m.value
    return external, rmw


def _check_registers(history: History, is_initial: InitialMatcher) -> Verdict:
    out = Collector()
    stats = base_stats(history)
    writers: dict[tuple[str, Hashable], list[Operation]] = {}
    # Keys some op wrote with a value the history does not know (an info op's write
    # computed from its reads): a read of an otherwise unknown value may be that write.
    unknown_writes: set[str] = set()
    final_put: dict[tuple[int, str], object] = {}
    for op in history.operations:
        for m in op.mops:
            if m.kind == "append":
                out.add(
                    "malformed-history",
                    f"op {op.op_id}: 'append' in a register history",
                    (op.op_id,),
                )
            elif not isinstance(m.value, Hashable):
                out.add("malformed-history", f"op {op.op_id}: unhashable value", (op.op_id,))
            elif m.kind == "put" and op.status != "ok" and _unknown(m.value):
                unknown_writes.add(m.key)
            elif m.kind == "put":
                ws = writers.setdefault((m.key, m.value), [])
                if op not in ws:
                    ws.append(op)
                final_put[(op.op_id, m.key)] = m.value
    if not out.empty:
        return out.verdict(stats)

    # -- resolve every external read to a version (writer op id or _INITIAL) -----
    versions: dict[tuple[str, int], list[Operation]] = {}  # (key, writer) -> readers
    successors: dict[tuple[str, int], list[Operation]] = {}
    wr_pairs: list[tuple[Operation, Operation, str]] = []
    info_seen: set[int] = set()
    ambiguous = 0
    for op in history.operations:
        if op.status != "ok":
            continue  # fail/info reads carry no information
        external, rmw = _external_reads(op, out)
        for _, key, value in external:
            ws = writers.get((key, value), [])
            initial = is_initial(key, value)
            if not ws and not initial and key in unknown_writes:
                ambiguous += 1  # perhaps the unknown write of an info op: infer nothing
                continue
            if not ws:
                if not initial:
                    out.add(
                        "garbage-read",
                        f"op {op.op_id} read {key!r} = {value!r}, which no op wrote",
                        (op.op_id,),
                    )
                    continue
                version = _INITIAL
            elif all(w.status == "fail" for w in ws) and not initial:
                out.add(
                    "G1a",
                    f"op {op.op_id} read {key!r} = {value!r}, written only by failed "
                    f"op(s) {[w.op_id for w in ws]} (aborted read)",
                    (op.op_id, *(w.op_id for w in ws)),
                )
                continue
            elif len(ws) > 1 or initial:
                ambiguous += 1  # several candidate writers: infer nothing
                continue
            else:
                w = ws[0]
                if w is op:
                    out.add(
                        "internal",
                        f"op {op.op_id} read {key!r} = {value!r} before writing that value itself",
                        (op.op_id,),
                    )
                    continue
                if final_put[(w.op_id, key)] != value:
                    out.add(
                        "G1b",
                        f"op {op.op_id} read {key!r} = {value!r}, an intermediate write of "
                        f"op {w.op_id} (its final write is {final_put[(w.op_id, key)]!r})",
                        (op.op_id, w.op_id),
                    )
                if w.status == "info":
                    info_seen.add(w.op_id)
                wr_pairs.append((w, op, key))
                version = w.op_id
            versions.setdefault((key, version), []).append(op)
            if key in rmw:
                successors.setdefault((key, version), []).append(op)

    committed = sorted(
        (op for op in history.operations if op.status == "ok" or op.op_id in info_seen),
        key=lambda op: op.op_id,
    )
    node_of = {op.op_id: i for i, op in enumerate(committed)}
    graph = DepGraph([op.op_id for op in committed])
    for w, r, key in wr_pairs:
        graph.add_edge(node_of[w.op_id], node_of[r.op_id], WR, key)
    for (key, version), succ in sorted(successors.items()):
        if len(succ) > 1:
            what = "the initial value" if version == _INITIAL else f"op {version}'s write"
            out.add(
                "lost-update",
                f"ops {[t.op_id for t in succ]} all read {what} of {key!r} and then wrote "
                f"{key!r}; at most one of them can directly follow that version",
                tuple(t.op_id for t in succ),
            )
    # Which writes each version's readers must precede: the version's RMW
    # successors (they immediately follow it); for the initial version, every
    # committed write of the key (they all follow it).
    writers_of: dict[str, set[int]] = {}
    for op in committed:
        for m in op.mops:
            if m.kind == "put":
                writers_of.setdefault(m.key, set()).add(node_of[op.op_id])
    for (key, version), readers in sorted(versions.items()):
        if version == _INITIAL:
            later = sorted(writers_of.get(key, ()))
        else:
            later = [node_of[t.op_id] for t in successors.get((key, version), [])]
        graph.add_fanout([node_of[r.op_id] for r in readers], later, key)
    graph.add_realtime([(node_of[op.op_id], op.invoked_at, op.completed_at) for op in committed])
    stats["info_committed"] = len(info_seen)
    stats["committed"] = len(committed)
    stats["ambiguous_reads"] = ambiguous
    for kind, n in graph.edge_counts.items():
        stats[f"edges.{kind}"] = n
    stats["cyclic_components"] = report_cycles(graph, out)
    return out.verdict(stats)


def check_registers(history: History, initial: Mapping[str, object]) -> Verdict:
    """Check a put/read register history; see the module docstring for coverage.

    Requirement for full power: every ``put`` value is unique per key and
    differs from the key's initial value (a non-unique value is tolerated but
    reads of it infer nothing).  ``initial[key]`` is the value before any
    write; a key missing from ``initial`` starts as ``None``.
    """

    def is_initial(key: str, value: object) -> bool:
        return value == initial[key] if key in initial else value is None

    return _check_registers(history, is_initial)


def _unknown(value: object) -> bool:
    """A written value the history only partly knows, such as ``(None, tag)``."""
    return value is None or (isinstance(value, tuple) and None in value)


def _balance(value: object) -> int | None:
    """A balance from an int or a ``(balance, tag)`` tuple; None if neither."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def check_bank(
    history: History,
    accounts: Sequence[str],
    initial: Mapping[str, int],
    *,
    allow_negative: bool = False,
) -> Verdict:
    """Bank invariants plus :func:`check_registers` on the same history.

    Balances are registers whose values are either plain ints or
    ``(balance, unique_tag)`` tuples.  Tags make every write unique, which is
    what gives the register check its power; with plain ints most reads are
    ambiguous and the register part degrades to garbage/G1a detection.  A read
    of an account's initial state may show ``initial[a]`` or any
    ``(initial[a], tag)`` whose tag no put wrote.

    Invariants: an ``ok`` txn whose first access to *every* account is a read
    saw a consistent snapshot, so those balances must sum to
    ``sum(initial[a] for a in accounts)`` (``wrong-total``); no ok read of an
    account may show a negative balance unless ``allow_negative``
    (``negative-balance``); balances must decode (``bad-balance``).
    """
    missing = [a for a in accounts if a not in initial]
    if missing:
        raise ValueError(f"accounts without an initial balance: {missing}")
    total = sum(initial[a] for a in accounts)
    account_set = frozenset(accounts)
    out = Collector()
    snapshots = 0
    for op in history.operations:
        if op.status != "ok":
            continue
        first: dict[str, object] = {}
        written: set[str] = set()
        for m in op.mops:
            if m.key not in account_set:
                continue
            if m.kind == "put":
                written.add(m.key)
                continue
            if m.kind != "r":
                continue
            bal = _balance(m.value)
            if bal is None:
                out.add(
                    "bad-balance",
                    f"op {op.op_id} read {m.key!r} = {m.value!r}, not a balance",
                    (op.op_id,),
                )
            elif bal < 0 and not allow_negative:
                out.add(
                    "negative-balance",
                    f"op {op.op_id} read {m.key!r} = {bal}",
                    (op.op_id,),
                )
            if m.key not in first and m.key not in written:
                first[m.key] = m.value
        if len(first) < len(account_set):
            continue
        balances = [_balance(first[a]) for a in accounts]
        if any(b is None for b in balances):
            continue  # already reported as bad-balance
        snapshots += 1
        seen = sum(b for b in balances if b is not None)
        if seen != total:
            shown = ", ".join(f"{a}={b}" for a, b in zip(accounts, balances, strict=True))
            out.add(
                "wrong-total",
                f"op {op.op_id} saw {shown}: total {seen}, expected {total}",
                (op.op_id,),
            )

    # Tags of every write, including writes whose balance the history does not know: a
    # value carrying one of them is that write's, never the initial state.
    put_tags = {
        (m.key, m.value[1])
        for op in history.operations
        for m in op.mops
        if m.kind == "put" and isinstance(m.value, tuple) and len(m.value) == 2
    }

    def is_initial(key: str, value: object) -> bool:
        if key not in initial:
            return value is None
        if value == initial[key]:
            return True
        return (
            isinstance(value, tuple)
            and len(value) == 2
            and value[0] == initial[key]
            and (key, value[1]) not in put_tags
        )

    registers = _check_registers(history, is_initial)
    out.extend(registers)
    stats = {k: v for k, v in registers.stats.items() if not k.startswith("anomal")}
    stats["bank.snapshots"] = snapshots
    stats["bank.total"] = total
    return out.verdict(stats)
