"""Both checkers, the in-repo one and Porcupine, on hand-made and generated histories.

Every anomaly the issue names (lost update, stale read, G0, G1c, G-single, write skew) is
written by hand for the workloads where it can occur, and both checkers must reject it;
valid histories must pass both. Generated histories then check that the two agree.

References: Adya, "Weak Consistency" (G0, G1a, G1c, G-single, G2); Kingsbury & Alvaro,
"Elle" (list-append inference); Herlihy & Wing (linearizability).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from maelstrom.checker import CheckResult, check_in_repo, combine
from maelstrom.history import Event, EventType
from maelstrom.linearizable import (
    CasRegister,
    LinOp,
    ListAppendDatabase,
    check,
    prune_unobserved,
)
from maelstrom.porcupine_driver import PorcupineUnavailable, ensure_binary
from maelstrom.porcupine_driver import check as porcupine

from .helpers import HistoryBuilder


@pytest.fixture(scope="module", autouse=True)
def porcupine_binary() -> None:
    # Porcupine is the independent half of every verdict here; CI has Go, so a missing
    # toolchain is a failure, never a skip.
    try:
        ensure_binary()
    except PorcupineUnavailable as error:
        pytest.fail(f"Porcupine driver unavailable: {error}")


def _both(workload: str, events: list[Event]) -> tuple[CheckResult, bool | None]:
    return check_in_repo(workload, events), porcupine(workload, events).valid


def _assert_invalid(workload: str, events: list[Event]) -> CheckResult:
    ours, theirs = _both(workload, events)
    assert ours.valid is False, ours
    assert theirs is False
    return ours


def _assert_valid(workload: str, events: list[Event]) -> None:
    ours, theirs = _both(workload, events)
    assert ours.valid is True, ours
    assert theirs is True


# ---------------------------------------------------------------------------- lin-kv


def _kv(h: HistoryBuilder, p: int, f: str, value: Any, start: int, end: int, **kw: Any) -> None:
    invoked = [0, None] if f == "read" else [0, value]
    h.op(p, f, invoked, [0, value], start, end, **kw)


def test_lin_kv_concurrent_history_is_valid() -> None:
    h = HistoryBuilder()
    _kv(h, 0, "write", 1, 0, 10)
    _kv(h, 1, "read", 1, 5, 15)
    _kv(h, 2, "cas", [1, 2], 12, 20)
    _kv(h, 1, "read", 1, 16, 18)  # concurrent with the cas: may precede it
    _kv(h, 0, "read", 2, 25, 30)
    _kv(h, 2, "cas", [5, 6], 31, 32, status="fail")  # failed ops did not happen
    _assert_valid("lin-kv", h.sorted())


def test_lin_kv_lost_update_two_cas_from_one_value() -> None:
    h = HistoryBuilder()
    _kv(h, 0, "write", 0, 0, 10)
    _kv(h, 1, "cas", [0, 1], 20, 30)
    _kv(h, 2, "cas", [0, 2], 21, 31)
    _assert_invalid("lin-kv", h.sorted())


def test_lin_kv_stale_read() -> None:
    h = HistoryBuilder()
    _kv(h, 0, "write", 1, 0, 10)
    _kv(h, 0, "write", 2, 20, 30)
    _kv(h, 1, "read", 1, 40, 50)
    result = _assert_invalid("lin-kv", h.sorted())
    assert result.details["failed-keys"] == 1


def test_lin_kv_unknown_write_may_land_late_but_not_twice() -> None:
    h = HistoryBuilder()
    _kv(h, 0, "write", 1, 0, 10)
    _kv(h, 1, "write", 2, 20, 25, status="info")
    _kv(h, 2, "read", 1, 30, 35)
    _kv(h, 2, "read", 2, 40, 50)
    _assert_valid("lin-kv", h.sorted())
    _kv(h, 2, "read", 1, 60, 70)
    _assert_invalid("lin-kv", h.sorted())


def test_lin_kv_unknown_cas_takes_effect_only_if_its_condition_held() -> None:
    h = HistoryBuilder()
    _kv(h, 0, "write", 0, 0, 10)
    _kv(h, 1, "cas", [0, 3], 20, 25, status="info")
    _kv(h, 2, "read", 3, 40, 50)
    _assert_valid("lin-kv", h.sorted())
    g = HistoryBuilder()
    _kv(g, 0, "write", 1, 0, 10)
    _kv(g, 1, "cas", [0, 3], 20, 25, status="info")
    _kv(g, 2, "read", 3, 40, 50)
    _assert_invalid("lin-kv", g.sorted())


def test_lin_kv_keys_are_independent() -> None:
    h = HistoryBuilder()
    h.op(0, "write", [0, 1], [0, 1], 0, 10)
    h.op(1, "write", [1, 2], [1, 2], 20, 30)
    h.op(2, "read", [1, None], [1, 2], 40, 50)
    h.op(2, "read", [0, None], [0, 1], 60, 70)
    _assert_valid("lin-kv", h.sorted())


# ---------------------------------------------------------------------------- list-append

LA = "txn-list-append"


def test_list_append_valid_concurrent_history() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1], ["append", "y", 1]], 0, 10)
    h.txn(1, [["r", "x", [1]], ["append", "x", 2]], 5, 20)
    h.txn(2, [["r", "x", [1, 2]], ["r", "y", [1]]], 25, 30)
    h.txn(3, [["append", "y", 2]], 26, 28, status="info")  # never observed: may not exist
    _assert_valid(LA, h.sorted())


def test_list_append_g0_write_cycle() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1], ["append", "y", 1]], 0, 10)
    h.txn(1, [["append", "x", 2], ["append", "y", 2]], 0, 10)
    h.txn(2, [["r", "x", [1, 2]], ["r", "y", [2, 1]]], 20, 30)
    assert "G0" in _assert_invalid(LA, h.sorted()).details["anomaly-types"]


def test_list_append_g1c_circular_information_flow() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1], ["r", "y", [1]]], 0, 10)
    h.txn(1, [["append", "y", 1], ["r", "x", [1]]], 0, 10)
    assert "G1c" in _assert_invalid(LA, h.sorted()).details["anomaly-types"]


def test_list_append_g_single_read_skew() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1], ["append", "y", 1]], 0, 10)
    h.txn(1, [["r", "x", []], ["r", "y", [1]]], 0, 10)
    assert "G-single" in _assert_invalid(LA, h.sorted()).details["anomaly-types"]


def test_list_append_write_skew() -> None:
    h = HistoryBuilder()
    h.txn(0, [["r", "x", None], ["r", "y", None], ["append", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", None], ["r", "y", None], ["append", "y", 1]], 0, 10)
    h.txn(2, [["r", "x", [1]], ["r", "y", [1]]], 20, 30)
    names = _assert_invalid(LA, h.sorted()).details["anomaly-types"]
    assert any(n.startswith("G2") for n in names), names


def test_list_append_lost_update() -> None:
    h = HistoryBuilder()
    h.txn(0, [["r", "x", None], ["append", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", None], ["append", "x", 2]], 0, 10)
    h.txn(2, [["r", "x", [1, 2]]], 20, 30)
    _assert_invalid(LA, h.sorted())


def test_list_append_stale_read_violates_real_time() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", None]], 20, 30)
    names = _assert_invalid(LA, h.sorted()).details["anomaly-types"]
    assert any(n.endswith("realtime") for n in names), names


def test_list_append_aborted_read() -> None:
    h = HistoryBuilder()
    h.txn(0, [["append", "x", 1]], 0, 10, status="fail")
    h.txn(1, [["r", "x", [1]]], 20, 30)
    assert "G1a" in _assert_invalid(LA, h.sorted()).details["anomaly-types"]


# ---------------------------------------------------------------------------- rw-register

RW = "txn-rw-register"


def test_rw_register_valid_history() -> None:
    h = HistoryBuilder()
    h.txn(0, [["w", "x", 1], ["r", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", 1], ["w", "y", 1]], 5, 20)
    h.txn(2, [["r", "x", 1], ["r", "y", 1]], 25, 30)
    _assert_valid(RW, h.sorted())


def test_rw_register_lost_update() -> None:
    h = HistoryBuilder()
    h.txn(0, [["r", "x", None], ["w", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", None], ["w", "x", 2]], 0, 10)
    _assert_invalid(RW, h.sorted())


def test_rw_register_stale_read() -> None:
    h = HistoryBuilder()
    h.txn(0, [["w", "x", 1]], 0, 10)
    h.txn(0, [["w", "x", 2]], 20, 30)
    h.txn(1, [["r", "x", 1]], 40, 50)
    _assert_invalid(RW, h.sorted())


def test_rw_register_write_skew() -> None:
    h = HistoryBuilder()
    h.txn(0, [["r", "x", None], ["r", "y", None], ["w", "x", 1]], 0, 10)
    h.txn(1, [["r", "x", None], ["r", "y", None], ["w", "y", 1]], 0, 10)
    h.txn(2, [["r", "x", 1], ["r", "y", 1]], 20, 30)
    _assert_invalid(RW, h.sorted())


def test_rw_register_g0_blind_writes_need_the_search() -> None:
    h = HistoryBuilder()
    h.txn(0, [["w", "x", 1], ["w", "y", 1]], 0, 10)
    h.txn(1, [["w", "x", 2], ["w", "y", 2]], 0, 10)
    h.txn(2, [["r", "x", 2], ["r", "y", 1]], 20, 30)
    result = _assert_invalid(RW, h.sorted())
    # Inference cannot order blind writes; the whole-database search can.
    assert result.details["inference"]["valid?"] is True
    assert result.details["search"]["valid?"] is False


def test_rw_register_g1c_and_g_single() -> None:
    cyclic = HistoryBuilder()
    cyclic.txn(0, [["w", "x", 1], ["r", "y", 1]], 0, 10)
    cyclic.txn(1, [["w", "y", 1], ["r", "x", 1]], 0, 10)
    _assert_invalid(RW, cyclic.sorted())
    skew = HistoryBuilder()
    skew.txn(0, [["w", "x", 1], ["w", "y", 1]], 0, 10)
    skew.txn(1, [["r", "x", None], ["r", "y", 1]], 0, 10)
    _assert_invalid(RW, skew.sorted())


# ---------------------------------------------------------------------------- search


def test_search_answers_unknown_past_its_bound() -> None:
    # Twelve concurrent unknown writes: every subset is a distinct configuration.
    ops = [LinOp(i, 0, None, ("write", str(i))) for i in range(12)]
    ops.append(LinOp(99, 1, 2, ("read", "0")))
    assert check(ops, CasRegister(), max_states=50).valid is None
    assert check(ops, CasRegister()).valid is True


def test_search_reports_where_it_got_stuck() -> None:
    ops = [
        LinOp(1, 0, 10, ("write", "1")),
        LinOp(2, 20, 30, ("write", "2")),
        LinOp(3, 40, 50, ("read", "1")),
    ]
    result = check(ops, CasRegister())
    assert result.valid is False and result.stuck_on == 3 and result.prefix == (1, 2)


def test_combine_is_false_then_unknown_then_true() -> None:
    def r(valid: bool | None) -> CheckResult:
        return CheckResult("x", valid, "")

    assert combine([r(True), r(None), r(False)]) is False
    assert combine([r(True), r(None)]) is None
    assert combine([r(True), r(True)]) is True


# ---------------------------------------------------------------------------- agreement


def _random_kv_history(rng: random.Random) -> list[Event]:
    """A plausible lin-kv history: a sequential run with random overlaps and a chance of
    a corrupted read, so both valid and invalid histories occur. Every op gets its own
    process, so overlapping ops never share one."""
    h = HistoryBuilder()
    state: int | None = None
    clock = 0
    for process in range(rng.randint(3, 9)):
        start = clock + rng.randint(0, 3)
        end = start + rng.randint(1, 12)
        clock = start + rng.randint(0, 2)
        f = rng.choice(("read", "write", "cas"))
        status: EventType = "ok" if rng.random() < 0.85 else "info"
        value: Any
        if f == "read":
            if state is None:
                continue
            value, status = (state if rng.random() < 0.85 else rng.randrange(3)), "ok"
        elif f == "write":
            value = state = rng.randrange(3)
        else:
            value = [rng.randrange(3), rng.randrange(3)]
            if state != value[0]:
                status = "fail"
            else:
                state = value[1]
        h.op(process, f, [0, None if f == "read" else value], [0, value], start, end, status)
    return h.sorted()


def test_checkers_agree_on_generated_lin_kv_histories() -> None:
    rng = random.Random(20261129)
    verdicts = set()
    for _ in range(40):
        events = _random_kv_history(rng)
        ours, theirs = _both("lin-kv", events)
        assert ours.valid == theirs, events
        verdicts.add(ours.valid)
    assert verdicts == {True, False}, "the generator should produce both kinds"


def test_pruning_unobserved_unknown_txns_keeps_the_verdict() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ops = []
        lists: dict[str, tuple[int, ...]] = {}
        for i in range(rng.randint(2, 7)):
            key = rng.choice("xy")
            unknown = rng.random() < 0.4
            if rng.random() < 0.5:
                seen = lists.get(key, ())
                if rng.random() < 0.2:
                    seen = (*seen, 99)
                mops: tuple[Any, ...] = (("r", key, None if unknown else seen),)
            else:
                lists[key] = (*lists.get(key, ()), i)
                mops = (("append", key, i),)
            start = rng.randint(0, 20)
            ops.append(LinOp(i, start, None if unknown else start + rng.randint(0, 5), mops))
        full = check(ops, ListAppendDatabase(ops)).valid
        pruned = prune_unobserved(ops)
        assert check(pruned, ListAppendDatabase(pruned)).valid == full


def _random_txn_history(rng: random.Random, workload: str) -> list[Event]:
    """A plausible txn history over three keys: a sequential run with random overlaps,
    some unknown and failed txns (whose writes still land, so G1a occurs), and a chance
    of a corrupted read."""
    h = HistoryBuilder()
    lists: dict[str, tuple[int, ...]] = {}
    registers: dict[str, int] = {}
    written: dict[str, int] = {}
    append = workload == "txn-list-append"
    clock = 0
    for process in range(rng.randint(2, 8)):
        start = clock + rng.randint(0, 3)
        end = start + rng.randint(1, 12)
        clock = start + rng.randint(0, 2)
        mops: list[list[Any]] = []
        for _ in range(rng.randint(1, 3)):
            key = rng.choice("xyz")
            if rng.random() < 0.5:
                seen: Any = list(lists[key]) if append and key in lists else registers.get(key)
                if rng.random() < 0.15:
                    seen = [*(seen or []), 99] if append else rng.choice([None, 1, 99])
                mops.append(["r", key, seen])
                continue
            written[key] = value = written.get(key, 0) + 1
            mops.append(["append" if append else "w", key, value])
            lists[key] = (*lists.get(key, ()), value)
            registers[key] = value
        roll = rng.random()
        status: EventType = "ok" if roll < 0.8 else "info" if roll < 0.9 else "fail"
        h.txn(process, mops, start, end, status)
    return h.sorted()


@pytest.mark.parametrize("workload", [LA, RW])
def test_checkers_agree_on_generated_txn_histories(workload: str) -> None:
    rng = random.Random(5)
    verdicts = set()
    for _ in range(60):
        events = _random_txn_history(rng, workload)
        ours, theirs = _both(workload, events)
        assert ours.valid == theirs, (ours, events)
        verdicts.add(ours.valid)
    assert verdicts == {True, False}, "the generator should produce both kinds"
