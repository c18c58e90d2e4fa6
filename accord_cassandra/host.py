"""The asyncio shell around one sans-IO :class:`accord.Node`.

One pump task carries out the node's ``Ready`` batches strictly in order:

1. ``ready = node.ready()`` — later inputs accumulate in the next batch;
2. the batch's journal records are appended and fsync'd (one fsync per batch: while it runs,
   new inputs pile up in the node, so the next batch commits them as a group), then
   ``node.advance(ready)`` acknowledges them as durable;
3. only then its messages go to peers and its replies to clients, except the batch's early
   requests (``ready.early``: requests that rest on none of its records), which go before
   the fsync, as its data reads start then too (docs/accord.md, "Requests that need no
   fsync");
4. its data reads and writes are scheduled per key in order: an operation on a key starts
   after every earlier operation on that key finished, which is the data-ordering contract
   of :mod:`accord.api`. Failed data operations are retried with capped backoff: a
   transaction cannot be applied halfway, and Cassandra coming back finishes it.

Everything runs on one event loop thread, so the node is never touched concurrently.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Histogram

from accord import ClientReply, Clock, Key, Node, NodeConfig, Timestamp, Topology, Txn
from accord.api import DataRead, DataWrite, JournalRecord
from accord.invariants import AccordError
from accord.messages import Envelope
from accord.messages.validate import InvalidMessage, MessageLimits, validate
from accord.testing import Bugs
from accord_cassandra.datastore import AsyncDataStore
from accord_cassandra.journal import FileJournal
from accord_cassandra.metrics import commit_latency_histogram

logger = logging.getLogger(__name__)

# The node's timers: retries (retry_ms, 1 s by default), timeouts and the progress scan
# (100 ms) need no finer tick than this. Each tick walks every coordinator and wakes the
# pump: at 10 ms that was 5% of a saturated sidecar's Python time. A reorder buffer holds
# PreAccepts for a few ms and is released on ticks, so with one the tick stays at 10 ms.
TICK_SECONDS = 0.025
TICK_SECONDS_REORDERING = 0.01
DATA_RETRY_SECONDS_MAX = 2.0
MAX_PENDING_CLIENTS = 10_000
# What a peer may make this node keep for transactions it coordinates and that are not yet
# decided: forged PreAccepts are never committed, and without a bound each one stayed in
# memory and the journal (20 forged 2,000-key PreAccepts took a node from 82 MB to 300 MB).
# An honest coordinator has at most MAX_PENDING_CLIENTS of its own in flight.
MAX_UNDECIDED_PER_PEER = 2 * MAX_PENDING_CLIENTS
# Keys plus deps entries of those transactions (a few hundred bytes each in memory, and
# in every snapshot the journal writes of them). Deps grow quadratically with transactions
# on the same keys, and so does recovering them. Measured with 300 forged 100-key
# PreAccepts sent to each of 3 sidecars: a 50k bound let 71 in, RSS grew 73 -> 184 MB and
# the journals to 490 MB while they were recovered; 20k let 50 in, RSS 73 -> 89 MB,
# journals 25 MB. An honest coordinator reaches 20k with ~110 transactions undecided at
# once on the same 3 keys; beyond that this replica refuses its PreAccepts until some
# are decided (the others still form quorums).
MAX_UNDECIDED_COST_PER_PEER = 20_000
# Client transactions in the protocol at once per key, per sidecar. Each one conflicts with
# every other on its key: hundreds at once made every commit slower than the recovery delay,
# so replicas recovered live transactions wholesale and a burst of 300 transfers on 3 keys
# locked them for good (docs/sidecars.md, "Overload"). Beyond this a transaction waits for
# a slot; at most MAX_WAITING wait per sidecar, and one still waiting at its deadline is
# refused. Both refusals are RESOURCE_EXHAUSTED: definite, nothing was submitted.
MAX_IN_FLIGHT_PER_KEY = 8
MAX_WAITING = 2_000
# How long before its timeout a transaction must get its slot to be submitted at all:
# twice the recent time from slot to answer (a moving average), within these bounds and
# at most half the timeout. A fixed 2 s refused 85 of a 300 burst, most after 8.5 s,
# while its last transfers succeeded at 9.2 s; under a heavier burst answers slow down
# and the reserve grows with them.
RESERVE_SECONDS_MIN = 0.25
RESERVE_SECONDS_MAX = 5.0
# Waiters per key, per slot: a key's waiters beyond this are refused at once. A key
# finishes a few dozen transactions per second at best, so more could not be reached
# before a client deadline anyway; each would only have cost a decode and a timer, and
# made the burst that much longer to answer.
WAITING_PER_SLOT = 8


class WallClock:
    """Physical microseconds (the HLC keeps timestamps unique and monotonic on top)."""

    def now_micros(self) -> int:
        return time.time_ns() // 1000


class Overloaded(RuntimeError):
    """Too many client transactions are in flight on this sidecar, or on one of the keys."""


@dataclass(eq=False)
class _Waiter:
    seq: int
    keys: tuple[Key, ...]
    future: asyncio.Future[None]


class Admission:
    """Bounds client transactions in the protocol per key; the rest wait, oldest first
    among those that fit, or are refused (:class:`Overloaded`).

    Waiters are queued per key, so a freed slot looks only at the waiters of the keys it
    freed (at most ``max_waiting_per_key`` each), and a waiter that leaves is removed from
    its keys' queues alone: with one list of all waiters, each release and each timeout
    walked all of them, quadratic in a burst of thousands.
    """

    def __init__(
        self,
        per_key: int = MAX_IN_FLIGHT_PER_KEY,
        max_waiting: int = MAX_WAITING,
        max_waiting_per_key: int | None = None,
    ):
        self.per_key = per_key
        self.max_waiting = max_waiting
        self.max_waiting_per_key = (
            max_waiting_per_key if max_waiting_per_key is not None else WAITING_PER_SLOT * per_key
        )
        self.in_flight: dict[Key, int] = {}
        # Per key, its waiters by sequence number (dicts keep insertion order: oldest first).
        self._queues: dict[Key, dict[int, _Waiter]] = {}
        self._waiting = 0
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return self._waiting

    def _fits(self, keys: tuple[Key, ...]) -> bool:
        return all(self.in_flight.get(k, 0) < self.per_key for k in keys)

    def _take(self, keys: tuple[Key, ...]) -> None:
        for key in keys:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def _refuse_waiting(self, keys: tuple[Key, ...]) -> None:
        if self._waiting >= self.max_waiting:
            raise Overloaded(f"{self.max_waiting} transactions already wait for busy keys")
        for key in keys:
            queued = len(self._queues.get(key, ()))
            if queued >= self.max_waiting_per_key:
                raise Overloaded(
                    f"{key.name} has {self.per_key} transactions in flight and {queued} "
                    "waiting on this sidecar, more than it can finish within a deadline; "
                    "nothing was submitted"
                )

    async def enter(self, keys: tuple[Key, ...], timeout: float) -> None:
        """Take a slot on every key of a transaction at once (never some and wait for the
        rest, which could deadlock two transactions), waiting at most ``timeout``."""
        if self._fits(keys) and not any(self._queues.get(k) for k in keys):
            self._take(keys)
            return
        self._refuse_waiting(keys)
        waiter = _Waiter(next(self._seq), keys, asyncio.get_running_loop().create_future())
        for key in keys:
            self._queues.setdefault(key, {})[waiter.seq] = waiter
        self._waiting += 1
        self._grant(keys)
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except (TimeoutError, asyncio.CancelledError) as error:
            if waiter.future.done() and not waiter.future.cancelled():
                self.leave(keys)  # granted just as it gave up: give the slot back
            else:
                # A younger waiter on these keys may fit once this one is gone.
                self._dequeue(waiter)
                self._grant(keys)
            if isinstance(error, TimeoutError):
                busy = next((k for k in keys if self.in_flight.get(k, 0) >= self.per_key), None)
                name = busy.name if busy is not None else "a key"
                raise Overloaded(
                    f"{name} has {self.per_key} transactions in flight on this sidecar and "
                    "no slot freed before the deadline; nothing was submitted"
                ) from None
            raise

    def _dequeue(self, waiter: _Waiter) -> None:
        for key in waiter.keys:
            queue = self._queues.get(key)
            if queue is not None and queue.pop(waiter.seq, None) is not None and not queue:
                del self._queues[key]
        self._waiting -= 1

    def leave(self, keys: tuple[Key, ...]) -> None:
        for key in keys:
            left = self.in_flight[key] - 1
            if left:
                self.in_flight[key] = left
            else:
                del self.in_flight[key]
        self._grant(keys)

    def _grant(self, freed: tuple[Key, ...]) -> None:
        # Only waiters on a freed key can fit now. Oldest first across those keys, and no
        # further than needed: the walk stops once every freed key is full again, so a
        # release looks at the waiters it grants plus those another key still blocks.
        granted: list[_Waiter] = []
        seen: set[int] = set()
        queues = [self._queues[key].values() for key in freed if key in self._queues]
        for waiter in heapq.merge(*queues, key=lambda w: w.seq):
            if all(self.in_flight.get(k, 0) >= self.per_key for k in freed):
                break
            if waiter.seq in seen or waiter.future.done():
                continue  # seen on another freed key, or given up (it dequeues itself)
            seen.add(waiter.seq)
            if self._fits(waiter.keys):
                self._take(waiter.keys)
                granted.append(waiter)
        for waiter in granted:
            self._dequeue(waiter)
            waiter.future.set_result(None)


@dataclass
class HostMetrics:
    commits: dict[str, int] = field(default_factory=dict)
    commit_latency: Histogram = field(default_factory=commit_latency_histogram)
    data_retries: int = 0
    # Rows written by a replica that is not the transaction's writer under shared storage,
    # because the writer said nothing within the recover delay (a second write by design).
    takeover_writes: int = 0
    batches: int = 0
    refused: int = 0

    def observe(self, outcome: str, seconds: float) -> None:
        self.commits[outcome] = self.commits.get(outcome, 0) + 1
        if outcome == "ok":
            self.commit_latency.observe(seconds)


class SidecarHost:
    def __init__(
        self,
        node_id: int,
        topology: Topology,
        journal: FileJournal,
        store: AsyncDataStore,
        send: Callable[[Envelope], None],
        *,
        config: NodeConfig | None = None,
        seed: int | None = None,
        limits: MessageLimits | None = None,
        check_data: Callable[[Envelope], None] | None = None,
        admission: Admission | None = None,
        bugs: Bugs | None = None,
    ) -> None:
        self.journal = journal
        self.store = store
        self._send = send
        records: list[JournalRecord] = journal.replay()
        self.node = Node(
            node_id,
            topology,
            WallClock(),
            random.Random(seed if seed is not None else time.time_ns()),
            config=config,
            bugs=bugs or Bugs(),
            journal=records,
        )
        self.metrics = HostMetrics()
        self.limits = limits or MessageLimits()
        # The data store's own checks (keys of served tables, rows that fit their columns):
        # raises InvalidMessage for what could never be written.
        self._check_data = check_data
        self._clock: Clock = WallClock()
        reordering = config is not None and config.reorder_buffer_micros > 0
        self._tick_seconds = TICK_SECONDS_REORDERING if reordering else TICK_SECONDS
        # Undecided transactions by the node that minted their TxnId: txn id -> cost.
        self._undecided: dict[int, dict[Timestamp, int]] = {}
        self._undecided_cost: dict[int, int] = {}
        self.admission = admission or Admission()
        # Moving average of the time from a slot granted to the node's answer.
        self._slot_seconds = RESERVE_SECONDS_MIN
        self._wake = asyncio.Event()
        self._clients: dict[int, tuple[asyncio.Future[ClientReply], float]] = {}
        self._request_ids = itertools.count(1)
        self._tails: dict[Key, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.replayed = len(records)
        # Set when the pump or the ticker died: the process must then exit (see _ended).
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._ticker())]
        for task in self._tasks:
            task.add_done_callback(self._ended)
        self._wake.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        # The pump and the ticker run until stop(). If one dies (the journal cannot be
        # written, a bug), the node can never make progress again: say so loudly and let
        # the process fail, rather than keep answering health checks while stuck.
        if task.cancelled() or self._stopping:
            return
        error = task.exception() or RuntimeError("the pump ended")
        logger.critical("sidecar host failed; it cannot continue", exc_info=error)
        self.failure = error
        self.failed.set()

    async def drain(self, timeout: float) -> None:
        """Stop taking clients and wait (bounded) for those in flight to finish."""
        self._stopping = True
        deadline = time.monotonic() + timeout
        while self._clients and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._stopping = True
        # Data work is cancelled, not awaited: a write that keeps failing retries forever,
        # and nothing is lost, since the journal re-issues unfinished writes on restart.
        for task in [*self._tasks, *self._tails.values()]:
            task.cancel()
        for task in [*self._tasks, *self._tails.values()]:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                logger.debug("task ended during shutdown", exc_info=True)
        for future, _ in list(self._clients.values()):
            if not future.done():
                future.set_exception(RuntimeError("sidecar is shutting down"))
        self.journal.close()
        await self.store.close()

    # ------------------------------------------------------------------ inputs

    def deliver(self, envelope: Envelope) -> None:
        """Hand the node one message from a peer, or raise :class:`InvalidMessage`.

        Peer input is untrusted: the message is checked before it can touch state or the
        journal, and a protocol invariant it breaks (two different Commits of one txn) is
        the sender's fault: the message is refused and the node carries on.
        """
        validate(envelope, self.node.topology, self._clock.now_micros(), self.limits)
        if self._check_data is not None:
            self._check_data(envelope)
        admitted = self._admit(envelope)
        try:
            self.node.step(envelope)
        except (AccordError, ValueError) as error:
            raise InvalidMessage(f"{type(envelope.body).__name__} broke {error}") from None
        finally:
            self._wake.set()
        if admitted is not None:
            self._charge(*admitted)

    def peer_reachable(self, peer: int, reachable: bool) -> None:
        """The transport's word on ``peer`` (see :meth:`accord.Node.peer_reachable`): the
        transactions it coordinated are recovered after the floor delay while it cannot
        be reached, not after the delay learned from live latencies."""
        self.node.peer_reachable(peer, reachable)
        self._wake.set()

    def _admit(self, envelope: Envelope) -> tuple[int, Timestamp] | None:
        """Refuse a new transaction whose coordinator already has too much undecided here."""
        body = envelope.body
        txn = getattr(body, "txn", None)
        txn_id = getattr(body, "txn_id", None)
        if txn is None or not isinstance(txn_id, Timestamp) or txn_id in self.node.store.commands:
            return None
        origin = txn_id.node
        if not self._fits(origin, len(txn.keys)):
            self._prune_undecided(origin)
            if not self._fits(origin, len(txn.keys)):
                raise InvalidMessage(
                    f"node {origin} already has {len(self._undecided.get(origin, ()))} "
                    f"undecided transactions costing {self._undecided_cost.get(origin, 0)} here"
                )
        return origin, txn_id

    def _fits(self, origin: int, keys: int) -> bool:
        return (
            len(self._undecided.get(origin, ())) < MAX_UNDECIDED_PER_PEER
            and self._undecided_cost.get(origin, 0) + keys <= MAX_UNDECIDED_COST_PER_PEER
        )

    def _charge(self, origin: int, txn_id: Timestamp) -> None:
        # What the replica now keeps for it: its keys and the deps it computed, which grow
        # with every other transaction on those keys (the journal keeps them too).
        command = self.node.store.commands.get(txn_id)
        if command is None or command.status.is_decided:
            return
        cost = len(command.txn.keys) if command.txn is not None else 1
        if command.deps is not None:
            cost += sum(len(ids) for _, ids in command.deps.items())
        self._undecided.setdefault(origin, {})[txn_id] = cost
        self._undecided_cost[origin] = self._undecided_cost.get(origin, 0) + cost

    def _prune_undecided(self, origin: int) -> None:
        pending = self._undecided.get(origin, {})
        commands = self.node.store.commands
        for txn_id in list(pending):
            command = commands.get(txn_id)
            if command is None or command.status.is_decided:
                self._undecided_cost[origin] -= pending.pop(txn_id)

    async def submit(self, txn: Txn, *, timeout: float) -> ClientReply:
        """Run ``txn``; its reply, or :class:`Overloaded` (definite: nothing was
        submitted), or TimeoutError (unknown: it may still commit)."""
        if self._stopping:
            raise Overloaded("sidecar is shutting down")
        if len(self._clients) + self.admission.waiting >= MAX_PENDING_CLIENTS:
            self.metrics.refused += 1
            raise Overloaded(f"{MAX_PENDING_CLIENTS} transactions already in flight")
        keys = tuple(sorted(set(txn.keys)))
        started = time.perf_counter()
        # A transaction admitted with almost no time left would time out in the protocol:
        # an unknown outcome for its client and a recovery for the replicas, where a
        # refusal now is definite and free. So the wait for a slot ends this much early.
        reserve = min(
            timeout / 2,
            max(RESERVE_SECONDS_MIN, min(RESERVE_SECONDS_MAX, 2 * self._slot_seconds)),
        )
        try:
            await self.admission.enter(keys, timeout - reserve)
        except Overloaded:
            self.metrics.refused += 1
            raise
        if self._stopping:
            self.admission.leave(keys)
            raise Overloaded("sidecar is shutting down")
        request_id = next(self._request_ids)
        future: asyncio.Future[ClientReply] = asyncio.get_running_loop().create_future()
        self._clients[request_id] = (future, started)
        # The slot is held until the node answers (its own client timeout bounds that),
        # not only while this caller waits: a transaction whose caller gave up is still
        # in the protocol, and freeing its slot let a burst put ever more transactions on
        # a key than the bound says (at 10,500 concurrent, thousands were left undecided
        # and recovered one by one for minutes after the burst).
        granted = time.perf_counter()
        future.add_done_callback(lambda done: self._finished(request_id, keys, done, granted))
        try:
            self.node.submit(request_id, txn)
        except BaseException:
            future.cancel()  # no answer will come: its callback gives the slot back
            raise
        self._wake.set()
        remaining = max(0.0, timeout - (time.perf_counter() - started))
        # Shielded: a caller that gives up must not cancel the future, whose callback holds
        # the slot until the node answers. A timeout scope, not wait_for: each layer between
        # the node's answer and this caller is another pass of a busy event loop (wait_for
        # added one; answered-to-returned was 3.2 ms at p50 under a saga-store load).
        async with asyncio.timeout(remaining):
            return await asyncio.shield(future)

    def _finished(
        self,
        request_id: int,
        keys: tuple[Key, ...],
        done: asyncio.Future[ClientReply],
        granted: float,
    ) -> None:
        held = time.perf_counter() - granted
        self._slot_seconds += (held - self._slot_seconds) / 8
        if not done.cancelled():
            done.exception()  # retrieved: its caller may be gone (shutdown sets one)
        self._clients.pop(request_id, None)
        self.admission.leave(keys)

    # ------------------------------------------------------------------ the pump

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self._tick_seconds)
            self.node.tick()
            self._wake.set()

    async def _pump(self) -> None:
        node = self.node
        while True:
            await self._wake.wait()
            self._wake.clear()
            while node.has_ready():
                ready = node.ready()
                # Requests that vouch for none of this batch's records, and reads, overlap
                # the fsync instead of following it (accord.api; docs/accord.md, "Requests
                # that need no fsync").
                early = ready.early
                for envelope in early:
                    self._send(envelope)
                for read in ready.reads:
                    self._schedule(read.keys, read)
                await self.journal.append(ready.persist)
                node.advance(ready)
                self.metrics.batches += 1
                if early:
                    sent = {id(envelope) for envelope in early}
                    for envelope in ready.messages:
                        if id(envelope) not in sent:
                            self._send(envelope)
                else:
                    for envelope in ready.messages:
                        self._send(envelope)
                for reply in ready.replies:
                    self._answer(reply)
                for write in ready.writes:
                    self._schedule(tuple(w.key for w in write.writes), write)

    def _answer(self, reply: ClientReply) -> None:
        entry = self._clients.get(reply.request_id)
        if entry is None:
            return
        future, started = entry
        self.metrics.observe(reply.outcome, time.perf_counter() - started)
        if not future.done():
            future.set_result(reply)

    # ------------------------------------------------------------------ data work

    def _schedule(self, keys: tuple[Key, ...], op: DataRead | DataWrite) -> None:
        previous = [self._tails[k] for k in keys if k in self._tails]
        task = asyncio.create_task(self._run_data(previous, op))
        for key in keys:
            self._tails[key] = task
        task.add_done_callback(lambda done: self._forget(keys, done))

    def _forget(self, keys: tuple[Key, ...], task: asyncio.Task[None]) -> None:
        for key in keys:
            if self._tails.get(key) is task:
                del self._tails[key]

    def _takes_over(self, txn_id: Timestamp) -> bool:
        """Whether this replica writes ``txn_id`` only because it took over from the writer."""
        store = self.node.store
        command = store.commands.get(txn_id)
        if command is None or not command.take_over or command.txn is None:
            return False
        shards = store.topology.shards_for(store.owned_keys(command.txn.keys))
        return not any(store.writer_of(txn_id, shard.replicas) == store.node_id for shard in shards)

    async def _run_data(self, previous: list[asyncio.Task[None]], op: DataRead | DataWrite) -> None:
        if previous:
            await asyncio.gather(*previous, return_exceptions=True)
        takeover = isinstance(op, DataWrite) and self._takes_over(op.txn_id)
        delay = 0.01
        while True:
            try:
                if isinstance(op, DataRead):
                    values = await self.store.read(op.selections, op.execute_at)
                    self.node.read_done(op.txn_id, values)
                else:
                    if op.writes:
                        await self.store.write(op.writes, op.execute_at)
                        if takeover:
                            self.metrics.takeover_writes += len(op.writes)
                    self.node.write_done(op.txn_id)
                self._wake.set()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.data_retries += 1
                logger.warning(
                    "data operation failed txn_id=%s; retrying in %.2fs",
                    op.txn_id,
                    delay,
                    exc_info=True,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, DATA_RETRY_SECONDS_MAX)

    # ------------------------------------------------------------------ introspection

    def pending_data_ops(self) -> int:
        return len(self._tails)

    def pending_clients(self) -> int:
        return len(self._clients)
