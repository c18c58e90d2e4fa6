"""The burn test: one seeded run of a workload against a simulated cluster, verified.

A run has two phases (after TigerBeetle's VOPR and FoundationDB's "unclogged" phase):

1. **Safety**: clients issue transactions while the nemesis drops, delays, duplicates and
   partitions messages, crashes and restarts nodes, and skews clocks.
2. **Liveness**: faults stop, every node is up, and every transaction that any replica
   knows must reach Applied or Invalidated, and every applied one must be known applied
   by all its replicas (durable), within a bounded virtual time.

Then the history is checked by the independent verifier in ``accord.sim.verify``, and the
replicas of every key must hold identical data. A run fails with its seed, which
reproduces it exactly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from accord.api import ClientReply
from accord.invariants import ConfigurationError, InvariantViolation, check_not_none, fail
from accord.node import NodeConfig
from accord.primitives import (
    BinOp,
    Const,
    Item,
    MakeTuple,
    Predicate,
    Put,
    ReadOf,
    Txn,
    Update,
    sim_key,
)
from accord.primitives.txn import MAX_BATCH_PARTS
from accord.sim import NO_BUGS, Bugs
from accord.sim.cluster import Cluster, Faults
from accord.sim.history import HistoryRecorder, MicroOp
from accord.sim.verify import Verdict, check_bank, check_list_append
from accord.topology import Topology, ring_topology

CLIENT_TIMEOUT_MICROS = 15_000_000
BANK_INITIAL_BALANCE = 100


@dataclass(frozen=True, slots=True)
class BurnConfig:
    nodes: int = 5
    rf: int = 3
    txns: int = 200
    clients: int = 6
    keys: int = 10
    workload: str = "list-append"
    faults: Faults = field(default_factory=Faults)
    reorder_buffer_micros: int = 0
    electorate: int | None = None
    # Nodes that vote first in every shard's electorate (accord.topology.preferred_electorate).
    electorate_preference: tuple[int, ...] = ()
    shards_per_node: int = 1
    bugs: Bugs = NO_BUGS
    # One data store shared by every replica, one writer per shard (NodeConfig.shared_storage),
    # as the sidecars run on Cassandra.
    shared_storage: bool = False
    # Small values make recovery coordinators race the original ones: a stress mode.
    recover_delay_micros: int | None = None
    # False: the fixed delays alone (NodeConfig.recover_delay_adaptive).
    recover_delay_adaptive: bool = True
    # Per flush that sends PreAccepts, with the coordinator_crashes fault on.
    coordinator_crash_chance: float = 0.03
    # Per message while faults last: a delay of 20-400 ms instead of 0.5-5 ms.
    long_delay_chance: float = 0.02
    # The nemesis acts every [min, max) microseconds; a crashed node stays down for
    # [min, max). Short values crash nodes between a promise and the next message.
    nemesis_interval_micros: tuple[int, int] = (300_000, 1_200_000)
    down_micros: tuple[int, int] = (100_000, 2_000_000)
    liveness_micros: int = 120_000_000
    # Client transactions per Accord transaction at most (NodeConfig.batch_max_parts).
    batch_max_parts: int = 1
    # How long a submission waits for others to join its batch, at most (with batching).
    batch_window_micros: int = 10_000
    safety_deadline_micros: int = 600_000_000

    def __post_init__(self) -> None:
        if self.workload not in ("list-append", "bank"):
            raise ValueError(f"unknown workload {self.workload!r}: choose list-append or bank")
        if self.txns < 1 or self.clients < 1 or self.keys < 2:
            raise ValueError("txns and clients must be >= 1 and keys >= 2")
        if not 1 <= self.batch_max_parts <= MAX_BATCH_PARTS:
            raise ValueError(f"batch_max_parts must be from 1 to {MAX_BATCH_PARTS}")
        if self.shards_per_node < 1:
            raise ValueError("shards_per_node must be >= 1")
        for name in ("coordinator_crash_chance", "long_delay_chance"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        for name in ("nemesis_interval_micros", "down_micros"):
            low, high = getattr(self, name)
            if not 0 < low < high:
                raise ValueError(f"{name} must be a range 0 < min < max")
        try:
            self.topology()
        except ConfigurationError as error:
            raise ValueError(str(error)) from None

    def topology(self) -> Topology:
        return ring_topology(
            list(range(1, self.nodes + 1)),
            self.rf,
            shards_per_node=self.shards_per_node,
            electorate_size=self.electorate,
            electorate_preference=self.electorate_preference,
        )


@dataclass(slots=True)
class RunResult:
    seed: int
    txns: int = 0
    ok: int = 0
    failed: int = 0
    unknown: int = 0
    fast_path: int = 0
    slow_path: int = 0
    recoveries: int = 0
    invalidations: int = 0
    latencies_micros: list[int] = field(default_factory=list)
    verdict: Verdict | None = None
    error: str | None = None
    unfinished: int = 0
    # Applied at a home replica, not yet known applied by every replica, when liveness ended.
    undurable: int = 0
    divergent: int = 0
    digest: str = ""
    sim_micros: int = 0
    cpu_seconds: float = 0.0
    messages: int = 0
    # Messages sent by type name.
    messages_by_type: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    crashes: int = 0
    # Transactions coordinated by client submissions, by how many client txns each carried.
    parts_per_batch: dict[int, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and self.verdict is not None
            and self.verdict.valid
            and self.unfinished == 0
            and self.undurable == 0
            and self.divergent == 0
        )

    @property
    def fast_path_share(self) -> float:
        decided = self.fast_path + self.slow_path
        return self.fast_path / decided if decided else 0.0

    def percentile_micros(self, fraction: float) -> int:
        if not self.latencies_micros:
            return 0
        ordered = sorted(self.latencies_micros)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    def verdict_text(self) -> str:
        if self.error is not None:
            return f"FAIL invariant: {self.error}"
        if self.verdict is not None and not self.verdict.valid:
            return f"FAIL history: {self.verdict.summary()}"
        if self.unfinished:
            return f"FAIL liveness: {self.unfinished} transactions undecided after faults healed"
        if self.undurable:
            return (
                f"FAIL liveness: {self.undurable} applied transactions not known applied by "
                "every replica after faults healed"
            )
        if self.divergent:
            return f"FAIL divergence: {self.divergent} keys differ between replicas"
        return "ok"

    def to_json(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "passed": self.passed,
            "verdict": self.verdict_text(),
            "txns": self.txns,
            "ok": self.ok,
            "failed": self.failed,
            "unknown": self.unknown,
            "fast_path_share": round(self.fast_path_share, 4),
            "latency_p50_ms": self.percentile_micros(0.5) / 1000,
            "latency_p99_ms": self.percentile_micros(0.99) / 1000,
            "recoveries": self.recoveries,
            "invalidations": self.invalidations,
            "unfinished": self.unfinished,
            "undurable": self.undurable,
            "divergent": self.divergent,
            "messages": self.messages,
            "messages_by_type": dict(sorted(self.messages_by_type.items())),
            "dropped": self.dropped,
            "crashes": self.crashes,
            "parts_per_batch": {str(k): v for k, v in sorted(self.parts_per_batch.items())},
            "sim_seconds": self.sim_micros / 1e6,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "digest": self.digest,
        }


@dataclass(slots=True)
class _Pending:
    op_id: int
    client: int
    invoked_micros: int
    mops: tuple[MicroOp, ...]
    done: bool = False


class _Workload:
    """Turns a seeded stream of choices into transactions and their history records."""

    def __init__(self, config: BurnConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.names = [f"k{i}" for i in range(config.keys)]
        self.keys = {name: sim_key(name) for name in self.names}
        self.next_value = 1

    def next(self) -> tuple[Txn, tuple[MicroOp, ...]]:
        if self.config.workload == "bank":
            return self._bank()
        return self._list_append()

    def _list_append(self) -> tuple[Txn, tuple[MicroOp, ...]]:
        rng = self.rng
        count = rng.randint(1, 4)
        chosen = rng.sample(self.names, min(count, len(self.names)))
        reads = [n for n in chosen if rng.random() < 0.5]
        appends = [n for n in chosen if n not in reads or rng.random() < 0.3]
        mops: list[MicroOp] = [MicroOp("r", n, None) for n in sorted(reads)]
        writes = []
        for name in sorted(appends):
            value = self.next_value
            self.next_value += 1
            key = self.keys[name]
            writes.append(Put(key, BinOp("concat", ReadOf(key, ()), Const((value,)))))
            mops.append(MicroOp("append", name, value))
        txn = Txn(
            reads=tuple(sorted(self.keys[n] for n in reads)),
            update=Update(tuple(writes)) if writes else None,
        )
        return txn, tuple(mops)

    def _bank(self) -> tuple[Txn, tuple[MicroOp, ...]]:
        rng = self.rng
        if rng.random() < 0.25:
            keys = tuple(sorted(self.keys.values()))
            return Txn(reads=keys), tuple(MicroOp("r", n, None) for n in sorted(self.names))
        source, target = rng.sample(self.names, 2)
        amount = rng.randint(1, 30)
        src, dst = self.keys[source], self.keys[target]
        # A balance is (amount, tag) with a tag unique to each write, so every value read
        # names the one write that produced it, which is what gives the checker its power.
        tag_src, tag_dst = self.next_value, self.next_value + 1
        self.next_value += 2
        update = Update(
            writes=(
                Put(
                    src,
                    MakeTuple((BinOp("-", Item(ReadOf(src), 0), Const(amount)), Const(tag_src))),
                ),
                Put(
                    dst,
                    MakeTuple((BinOp("+", Item(ReadOf(dst), 0), Const(amount)), Const(tag_dst))),
                ),
            ),
            condition=(Predicate(">=", Item(ReadOf(src), 0), Const(amount)),),
        )
        # Put values hold (delta, tag) until the result is known (see observed / unknown).
        mops = (
            MicroOp("r", source, None),
            MicroOp("r", target, None),
            MicroOp("put", source, (-amount, tag_src)),
            MicroOp("put", target, (amount, tag_dst)),
        )
        return Txn(reads=tuple(sorted((src, dst))), update=update), mops

    @staticmethod
    def unknown(mops: tuple[MicroOp, ...]) -> tuple[MicroOp, ...]:
        """The micro-ops of a txn whose outcome is unknown or negative: nothing observed,
        and register writes of unknown value (appends keep their unique value)."""
        return tuple(
            m if m.kind == "append" else MicroOp(m.kind, m.key, _unknown_value(m)) for m in mops
        )

    def observed(self, mops: tuple[MicroOp, ...], reply: ClientReply) -> tuple[MicroOp, ...]:
        """The micro-ops as executed: reads filled in from the result."""
        result = check_not_none(reply.result, "ok reply for %s without a result", reply.txn_id)
        out: list[MicroOp] = []
        reads: dict[str, object] = {}
        for mop in mops:
            if mop.kind == "r":
                value = result.read(self.keys[mop.key])
                if self.config.workload == "list-append":
                    value = tuple(value) if isinstance(value, tuple) else ()
                reads[mop.key] = value
                out.append(MicroOp("r", mop.key, value))
            elif mop.kind == "append":
                out.append(mop)
            elif result.applied:
                before, change = reads[mop.key], mop.value
                if not (isinstance(before, tuple) and isinstance(change, tuple)):
                    fail("bank put on %r: %r + %r are not (balance, tag)", mop.key, before, change)
                out.append(MicroOp("put", mop.key, (before[0] + change[0], change[1])))
        return tuple(out)


def _unknown_value(mop: MicroOp) -> object:
    # A bank write keeps its unique tag, so nothing else can be mistaken for it.
    if mop.kind == "put" and isinstance(mop.value, tuple):
        return (None, mop.value[1])
    return None


class _Nemesis:
    """Injects faults on a random schedule while the safety phase lasts."""

    def __init__(
        self, cluster: Cluster, config: BurnConfig, rng: random.Random, max_down: int
    ) -> None:
        self.cluster = cluster
        self.faults = config.faults
        self.interval = config.nemesis_interval_micros
        self.down = config.down_micros
        self.rng = rng
        self.max_down = max_down

    def arm(self) -> None:
        self.cluster.schedule_call(self.rng.randrange(*self.interval), self.act)

    def act(self) -> None:
        cluster = self.cluster
        if not cluster.faults_active:
            return
        roll = self.rng.random()
        nodes = sorted(cluster.slots)
        if self.faults.slow_links and self.rng.random() < 0.5:
            # Slow nodes (a pause, a full disk) more than slow wires: every link out of one
            # to three nodes, so that coordinators decide without their late replies.
            slow_nodes = self.rng.sample(nodes, self.rng.randint(1, min(3, len(nodes) - 1)))
            links = {(a, b) for a in slow_nodes for b in nodes if a != b}
            cluster.slow_down(links, for_micros=self.rng.randrange(200_000, 1_500_000))
        if self.faults.partitions and roll < 0.45:
            cluster.partition(
                self._partition(nodes), heal_after_micros=self.rng.randrange(200_000, 2_500_000)
            )
        elif self.faults.crashes and roll < 0.8:
            down = len(nodes) - len(cluster.live_nodes())
            if down < self.max_down:
                victim = self.rng.choice(cluster.live_nodes())
                cluster.crash(victim, down_micros=self.rng.randrange(*self.down))
        self.arm()

    def _partition(self, nodes: list[int]) -> set[tuple[int, int]]:
        rng = self.rng
        blocked: set[tuple[int, int]] = set()
        if rng.random() < 0.6:
            minority = set(rng.sample(nodes, rng.randint(1, max(1, (len(nodes) - 1) // 2))))
            for a in nodes:
                for b in nodes:
                    if (a in minority) != (b in minority):
                        blocked.add((a, b))
        else:
            for _ in range(rng.randint(1, len(nodes))):
                a, b = rng.sample(nodes, 2)
                blocked.add((a, b))
        return blocked


def run_seed(seed: int, config: BurnConfig) -> RunResult:
    """One burn-test run; never raises for protocol failures (they are in the result)."""
    started = time.process_time()
    result = RunResult(seed)
    try:
        _run(seed, config, result)
    except InvariantViolation as violation:
        result.error = str(violation)
    result.cpu_seconds = time.process_time() - started
    return result


def _run(seed: int, config: BurnConfig, result: RunResult) -> None:
    rng = random.Random(seed ^ 0x5EED)
    topology = config.topology()
    recorder = HistoryRecorder()
    workload = _Workload(config, rng)
    pending: dict[int, _Pending] = {}
    issued = 0

    def on_reply(_node: int, reply: ClientReply) -> None:
        entry = pending.get(reply.request_id)
        if entry is None or entry.done:
            return
        finish(entry, reply)

    node_config = NodeConfig(
        reorder_buffer_micros=config.reorder_buffer_micros,
        shared_storage=config.shared_storage,
        recover_delay_adaptive=config.recover_delay_adaptive,
        batch_max_parts=config.batch_max_parts,
    )
    if config.recover_delay_micros is not None:
        node_config = replace(
            node_config,
            recover_delay_micros=config.recover_delay_micros,
            recover_delay_other_micros=3 * config.recover_delay_micros,
        )
    max_down = max(1, (config.rf - 1) // 2)
    cluster = Cluster(
        topology,
        seed,
        faults=config.faults,
        config=node_config,
        bugs=config.bugs,
        on_reply=on_reply,
        max_down=max_down,
        coordinator_crash_chance=config.coordinator_crash_chance,
        down_micros=config.down_micros,
        long_delay_chance=config.long_delay_chance,
        shared_store=config.shared_storage,
        batch_window_micros=config.batch_window_micros,
    )
    if config.workload == "bank":
        cluster.preload(dict.fromkeys(workload.keys.values(), (BANK_INITIAL_BALANCE, 0)))

    def finish(entry: _Pending, reply: ClientReply | None) -> None:
        entry.done = True
        del pending[entry.op_id]
        now = cluster.now
        declined = reply is not None and reply.result is not None and not reply.result.applied
        if reply is not None and reply.outcome == "ok" and declined and config.workload == "bank":
            # A transfer refused for insufficient funds wrote nothing: to the history it is a
            # definite failure, which is exactly what the checker needs to know.
            recorder.complete(entry.op_id, "fail", workload.unknown(entry.mops), now)
            result.ok += 1
            result.latencies_micros.append(now - entry.invoked_micros)
        elif reply is not None and reply.outcome == "ok":
            recorder.complete(entry.op_id, "ok", workload.observed(entry.mops, reply), now)
            result.ok += 1
            result.latencies_micros.append(now - entry.invoked_micros)
        elif reply is not None and reply.outcome == "invalidated":
            recorder.complete(entry.op_id, "fail", workload.unknown(entry.mops), now)
            result.failed += 1
        else:
            recorder.complete(entry.op_id, "info", workload.unknown(entry.mops), now)
            result.unknown += 1
        cluster.schedule_call(rng.randrange(0, 2_000), lambda: issue(entry.client))

    def issue(client: int) -> None:
        nonlocal issued
        if issued >= config.txns:
            return
        live = cluster.live_nodes()
        if not live:
            cluster.schedule_call(50_000, lambda: issue(client))
            return
        issued += 1
        txn, mops = workload.next()
        op_id = recorder.invoke(client, workload.unknown(mops), cluster.now)
        entry = _Pending(op_id, client, cluster.now, mops)
        pending[op_id] = entry
        cluster.submit(rng.choice(live), op_id, txn)
        cluster.schedule_call(CLIENT_TIMEOUT_MICROS, _timeout(entry))

    def _timeout(entry: _Pending) -> Callable[[], None]:
        def expire() -> None:
            if not entry.done:
                finish(entry, None)

        return expire

    def starter(client: int) -> Callable[[], None]:
        return lambda: issue(client)

    for client in range(config.clients):
        cluster.schedule_call(rng.randrange(0, 5_000), starter(client))
    if config.faults.any():
        _Nemesis(cluster, config, rng, max_down).arm()

    try:
        cluster.run_until(
            lambda: issued >= config.txns and not pending,
            deadline_micros=config.safety_deadline_micros,
        )
        cluster.heal()
        _run_liveness(cluster, config)
    finally:
        _collect(cluster, result, issued)
    history = recorder.history()
    if config.workload == "bank":
        initial = dict.fromkeys(workload.names, BANK_INITIAL_BALANCE)
        result.verdict = check_bank(history, workload.names, initial)
    else:
        result.verdict = check_list_append(history)


def _run_liveness(cluster: Cluster, config: BurnConfig) -> None:
    settled = [False]

    def probe() -> None:
        # Not only what some replica knows undecided: a txn applied by some replicas may be
        # unknown to another that no Apply reached (cut off, its coordinator crashed since);
        # the home shard's progress log re-sends it until every replica applied it. Replicas
        # are compared (divergent_keys) only once that happened.
        settled[0] = not cluster.unfinished() and not cluster.undurable()
        if not settled[0]:
            cluster.schedule_call(200_000, probe)

    cluster.schedule_call(200_000, probe)
    cluster.run_until(lambda: settled[0], deadline_micros=cluster.now + config.liveness_micros)


def _collect(cluster: Cluster, result: RunResult, issued: int) -> None:
    result.txns = issued
    result.sim_micros = cluster.now
    result.unfinished = len(cluster.unfinished())
    result.undurable = len(cluster.undurable())
    result.divergent = len(cluster.divergent_keys())
    result.digest = cluster.digest
    result.messages = cluster.network.sent
    result.messages_by_type = {kind.__name__: n for kind, n in cluster.network.sent_by_type.items()}
    result.dropped = cluster.network.dropped
    result.crashes = sum(slot.crashes for slot in cluster.slots.values())
    stats = cluster.total_stats()
    result.fast_path = stats.fast_path
    result.slow_path = stats.slow_path
    result.recoveries = stats.recoveries
    result.invalidations = stats.invalidations
    result.parts_per_batch = dict(stats.parts_per_batch)
