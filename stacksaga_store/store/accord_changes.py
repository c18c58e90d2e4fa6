"""Accord transactions of the accord commit mode: the sidecars' gateway, state changes and
their group commit (:mod:`stacksaga_store.store.accord_store` says why every write of the mode
goes through them).

Theory of operation
-------------------
*One transaction per state change.* The orchestrator opens a state change
(``async with store.state_change(label)``) around each change of a saga: start, step outcome,
completion, freeze/quarantine, unfreeze, restore re-arm. Inside it, every write any
participant issues (the event store, the recovery writer's directory rows, the marker's
commit) becomes a :class:`Part` of one :class:`AccordChange`: LET rows, conditions and
mutations under a per-part name prefix. On a clean exit the change commits as one Accord
transaction; an exception (or a crash) before that writes nothing. Conditions carry the
invariants the separate writes needed an order for: the es_transaction row does not exist yet
(start), the tryout index is free, the marker lease is still ours (STRICT; RELAXED's commit
needs no condition of its own, the tryout's refuses a second record), the Tier-4 row of a
cached bucket still exists. A refused change raises
:class:`StateChangeConflict` naming the parts whose conditions failed, and nothing of it
landed.

*Group commit.* Concurrent state changes of one process may share an Accord transaction
(:class:`ChangeBatcher`): a sidecar's cost is mostly per transaction, not per row. Each change
keeps its parts, conditions and all-or-nothing outcome; a batch refused whole because of
another change's condition sends the others again alone.

*Retries.* :class:`AccordGateway` sends a transaction whose outcome is unknown again (to the
next sidecar). Every change that can be refused carries a condition its own first commit
makes false, so a second copy is refused: a refused retry whose conditioned parts all
recognise their own writes in what the transaction read (:attr:`Part.mine`) counts as
applied.

*Crash injection.* :class:`CommitCrashes` lets tests stop a process just before or just after
the transaction of a state change with a given label.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stacksaga_store.errors import InvariantViolation, StackSagaError, check_state

__all__ = [
    "ACCORD_COMMIT_ATTEMPTS_MAX",
    "AccordChange",
    "AccordCommitError",
    "AccordGateway",
    "AccordOutcome",
    "ChangeBatcher",
    "ChangeRunner",
    "CommitCrashes",
    "Part",
    "SimulatedCommitCrash",
    "StateChangeConflict",
    "after_commit",
    "batcher_of",
    "current_change",
    "sidecar_client",
]

logger = logging.getLogger(__name__)

ACCORD_COMMIT_ATTEMPTS_MAX = 8
# Times a refused state change is repaired and sent again (one repair per refused part).
REPAIRS_MAX = 2
ACCORD_RETRY_SECONDS = (0.05, 1.0)
# How long new transactions skip a sidecar whose last answer was a failure.
SIDECAR_REST_SECONDS = 5.0


def sidecar_client() -> Any:
    """``accord_cassandra.client``, imported on first use of the accord mode.

    Dynamically: the sidecar client (grpc) is only needed in this mode, and its generated
    gRPC code is untyped, which must not fail ``mypy --strict`` of this package.
    """
    return importlib.import_module("accord_cassandra.client")


# -- the gateway ---------------------------------------------------------------------------


class AccordCommitError(StackSagaError):
    """An Accord transaction was refused for good (a bug or a misconfigured sidecar) or did
    not get an answer after :data:`ACCORD_COMMIT_ATTEMPTS_MAX` attempts."""

    retryable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class AccordOutcome:
    applied: bool
    rows: dict[str, dict[str, object] | None]
    slices: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    attempts: int = 1  # > 1: an earlier copy's outcome was unknown (it may have committed)


# Definite refusals that another sidecar, or the same one a moment later, may accept.
RETRIED_DEFINITE_CODES = ("RESOURCE_EXHAUSTED", "NOT_SENT")


class AccordGateway:
    """The sidecars' client API (``accord_cassandra.client.AsyncClient``) with failover.

    A transaction whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED), or that was
    refused for load (RESOURCE_EXHAUSTED) or never sent (NOT_SENT: the sidecar refused the
    connection), is sent again, to the next sidecar; :attr:`AccordOutcome.attempts` tells the
    caller, whose conditions decide whether a refused copy was its own earlier commit.
    """

    def __init__(
        self, addresses: Sequence[str], *, token: str | None = None, timeout: float = 15.0
    ) -> None:
        check_state(bool(addresses), "the accord commit mode needs at least one sidecar")
        client_module = sidecar_client()
        self._error_type: type[Exception] = client_module.TransactionError
        self._clients = [
            client_module.AsyncClient(a, token=token, timeout=timeout) for a in addresses
        ]
        self._next = 0
        self._resting = [0.0] * len(self._clients)  # monotonic time until which it is skipped
        self.transactions = 0
        self.retries = 0
        self.batcher: ChangeBatcher | None = None  # made on first use (batcher_of)

    async def transact(self, build: Callable[[], Any]) -> AccordOutcome:
        """``build()`` returns a fresh ``accord_cassandra.client.Transaction``.

        Transactions go to the sidecars in turn: the sidecar a client talks to coordinates
        the transaction, and coordinating costs it several times what a replica spends, so
        one sidecar taking them all was the first to run out of CPU."""
        index = self._pick()
        for attempt in range(ACCORD_COMMIT_ATTEMPTS_MAX):
            client = self._clients[index]
            try:
                result = await client.transact(build())
            except self._error_type as error:
                code = getattr(error, "code", "UNKNOWN")
                if getattr(error, "definite", False) and code not in RETRIED_DEFINITE_CODES:
                    raise AccordCommitError(f"accord refused the transaction: {error}") from None
                self.retries += 1
                # Other transactions keep off it for a while: one that hangs would cost each
                # of them the whole deadline before its retry.
                self._resting[index] = time.monotonic() + SIDECAR_REST_SECONDS
                index = (index + 1) % len(self._clients)
                delay = min(ACCORD_RETRY_SECONDS[1], ACCORD_RETRY_SECONDS[0] * 2**attempt)
                logger.info("accord commit retry %d after %s", attempt + 1, code)
                await asyncio.sleep(delay)
                continue
            self.transactions += 1
            if result.error:
                raise AccordCommitError(f"accord transaction failed: {result.error}")
            return AccordOutcome(
                result.applied, dict(result.rows), dict(result.slices), attempt + 1
            )
        raise AccordCommitError(f"no accord outcome after {ACCORD_COMMIT_ATTEMPTS_MAX} attempts")

    def _pick(self) -> int:
        """The next sidecar in turn that did not just fail (any, if all did)."""
        count = len(self._clients)
        now = time.monotonic()
        for step in range(count):
            index = (self._next + step) % count
            if self._resting[index] <= now:
                self._next = index + 1
                return index
        index = self._next % count
        self._next += 1
        return index

    async def read(self, build: Callable[[Any], None]) -> AccordOutcome:
        """A read-only transaction: ``build(txn)`` adds its LETs."""

        def make() -> Any:
            txn = sidecar_client().Transaction()
            build(txn)
            return txn

        return await self.transact(make)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


# -- state changes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    """One participant's share of a state change.

    ``build(txn, tag)`` adds LETs (named ``tag`` + anything), conditions and mutations;
    ``mine(outcome, tag)`` says whether the rows the transaction read show this part's own
    writes (its earlier copy committed); None for a part without conditions.
    """

    what: str
    build: Callable[[Any, str], None]
    mine: Callable[[AccordOutcome, str], bool] | None = None
    # Called when this part's condition failed: True if it changed what it builds so that
    # sending the change again may succeed (a cached Tier-4 row that was dropped).
    repair: Callable[[], bool] | None = None
    # Did this part's condition hold over what the transaction read? (None: no condition.)
    held: Callable[[AccordOutcome, str], bool] | None = None
    # A condition only (a fence): a change of guards alone writes nothing and is not sent.
    guard: bool = False
    # The write lane (a writer instance id) whose Tier-4/5 rows this part touches: the
    # batcher keeps one lane's changes out of the batches of other lanes (ChangeBatcher).
    lane: str | None = None


class StateChangeConflict(StackSagaError):
    """A state change's conditions did not hold: nothing of it was written."""

    retryable: ClassVar[bool] = True

    def __init__(self, label: str, parts: Sequence[str], outcome: AccordOutcome) -> None:
        super().__init__(f"state change {label!r} refused; its conditions: {', '.join(parts)}")
        self.label = label
        self.parts = tuple(parts)
        self.outcome = outcome


class SimulatedCommitCrash(BaseException):
    """Raised by :class:`CommitCrashes` (a BaseException, like a SIGKILL nothing catches)."""

    def __init__(self, label: str, phase: str) -> None:
        super().__init__(f"simulated crash {phase} the commit of {label!r}")
        self.label = label
        self.phase = phase


class CommitCrashes:
    """Armed ``(label, phase)`` pairs, phase ``before`` or ``after``; each fires once. A
    label ``step#3`` names the third change labelled ``step`` of this process."""

    PHASES = ("before", "after")

    def __init__(self, *points: tuple[str, str]) -> None:
        for _, phase in points:
            check_state(phase in self.PHASES, f"crash phase {phase!r}")
        self._armed = set(points)
        self.fired: list[tuple[str, str]] = []
        self._seen: Counter[str] = Counter()

    def count(self, label: str) -> int:
        """Called once per commit: the ordinal of this change among its label's."""
        self._seen[label] += 1
        return self._seen[label]

    def arm(self, label: str, phase: str) -> None:
        check_state(phase in self.PHASES, f"crash phase {phase!r}")
        self._armed.add((label, phase))

    def hit(self, label: str, phase: str, ordinal: int = 0) -> None:
        for name in (label, f"{label}#{ordinal}"):
            if (name, phase) in self._armed:
                self._armed.discard((name, phase))
                self.fired.append((name, phase))
                raise SimulatedCommitCrash(name, phase)


_CURRENT: contextvars.ContextVar[AccordChange | None] = contextvars.ContextVar(
    "stacksaga_accord_change", default=None
)


def current_change() -> AccordChange | None:
    return _CURRENT.get()


def after_commit(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the open state change committed (at once if none is open)."""
    change = _CURRENT.get()
    if change is None:
        callback()
    else:
        change.on_commit.append(callback)


class AccordChange:
    """The parts of one state change, committed as one transaction by :meth:`commit`."""

    def __init__(self, gateway: AccordGateway, label: str, crashes: CommitCrashes) -> None:
        self.gateway = gateway
        self.label = label
        self.crashes = crashes
        self.parts: list[Part] = []
        self.on_commit: list[Callable[[], None]] = []
        # Called with the conflict when the change is refused (a cache to forget, say).
        self.on_refused: list[Callable[[StateChangeConflict], None]] = []
        # Awaited then too: undoing what the change's own transaction cannot (a marker lease).
        self.undo_on_refused: list[Callable[[], Awaitable[None]]] = []

    def add(self, part: Part) -> None:
        self.parts.append(part)

    @property
    def lanes(self) -> frozenset[str]:
        """The write lanes its parts name (empty: none)."""
        return frozenset(part.lane for part in self.parts if part.lane is not None)

    def _build(self) -> Any:
        return self.build_into(sidecar_client().Transaction(), "")

    def build_into(self, txn: Any, prefix: str) -> Any:
        """Add this change to ``txn``, its LET names prefixed (a batch of changes)."""
        for index, part in enumerate(self.parts):
            part.build(txn, f"{prefix}p{index}_")
        return txn

    async def commit(self) -> AccordOutcome | None:
        if all(part.guard for part in self.parts):
            return None
        ordinal = self.crashes.count(self.label)
        self.crashes.hit(self.label, "before", ordinal)
        # The first attempt may share one transaction with other state changes of this
        # process sent at the same moment (ChangeBatcher).
        outcome, batched = await batcher_of(self.gateway).commit(self)
        for _ in range(REPAIRS_MAX + 1):
            if outcome.applied or self._own_retry(outcome):
                break
            failing = self._failing(outcome)
            if (failing or not batched) and not (
                failing and all(p.repair is not None and p.repair() for p in failing)
            ):
                break
            # Repaired, or refused by another change of its batch: alone from now on.
            batched = False
            outcome = await self.gateway.transact(self._build)
        if not outcome.applied and not self._own_retry(outcome):
            failed = [part.what for part in self._failing(outcome)]
            conflict = StateChangeConflict(self.label, failed or ["?"], outcome)
            for refused in self.on_refused:
                refused(conflict)
            for undo in self.undo_on_refused:
                await undo()
            raise conflict
        for callback in self.on_commit:
            callback()
        self.crashes.hit(self.label, "after", ordinal)
        return outcome

    def _failing(self, outcome: AccordOutcome) -> list[Part]:
        return [
            part
            for index, part in enumerate(self.parts)
            if part.held is not None and not part.held(outcome, f"p{index}_")
        ]

    def _own_retry(self, outcome: AccordOutcome) -> bool:
        """A refused copy after an unknown outcome: was the earlier copy ours?"""
        if outcome.attempts <= 1:
            return False
        conditioned = [(i, p) for i, p in enumerate(self.parts) if p.mine is not None]
        return bool(conditioned) and all(
            p.mine is not None and p.mine(outcome, f"p{i}_") for i, p in conditioned
        )


# Group commit of state changes (ChangeBatcher): transactions in flight at most, and what one
# transaction may carry (the sidecars refuse more than 64 LETs, conditions or mutations).
BATCH_IN_FLIGHT_MAX = 4
BATCH_CHANGES_MAX = 32
BATCH_LETS_MAX = 64
BATCH_CONDITIONS_MAX = 64
BATCH_MUTATIONS_MAX = 64
# How long a partial batch waits, once a batch is answered, for that batch's callers to queue
# their next changes (it goes as soon as all of them have).
BATCH_GATHER_SECONDS = 0.005
# Queued changes' LET prefixes cycle through this many: far more than can ever be queued.
PREFIXES = 1 << 20


@dataclass(slots=True)
class _Queued:
    change: AccordChange
    future: asyncio.Future[tuple[AccordOutcome | None, bool]]
    # The change built once, its LET names under ``prefix`` (unique among the changes that
    # can be queued at once): a batch is these requests' fields put together, not a second
    # build of every change (on the client's loop, the critical path of each batch).
    prefix: str
    request: Any
    rows: frozenset[bytes]  # the rows it mutates (a transaction mutates a row once)
    lanes: frozenset[str]

    @classmethod
    def of(
        cls,
        change: AccordChange,
        future: asyncio.Future[tuple[AccordOutcome | None, bool]],
        prefix: str,
    ) -> _Queued:
        request = change.build_into(sidecar_client().Transaction(), prefix).request
        rows = frozenset(m.row.SerializeToString(deterministic=True) for m in request.mutations)
        return cls(change, future, prefix, request, rows, change.lanes)


class ChangeBatcher:
    """Group commit: concurrent state changes of this process share Accord transactions.

    Every Accord transaction costs the sidecars a lot whatever it carries, so concurrent
    changes share them. Changes queue; a transaction carries the queued changes that fit
    (limits above; mutated rows disjoint). When none is in flight the queue goes at once (a
    change alone when the process is idle: no added latency). While one is, another starts
    only with a *full* batch -- the queue holds more than one transaction can carry -- and at
    most :data:`BATCH_IN_FLIGHT_MAX` are in flight. So the batches stay as large as the load
    allows: on this 2-core machine with the sidecars beside the client, 4 transactions always
    in flight (one per fixed group of lanes) carried ~4.5 starts each at 32 starts in flight
    and ran 150-200 creates/s; one at a time carried ~16 and ran 240-290. And once a batch
    is answered, a partial batch waits (at most :data:`BATCH_GATHER_SECONDS`) for that
    batch's callers to queue their next changes: under a steady load they come straight
    back, and without the wait a batch of the ones queued meanwhile and a batch of the
    returners alternate (23 and 1 of 24 callers in the test); with it, one carries ~all 32.

    *Batches in flight do not share write lanes.* Accord orders two transactions that share
    a partition one after the other (and the later one leaves the fast path), so batches in
    flight should not share partitions. A lane's changes do (its Tier-4 row, its Tier-5
    partitions), different lanes' do not, and es_transaction rows are one saga's. So while a
    batch is in flight, changes of its lanes (:attr:`AccordChange.lanes`) wait for it, and a
    batch takes whole lanes, oldest first: 128 queued changes over 16 lanes make four full
    batches of four lanes each, not one batch that holds every lane. Which batch a change
    joins is a matter of speed only: any two transactions are serialisable whatever they
    share.

    A batch is one transaction, so each change in it is still all-or-nothing, and its
    conditions are its own: the batch's conditions are the AND of all of them, each read on
    the state before the batch. A batch refused is refused whole; each change then looks at
    its own conditions in what the batch read: one of its own failed, it is refused (or
    repaired) as alone; none did, it is sent again alone (:meth:`AccordChange.commit`). A
    batch the sidecars reject outright is sent again change by change.
    """

    def __init__(
        self,
        gateway: AccordGateway,
        in_flight_max: int = BATCH_IN_FLIGHT_MAX,
        gather_seconds: float = BATCH_GATHER_SECONDS,
    ) -> None:
        check_state(
            in_flight_max >= 1, f"batches in flight must be at least 1, got {in_flight_max}"
        )
        check_state(
            0 <= gather_seconds <= 1, f"gather_seconds must be in 0..1, got {gather_seconds}"
        )
        self.gateway = gateway
        self.in_flight_max = in_flight_max
        self.gather_seconds = gather_seconds
        # Callers of answered batches not yet back with a next change, and the timer that
        # stops waiting for them.
        self._awaited = 0
        self._gather_timer: asyncio.TimerHandle | None = None
        self._queue: list[_Queued] = []
        self._in_flight = 0
        self._held: set[str] = set()  # lanes of the batches in flight
        self._tasks: set[asyncio.Future[None]] = set()
        self._sequence = itertools.count()
        self.batches = 0
        self.batched_changes = 0

    async def commit(self, change: AccordChange) -> tuple[AccordOutcome, bool]:
        """The outcome of the transaction that carried ``change`` (its LETs under their own
        names), and whether other changes shared it."""
        prefix = f"c{next(self._sequence) % PREFIXES}_"
        queued = _Queued.of(change, asyncio.get_running_loop().create_future(), prefix)
        self._queue.append(queued)
        if self._awaited == 1:
            self._end_gather()  # the last caller awaited is back
        else:
            self._awaited = max(0, self._awaited - 1)
            self._flush()
        try:
            # Not shielded: the future is this change's alone (its batch settles each
            # member's own), so a caller that gives up cancels only it; and a shield is one
            # more pass of the client's busy loop between a batch's answer and each change.
            outcome, batched = await queued.future
        except asyncio.CancelledError:
            if queued in self._queue:
                self._queue.remove(queued)
            raise
        if outcome is None:  # its batch was rejected as a whole: alone
            return await self.gateway.transact(change._build), False
        return outcome, batched

    def _could_fill(self) -> bool:
        """Whether the queue may hold more than one transaction carries, by its counts alone
        (cheap: _take, which decides, costs ~0.1 ms at 32 queued, and a gathering batcher
        asks at every change queued)."""
        queue = self._queue
        if len(queue) > BATCH_CHANGES_MAX:
            return True
        lets = conditions = mutations = 0
        for queued in queue:
            request = queued.request
            lets += len(request.lets)
            conditions += len(request.conditions)
            mutations += len(request.mutations)
        return (
            lets > BATCH_LETS_MAX
            or conditions > BATCH_CONDITIONS_MAX
            or mutations > BATCH_MUTATIONS_MAX
        )

    def _flush(self) -> None:
        while self._queue and self._in_flight < self.in_flight_max:
            waiting = self._in_flight or self._awaited
            if waiting and not self._could_fill():
                # Only a full batch goes now; two changes that mutate one row also fill
                # one, but that is rare enough to wait for.
                return
            batch, full = _take(self._queue, self._held)
            if not batch or (waiting and not full):
                # A partial batch waits for the one in flight, or for the callers of the one
                # just answered to come back, and grows meanwhile.
                return
            taken = {id(queued) for queued in batch}
            self._queue = [queued for queued in self._queue if id(queued) not in taken]
            lanes = frozenset().union(*(queued.lanes for queued in batch))
            self._held |= lanes
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(batch, lanes))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Queued], lanes: frozenset[str]) -> None:
        try:
            if len(batch) == 1:
                outcome = await self.gateway.transact(batch[0].change._build)
                _settle(batch[0].future, (outcome, False))
                return

            def build() -> Any:
                txn = sidecar_client().Transaction()
                request = txn.request
                for queued in batch:
                    request.lets.extend(queued.request.lets)
                    request.conditions.extend(queued.request.conditions)
                    request.mutations.extend(queued.request.mutations)
                return txn

            self.batches += 1
            self.batched_changes += len(batch)
            try:
                outcome = await self.gateway.transact(build)
            except AccordCommitError as error:
                logger.info("a batch of %d changes was refused (%s); alone", len(batch), error)
                for queued in batch:
                    _settle(queued.future, (None, False))
                return
            views = _views(outcome)
            for queued in batch:
                view = views.get(queued.prefix) or AccordOutcome(
                    outcome.applied, {}, {}, outcome.attempts
                )
                _settle(queued.future, (view, True))
        except BaseException as error:
            for queued in batch:
                if not queued.future.done():
                    queued.future.set_exception(error)
            if not isinstance(error, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._held -= lanes
            self._gather(len(batch))

    def _gather(self, answered: int) -> None:
        """Hold partial batches until the ``answered`` callers just woken have queued their
        next changes, at most :attr:`gather_seconds`. Under a steady load those callers come
        straight back: sent at once, the queue would go without them and they would wait for
        a whole transaction, so two half-size batches would alternate at twice the cost per
        change of one full one."""
        if self.gather_seconds <= 0:
            self._flush()
            return
        self._awaited += answered
        if self._gather_timer is not None:
            self._gather_timer.cancel()
        self._gather_timer = asyncio.get_running_loop().call_later(
            self.gather_seconds, self._end_gather
        )
        self._flush()  # a full batch need not wait

    def _end_gather(self) -> None:
        self._awaited = 0
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        self._flush()


def _take(queue: list[_Queued], held: set[str]) -> tuple[list[_Queued], bool]:
    """The next batch from ``queue`` and whether it is full (a change it could have taken
    did not fit). Changes of ``held`` lanes wait; the others go lane by lane, each lane's
    changes in order, the lanes in the order of their oldest queued change (a change without
    a lane is a lane of its own); each change that fits."""
    by_lane: dict[object, list[_Queued]] = {}
    for queued in queue:
        if queued.lanes & held:
            continue
        key: object = min(queued.lanes) if queued.lanes else id(queued)
        by_lane.setdefault(key, []).append(queued)
    batch: list[_Queued] = []
    lets = conditions = mutations = 0
    rows: set[bytes] = set()
    full = False
    for changes in by_lane.values():
        for queued in changes:
            request = queued.request
            fits = (
                len(batch) < BATCH_CHANGES_MAX
                and lets + len(request.lets) <= BATCH_LETS_MAX
                and conditions + len(request.conditions) <= BATCH_CONDITIONS_MAX
                and mutations + len(request.mutations) <= BATCH_MUTATIONS_MAX
                and rows.isdisjoint(queued.rows)
            )
            if not fits and batch:
                full = True
                continue
            batch.append(queued)
            lets += len(request.lets)
            conditions += len(request.conditions)
            mutations += len(request.mutations)
            rows |= queued.rows
    return batch, full


def _settle(
    future: asyncio.Future[tuple[AccordOutcome | None, bool]],
    result: tuple[AccordOutcome | None, bool],
) -> None:
    if not future.done():
        future.set_result(result)


def _views(outcome: AccordOutcome) -> dict[str, AccordOutcome]:
    """Each change's share of a batch's outcome, by its prefix, its LETs under their own
    names (one pass over the rows, not one per change)."""
    rows: dict[str, dict[str, dict[str, object] | None]] = {}
    slices: dict[str, dict[str, list[dict[str, object]]]] = {}
    for name, row in outcome.rows.items():
        head, _, own = name.partition("_")
        rows.setdefault(head + "_", {})[own] = row
    for name, found in outcome.slices.items():
        head, _, own = name.partition("_")
        slices.setdefault(head + "_", {})[own] = found
    return {
        prefix: AccordOutcome(
            outcome.applied, rows.get(prefix, {}), slices.get(prefix, {}), outcome.attempts
        )
        for prefix in rows.keys() | slices.keys()
    }


def batcher_of(gateway: AccordGateway) -> ChangeBatcher:
    batcher = gateway.batcher
    if batcher is None:
        batcher = gateway.batcher = ChangeBatcher(gateway)
    return batcher


class ChangeRunner:
    """Opens state changes and submits parts: joined to the open change, or alone."""

    def __init__(self, gateway: AccordGateway, crashes: CommitCrashes | None = None) -> None:
        self.gateway = gateway
        self.crashes = crashes or CommitCrashes()

    @contextlib.asynccontextmanager
    async def state_change(
        self, label: str, guard: Part | None = None
    ) -> AsyncIterator[AccordChange]:
        """One Accord transaction for everything submitted inside (joins an open one);
        ``guard`` (a condition part) joins it too, once per change."""
        outer = _CURRENT.get()
        if outer is not None:
            if guard is not None and all(p.what != guard.what for p in outer.parts):
                outer.add(guard)
            yield outer
            return
        change = AccordChange(self.gateway, label, self.crashes)
        if guard is not None:
            change.add(guard)
        token = _CURRENT.set(change)
        try:
            yield change
        finally:
            _CURRENT.reset(token)
        await change.commit()

    async def submit(self, part: Part, label: str | None = None) -> AccordOutcome | None:
        change = _CURRENT.get()
        if change is not None:
            change.add(part)
            return None
        alone = AccordChange(self.gateway, label or part.what, self.crashes)
        alone.add(part)
        return await alone.commit()

    async def now_or_refused(self, part: Part, guard: Part | None = None) -> AccordOutcome:
        """Commit ``part`` alone now, even inside an open change; a refusal is returned, not
        raised (its rows say why). ``guard``, a condition part (a fence), joins it as
        ``p1_``."""
        alone = AccordChange(self.gateway, part.what, self.crashes)
        alone.add(part)
        if guard is not None:
            alone.add(guard)
        try:
            outcome = await alone.commit()
        except StateChangeConflict as conflict:
            return conflict.outcome
        if outcome is None:
            raise InvariantViolation("a one-part change has an outcome")
        return outcome

    async def now(self, part: Part) -> AccordOutcome:
        """Commit ``part`` on its own now, even inside an open change (a lease acquire, which
        must precede the step it guards)."""
        alone = AccordChange(self.gateway, part.what, self.crashes)
        alone.add(part)
        outcome = await alone.commit()
        if outcome is None:
            raise InvariantViolation("a one-part change has an outcome")
        return outcome
