"""The burn test in CI: many seeds with every fault, determinism, and proof of teeth.

Reference for the approach: Accord ``BurnTest`` (seeded cluster, strict-serializability
verifier, reconcile mode) and TigerBeetle's VOPR (safety phase, then liveness phase).
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from accord.sim import Bugs
from accord.sim.burn import BurnConfig, RunResult, run_seed
from accord.sim.cluster import Faults

SEEDS = int(os.environ.get("ACCORD_BURN_SEEDS", "50"))
TXNS = int(os.environ.get("ACCORD_BURN_TXNS", "200"))
ALL_FAULTS = Faults.parse("all")
# Crashes between sending a batch's early requests and journaling it (Ready.early), often.
EARLY: dict[str, object] = {
    "faults": dataclasses.replace(ALL_FAULTS, early_crashes=True),
    "coordinator_crash_chance": 0.1,
}


def _explain(result: RunResult) -> str:
    batching = " --batch-max-parts 8 --batch-window-ms 30" if _batched(result) else ""
    return (
        f"seed={result.seed}: {result.verdict_text()} (reproduce: python -m accord.sim "
        f"--seed-start {result.seed} --seeds 1 --txns {TXNS}{batching})"
    )


# Nodes told when a peer crashed or their link to it was cut (Node.peer_reachable), as the
# sidecars' transport tells them: a cut-off coordinator that is alive has its txns
# recovered after the floor delay while it still drives them.
DETECTOR = dataclasses.replace(ALL_FAULTS, detector=True)


# Group commit (NodeConfig.batch_max_parts): the simulated host holds submissions for up
# to 30 ms, so client transactions arriving together are coordinated as one batch.
BATCHING: dict[str, object] = {"batch_max_parts": 8, "batch_window_micros": 30_000}


def _batched(result: RunResult) -> int:
    """Client transactions that shared their Accord transaction with another."""
    return sum(parts * count for parts, count in result.parts_per_batch.items() if parts > 1)


@pytest.mark.parametrize("workload", ["list-append", "bank"])
def test_burn_all_faults(workload: str) -> None:
    """Every seed under every fault; odd seeds batch client transactions (BATCHING), so a
    batching bug fails this suite as well as the one that plants it."""
    seeds = SEEDS if workload == "list-append" else max(5, SEEDS // 5)
    config = BurnConfig(nodes=5, rf=3, txns=TXNS, workload=workload, faults=ALL_FAULTS)
    batching = dataclasses.replace(config, **BATCHING)  # type: ignore[arg-type]
    failures = []
    committed = 0
    batched = 0
    for seed in range(seeds):
        result = run_seed(seed, batching if seed % 2 else config)
        committed += result.ok
        batched += _batched(result)
        if not result.passed:
            failures.append(_explain(result))
    assert not failures, "\n".join(failures)
    # Faults must not have starved the workload: most transactions commit.
    assert committed >= 0.8 * seeds * TXNS
    # The batching seeds did coordinate client transactions together.
    assert batched >= seeds // 2 * 5


def test_burn_without_faults_is_mostly_fast_path() -> None:
    result = run_seed(7, BurnConfig(txns=300, faults=Faults()))
    assert result.passed, _explain(result)
    assert result.ok == result.txns
    assert result.recoveries == 0
    assert result.fast_path_share > 0.5


def test_reorder_buffer_and_smaller_electorate_stay_safe() -> None:
    for seed in range(5):
        result = run_seed(
            seed,
            BurnConfig(
                nodes=5,
                rf=5,
                electorate=4,
                txns=150,
                faults=ALL_FAULTS,
                reorder_buffer_micros=5_000,
            ),
        )
        assert result.passed, _explain(result)


def test_reconcile_same_seed_same_trace() -> None:
    config = BurnConfig(txns=150, faults=ALL_FAULTS)
    first, second = run_seed(3, config), run_seed(3, config)
    assert first.digest == second.digest
    assert first.to_json() | {"cpu_seconds": 0} == second.to_json() | {"cpu_seconds": 0}
    other = run_seed(4, config)
    assert other.digest != first.digest


# Multi-shard: more nodes than replicas, two ranges per node, so transactions span shards
# whose replica sets differ; fast quorum 4 of 5 with one vote of slack, the setting where
# recovery evidence decides; coordinators crashing mid-PreAccept, slow nodes, recovery
# soon after a coordinator goes quiet.
MULTI_SHARD: dict[str, object] = {
    "nodes": 8,
    "rf": 5,
    "shards_per_node": 2,
    "keys": 3,
    "clients": 12,
    "txns": 150,
    "recover_delay_micros": 300_000,
    "coordinator_crash_chance": 0.2,
}
# "racing" makes recovery coordinators race the original ones (recovery delay 5 ms, fixed:
# a delay learned from latency would grow past the race it is there to provoke).
RACING: dict[str, object] = {
    "recover_delay_micros": 5_000,
    "recover_delay_adaptive": False,
    "keys": 4,
    "clients": 10,
}
# The sidecars' deployment: one store for every replica, one writer per shard, multi-shard.
SHARED: dict[str, object] = {**MULTI_SHARD, "shared_storage": True}
# Crash storms: crashes every 50-300 ms and short downtimes, racing recovery, multi-shard.
# This profile found coordination ids being reused after a restart.
STORM: dict[str, object] = {
    **MULTI_SHARD,
    "recover_delay_micros": 2_000,
    "recover_delay_adaptive": False,
    "nemesis_interval_micros": (50_000, 300_000),
    "down_micros": (30_000, 400_000),
}

# Each deliberately broken protocol must be caught within a bounded number of seeds, by the
# history checker or by the simulator's oracles (accord/sim/oracle.py).
TEETH: dict[str, tuple[int, dict[str, object]]] = {
    "execute_without_waiting": (10, {}),
    "fast_vote_ignores_conflicts": (10, {}),
    "deps_omit_uncommitted": (20, {}),
    "fast_quorum_is_slow_quorum": (20, RACING),
    "forget_promise_on_restart": (10, {}),
    "recovery_ignores_earlier_accepted": (10, MULTI_SHARD),
    "witness_any_key": (10, MULTI_SHARD),
    "write_before_durable": (1, {}),
    # The stale proposal needs a recovery racing the one that wrote: the fixed delay. Seed 4
    # since coordinators that are no replica ask replicas (CheckStatus) before recovering:
    # fewer recoveries race.
    "applied_acks_any_proposal": (5, {**SHARED, "recover_delay_adaptive": False}),
    # Two parts of one batch on one key: a lost append or a lost transfer.
    "batch_ignores_disjointness": (5, BATCHING),
    # Votes sent before they are durable, lost by a crash before the journal append.
    "early_votes": (3, EARLY),
}


def test_every_planted_variant_is_listed() -> None:
    assert set(TEETH) == {f.name for f in dataclasses.fields(Bugs)}


@pytest.mark.parametrize("bug", sorted(TEETH))
def test_burn_test_has_teeth(bug: str) -> None:
    seeds, extra = TEETH[bug]
    config = BurnConfig(
        **{"txns": 200, "faults": ALL_FAULTS, "bugs": Bugs(**{bug: True}), **extra}  # type: ignore[arg-type]
    )
    for seed in range(seeds):
        result = run_seed(seed, config)
        if not result.passed:
            return
    pytest.fail(f"broken variant {bug} passed {seeds} seeds")


@pytest.mark.parametrize(
    ("profile", "seeds"),
    [
        ("racing", 10),
        ("multi-shard", 10),
        ("storm", 5),
        ("shared-storage", 10),
        ("batching", 10),
        ("batching-shared-storage", 5),
        ("early-crashes", 10),
        ("early-crashes-shared-storage", 5),
        ("detector-shared-storage", 10),
    ],
)
def test_the_correct_protocol_survives_every_profile(profile: str, seeds: int) -> None:
    """The correct protocol under the profiles that expose the broken variants."""
    extra = {
        "racing": RACING,
        "multi-shard": MULTI_SHARD,
        "storm": STORM,
        "shared-storage": SHARED,
        "batching": {**BATCHING, "clients": 24, "keys": 20},
        "batching-shared-storage": {**SHARED, **BATCHING, "clients": 24},
        "early-crashes": EARLY,
        "early-crashes-shared-storage": {**SHARED, **EARLY},
        "detector-shared-storage": {**SHARED, "faults": DETECTOR},
    }[profile]
    config = BurnConfig(**{"txns": 200, "faults": ALL_FAULTS, **extra})  # type: ignore[arg-type]
    batched = 0
    for seed in range(seeds):
        result = run_seed(seed, config)
        assert result.passed, _explain(result)
        batched += _batched(result)
    assert batched > 0 or config.batch_max_parts == 1


def test_the_simulated_detector_tells_nodes_of_crashes_and_cuts_and_of_their_end() -> None:
    from accord.sim.cluster import DETECT_MICROS, Cluster
    from accord.topology import ring_topology

    assert Faults.parse("all,detector") == DETECTOR
    cluster = Cluster(ring_topology([1, 2, 3], 3), seed=1, faults=Faults(detector=True))
    cluster.crash(3, down_micros=1_000_000)
    cluster.partition({(1, 2)}, heal_after_micros=500_000)
    cluster.run_until(lambda: False, deadline_micros=cluster.now + 2 * DETECT_MICROS)
    unreachable = {n: cluster.node(n).unreachable for n in (1, 2)}  # type: ignore[union-attr]
    assert unreachable == {1: {2, 3}, 2: {3}}
    cluster.run_until(lambda: False, deadline_micros=600_000)
    assert cluster.node(1).unreachable == {3}  # type: ignore[union-attr]
    cluster.run_until(lambda: False, deadline_micros=1_100_000)
    assert all(cluster.node(n).unreachable == set() for n in (1, 2, 3))  # type: ignore[union-attr]
