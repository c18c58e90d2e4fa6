"""The register and bank checkers on hand-made histories, and the history format itself.
As for list-append, each invalid history pins the one anomaly name that explains it."""

from __future__ import annotations

import json

import pytest

from accord.sim.history import History, HistoryRecorder, MicroOp, Operation
from accord.sim.verify import (
    check_bank,
    check_registers,
)
from tests.sim.histories import (
    app,
    assert_only,
    assert_valid,
    hist,
    names,
    op,
    put,
    r,
)

# ---------------------------------------------------------------------------
# registers


def test_register_read_of_failed_write_is_g1a() -> None:
    v = check_registers(
        hist(op(1, [put("x", 5)], 0, status="fail"), op(2, [r("x", 5)], 20)),
        {"x": 0},
    )
    assert_only(v, "G1a")


def test_register_garbage_read() -> None:
    assert_only(check_registers(hist(op(1, [r("x", 7)], 0)), {"x": 0}), "garbage-read")


def test_register_read_from_the_future_is_g1c_realtime() -> None:
    v = check_registers(
        hist(op(1, [r("x", 5)], 0, 10), op(2, [put("x", 5)], 20, 30)),
        {"x": 0},
    )
    assert_only(v, "G1c-realtime")


def test_register_g1c() -> None:
    v = check_registers(
        hist(op(1, [put("x", 1), r("y", 2)], 0), op(2, [put("y", 2), r("x", 1)], 0)),
        {},
    )
    assert_only(v, "G1c")


def test_register_lost_update() -> None:
    v = check_registers(
        hist(
            op(1, [r("x", 0), put("x", 1)], 0),
            op(2, [r("x", 0), put("x", 2)], 0),
        ),
        {"x": 0},
    )
    assert "lost-update" in names(v)
    assert not v.valid


def test_register_stale_read_after_rmw_is_g_single_realtime() -> None:
    v = check_registers(
        hist(op(1, [r("x", 0), put("x", 1)], 0, 10), op(2, [r("x", 0)], 20, 30)),
        {"x": 0},
    )
    assert_only(v, "G-single-realtime")


def test_register_stale_read_of_initial_value_after_blind_write() -> None:
    # The initial version precedes every write, blind or not.
    v = check_registers(
        hist(op(1, [put("x", 1)], 0, 10), op(2, [r("x", 0)], 20, 30)),
        {"x": 0},
    )
    assert_only(v, "G-single-realtime")


def test_register_stale_blind_overwrite_is_not_detected() -> None:
    # Documented limitation: blind writes have no known order, so reading 1
    # after 2 was written (and acknowledged) proves nothing to this checker.
    v = check_registers(
        hist(op(1, [put("x", 1)], 0, 10), op(2, [put("x", 2)], 20, 30), op(3, [r("x", 1)], 40)),
        {"x": 0},
    )
    assert_valid(v)


def test_register_g1b_and_internal() -> None:
    v = check_registers(
        hist(op(1, [put("x", 1), put("x", 2)], 0), op(2, [r("x", 1)], 0)),
        {},
    )
    assert names(v) == {"G1b"}
    v = check_registers(hist(op(1, [put("x", 1), r("x", 0)], 0)), {"x": 0})
    assert_only(v, "internal")


def test_register_ambiguous_values_infer_nothing() -> None:
    # Two writers of 5: the read could come from either; no edge, no anomaly.
    v = check_registers(
        hist(op(1, [put("x", 5)], 0), op(2, [put("x", 5)], 100), op(3, [r("x", 5)], 50, 60)),
        {"x": 0},
    )
    assert_valid(v)
    assert v.stats["ambiguous_reads"] == 1


def test_register_valid_sequential_with_info() -> None:
    v = check_registers(
        hist(
            op(1, [r("x"), put("x", "a")], 0, 10),
            op(2, [r("x", "a"), put("x", "b"), put("y", 1)], 20, status="info"),
            op(3, [r("x", "b"), r("y", 1)], 100, 110),
            op(4, [put("x", "lost")], 120, status="info"),
            op(5, [r("x", "b")], 130, 140),
        ),
        {},
    )
    assert_valid(v)
    assert v.stats["info_committed"] == 1


# ---------------------------------------------------------------------------
# bank

ACCOUNTS = ("a", "b")
INITIAL = {"a": 10, "b": 10}


def test_bank_non_conserved_total() -> None:
    v = check_bank(
        hist(
            op(1, [r("a", 10), r("b", 10), put("a", 5), put("b", 15)], 0),
            op(2, [r("a", 5), r("b", 10)], 20),
        ),
        ACCOUNTS,
        INITIAL,
    )
    assert "wrong-total" in names(v)
    (a,) = [x for x in v.anomalies if x.name == "wrong-total"]
    assert a.op_ids == (2,)


def test_bank_read_of_failed_transfer() -> None:
    v = check_bank(
        hist(
            op(
                1,
                [r("a", (10, 0)), r("b", (10, 0)), put("a", (5, 1)), put("b", (15, 1))],
                0,
                status="fail",
            ),
            op(2, [r("a", (5, 1)), r("b", (15, 1))], 20),
        ),
        ACCOUNTS,
        INITIAL,
    )
    assert_only(v, "G1a")
    assert v.stats["anomaly.G1a"] == 2


def test_bank_negative_balance() -> None:
    h = hist(
        op(1, [r("a", 10), r("b", 10), put("a", -5), put("b", 25)], 0),
        op(2, [r("a", -5), r("b", 25)], 20),
    )
    assert_only(check_bank(h, ACCOUNTS, INITIAL), "negative-balance")
    assert_valid(check_bank(h, ACCOUNTS, INITIAL, allow_negative=True))


def test_bank_bad_balance() -> None:
    v = check_bank(hist(op(1, [r("a", "ten"), r("b", 10)], 0)), ACCOUNTS, INITIAL)
    assert "bad-balance" in names(v)


def test_bank_tagged_valid_and_lost_update() -> None:
    ok = hist(
        op(1, [r("a", 10), r("b", 10), put("a", (5, 1)), put("b", (15, 1))], 0),
        op(2, [r("a", (5, 1)), r("b", (15, 1))], 20),
        op(3, [r("a", (5, 1)), put("a", (0, 3)), r("b", (15, 1)), put("b", (20, 3))], 40),
        op(4, [r("a", (0, 3)), r("b", (20, 3))], 60),
    )
    v = check_bank(ok, ACCOUNTS, INITIAL)
    assert_valid(v)
    assert v.stats["bank.snapshots"] == 4
    # Two concurrent transfers that both read the initial balances: each
    # snapshot is conserved, but one transfer's effect is lost.
    lost = hist(
        op(1, [r("a", (10, 0)), r("b", (10, 0)), put("a", (5, 1)), put("b", (15, 1))], 0),
        op(2, [r("a", (10, 0)), r("b", (10, 0)), put("a", (7, 2)), put("b", (13, 2))], 0),
    )
    v = check_bank(lost, ACCOUNTS, INITIAL)
    assert "lost-update" in names(v)
    assert not v.valid


def test_bank_rejects_unknown_account() -> None:
    with pytest.raises(ValueError, match="initial balance"):
        check_bank(History(()), ["a", "z"], INITIAL)


# ---------------------------------------------------------------------------
# history format and recorder


def test_recorder_round_trip_and_pending_become_info() -> None:
    rec = HistoryRecorder()
    a = rec.invoke(0, [app("x", 1), r("x")], now=5)
    b = rec.invoke(1, [r("x")], now=6)
    with pytest.raises(ValueError, match="in flight"):
        rec.invoke(0, [r("x")], now=7)
    rec.complete(a, "ok", [app("x", 1), r("x", (1,))], now=9)
    c = rec.invoke(0, [app("y", 2)], now=10)
    rec.complete(c, "info", None, now=50)
    d = rec.invoke(2, [r("x")], now=11)
    with pytest.raises(ValueError, match="differ"):
        rec.complete(d, "ok", [r("y", ())], now=12)
    h = rec.history()
    assert [o.op_id for o in h.operations] == [0, 1, 2, 3]
    assert h.by_id(b).status == "info" and h.by_id(b).completed_at is None
    assert h.by_id(c).completed_at is None
    assert [o.op_id for o in h.ok_ops()] == [a]
    again = History.from_json(json.loads(json.dumps(h.to_json())))
    assert again == h
    assert again.by_id(a).mops[1].value == (1,)


def test_history_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        hist(op(1, [], 0), op(1, [], 0))
    with pytest.raises(ValueError, match="precedes"):
        Operation(1, 1, 10, 5, "ok", ())
    with pytest.raises(ValueError, match="info"):
        Operation(1, 1, 10, 15, "info", ())
    with pytest.raises(ValueError, match="kind"):
        MicroOp("cas", "x", 1)  # type: ignore[arg-type]
