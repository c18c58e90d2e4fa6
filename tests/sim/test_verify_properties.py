"""Properties of the history checkers: serial executions made concurrent are accepted, their
mutations rejected, and on tiny histories the checkers agree with a brute-force oracle."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.sim.history import History, MicroOp, Operation, OpStatus
from accord.sim.verify import (
    check_bank,
    check_list_append,
    check_registers,
)
from tests.sim.histories import (
    SerialTxn,
    app,
    assert_valid,
    gen_list_append,
    names,
    put,
    r,
    to_history,
)

# ---------------------------------------------------------------------------
# properties


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), spread=st.integers(0, 400))
def test_serial_list_append_histories_are_valid(seed: int, n: int, spread: int) -> None:
    h = gen_list_append(seed, n, spread=spread, active_keys=2, final_reads=1)
    assert_valid(check_list_append(h))
    # JSON round trip preserves the verdict's input exactly
    assert History.from_json(json.loads(json.dumps(h.to_json()))) == h


def _mutable_reads(h: History) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i, o in enumerate(h.operations)
        if o.status == "ok"
        for j, m in enumerate(o.mops)
        if m.kind == "r" and isinstance(m.value, tuple) and len(m.value) >= 2
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(4, 40),
    choice=st.integers(0, 10**6),
    reorder=st.booleans(),
)
def test_mutated_list_append_histories_are_rejected(
    seed: int, n: int, choice: int, reorder: bool
) -> None:
    # Two final full reads guarantee that any mutated read conflicts with an
    # untouched read that is at least as long.
    h = gen_list_append(seed, n, spread=200, active_keys=2, final_reads=2)
    candidates = _mutable_reads(h)
    if not candidates:
        return  # nothing to mutate (rare: almost no appends)
    i, j = candidates[choice % len(candidates)]
    target = h.operations[i]
    seen = target.mops[j].value
    assert isinstance(seen, tuple)
    k = choice % (len(seen) - 1)  # a non-last index
    if reorder:
        mutated = (*seen[:k], seen[k + 1], seen[k], *seen[k + 2 :])
    else:
        mutated = seen[:k] + seen[k + 1 :]
    mops = list(target.mops)
    mops[j] = replace(mops[j], value=mutated)
    ops = list(h.operations)
    ops[i] = replace(target, mops=tuple(mops))
    v = check_list_append(History(tuple(ops)))
    assert not v.valid
    assert "incompatible-order" in names(v), v.summary()


def _bal(v: object) -> int:
    b = v[0] if isinstance(v, tuple) else v
    assert isinstance(b, int)
    return b


def _gen_bank(
    seed: int, n: int, *, tagged: bool, spread: int
) -> tuple[History, list[str], dict[str, object]]:
    rng = random.Random(seed)
    accounts = ["a", "b", "c"]
    state: dict[str, object] = dict.fromkeys(accounts, 10)
    tags = itertools.count(1)

    txns: list[SerialTxn] = []
    for i in range(n):
        roll = rng.random()
        status: OpStatus = "ok" if roll < 0.8 else ("info" if roll < 0.9 else "fail")
        applied = status == "ok" or (status == "info" and rng.random() < 0.5)
        known = status == "ok"
        if rng.random() < 0.4:
            mops = [r(a, state[a] if known else None) for a in accounts]
        else:
            src, dst = rng.sample(accounts, 2)
            amount = rng.randint(0, 5)
            s_bal, d_bal = _bal(state[src]), _bal(state[dst])
            mops = [r(src, state[src] if known else None), r(dst, state[dst] if known else None)]
            if s_bal >= amount:
                tag = next(tags)
                new_s: object = (s_bal - amount, tag) if tagged else s_bal - amount
                new_d: object = (d_bal + amount, tag) if tagged else d_bal + amount
                mops += [put(src, new_s), put(dst, new_d)]
                if applied:
                    state[src], state[dst] = new_s, new_d
        txns.append(SerialTxn(mops, status, 100 * (i + 1), applied))
    return to_history(txns, rng, spread), accounts, state


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 40),
    tagged=st.booleans(),
    spread=st.integers(0, 400),
)
def test_serial_bank_histories_are_valid(seed: int, n: int, tagged: bool, spread: int) -> None:
    h, accounts, _ = _gen_bank(seed, n, tagged=tagged, spread=spread)
    initial = dict.fromkeys(accounts, 10)
    assert_valid(check_bank(h, accounts, initial))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), delta=st.integers(1, 3))
def test_bank_skewed_snapshot_is_rejected(seed: int, n: int, delta: int) -> None:
    h, accounts, final = _gen_bank(seed, n, tagged=True, spread=100)
    # Append a read-all, after everything, that saw one account richer than it was.
    t0 = max((o.invoked_at for o in h.operations), default=0) + 10_000
    skewed = dict(final)
    first = accounts[0]
    skewed[first] = (_bal(final[first]) + delta, "skew")
    bad = Operation(len(h), 10_000, t0, t0 + 10, "ok", tuple(r(a, skewed[a]) for a in accounts))
    v = check_bank(History((*h.operations, bad)), accounts, dict.fromkeys(accounts, 10))
    assert "wrong-total" in names(v)
    assert not v.valid


def _gen_registers(seed: int, n: int, spread: int) -> tuple[History, list[str]]:
    """A serial register database with unique put values, plus a final read of every key."""
    rng = random.Random(seed)
    keys = ["x", "y", "z"]
    state: dict[str, object] = dict.fromkeys(keys, 0)
    values = itertools.count(1)
    txns: list[SerialTxn] = []
    for i in range(n):
        roll = rng.random()
        status: OpStatus = "ok" if roll < 0.8 else ("info" if roll < 0.9 else "fail")
        applied = status == "ok" or (status == "info" and rng.random() < 0.5)
        mops: list[MicroOp] = []
        for _ in range(rng.randint(1, 4)):
            key = rng.choice(keys)
            if rng.random() < 0.5:
                mops.append(r(key, state[key] if status == "ok" else None))
            else:
                value = next(values)
                mops.append(put(key, value))
                if applied:
                    state[key] = value
        txns.append(SerialTxn(mops, status, 100 * (i + 1), applied))
    final = SerialTxn([r(k, state[k]) for k in keys], "ok", 100 * (n + 1) + 10 * spread, True)
    return to_history([*txns, final], rng, spread), keys


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), spread=st.integers(0, 400))
def test_serial_register_histories_are_valid(seed: int, n: int, spread: int) -> None:
    h, keys = _gen_registers(seed, n, spread)
    assert_valid(check_registers(h, dict.fromkeys(keys, 0)))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), choice=st.integers(0, 10**6))
def test_register_stale_final_read_is_rejected(seed: int, n: int, choice: int) -> None:
    # Make the last read (after everything, in real time) return a version
    # that an acknowledged read-modify-write had already overwritten.
    h, keys = _gen_registers(seed, n, spread=150)
    *body, final = h.operations
    stale: list[tuple[str, object]] = []
    for o in body:
        if o.status != "ok":
            continue
        first: dict[str, object] = {}  # key -> value read before any own put
        written: set[str] = set()
        for m in o.mops:
            if m.kind == "r" and m.key not in first and m.key not in written:
                first[m.key] = m.value
            elif m.kind == "put" and m.key not in written:
                written.add(m.key)
                if m.key in first:
                    stale.append((m.key, first[m.key]))
    if not stale:
        return
    key, old = stale[choice % len(stale)]
    mops = tuple(replace(m, value=old) if m.key == key else m for m in final.mops)
    v = check_registers(History((*body, replace(final, mops=mops))), dict.fromkeys(keys, 0))
    assert not v.valid
    # The mutation adds exactly one edge, final -rw-> (the RMW); with real
    # time that always closes a cycle, and the checker may find a less
    # time-dependent one through it first.
    assert names(v) <= {"G-single", "G-single-realtime", "G2", "G2-realtime"}, v.summary()


# ---------------------------------------------------------------------------
# soundness against a brute-force oracle on tiny histories


def _oracle_accepts(h: History, initial: dict[str, object] | None) -> bool:
    """Exhaustive search for a real-time-respecting serial order explaining every ok read.

    ``initial is None`` means list-append semantics, else register semantics.
    Failed ops never run; each info op may or may not have run.
    """
    ops = [o for o in h.operations if o.status != "fail"]
    infos = [o for o in ops if o.status == "info"]
    for keep in itertools.product((False, True), repeat=len(infos)):
        dropped = {o.op_id for o, k in zip(infos, keep, strict=True) if not k}
        chosen = [o for o in ops if o.op_id not in dropped]
        for order in itertools.permutations(chosen):
            if _respects_realtime(order) and _replays(order, initial):
                return True
    return False


def _respects_realtime(order: Sequence[Operation]) -> bool:
    for i, a in enumerate(order):
        for b in order[:i]:
            # b is placed before a; forbidden if a finished before b began
            if a.completed_at is not None and a.completed_at < b.invoked_at:
                return False
    return True


def _replays(order: Sequence[Operation], initial: dict[str, object] | None) -> bool:
    lists: dict[str, tuple[object, ...]] = {}
    regs: dict[str, object] = dict(initial or {})
    for o in order:
        for m in o.mops:
            if m.kind == "append":
                lists[m.key] = (*lists.get(m.key, ()), m.value)
            elif m.kind == "put":
                regs[m.key] = m.value
            elif o.status == "ok":
                if initial is None:
                    if (m.value or ()) != lists.get(m.key, ()):
                        return False
                elif m.value != regs.get(m.key):
                    return False
    return True


@st.composite
def _tiny_histories(draw: st.DrawFn, registers: bool) -> History:
    """2-5 ops on two keys: serially consistent reads, random intervals, some corruption."""
    n = draw(st.integers(2, 5))
    kinds: list[OpStatus] = ["ok", "ok", "ok", "info", "fail"]
    statuses = draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n))
    values = itertools.count(1)
    bodies: list[list[MicroOp]] = []
    for _ in range(n):
        body: list[MicroOp] = []
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(["x", "y"]))
            if draw(st.booleans()):
                body.append(r(key))
            else:
                body.append(put(key, next(values)) if registers else app(key, next(values)))
        bodies.append(body)
    # Execute some order serially so that reads are often explainable...
    order = draw(st.permutations(range(n)))
    lists: dict[str, tuple[int, ...]] = {}
    regs: dict[str, object] = {"x": 0, "y": 0}
    for i in order:
        if statuses[i] == "fail" or (statuses[i] == "info" and draw(st.booleans())):
            continue
        for j, m in enumerate(bodies[i]):
            if m.kind == "append":
                assert isinstance(m.value, int)
                lists[m.key] = (*lists.get(m.key, ()), m.value)
            elif m.kind == "put":
                regs[m.key] = m.value
            elif statuses[i] == "ok":
                seen: object = regs[m.key] if registers else lists.get(m.key, ())
                bodies[i][j] = r(m.key, seen)
    # ...then occasionally corrupt one read: drop, reorder or go stale.
    if draw(st.booleans()):
        reads = [(i, j) for i in range(n) for j, m in enumerate(bodies[i]) if m.kind == "r"]
        if reads:
            i, j = draw(st.sampled_from(reads))
            m = bodies[i][j]
            if registers:
                bodies[i][j] = r(m.key, draw(st.integers(0, 9)))
            elif isinstance(m.value, tuple) and m.value:
                bodies[i][j] = r(
                    m.key, draw(st.sampled_from([m.value[:-1], m.value[::-1], m.value[1:]]))
                )
    ops = []
    for i in range(n):
        inv = draw(st.integers(0, 60))
        status = statuses[i]
        done = None if status == "info" else inv + draw(st.integers(0, 30))
        if status != "ok":  # unknown/failed outcomes carry no read values
            bodies[i] = [replace(m, value=None) if m.kind == "r" else m for m in bodies[i]]
        ops.append(Operation(i, i, inv, done, status, tuple(bodies[i])))
    return History(tuple(ops))


@settings(max_examples=400, deadline=None)
@given(h=_tiny_histories(registers=False))
def test_list_append_is_sound_against_oracle(h: History) -> None:
    v = check_list_append(h)
    if not v.valid:
        assert not _oracle_accepts(h, None), v.summary()


@settings(max_examples=400, deadline=None)
@given(h=_tiny_histories(registers=True))
def test_registers_is_sound_against_oracle(h: History) -> None:
    v = check_registers(h, {"x": 0, "y": 0})
    if not v.valid:
        assert not _oracle_accepts(h, {"x": 0, "y": 0}), v.summary()
