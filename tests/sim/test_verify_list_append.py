"""The list-append checker on hand-made histories: every invalid one is built so that exactly
one anomaly class is the honest explanation, and the tests pin the *name* (a checker that
merely says "invalid" for the wrong reason would hide real regressions); then scale."""

from __future__ import annotations

from accord.sim.history import History, Operation
from accord.sim.verify import (
    check_list_append,
)
from tests.sim.histories import (
    app,
    assert_only,
    assert_valid,
    gen_list_append,
    hist,
    names,
    op,
    put,
    r,
)

# ---------------------------------------------------------------------------
# list-append: histories that must be rejected


def test_lost_update_is_g_single() -> None:
    # Both read the empty list and appended; the final read shows both
    # appends.  1's append precedes 2's (ww), yet 2 read a list without 1's
    # append (rw 2 -> 1): one anti-dependency closes the cycle -> G-single.
    v = check_list_append(
        hist(
            op(1, [r("x", ()), app("x", 1)], 0),
            op(2, [r("x", ()), app("x", 2)], 0),
            op(3, [r("x", (1, 2))], 20),
        )
    )
    assert_only(v, "G-single")
    (a,) = v.anomalies
    assert sorted(a.op_ids) == [1, 2]
    assert sorted(e.kind for e in a.cycle) == ["rw", "ww"]
    assert {e.key for e in a.cycle} == {"x"}


def test_stale_read_under_real_time_with_later_observer() -> None:
    # 1 appends and is acknowledged at t=10; 2 starts at t=20 and still reads
    # the empty list.  Serializable (2 before 1) but not strict: rw 2->1, rt 1->2.
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0, 10),
            op(2, [r("x", ())], 20, 30),
            op(3, [r("x", (1,))], 40, 50),
        )
    )
    assert_only(v, "G-single-realtime")
    (a,) = v.anomalies
    assert [(e.src, e.kind, e.dst) for e in a.cycle] in (
        [(2, "rw", 1), (1, "rt", 2)],
        [(1, "rt", 2), (2, "rw", 1)],
    )


def test_stale_read_under_real_time_without_any_observer() -> None:
    # Nobody ever reads [1], but 1 committed, so its append sits after the
    # longest observed list: 2's read of [] still anti-depends on it.
    v = check_list_append(hist(op(1, [app("x", 1)], 0, 10), op(2, [r("x", ())], 20, 30)))
    assert_only(v, "G-single-realtime")


def test_stale_read_is_fine_when_concurrent() -> None:
    # Same reads, but the intervals overlap: 2 may serialize before 1.
    v = check_list_append(
        hist(op(1, [app("x", 1)], 0, 30), op(2, [r("x", ())], 20, 40), op(3, [r("x", (1,))], 50))
    )
    assert_valid(v)


def test_g0_write_cycle() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1), app("y", 1)], 0),
            op(2, [app("x", 2), app("y", 2)], 0),
            op(3, [r("x", (1, 2)), r("y", (2, 1))], 100),
        )
    )
    assert_only(v, "G0")
    (a,) = v.anomalies
    assert {e.kind for e in a.cycle} == {"ww"}


def test_g1a_aborted_read() -> None:
    v = check_list_append(
        hist(op(1, [app("x", 1)], 0, status="fail"), op(2, [r("x", (1,))], 20)),
    )
    assert_only(v, "G1a")
    assert v.anomalies[0].op_ids == (2, 1)


def test_g1b_intermediate_read() -> None:
    v = check_list_append(
        hist(op(1, [app("x", 1), app("x", 2)], 0), op(2, [r("x", (1,))], 5)),
    )
    assert "G1b" in names(v)
    assert not v.valid


def test_g1c_circular_information_flow() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1), r("y", (2,))], 0),
            op(2, [app("y", 2), r("x", (1,))], 0),
        )
    )
    assert_only(v, "G1c")
    assert {e.kind for e in v.anomalies[0].cycle} == {"wr"}


def test_g_single_read_skew() -> None:
    # 2 sees 1's append to y but not its append to x.
    v = check_list_append(
        hist(
            op(1, [app("x", 1), app("y", 1)], 0),
            op(2, [r("x", ()), r("y", (1,))], 0),
            op(3, [r("x", (1,))], 0),
        )
    )
    assert_only(v, "G-single")


def test_write_skew_is_g2() -> None:
    v = check_list_append(
        hist(
            op(1, [r("x", ()), r("y", ()), app("x", 1)], 0),
            op(2, [r("x", ()), r("y", ()), app("y", 2)], 0),
            op(3, [r("x", (1,)), r("y", (2,))], 100),
        )
    )
    assert_only(v, "G2")
    assert [e.kind for e in v.anomalies[0].cycle] == ["rw", "rw"]


def test_write_skew_without_observers_is_g2() -> None:
    # The unobserved-append inference alone proves the two rw edges.
    v = check_list_append(
        hist(
            op(1, [r("x", ()), r("y", ()), app("x", 1)], 0),
            op(2, [r("x", ()), r("y", ()), app("y", 2)], 0),
        )
    )
    assert_only(v, "G2")


def test_incompatible_order() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0),
            op(2, [app("x", 2)], 0),
            op(3, [r("x", (1, 2))], 20),
            op(4, [r("x", (2, 1))], 20),
        )
    )
    assert_only(v, "incompatible-order")
    assert set(v.anomalies[0].op_ids) == {3, 4}


def test_garbage_read() -> None:
    v = check_list_append(hist(op(1, [app("x", 1)], 0), op(2, [r("x", (1, 99))], 20)))
    assert_only(v, "garbage-read")


def test_duplicate_elements() -> None:
    v = check_list_append(hist(op(1, [app("x", 1)], 0), op(2, [r("x", (1, 1))], 20)))
    assert "duplicate-elements" in names(v)


def test_internal_own_append_not_seen() -> None:
    v = check_list_append(hist(op(1, [app("x", 1), r("x", ())], 0)))
    assert_only(v, "internal")


def test_internal_repeated_reads_disagree() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0),
            op(2, [app("x", 2)], 0),
            op(3, [r("x", (1,)), r("x", (1, 2))], 30),
        )
    )
    assert "internal" in names(v)


def test_internal_read_of_own_future_append() -> None:
    v = check_list_append(hist(op(1, [r("x", (1,)), app("x", 1)], 0)))
    assert_only(v, "internal")


def test_internal_fine_when_consistent() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0),
            op(2, [app("x", 2), r("x", (1, 2)), app("x", 3), r("x", (1, 2, 3))], 20),
        )
    )
    assert_valid(v)


def test_reads_after_own_append_see_only_own_suffix() -> None:
    # Own append must be the *last* element seen.
    v = check_list_append(
        hist(
            op(1, [app("x", 1), r("x", (1, 2))], 0),
            op(2, [app("x", 2)], 0),
        )
    )
    assert "internal" in names(v)


def test_duplicate_append_is_malformed() -> None:
    v = check_list_append(hist(op(1, [app("x", 1)], 0), op(2, [app("x", 1)], 0)))
    assert_only(v, "malformed-history")


def test_put_in_list_append_history_is_malformed() -> None:
    assert_only(check_list_append(hist(op(1, [put("x", 1)], 0))), "malformed-history")


def test_non_list_read_is_malformed() -> None:
    assert_only(check_list_append(hist(op(1, [r("x", 5)], 0))), "malformed-history")


def test_info_op_observed_joins_cycles() -> None:
    # The info op's append was observed, so it committed: its own stale read
    # is then no longer ignored... but info reads are unknown, so instead use
    # real time *into* it: 2 completed before info op 1 was invoked, and 1's
    # append is visible to 2.  That is a read from the future.
    v = check_list_append(
        hist(
            op(2, [r("x", (1,))], 0, 10),
            op(1, [app("x", 1)], 20, status="info"),
        )
    )
    assert_only(v, "G1c-realtime")


def test_examples_are_capped_but_counts_are_exact() -> None:
    ops = [op(0, [app("x", 0)], 0, status="fail")]
    ops += [op(i, [r("x", (0,))], 20) for i in range(1, 11)]
    v = check_list_append(hist(*ops))
    assert v.stats["anomaly.G1a"] == 10
    assert len(v.anomalies) == 3
    assert "G1a x10" in v.summary()


def test_many_readers_fan_out_without_self_loops() -> None:
    # 100 readers of the empty list, plus 1 that reads [] and then appends:
    # enough pairs to use hub chains; the appender must not anti-depend on
    # itself through the hub, and 2's blind append follows every read.
    ops = [op(i, [r("x", ())], 0, 100) for i in range(3, 103)]
    ops += [op(1, [r("x", ()), app("x", 1)], 0, 100), op(2, [app("x", 2)], 0, 100)]
    assert_valid(check_list_append(hist(*ops)))


def test_many_readers_fan_out_detects_stale_read() -> None:
    # Same shape, but blind appender 2 was acknowledged before reader 1 was
    # invoked, so 1's empty read is stale: 1 -rw-> 2 (via the hub) -rt-> 1.
    ops = [op(i, [r("x", ())], 0, 100) for i in range(3, 103)]
    ops += [op(2, [app("x", 2)], 0, 10), op(1, [r("x", ()), app("x", 1)], 20, 100)]
    v = check_list_append(hist(*ops))
    assert_only(v, "G-single-realtime")
    (a,) = v.anomalies
    assert {(e.src, e.kind, e.dst) for e in a.cycle} == {(1, "rw", 2), (2, "rt", 1)}


# ---------------------------------------------------------------------------
# list-append: histories that must be accepted


def test_sequential_history_is_valid() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0, 10),
            op(2, [r("x", (1,)), app("x", 2)], 20, 30),
            op(3, [r("x", (1, 2)), r("y", ())], 40, 50),
        )
    )
    assert_valid(v)
    assert v.stats["committed"] == 3
    assert v.summary().startswith("valid")


def test_concurrent_non_conflicting_is_valid() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0, 30),
            op(2, [app("y", 1)], 5, 25),
            op(3, [r("x", (1,)), r("y", ())], 10, 40),
            op(4, [r("x", (1,)), r("y", (1,))], 50, 60),
        )
    )
    assert_valid(v)


def test_info_op_that_took_effect_is_valid() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1), r("y")], 0, status="info"),
            op(2, [r("x", (1,))], 100, 110),
        )
    )
    assert_valid(v)
    assert v.stats["info_committed"] == 1


def test_info_op_that_did_not_take_effect_is_valid() -> None:
    v = check_list_append(
        hist(
            op(1, [app("x", 1)], 0, status="info"),
            op(2, [r("x", ())], 100, 110),
            op(3, [app("x", 2)], 120, 130),
            op(4, [r("x", (2,))], 140, 150),
        )
    )
    assert_valid(v)
    assert v.stats["info_committed"] == 0


def test_failed_op_never_observed_is_valid() -> None:
    v = check_list_append(
        hist(op(1, [app("x", 1), r("x")], 0, status="fail"), op(2, [r("x", ())], 20))
    )
    assert_valid(v)


def test_empty_reads_are_valid() -> None:
    v = check_list_append(
        hist(op(1, [r("x", None), r("y", ())], 0), op(2, [r("x", ()), app("y", 1)], 20))
    )
    assert_valid(v)


def test_empty_history_is_valid() -> None:
    assert_valid(check_list_append(History(())))


# ---------------------------------------------------------------------------
# scale


def test_scale_20000_ops_valid() -> None:
    # Keys rotate so lists stay short, and ~10 txns overlap at any time; the
    # point is that the checker is linear-ish (real time via the chain, not
    # O(n^2) pairs), so no timing assertion.
    h = gen_list_append(7, 20_000, spread=500, active_keys=8, max_per_key=40, final_reads=1)
    assert len(h) == 20_001
    v = check_list_append(h)
    assert_valid(v)
    assert v.stats["committed"] > 15_000
    assert v.stats["edges.rt"] > 15_000
    # data edges stay linear in the number of ops
    assert v.stats["edges.ww"] + v.stats["edges.wr"] + v.stats["edges.rw"] < 10 * len(h)


def test_scale_20000_ops_with_one_stale_read() -> None:
    h = gen_list_append(11, 20_000, spread=500, active_keys=8, max_per_key=40, final_reads=1)
    # A read-only op long after everything, seeing an early (stale) state.
    early = next(
        o
        for o in h.operations
        if o.status == "ok" and any(m.kind == "r" and m.value for m in o.mops)
    )
    m = next(m for m in early.mops if m.kind == "r" and m.value)
    t0 = max(o.invoked_at for o in h.operations) + 100_000
    stale = Operation(len(h), 99_999, t0, t0 + 10, "ok", (m,))
    v = check_list_append(History((*h.operations, stale)))
    assert not v.valid
    assert names(v) == {"G-single-realtime"}, v.summary()
    # The explanation is the short cycle (stale read -rw-> overwriting
    # append -rt-> stale read), not some long detour through the history.
    (a,) = v.anomalies
    assert len(a.cycle) == 2, v.summary()
    assert a.cycle[0].src == stale.op_id or a.cycle[1].src == stale.op_id
