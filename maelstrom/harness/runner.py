"""The harness's event loop: nodes, network, clients, nemesis, and the history.

Theory of operation
-------------------
One thread owns all state. It waits on the shared inbox (lines the nodes wrote) with a
timeout equal to the time until the next timer, then runs every due timer from a heap
ordered by ``(time, sequence)``: message deliveries, client invocations, client timeouts
and nemesis steps. Wall time comes from ``time.monotonic``; history times are nanoseconds
since the test started, as in Jepsen.

A run has Maelstrom's phases:

1. *init*: every node gets ``init`` from its own client id and must answer ``init_ok``
   within 10 s, or the test aborts (``:valid? :unknown``).
2. *main*: for ``time_limit`` seconds, invocations arrive at ``rate`` per second overall
   (Jepsen's ``stagger``: gaps uniform on [0, 2/rate]), each given to a random idle worker
   thread; a thread has at most one request in flight. The nemesis alternates between
   starting a partition and healing it every ~``nemesis_interval`` seconds (uniform
   jitter of +-50%).
3. *drain*: no new invocations, the network heals, and in-flight requests get until their
   timeouts to complete.

Outcomes follow Maelstrom's ``client.clj``: a ``*_ok`` reply is ``:ok``; a definite error
is ``:fail``; an indefinite error, a malformed reply or a timeout is ``:info``, except for
lin-kv reads, which are idempotent and so ``:fail``. After an ``:info`` the thread takes a
fresh process number (+concurrency) and a fresh client id, since the old request may still
be running. Replies that arrive after their timeout are counted and ignored.

The harness enforces the protocol on the nodes: a line that is not a valid message, a
message from a node that claims another ``src``, or a reply that does not match its
request counts as a protocol error, which makes the run invalid.
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from accord.invariants import check_not_none
from maelstrom.harness.generators import (
    Generator,
    Invocation,
    LinKvGenerator,
    TxnGenerator,
)
from maelstrom.harness.net import PARTITION_SHAPES, Grudge, Latency, NetStats, grudge
from maelstrom.harness.processes import InboxItem, NodeProcess
from maelstrom.history import NEMESIS, WORKLOADS, Event, EventType
from maelstrom.protocol import (
    Packet,
    ProtocolError,
    code_name,
    is_definite,
    parse_line,
    render,
)

logger = logging.getLogger(__name__)

INIT_TIMEOUT_SECONDS: Final = 10.0
TXN_TIMEOUT_MS: Final = 5000.0
LIN_KV_MIN_TIMEOUT_MS: Final = 1000.0
MAX_INBOX_LINES: Final = 1_000_000
"""Lines waiting in the harness inbox before it declares itself overloaded and aborts."""
MAX_PROTOCOL_ERRORS_LOGGED: Final = 20
INBOX_BATCH_MAX: Final = 2000
"""Inbox lines handled between checks of the timer heap."""
OK_TYPES: Final = {"read": "read_ok", "write": "write_ok", "cas": "cas_ok", "txn": "txn_ok"}


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything that determines a run (``maelstrom test`` options, by their names)."""

    workload: str
    node_count: int = 5
    time_limit_s: float = 30.0
    rate: float = 5.0
    concurrency: int = 0
    """0 means Maelstrom's default: 2n for lin-kv, n otherwise."""
    latency: Latency = field(default_factory=Latency)
    nemesis: tuple[str, ...] = ()
    nemesis_interval_s: float = 10.0
    partition_shapes: tuple[str, ...] = PARTITION_SHAPES
    seed: int = 0
    node_command: tuple[str, ...] = (sys.executable, "-m", "maelstrom.node")
    node_args: tuple[str, ...] = ()
    timeout_ms: float = 0.0
    """0 means Maelstrom's: max(10 x mean latency, 1 s) for lin-kv, 5 s for txns."""
    per_key_limit: int = 100
    process_limit: int = 20
    key_count: int = 10
    max_txn_length: int = 4
    max_writes_per_key: int = 16

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}: {', '.join(sorted(WORKLOADS))}")
        if not 1 <= self.node_count <= 64:
            raise ValueError("node count must be between 1 and 64")
        if self.time_limit_s <= 0 or self.rate <= 0:
            raise ValueError("time limit and rate must be positive")
        unknown = set(self.nemesis) - {"partition"}
        if unknown:
            raise ValueError(f"unsupported nemesis {sorted(unknown)}: only 'partition'")
        if self.nemesis_interval_s <= 0:
            raise ValueError("nemesis interval must be positive")
        group = 2 * self.node_count
        if self.workload == "lin-kv" and self.effective_concurrency % group:
            raise ValueError(
                f"lin-kv needs --concurrency to be a multiple of 2n = {group} "
                f"(jepsen.independent), got {self.effective_concurrency}"
            )
        if self.concurrency < 0:
            raise ValueError("concurrency must not be negative")
        bad_shapes = set(self.partition_shapes) - set(PARTITION_SHAPES)
        if bad_shapes or not self.partition_shapes:
            raise ValueError(f"partition shapes must come from {', '.join(PARTITION_SHAPES)}")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(self.node_count))

    @property
    def effective_concurrency(self) -> int:
        if self.concurrency > 0:
            return self.concurrency
        return 2 * self.node_count if self.workload == "lin-kv" else self.node_count

    @property
    def effective_timeout_ms(self) -> float:
        if self.timeout_ms > 0:
            return self.timeout_ms
        if self.workload == "lin-kv":
            return max(10 * self.latency.mean_ms, LIN_KV_MIN_TIMEOUT_MS)
        return TXN_TIMEOUT_MS


@dataclass(slots=True)
class _InFlight:
    msg_id: int
    invocation: Invocation
    invoked_at: float


@dataclass(slots=True)
class _Worker:
    thread: int
    process: int
    client: str
    node: str
    next_msg_id: int = 1
    in_flight: _InFlight | None = None


@dataclass(slots=True)
class RunRecord:
    """What a run produced, before checking: the history and the harness's counters."""

    config: RunConfig
    events: list[Event] = field(default_factory=list)
    net: NetStats = field(default_factory=NetStats)
    protocol_errors: list[str] = field(default_factory=list)
    protocol_error_count: int = 0
    late_replies: int = 0
    aborted: str | None = None
    crashed_nodes: list[str] = field(default_factory=list)
    partitions: int = 0
    keys_used: int = 0
    duration_s: float = 0.0
    exit_statuses: dict[str, int | None] = field(default_factory=dict)


class _Abort(Exception):
    """The run cannot go on (init timeout, overload); the message says why."""


class Runner:
    """Runs one test; :meth:`run` always stops every node it started."""

    def __init__(self, config: RunConfig, results_dir: Path) -> None:
        self.config = config
        self.results_dir = results_dir
        self.rng = random.Random(config.seed)
        self.net_rng = random.Random(config.seed * 7919 + 1)
        self.record = RunRecord(config)
        self.inbox: queue.SimpleQueue[InboxItem] = queue.SimpleQueue()
        self.nodes: dict[str, NodeProcess] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0
        self.start = time.monotonic()
        self.grudge: Grudge = {}
        self.workers: list[_Worker] = []
        self.by_client: dict[str, _Worker] = {}
        self._next_client = 1
        self.phase = "init"
        self.pending_init: dict[str, int] = {}
        self.waiting_for_worker = False
        self.generator: Generator = self._generator()

    # ------------------------------------------------------------------ setup

    def _generator(self) -> Generator:
        config = self.config
        if config.workload == "lin-kv":
            return LinKvGenerator(
                config.node_count,
                config.effective_concurrency,
                self.rng,
                per_key_limit=config.per_key_limit,
                process_limit=config.process_limit,
            )
        return TxnGenerator(
            config.workload,
            self.rng,
            key_count=config.key_count,
            max_txn_length=config.max_txn_length,
            max_writes_per_key=config.max_writes_per_key,
        )

    def _new_client(self) -> str:
        client = f"c{self._next_client}"
        self._next_client += 1
        return client

    def _spawn(self) -> None:
        logs = self.results_dir / "node-logs"
        logs.mkdir(parents=True, exist_ok=True)
        command = (*self.config.node_command, *self.config.node_args)
        for name in self.config.nodes:
            try:
                self.nodes[name] = NodeProcess(name, command, logs / f"{name}.log", self.inbox)
            except OSError as error:
                raise _Abort(f"cannot start {shlex.join(command)}: {error}") from None

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        return time.monotonic()

    def history_time(self) -> int:
        return int((time.monotonic() - self.start) * 1e9)

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self.timers, (when, self._timer_seq, action))

    # ------------------------------------------------------------------ run

    def run(self) -> RunRecord:
        """Spawn, init, run the workload, drain, stop. Never leaves a child running."""
        try:
            self._spawn()
            self.start = time.monotonic()
            self._init_nodes()
            self._main_phase()
            self._drain_phase()
        except _Abort as abort:
            self.record.aborted = str(abort)
            logger.error("run aborted: %s", abort)
        finally:
            self.record.duration_s = time.monotonic() - self.start
            for node in self.nodes.values():
                node.close_input()
            for name, node in self.nodes.items():
                self.record.exit_statuses[name] = node.stop()
        self.record.keys_used = self.generator.keys_used
        return self.record

    def _loop(self, done: Callable[[], bool], deadline: float) -> None:
        """Serve the inbox and timers until ``done()`` or ``deadline``."""
        while not done():
            now = self.now()
            while self.timers and self.timers[0][0] <= now:
                _, _, action = heapq.heappop(self.timers)
                action()
                if done():
                    return
            if now >= deadline:
                return
            wake = min(deadline, self.timers[0][0] if self.timers else deadline)
            try:
                item = self.inbox.get(timeout=max(0.0, min(wake - now, 0.05)))
            except queue.Empty:
                continue
            self._on_output(*item)
            for _ in range(INBOX_BATCH_MAX):
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._on_output(*item)
            if self.inbox.qsize() > MAX_INBOX_LINES:
                raise _Abort(f"harness overloaded: over {MAX_INBOX_LINES} lines unread")

    def _init_nodes(self) -> None:
        nodes = self.config.nodes
        for name in nodes:
            client = self._new_client()
            self.pending_init[client] = 1
            body = {"type": "init", "msg_id": 1, "node_id": name, "node_ids": list(nodes)}
            self._client_send(client, name, body)
        deadline = self.now() + INIT_TIMEOUT_SECONDS
        crashed = self.record.crashed_nodes
        self._loop(lambda: not self.pending_init or bool(crashed), deadline)
        if crashed:
            raise _Abort(f"node(s) {', '.join(crashed)} exited during init")
        if self.pending_init:
            raise _Abort(
                f"{len(self.pending_init)} node(s) did not answer init_ok within "
                f"{INIT_TIMEOUT_SECONDS:.0f} s"
            )

    def _main_phase(self) -> None:
        config = self.config
        self.phase = "main"
        self.start = time.monotonic()
        for thread in range(config.effective_concurrency):
            worker = _Worker(
                thread, thread, self._new_client(), config.nodes[thread % len(config.nodes)]
            )
            self.workers.append(worker)
            self.by_client[worker.client] = worker
        self.at(self.now() + self._stagger(), self._emit)
        if "partition" in config.nemesis:
            self.at(self.now() + self._nemesis_gap(), self._nemesis_start)
        self._loop(lambda: False, self.start + config.time_limit_s)

    def _drain_phase(self) -> None:
        self.phase = "drain"
        if self.grudge:
            self._nemesis_stop(reschedule=False)
        deadline = self.now() + self.config.effective_timeout_ms / 1000 + 1.0
        self._loop(lambda: all(w.in_flight is None for w in self.workers), deadline)

    # ------------------------------------------------------------------ network

    def _client_send(self, client: str, node: str, body: dict[str, Any]) -> None:
        self.record.net.client_sent += 1
        self.nodes[node].send(render(Packet(client, node, body)).encode("utf-8"))

    def _protocol_error(self, text: str) -> None:
        self.record.protocol_error_count += 1
        if len(self.record.protocol_errors) < MAX_PROTOCOL_ERRORS_LOGGED:
            self.record.protocol_errors.append(text)
        logger.warning("protocol error: %s", text)

    def _on_output(self, node: str, line: bytes | None) -> None:
        if line is None:
            # Only a loop still running sees this, so the node exited mid-test.
            if node not in self.record.crashed_nodes:
                self.record.crashed_nodes.append(node)
                logger.error("node %s closed its stdout (crashed?)", node)
            return
        try:
            packet = parse_line(line)
        except ProtocolError as error:
            self._protocol_error(f"{node} wrote an invalid message: {error.problem}")
            return
        if packet.src != node:
            self._protocol_error(f"{node} sent a message claiming src {packet.src!r}")
            return
        dest = packet.dest
        if dest in self.nodes:
            self._route(packet, line)
        elif dest in self.by_client or dest in self.pending_init:
            self.record.net.client_sent += 1
            self._on_client_reply(packet)
        elif dest.startswith("c"):
            # A client that went away (a fresh id after :info): Maelstrom drops these too.
            self.record.net.client_sent += 1
            self.record.late_replies += 1
        else:
            self._protocol_error(f"{node} sent to unknown node {dest!r}")

    def _route(self, packet: Packet, line: bytes) -> None:
        net = self.record.net
        net.server_sent += 1
        net.by_type[packet.type] = net.by_type.get(packet.type, 0) + 1
        delay = self.config.latency.draw_seconds(self.net_rng)
        src, dest = packet.src, packet.dest

        def deliver() -> None:
            # Partitions drop at receive time, as Maelstrom's net does.
            if src in self.grudge.get(dest, frozenset()):
                net.server_dropped += 1
                return
            net.server_delivered += 1
            self.nodes[dest].send(line if line.endswith(b"\n") else line + b"\n")

        if delay == 0:
            deliver()
        else:
            self.at(self.now() + delay, deliver)

    # ------------------------------------------------------------------ clients

    def _stagger(self) -> float:
        return self.rng.uniform(0, 2 / self.config.rate)

    def _emit(self) -> None:
        if self.phase != "main":
            return
        idle = [w for w in self.workers if w.in_flight is None]
        if not idle:
            self.waiting_for_worker = True
            return
        self._invoke(self.rng.choice(idle))
        self.at(self.now() + self._stagger(), self._emit)

    def _invoke(self, worker: _Worker) -> None:
        invocation = self.generator.next(worker.thread, worker.process)
        msg_id = worker.next_msg_id
        worker.next_msg_id += 1
        worker.in_flight = _InFlight(msg_id, invocation, self.now())
        self._event("invoke", invocation.f, invocation.value, worker.process)
        self._client_send(worker.client, worker.node, {**invocation.body, "msg_id": msg_id})
        timeout = self.config.effective_timeout_ms / 1000
        self.at(self.now() + timeout, lambda: self._on_timeout(worker, msg_id))

    def _event(
        self,
        kind: EventType,
        f: str,
        value: Any,
        process: int | str,
        error: tuple[str, str] | None = None,
    ) -> None:
        events = self.record.events
        events.append(Event(len(events), kind, f, value, self.history_time(), process, error))

    def _on_client_reply(self, packet: Packet) -> None:
        if packet.dest in self.pending_init:
            if packet.type == "init_ok" and packet.in_reply_to == 1:
                del self.pending_init[packet.dest]
            else:
                self._protocol_error(f"{packet.src} answered init with {packet.body}")
            return
        worker = self.by_client[packet.dest]
        flight = worker.in_flight
        if flight is None or packet.in_reply_to != flight.msg_id:
            self.record.late_replies += 1
            return
        self._complete(worker, *self._outcome(flight.invocation, packet))

    def _outcome(
        self, invocation: Invocation, packet: Packet
    ) -> tuple[EventType, Any, tuple[str, str] | None]:
        body = packet.body
        if packet.type == "error":
            code = body.get("code")
            if not isinstance(code, int) or isinstance(code, bool):
                self._protocol_error(f"{packet.src}: error without an integer code: {body}")
                return "info", invocation.value, ("malformed-reply", str(body)[:200])
            error = (code_name(code), str(body.get("text", ""))[:500])
            if is_definite(code) or self._idempotent(invocation):
                return "fail", invocation.value, error
            return "info", invocation.value, error
        if packet.type != OK_TYPES[invocation.f]:
            self._protocol_error(
                f"{packet.src} answered {invocation.f} with {packet.type}: {str(body)[:200]}"
            )
            return "info", invocation.value, ("malformed-reply", packet.type)
        try:
            return "ok", _completed_value(invocation, body), None
        except ValueError as problem:
            self._protocol_error(f"{packet.src}: {problem}")
            return "info", invocation.value, ("malformed-reply", str(problem)[:200])

    def _idempotent(self, invocation: Invocation) -> bool:
        # Maelstrom's lin-kv client marks reads idempotent: an unknown read did nothing.
        return self.config.workload == "lin-kv" and invocation.f == "read"

    def _on_timeout(self, worker: _Worker, msg_id: int) -> None:
        flight = worker.in_flight
        if flight is None or flight.msg_id != msg_id:
            return
        kind: EventType = "fail" if self._idempotent(flight.invocation) else "info"
        timeout = f"no reply within {self.config.effective_timeout_ms:.0f} ms"
        self._complete(worker, kind, flight.invocation.value, ("timeout", timeout))

    def _complete(
        self, worker: _Worker, kind: EventType, value: Any, error: tuple[str, str] | None
    ) -> None:
        flight = check_not_none(worker.in_flight, "completion without an operation in flight")
        worker.in_flight = None
        self._event(kind, flight.invocation.f, value, worker.process, error)
        if kind == "info":
            # The request may still be running: Jepsen retires the process, and the client.
            del self.by_client[worker.client]
            worker.process += self.config.effective_concurrency
            worker.client = self._new_client()
            self.by_client[worker.client] = worker
        if self.phase == "main" and self.waiting_for_worker:
            self.waiting_for_worker = False
            self._invoke(worker)
            self.at(self.now() + self._stagger(), self._emit)

    # ------------------------------------------------------------------ nemesis

    def _nemesis_gap(self) -> float:
        return self.config.nemesis_interval_s * self.rng.uniform(0.5, 1.5)

    def _nemesis_start(self) -> None:
        if self.phase != "main":
            return
        shape = self.rng.choice(self.config.partition_shapes)
        self.grudge = grudge(shape, self.config.nodes, self.rng)
        self.record.partitions += 1
        value = {"shape": shape, "grudge": {n: sorted(g) for n, g in sorted(self.grudge.items())}}
        self._event("info", "start-partition", value, NEMESIS)
        self.at(self.now() + self._nemesis_gap(), self._nemesis_stop)

    def _nemesis_stop(self, reschedule: bool = True) -> None:
        self.grudge = {}
        self._event("info", "stop-partition", "network healed", NEMESIS)
        if reschedule and self.phase == "main":
            self.at(self.now() + self._nemesis_gap(), self._nemesis_start)


def _completed_value(invocation: Invocation, body: dict[str, Any]) -> Any:
    """The ``:ok`` value of a reply, after checking it answers what was asked."""
    if invocation.f == "read":
        if "value" not in body:
            raise ValueError("read_ok without a value")
        return [invocation.value[0], body["value"]]
    if invocation.f in ("write", "cas"):
        return invocation.value
    txn = body.get("txn")
    asked = invocation.value
    if not isinstance(txn, list) or len(txn) != len(asked):
        raise ValueError(f"txn_ok with {str(txn)[:100]} answers {len(asked)} micro-ops")
    for mine, theirs in zip(asked, txn, strict=True):
        if not isinstance(theirs, list) or len(theirs) != 3:
            raise ValueError(f"txn_ok micro-op {theirs!r} is not [f, k, v]")
        if theirs[0] != mine[0] or theirs[1] != mine[1]:
            raise ValueError(f"txn_ok micro-op {theirs!r} answers {mine!r}")
        if mine[0] != "r" and theirs[2] != mine[2]:
            raise ValueError(f"txn_ok write {theirs!r} differs from {mine!r}")
    return json.loads(json.dumps(txn))


__all__ = ["RunConfig", "RunRecord", "Runner"]
