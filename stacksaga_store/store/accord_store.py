"""The accord commit mode's store: every saga state change is one Accord transaction.

Theory of operation
-------------------
In the ``accord`` commit mode the seed's nine tables, in the seed's own keyspace, are written
only through the Accord sidecars (``accord_cassandra.client``). That is a rule, not a taste:
a sidecar writes with ``USING TIMESTAMP`` derived from the transaction's executeAt, far above
any driver timestamp, so a plain write that follows an Accord write of the same cells is lost.
So in this mode :class:`AccordEventStore`, :class:`AccordProtection` and
:class:`AccordDirectory` replace every write of :class:`~stacksaga_store.store.events.
CassandraEventStore`, :class:`~stacksaga_store.store.protection.WriteProtection` and
:class:`~stacksaga_store.recovery.directory.Directory` (no LWT, no logged batch), and the
reads that decide something (a transaction's history, a marker before an admin restore, a
final marker a RELAXED guard would skip a step on, a Tier-5 bucket) are Accord reads too: a
client hears of a transaction once its outcome is chosen, possibly before a replica wrote it
to Cassandra, so a plain read could miss it.

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
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from stacksaga_store.clock import to_utc
from stacksaga_store.config.settings import ConsistencyMode, ProtectionPolicy
from stacksaga_store.errors import (
    InvariantViolation,
    LeaseBusyError,
    LeaseFenceRefusedError,
    StackSagaError,
    TransactionHistoryFullError,
    TransactionNotFoundError,
    check_state,
)
from stacksaga_store.store.cql import CqlSession, Prepared
from stacksaga_store.store.events import (
    TRYOUTS_PER_TRANSACTION_MAX,
    CassandraEventStore,
    StateWrite,
    _check_payload,
)
from stacksaga_store.store.model import (
    FencingRow,
    FrozenRecord,
    RestorePath,
    TransactionKey,
    TransactionRecord,
    TransactionView,
)
from stacksaga_store.store.protection import (
    _SKIP,
    TTL_SLACK_SECONDS,
    GuardOutcome,
    GuardResult,
    MarkerKey,
    MarkerSnapshot,
    Write,
    WriteProtection,
)
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    PARKED_STATUSES,
    ExecutionType,
    MarkerState,
    RunningStatus,
    TryoutRecord,
    TryoutStatus,
)

__all__ = [
    "ACCORD_COMMIT_ATTEMPTS_MAX",
    "FENCE_PART",
    "AccordChange",
    "AccordCommitError",
    "AccordEventStore",
    "AccordGateway",
    "AccordOutcome",
    "AccordProtection",
    "CommitCrashes",
    "Part",
    "SimulatedCommitCrash",
    "StateChangeConflict",
    "after_commit",
    "current_change",
    "ms",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ACCORD_COMMIT_ATTEMPTS_MAX = 8
# Times a refused state change is repaired and sent again (one repair per refused part).
REPAIRS_MAX = 2
ACCORD_RETRY_SECONDS = (0.05, 1.0)
# Rows per Accord slice read: the sidecars' MAX_ROWS_PER_SLICE.
SLICE_ROWS_MAX = 1000
TRANSACTION = "es_transaction"
TRYOUT = "es_transaction_tryout"
FROZEN = "es_frozen_transaction"
MARKERS = "es_execution_markers"
RING_STATE = "es_ring_state"
# The part of a state change that fences it by its range lease's epoch (see fence_part).
FENCE_PART = "range lease still at"


def sidecar_client() -> Any:
    """``accord_cassandra.client``, imported on first use of the accord mode.

    Dynamically: the sidecar client (grpc) is only needed in this mode, and its generated
    gRPC code is untyped, which must not fail ``mypy --strict`` of this package.
    """
    return importlib.import_module("accord_cassandra.client")


def ms(moment: datetime) -> int:
    """A ``timestamp`` cell as the sidecars carry it: milliseconds since the epoch."""
    return (
        int(moment.timestamp() * 1000)
        if moment.tzinfo
        else int(moment.replace(tzinfo=UTC).timestamp() * 1000)
    )


def from_ms(value: object) -> datetime:
    if not isinstance(value, int):
        raise InvariantViolation(f"a timestamp cell read back as {value!r}")
    return datetime.fromtimestamp(value / 1000, tz=UTC)


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
        self.transactions = 0
        self.retries = 0
        self.batcher: ChangeBatcher | None = None  # made on first use (batcher_of)

    async def transact(self, build: Callable[[], Any]) -> AccordOutcome:
        """``build()`` returns a fresh ``accord_cassandra.client.Transaction``."""
        for attempt in range(ACCORD_COMMIT_ATTEMPTS_MAX):
            client = self._clients[self._next % len(self._clients)]
            try:
                result = await client.transact(build())
            except self._error_type as error:
                code = getattr(error, "code", "UNKNOWN")
                if getattr(error, "definite", False) and code not in RETRIED_DEFINITE_CODES:
                    raise AccordCommitError(f"accord refused the transaction: {error}") from None
                self.retries += 1
                self._next += 1
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


def _fence_of(change: AccordChange | None) -> Part | None:
    """The epoch condition the open state change carries (a fenced dispatch), if any."""
    if change is None:
        return None
    return next((p for p in change.parts if p.guard and p.what.startswith(FENCE_PART)), None)


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


# Group commit of state changes (ChangeBatcher): transactions in flight before changes wait
# to share one, and what one transaction may carry (the sidecars refuse more than 64 LETs,
# conditions or mutations).
BATCH_IN_FLIGHT_MAX = 4
BATCH_CHANGES_MAX = 16
BATCH_LETS_MAX = 64
BATCH_CONDITIONS_MAX = 64
BATCH_MUTATIONS_MAX = 64


@dataclass(slots=True)
class _Queued:
    change: AccordChange
    future: asyncio.Future[tuple[AccordOutcome | None, bool]]
    lets: int
    conditions: int
    mutations: int
    rows: frozenset[bytes]  # the rows it mutates (a transaction mutates a row once)


class ChangeBatcher:
    """Group commit: concurrent state changes of this process share Accord transactions.

    Every Accord transaction costs the sidecars about the same whatever it carries, and that
    cost bounds the accord mode's rate. So while :data:`BATCH_IN_FLIGHT_MAX` transactions are
    in flight, further changes queue, and each transaction sent carries every queued change
    that fits (limits above; mutated rows disjoint): one change alone when the gateway is
    idle (no added latency), many under load. A batch is one transaction, so each change in
    it is still all-or-nothing, and its conditions are its own: the batch's conditions are
    the AND of all of them, each read on the state before the batch. A batch refused is
    refused whole; each change then looks at its own conditions in what the batch read:
    one of its own failed, it is refused (or repaired) as alone; none did, it is sent again
    alone (:meth:`AccordChange.commit`). A batch the sidecars reject outright is sent again
    change by change.
    """

    def __init__(self, gateway: AccordGateway) -> None:
        self.gateway = gateway
        self._queue: list[_Queued] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Future[None]] = set()
        self.batches = 0
        self.batched_changes = 0

    async def commit(self, change: AccordChange) -> tuple[AccordOutcome, bool]:
        """The outcome of the transaction that carried ``change`` (its LETs under their own
        names), and whether other changes shared it."""
        shape = change.build_into(sidecar_client().Transaction(), "").request
        loop = asyncio.get_running_loop()
        queued = _Queued(
            change,
            loop.create_future(),
            len(shape.lets),
            len(shape.conditions),
            len(shape.mutations),
            frozenset(m.row.SerializeToString(deterministic=True) for m in shape.mutations),
        )
        self._queue.append(queued)
        self._flush()
        try:
            outcome, batched = await asyncio.shield(queued.future)
        except asyncio.CancelledError:
            if queued in self._queue:
                self._queue.remove(queued)
            raise
        if outcome is None:  # its batch was rejected as a whole: alone
            return await self.gateway.transact(change._build), False
        return outcome, batched

    def _flush(self) -> None:
        while self._queue and self._in_flight < BATCH_IN_FLIGHT_MAX:
            batch = self._take()
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Queued]:
        batch: list[_Queued] = []
        lets = conditions = mutations = 0
        rows: set[bytes] = set()
        kept: list[_Queued] = []
        for queued in self._queue:
            fits = (
                len(batch) < BATCH_CHANGES_MAX
                and lets + queued.lets <= BATCH_LETS_MAX
                and conditions + queued.conditions <= BATCH_CONDITIONS_MAX
                and mutations + queued.mutations <= BATCH_MUTATIONS_MAX
                and rows.isdisjoint(queued.rows)
            )
            if not fits and batch:
                kept.append(queued)
                continue
            batch.append(queued)
            lets += queued.lets
            conditions += queued.conditions
            mutations += queued.mutations
            rows |= queued.rows
        self._queue = kept
        return batch

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            if len(batch) == 1:
                outcome = await self.gateway.transact(batch[0].change._build)
                _settle(batch[0].future, (outcome, False))
                return

            def build() -> Any:
                txn = sidecar_client().Transaction()
                for index, queued in enumerate(batch):
                    queued.change.build_into(txn, f"c{index}_")
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
            for index, queued in enumerate(batch):
                _settle(queued.future, (_view(outcome, f"c{index}_"), True))
        except BaseException as error:
            for queued in batch:
                if not queued.future.done():
                    queued.future.set_exception(error)
            if not isinstance(error, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._flush()


def _settle(
    future: asyncio.Future[tuple[AccordOutcome | None, bool]],
    result: tuple[AccordOutcome | None, bool],
) -> None:
    if not future.done():
        future.set_result(result)


def _view(outcome: AccordOutcome, prefix: str) -> AccordOutcome:
    """One change's share of a batch's outcome, its LETs under their own names."""
    cut = len(prefix)
    return AccordOutcome(
        outcome.applied,
        {name[cut:]: row for name, row in outcome.rows.items() if name.startswith(prefix)},
        {name[cut:]: rows for name, rows in outcome.slices.items() if name.startswith(prefix)},
        outcome.attempts,
    )


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


# -- the event store -----------------------------------------------------------------------

_NOT_ACTIVE = tuple(sorted(s.value for s in FINAL_STATUSES | PARKED_STATUSES))


class AccordEventStore(CassandraEventStore):
    """:class:`CassandraEventStore` whose writes and reads are Accord transactions."""

    def __init__(
        self,
        cql: CqlSession,
        keyspace: str,
        *,
        gateway: AccordGateway,
        crashes: CommitCrashes | None = None,
    ) -> None:
        super().__init__(cql, keyspace)
        self.runner = ChangeRunner(gateway, crashes)
        self.gateway = gateway

    # -- state changes -----------------------------------------------------------------------

    def state_change(
        self, label: str, *, fence: FencingRow | None = None
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.runner.state_change(label, None if fence is None else self.fence_part(fence))

    def fence_part(self, fence: FencingRow) -> Part:
        """The condition that the range lease a dispatch runs under is still the current one:
        its fencing row, read in the change's own transaction, still holds its epoch. A
        dispatch whose range moved on (a paused node waking after a new epoch was persisted)
        is refused and writes nothing, however late its transaction arrives. No ``mine``: a
        refused copy of a committed change is recognised by its other parts."""
        ks, pk, name = self.keyspace, [fence.region, fence.cluster], (fence.name,)

        def build(txn: Any, tag: str) -> None:
            row = txn.let(f"{tag}e", ks, RING_STATE, pk, name)
            txn.where(row["epoch"] == fence.epoch)

        def held(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}e")
            return row is not None and row.get("epoch") == fence.epoch

        return Part(f"{FENCE_PART} {fence.name} epoch {fence.epoch}", build, held=held, guard=True)

    @staticmethod
    def pk(key: TransactionKey) -> list[object]:
        return [key.region, key.cluster, key.service_name, key.transaction_id]

    def part_for(self, prepared: Prepared, params: Sequence[Any]) -> Part:
        """The Accord part of a :meth:`state_write` (write protection batches those)."""
        check_state(prepared is self._statement("state"), f"no accord form of {prepared!r}")
        status, now, payload, *key_params = params
        key = TransactionKey(*key_params)
        return self._state_part(key, RunningStatus(status), payload, now)

    def _state_part(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> Part:
        ks, pk = self.keyspace, self.pk(key)

        def build(txn: Any, tag: str) -> None:
            txn.update(
                ks,
                TRANSACTION,
                pk,
                running_status=status.value,
                updated_at=ms(now),
                payload=payload,
            )

        return Part(f"status {status.value}", build)

    # -- es_transaction ----------------------------------------------------------------------

    async def create(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None,
    ) -> TransactionRecord:
        _check_payload(payload)
        ks, pk, path = self.keyspace, self.pk(key), restore_path
        columns: dict[str, object] = {
            "running_status": status.value,
            "created_at": ms(now),
            "updated_at": ms(now),
            "payload": payload,
        }
        columns.update(_path_columns(path))

        def build(txn: Any, tag: str) -> None:
            row = txn.let(f"{tag}t", ks, TRANSACTION, pk)
            txn.where(row.is_null())
            txn.update(ks, TRANSACTION, pk, values=columns)

        def mine(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}t")
            return (
                row is not None
                and row.get("created_at") == ms(now)
                and bytes(_blob(row.get("payload"))) == payload
            )

        def held(outcome: AccordOutcome, tag: str) -> bool:
            return outcome.rows.get(f"{tag}t") is None

        await self.runner.submit(Part("es_transaction absent", build, mine, held=held), "start")
        return TransactionRecord(key, status, now, now, payload, restore_path)

    def state_write(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> StateWrite:
        _check_payload(payload)
        return StateWrite(self._statement("state"), (status.value, now, payload, *key.params()))

    async def write_state(
        self, key: TransactionKey, status: RunningStatus, payload: bytes, now: datetime
    ) -> None:
        _check_payload(payload)
        await self.runner.submit(self._state_part(key, status, payload, now))

    async def write_restore_path(
        self, key: TransactionKey, path: RestorePath, *, expect: RestorePath | None = None
    ) -> None:
        """Point es_transaction.restore_* at a new watchdog; with ``expect``, only while the
        transaction is active and its watchdog is still ``expect`` (a restore re-arm)."""
        ks, pk = self.keyspace, self.pk(key)

        def build(txn: Any, tag: str) -> None:
            if expect is not None:
                row = txn.let(f"{tag}t", ks, TRANSACTION, pk)
                txn.where(
                    row["restore_date"] == expect.date_of_year,
                    row["restore_window"] == expect.window,
                    row["restore_instance_id"] == expect.instance_id,
                    row["restore_bucket"] == expect.bucket,
                    *(row["running_status"] != status for status in _NOT_ACTIVE),
                )
            txn.update(ks, TRANSACTION, pk, values=_path_columns(path))

        def mine(outcome: AccordOutcome, tag: str) -> bool:
            return _path(outcome.rows.get(f"{tag}t")) == path

        def held(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}t")
            return (
                row is not None
                and _path(row) == expect
                and str(row.get("running_status")) not in _NOT_ACTIVE
            )

        await self.runner.submit(
            Part(
                "watchdog still the restored one",
                build,
                mine if expect else None,
                held=held if expect else None,
            ),
            "rearm",
        )

    async def read_record(self, key: TransactionKey) -> TransactionRecord | None:
        ks, pk = self.keyspace, self.pk(key)
        outcome = await self.gateway.read(lambda txn: txn.let("t", ks, TRANSACTION, pk))
        row = outcome.rows.get("t")
        return None if row is None else _record(key, row)

    async def read(self, key: TransactionKey) -> TransactionView:
        """The transaction, its tryouts and its frozen row in one Accord read (more reads
        only for a history over :data:`SLICE_ROWS_MAX` tryouts)."""
        ks, pk = self.keyspace, self.pk(key)

        def build(txn: Any) -> None:
            txn.let("t", ks, TRANSACTION, pk)
            txn.let("f", ks, FROZEN, pk)
            txn.let_slice("h", ks, TRYOUT, pk, column="tryout_index", limit=SLICE_ROWS_MAX)

        outcome = await self.gateway.read(build)
        row = outcome.rows.get("t")
        if row is None:
            raise TransactionNotFoundError(f"no transaction {key}")
        tryouts = [_tryout(r) for r in outcome.slices.get("h", [])]
        if len(tryouts) == SLICE_ROWS_MAX:
            tryouts.extend(await self._tryouts_after(key, tryouts[-1].tryout_index))
        return TransactionView(
            record=_record(key, row), tryouts=tuple(tryouts), frozen=_frozen(outcome.rows.get("f"))
        )

    async def read_tryouts(self, key: TransactionKey) -> tuple[TryoutRecord, ...]:
        return tuple(await self._tryouts_after(key, None))

    async def _tryouts_after(self, key: TransactionKey, after: int | None) -> list[TryoutRecord]:
        ks, pk = self.keyspace, self.pk(key)
        found: list[TryoutRecord] = []
        while len(found) < TRYOUTS_PER_TRANSACTION_MAX:
            last = after

            def build(txn: Any, last: int | None = last) -> None:
                txn.let_slice(
                    "h", ks, TRYOUT, pk, column="tryout_index", gt=last, limit=SLICE_ROWS_MAX
                )

            rows = (await self.gateway.read(build)).slices.get("h", [])
            found.extend(_tryout(r) for r in rows)
            if len(rows) < SLICE_ROWS_MAX:
                break
            after = found[-1].tryout_index
        return found

    async def read_frozen(self, key: TransactionKey) -> FrozenRecord | None:
        ks, pk = self.keyspace, self.pk(key)
        outcome = await self.gateway.read(lambda txn: txn.let("f", ks, FROZEN, pk))
        return _frozen(outcome.rows.get("f"))

    # -- tryouts -----------------------------------------------------------------------------

    def _tryout_part(
        self,
        key: TransactionKey,
        index: int,
        executor: str,
        execution_type: ExecutionType,
        status: TryoutStatus,
        now: datetime,
    ) -> Part:
        ks, pk = self.keyspace, self.pk(key)
        wanted = (executor, execution_type.value, status.value, ms(now))

        def build(txn: Any, tag: str) -> None:
            row = txn.let(f"{tag}o", ks, TRYOUT, pk, (index,))
            txn.where(row.is_null())
            txn.update(
                ks,
                TRYOUT,
                pk,
                (index,),
                executor=executor,
                execution_type=execution_type.value,
                status=status.value,
                created_at=ms(now),
            )

        def mine(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}o")
            return (
                row is not None
                and (
                    row.get("executor"),
                    row.get("execution_type"),
                    row.get("status"),
                    row.get("created_at"),
                )
                == wanted
            )

        def held(outcome: AccordOutcome, tag: str) -> bool:
            return outcome.rows.get(f"{tag}o") is None

        return Part(f"tryout {index} free", build, mine, held=held)

    async def append_tryout(
        self,
        key: TransactionKey,
        index: int,
        *,
        executor: str,
        execution_type: ExecutionType,
        status: TryoutStatus,
        now: datetime,
    ) -> TryoutRecord:
        """Inside a state change: the row at ``index``, the change refused if it is taken.
        Alone: at ``index`` or the next free one (the LWT version's contract)."""
        stored_at = now.replace(microsecond=now.microsecond // 1000 * 1000)
        for _ in range(32):
            if index >= TRYOUTS_PER_TRANSACTION_MAX:
                raise TransactionHistoryFullError(
                    f"{key}: {TRYOUTS_PER_TRANSACTION_MAX} tryouts recorded; no more accepted"
                )
            part = self._tryout_part(key, index, executor, execution_type, status, now)
            try:
                await self.runner.submit(part, "tryout")
            except StateChangeConflict:
                index += 1
                continue
            return TryoutRecord(index, executor, execution_type, status, stored_at)
        raise AccordCommitError(f"{key}: tryout append lost 32 index races")

    # -- es_frozen_transaction ---------------------------------------------------------------

    async def freeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        reason: str,
        now: datetime,
    ) -> FrozenRecord:
        check_state(status in PARKED_STATUSES, "not parked")
        _check_payload(payload)
        ks, pk = self.keyspace, self.pk(key)
        state = self._state_part(key, status, payload, now)

        def build(txn: Any, tag: str) -> None:
            state.build(txn, tag)
            txn.update(ks, FROZEN, pk, frozen_at=ms(now), reason=reason)

        await self.runner.submit(Part("freeze", build), "freeze")
        return FrozenRecord(frozen_at=now, reason=reason)

    async def unfreeze(
        self,
        key: TransactionKey,
        *,
        status: RunningStatus,
        payload: bytes,
        now: datetime,
        restore_path: RestorePath | None = None,
    ) -> None:
        _check_payload(payload)
        ks, pk, path = self.keyspace, self.pk(key), restore_path
        # One upsert of the row (a transaction mutates a row at most once).
        columns: dict[str, object] = {
            "running_status": status.value,
            "updated_at": ms(now),
            "payload": payload,
        }
        columns.update(_path_columns(path))

        def build(txn: Any, tag: str) -> None:
            txn.update(ks, TRANSACTION, pk, values=columns)
            txn.delete(ks, FROZEN, pk)

        await self.runner.submit(Part("unfreeze", build), "unfreeze")


def _path_columns(path: RestorePath | None) -> dict[str, object]:
    """es_transaction's restore_* cells naming ``path`` (none without one)."""
    if path is None:
        return {}
    return {
        "restore_date": path.date_of_year,
        "restore_window": path.window,
        "restore_instance_id": path.instance_id,
        "restore_bucket": path.bucket,
    }


def _blob(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvariantViolation(f"a blob cell read back as {type(value).__name__}")


def _path(row: dict[str, object] | None) -> RestorePath | None:
    if row is None or row.get("restore_date") is None:
        return None
    window, bucket = row.get("restore_window"), row.get("restore_bucket")
    if not (isinstance(window, int) and isinstance(bucket, int)):
        raise InvariantViolation(f"restore path is not two ints: {window!r}, {bucket!r}")
    return RestorePath(
        date_of_year=str(row["restore_date"]),
        window=window,
        instance_id=str(row["restore_instance_id"]),
        bucket=bucket,
    )


def _record(key: TransactionKey, row: dict[str, object]) -> TransactionRecord:
    return TransactionRecord(
        key=key,
        running_status=RunningStatus(str(row["running_status"])),
        created_at=from_ms(row["created_at"]),
        updated_at=from_ms(row["updated_at"]),
        payload=_blob(row.get("payload")),
        restore_path=_path(row),
    )


def _tryout(row: dict[str, object]) -> TryoutRecord:
    index = row["tryout_index"]
    if not isinstance(index, int):
        raise InvariantViolation(f"tryout_index read back as {index!r}")
    return TryoutRecord(
        tryout_index=index,
        executor=str(row["executor"]),
        execution_type=ExecutionType(str(row["execution_type"])),
        status=TryoutStatus(str(row["status"])),
        created_at=to_utc(from_ms(row["created_at"])),
    )


def _frozen(row: dict[str, object] | None) -> FrozenRecord | None:
    if row is None:
        return None
    return FrozenRecord(frozen_at=from_ms(row["frozen_at"]), reason=str(row["reason"]))


def uuid_of(value: object) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


# -- execution markers -----------------------------------------------------------------------


class AccordProtection(WriteProtection):
    """Execution markers through Accord: the STRICT lease is a conditional insert with a TTL
    (expiry judged as of each transaction's executeAt, so every replica agrees), its commit
    a conditional update inside the step's state change; RELAXED_WITH_DEDUP writes COMMITTED
    in the step's state change, whose tryout condition lets exactly one of two duplicate runs
    record its result (alone, outside a change: ``IF`` no marker exists)."""

    def __init__(
        self,
        cql: CqlSession,
        keyspace: str,
        *,
        events: AccordEventStore,
        lease_waits_max: int = 3,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(cql, keyspace, lease_waits_max=lease_waits_max, sleep=sleep)
        self.events = events
        self.runner = events.runner

    @staticmethod
    def _pk(key: MarkerKey) -> list[object]:
        return AccordEventStore.pk(key.transaction)

    def _marker_part(
        self,
        key: MarkerKey,
        what: str,
        *,
        expect: str | None,
        write: str | None,
        ttl: int | None = None,
    ) -> Part:
        """``IF marker = expect`` (None: no marker), then ``write`` it (None: delete it)."""
        ks, pk, step = self.keyspace, self._pk(key), (key.step_id,)

        def build(txn: Any, tag: str) -> None:
            row = txn.let(f"{tag}m", ks, MARKERS, pk, step)
            txn.where(row.is_null() if expect is None else row["execution_state"] == expect)
            if write is None:
                txn.delete(ks, MARKERS, pk, step)
            else:
                txn.update(ks, MARKERS, pk, step, ttl=ttl, execution_state=write)

        def mine(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}m")
            return (
                (row is None)
                if write is None
                else (row is not None and row.get("execution_state") == write)
            )

        def held(outcome: AccordOutcome, tag: str) -> bool:
            row = outcome.rows.get(f"{tag}m")
            if expect is None:
                return row is None
            return row is not None and row.get("execution_state") == expect

        return Part(what, build, mine, held=held)

    async def _marker(self, key: MarkerKey) -> str | None:
        ks, pk, step = self.keyspace, self._pk(key), (key.step_id,)
        outcome = await self.events.gateway.read(lambda txn: txn.let("m", ks, MARKERS, pk, step))
        row = outcome.rows.get("m")
        return None if row is None else str(row.get("execution_state"))

    def _result_parts(self, writes: Sequence[Write]) -> list[Part]:
        return [self.events.part_for(prepared, params) for prepared, params in writes]

    async def reset_failed(self, key: MarkerKey, policy: ProtectionPolicy) -> bool:
        if await self._marker(key) != MarkerState.FAILED.value:
            return False
        failed = MarkerState.FAILED.value
        await self.runner.submit(
            self._marker_part(key, "marker still FAILED", expect=failed, write=None)
        )
        return True

    async def _run_relaxed(
        self,
        key: MarkerKey,
        action: Callable[[], Awaitable[T]],
        result_writes: Callable[[T], Sequence[Write]],
        is_final_failure: Callable[[Exception], bool],
    ) -> GuardResult[T]:
        mode = ConsistencyMode.RELAXED_WITH_DEDUP
        # A plain read first: a stale "no marker" only runs a duplicate (the mode's
        # trade-off), whose commit the IF then refuses. But a plain read may also lag an
        # Accord *delete*: an admin restore removes a FAILED marker in its unfreeze
        # transaction, whose outcome we hear before a replica wrote the tombstone to
        # Cassandra. Skipping on that stale FAILED would freeze the restored saga again, so
        # a final state is skipped on only once an Accord read confirms it.
        rows = await self.cql.execute(self._statement("read"), key.params(), row_limit=1)
        state = rows[0]["execution_state"] if rows else None
        final = MarkerSnapshot(state, None).final if state else None
        if final is not None:
            state = await self._marker(key)
            final = MarkerSnapshot(state, None).final if state else None
        if final is not None:
            return GuardResult(_SKIP[final], None, mode)
        try:
            value = await action()
        except Exception as error:
            if is_final_failure(error):
                await self.runner.submit(
                    self._marker_part(key, "no marker", expect=None, write=MarkerState.FAILED.value)
                )
            raise
        for part in self._result_parts(result_writes(value)):
            await self.runner.submit(part)
        committed = MarkerState.COMMITTED.value
        if current_change() is None:
            await self.runner.submit(
                self._marker_part(key, "no marker", expect=None, write=committed)
            )
        else:
            # In the step's state change, whose tryout part appends at the index the history
            # was read at [index free]: a second record of this invocation is refused by that
            # condition already (every record writes marker and tryout in one transaction, and
            # an index is written once), so the marker's own [no marker] would only add a read.
            await self.runner.submit(self._marker_write(key, committed))
        return GuardResult(GuardOutcome.EXECUTED, value, mode)

    def _marker_write(self, key: MarkerKey, state: str) -> Part:
        ks, pk, step = self.keyspace, self._pk(key), (key.step_id,)

        def build(txn: Any, tag: str) -> None:
            txn.update(ks, MARKERS, pk, step, execution_state=state)

        return Part(f"marker {state}", build)

    # STRICT: the base class's flow (WriteProtection._run_strict) with Accord's three steps.

    async def _after_failure(self, key: MarkerKey, holder: str, target: MarkerState | None) -> None:
        if target is None:
            await self._drop_lease(key, holder)
            return
        # In the failure's state change: FAILED only while the lease is still ours.
        await self.runner.submit(
            self._marker_part(key, "lease still ours", expect=holder, write=target.value)
        )

    async def _claim_epoch(
        self, key: MarkerKey, range_epoch: int, fence: Callable[[], str | None] | None
    ) -> None:
        """No epoch row here: the marker lease's take (:meth:`_acquire`) and the step's state
        change both carry the epoch condition itself (:meth:`AccordEventStore.fence_part`)."""
        return

    async def _commit_strict(
        self,
        key: MarkerKey,
        holder: str,
        policy: ProtectionPolicy,
        writes: Sequence[Write],
        range_epoch: int | None = None,
    ) -> None:
        """Into the step's state change: the result, and COMMITTED while the lease is ours.
        If the change is refused (a fence, say), none of it landed and this attempt will not
        commit again, so its lease is dropped at once: the next holder need not wait out the
        TTL. The drop is conditional on the lease still being ours, so it deletes nothing if
        the marker did reach COMMITTED (a copy of the change that applied after all)."""
        change = current_change()
        if change is not None:
            change.undo_on_refused.append(lambda: self._drop_lease(key, holder))
        for part in self._result_parts(writes):
            await self.runner.submit(part)
        await self.runner.submit(
            self._marker_part(
                key, "lease still ours", expect=holder, write=MarkerState.COMMITTED.value
            )
        )

    async def _acquire(
        self, key: MarkerKey, holder: str, policy: ProtectionPolicy
    ) -> tuple[MarkerState | None, int]:
        """(None, waits) once we hold the lease; (final state, waits) if the step is done."""
        waits = 0
        lease = self._marker_part(
            key, "no marker", expect=None, write=holder, ttl=policy.lease_seconds
        )
        fence = _fence_of(current_change())
        while True:
            # Its own transaction, now: the lease must be held before the step runs. Fenced
            # (a Retry-Node's dispatch), under the step's epoch condition too: a take sent
            # after the range moved on is refused, so the step does not run at all.
            outcome = await self.runner.now_or_refused(lease, fence)
            if fence is not None and fence.held is not None and not fence.held(outcome, "p1_"):
                mine = outcome.rows.get("p0_m")
                if mine is not None and mine.get("execution_state") == holder:
                    await self._drop_lease(key, holder)  # an earlier copy took it after all
                raise LeaseFenceRefusedError(
                    f"{key.transaction} step {key.step_id}: marker lease refused by the range "
                    f"lease's epoch condition ({fence.what}); the step is not run"
                )
            row = outcome.rows.get("p0_m")
            if outcome.applied or (row is not None and row.get("execution_state") == holder):
                return None, waits
            state = "" if row is None else str(row.get("execution_state"))
            snapshot = MarkerSnapshot(state, None)
            if snapshot.final is not None:
                return snapshot.final, waits
            if waits >= self.lease_waits_max:
                raise LeaseBusyError(
                    f"{key.transaction} step {key.step_id}: lease still held after {waits} waits"
                )
            waits += 1
            # The sidecars do not serve TTL(): wait out a whole lease (seed: "retry after TTL").
            logger.info(
                "lease busy: txn=%s step=%s holder=%s wait=%d/%d",
                key.transaction,
                key.step_id,
                state,
                waits,
                self.lease_waits_max,
            )
            await self._sleep(policy.lease_seconds + TTL_SLACK_SECONDS)

    async def _drop_lease(self, key: MarkerKey, holder: str) -> None:
        """Best effort, on its own: a lease left behind expires by its TTL."""
        try:
            await self.runner.now_or_refused(
                self._marker_part(key, "lease still ours", expect=holder, write=None)
            )
        except StackSagaError as exc:
            logger.warning(
                "txn=%s step=%s: lease not dropped (%s)", key.transaction, key.step_id, exc
            )
