"""Harness parts in isolation: partition shapes, generators, histories, EDN."""

from __future__ import annotations

import json
import random

import pytest

from maelstrom.edn import Keyword, dumps
from maelstrom.harness.generators import LinKvGenerator, TxnGenerator
from maelstrom.harness.net import PARTITION_SHAPES, Latency, grudge
from maelstrom.harness.runner import RunConfig
from maelstrom.history import Event, from_json, pair, to_edn_lines, to_json

NODES = [f"n{i}" for i in range(5)]


def _hears(g: dict[str, frozenset[str]], dest: str, src: str) -> bool:
    return src not in g[dest]


@pytest.mark.parametrize("seed", range(10))
def test_halves_split_into_a_majority_and_a_minority(seed: int) -> None:
    g = grudge("halves", NODES, random.Random(seed))
    sizes = sorted(len(NODES) - len(blocked) for blocked in g.values())
    assert sizes == [2, 2, 3, 3, 3]
    assert all(_hears(g, a, b) == _hears(g, b, a) for a in NODES for b in NODES)


@pytest.mark.parametrize("seed", range(10))
def test_majorities_ring_gives_everyone_a_different_majority(seed: int) -> None:
    g = grudge("majorities-ring", NODES, random.Random(seed))
    views = {n: frozenset(m for m in NODES if _hears(g, n, m)) for n in NODES}
    assert all(len(v) == 3 and n in v for n, v in views.items())
    assert len(set(views.values())) == len(NODES)


@pytest.mark.parametrize("seed", range(10))
def test_bridge_node_hears_everyone_and_the_sides_do_not_meet(seed: int) -> None:
    g = grudge("bridge", NODES, random.Random(seed))
    [bridge] = [n for n in NODES if not g[n]]
    sides = [n for n in NODES if n != bridge]
    cut = [(a, b) for a in sides for b in sides if not _hears(g, a, b)]
    assert len(cut) == 8  # two pairs, each blocked from the other pair, both ways


def test_one_isolates_exactly_one_node() -> None:
    g = grudge("one", NODES, random.Random(3))
    isolated = [n for n in NODES if len(g[n]) == 4]
    assert len(isolated) == 1
    assert sorted(PARTITION_SHAPES) == ["bridge", "halves", "majorities-ring", "one"]


def test_latency_distributions() -> None:
    rng = random.Random(1)
    assert Latency(5, "constant").draw_seconds(rng) == 0.005
    draws = [Latency(5, "exponential").draw_seconds(rng) for _ in range(2000)]
    assert 0.004 < sum(draws) / len(draws) < 0.006
    assert all(0 <= Latency(5, "uniform").draw_seconds(rng) <= 0.010 for _ in range(100))
    with pytest.raises(ValueError, match="distribution"):
        Latency(5, "pareto")


def test_lin_kv_generator_groups_roles_and_key_rollover() -> None:
    with pytest.raises(ValueError, match="multiple of 2n"):
        LinKvGenerator(5, 12, random.Random(1))
    gen = LinKvGenerator(5, 20, random.Random(1), per_key_limit=10)
    reads = [gen.next(t, t) for t in range(5)]
    assert all(i.f == "read" for i in reads)
    assert {gen.next(t, t).f for t in range(5, 10) for _ in range(5)} <= {"write", "cas"}
    assert gen.next(10, 10).value[0] != gen.next(0, 0).value[0]  # groups use other keys
    keys = {gen.next(0, 0).value[0] for _ in range(40)}
    assert len(keys) >= 4  # per-key limit rolls the group onto fresh keys
    for _ in range(30):
        invocation = gen.next(7, 7)
        if invocation.f == "cas":
            assert all(0 <= v < 5 for v in invocation.value[1])


def test_lin_kv_generator_process_limit() -> None:
    gen = LinKvGenerator(1, 2, random.Random(1), per_key_limit=1000, process_limit=3)
    first = gen.next(0, 0).value[0]
    gen.next(1, 1)
    gen.next(0, 2)
    assert gen.next(1, 3).value[0] != first  # a fourth process moves the key on


@pytest.mark.parametrize("workload", ["txn-list-append", "txn-rw-register"])
def test_txn_generator_writes_unique_values_per_key(workload: str) -> None:
    gen = TxnGenerator(workload, random.Random(5), max_writes_per_key=4)
    written: set[tuple[int, int]] = set()
    for _ in range(300):
        invocation = gen.next(0, 0)
        assert 1 <= len(invocation.value) <= 4
        assert invocation.body == {"type": "txn", "txn": invocation.value}
        for f, key, value in invocation.value:
            if f == "r":
                assert value is None
                continue
            assert f == ("append" if workload == "txn-list-append" else "w")
            assert (key, value) not in written and 1 <= value <= 4
            written.add((key, value))
    assert gen.keys_used > 10


def _events() -> list[Event]:
    return [
        Event(0, "invoke", "txn", [["r", 1, None], ["append", 1, 2]], 10, 0),
        Event(1, "invoke", "txn", [["append", 2, 1]], 11, 1),
        Event(2, "info", "start-partition", {"shape": "one"}, 12, "nemesis"),
        Event(3, "ok", "txn", [["r", 1, [1]], ["append", 1, 2]], 20, 0),
        Event(4, "info", "txn", [["append", 2, 1]], 30, 1, ("timeout", "no reply")),
        Event(5, "invoke", "txn", [["r", 2, None]], 40, 0),
    ]


def test_pair_folds_completions_and_leaves_unfinished_as_info() -> None:
    ops = pair(_events())
    assert [(o.index, o.status, o.completed) for o in ops] == [
        (0, "ok", 20),
        (1, "info", None),
        (5, "info", None),
    ]
    assert ops[0].value == [["r", 1, [1]], ["append", 1, 2]]


def test_history_json_round_trip() -> None:
    document = json.loads(json.dumps(to_json("txn-list-append", _events())))
    assert from_json(document) == ("txn-list-append", _events())


def test_edn_history_lines_look_like_jepsen() -> None:
    lines = to_edn_lines("txn-list-append", _events())
    assert lines[0] == (
        "{:index 0, :type :invoke, :f :txn, :value [[:r 1 nil] [:append 1 2]], "
        ":time 10, :process 0}"
    )
    assert ":process :nemesis" in lines[2]
    assert lines[4].endswith(':error [:timeout "no reply"]}')


def test_edn_values() -> None:
    assert dumps({"valid?": Keyword("unknown"), "a": [1, None, True], "s": 'q"\n'}) == (
        '{:valid? :unknown, :a [1 nil true], :s "q\\"\\n"}'
    )
    assert dumps({"has space": 1.5}) == '{"has space" 1.5}'
    with pytest.raises(ValueError, match="NaN"):
        dumps(float("nan"))


def test_run_config_applies_maelstrom_defaults_and_refuses_bad_options() -> None:
    lin = RunConfig(workload="lin-kv", node_count=5, latency=Latency(150, "constant"))
    assert lin.nodes == ("n0", "n1", "n2", "n3", "n4")
    assert lin.effective_concurrency == 10 and lin.effective_timeout_ms == 1500
    txn = RunConfig(workload="txn-list-append", node_count=3)
    assert txn.effective_concurrency == 3 and txn.effective_timeout_ms == 5000
    with pytest.raises(ValueError, match="multiple of 2n"):
        RunConfig(workload="lin-kv", node_count=5, concurrency=7)
    with pytest.raises(ValueError, match="only 'partition'"):
        RunConfig(workload="lin-kv", nemesis=("kill",))
    with pytest.raises(ValueError, match="unknown workload"):
        RunConfig(workload="g-set")
