"""Write protection: run a step invocation's business logic at most once per marker.

Theory of operation (seed Part 3)
---------------------------------
Each step invocation has one row in es_execution_markers, keyed by the transaction's partition
key and ``step_id`` (``<step>:<EXECUTE|COMPENSATE>``, :func:`stacksaga_store.store.states.step_id`).

STRICT (Cassandra LWT, Paxos):

1. ``INSERT ... execution_state = 'LEASED:<holder>' IF NOT EXISTS USING TTL <lease>``.
   The seed's three outcomes:

   * applied: this worker holds the lease; go on;
   * the row exists with a TTL (a live ``LEASED:*`` lease): another worker is running the step;
     read the remaining TTL (SERIAL read) and retry after it, at most ``lease_waits_max`` times
     (then :class:`~stacksaga_store.errors.LeaseBusyError`, retryable);
   * the row exists without a TTL (``COMMITTED``, or the extension ``FAILED``): the step is done;
     skip the business logic.

2. Run the business logic, then write the step's result (the es_transaction status/payload).
3. Commit: ``UPDATE ... SET execution_state = 'COMMITTED' IF execution_state = 'LEASED:<holder>'``.
   The rewritten cell has no TTL, so the marker becomes permanent. The condition is a fencing
   check the seed lacks: if our lease expired and another worker took the step over, the commit
   is refused and :class:`~stacksaga_store.errors.LeaseLostError` says so instead of two workers
   both "committing". A retryable failure deletes the lease (``DELETE ... IF`` ours) so the retry
   need not wait for the TTL; a permanent failure rewrites it to ``FAILED``.

Epoch fence (a Retry-Node's resume under a coordinator's lease, STRICT). The transaction's
partition of es_execution_markers holds one more row, ``step_id`` :data:`EPOCH_ROW` (no
step's id: those all end in ``:EXECUTE``/``:COMPENSATE``), whose state names the highest
range-lease epoch any resume of this transaction has run under (``EPOCH:<20 digits>``, so
text order is number order). After its marker lease is acquired and before the business logic
runs, a fenced attempt *claims* the row: ``UPDATE ... IF execution_state <= <its epoch>``
(``INSERT ... IF NOT EXISTS`` the first time). A row past its epoch means a node of a later
epoch resumed the transaction, so the range moved: the attempt drops its marker lease, runs
nothing and raises :class:`~stacksaga_store.errors.LeaseFenceRefusedError`, whatever its own
lease clock says. Its commit is one conditional batch: the marker ``IF`` the lease is ours
*and* the epoch row ``IF`` it still holds the attempt's epoch, so a commit sent after a later
node claimed the transaction is refused too. What stays unfenced: the step's result writes
(plain, before the commit, as above), and a node that pauses *after* its claim and before its
business logic runs it once more (its commit is then refused).

If the holder dies between 1 and 3, the lease expires after its TTL and the next delivery
acquires it and completes the step. The result is written before the commit for the same
reason: a marker is only ever COMMITTED after the result it vouches for is durable.

RELAXED_WITH_DEDUP (no Paxos):

1. Read the marker at the read consistency level; if it is COMMITTED (or FAILED), skip.
2. Run the business logic.
3. One LOGGED batch: the step's result and ``execution_state = 'COMMITTED'`` (no TTL).

Two workers that read "no marker" at the same moment both run the step; the seed accepts that
for steps that are idempotent by design. With quorum reads and writes, a worker that reads
after a batch was acknowledged sees its marker, so the logic never runs after a commit.

Every LWT whose answer is lost (timeout) is resolved by a SERIAL read of the marker, which
finishes any in-flight Paxos round first; ``LEASED:<holder>`` carries a random holder id so
the reader can tell its own lease from another's. A domain's mode must not change while its
transactions are in flight: mixing LWT and plain writes on one marker breaks the guarantees.
Cancellation (``CancelledError``) leaves a STRICT lease to expire on its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from stacksaga_store.config.settings import ConsistencyMode, ProtectionPolicy
from stacksaga_store.errors import (
    LeaseBusyError,
    LeaseFencedError,
    LeaseFenceRefusedError,
    LeaseLostError,
    StackSagaError,
    check_state,
)
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind, StoreUnavailableError
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.states import LEASE_PREFIX, MarkerState

__all__ = [
    "EPOCH_ROW",
    "GuardOutcome",
    "GuardResult",
    "MarkerKey",
    "MarkerSnapshot",
    "WriteProtection",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Write = tuple[Prepared, Sequence[Any]]

# A SERIAL read or LWT can time out under Paxos contention (many deliveries of one step at
# once). A few jittered retries ride that out; more would only add load to a hot partition.
CONTENTION_RETRIES_MAX = 5
CONTENTION_BACKOFF_SECONDS = (0.05, 0.25)
# Cassandra expires a TTL at whole-second granularity; wait this much past the reported TTL.
TTL_SLACK_SECONDS = 1.0
# The marker partition's row naming the latest range-lease epoch a resume ran under (module
# docstring, "Epoch fence"). No step's id: those always end in ":EXECUTE" or ":COMPENSATE".
EPOCH_ROW = "range-epoch"
EPOCH_PREFIX = "EPOCH:"
EPOCH_DIGITS = 20
CLAIM_ATTEMPTS_MAX = 4


def epoch_text(epoch: int) -> str:
    """An epoch as the epoch row stores it: fixed width, so text order is number order."""
    check_state(0 <= epoch < 10**EPOCH_DIGITS, f"epoch {epoch} out of range")
    return f"{EPOCH_PREFIX}{epoch:0{EPOCH_DIGITS}d}"


class GuardOutcome(StrEnum):
    EXECUTED = "EXECUTED"
    ALREADY_COMMITTED = "ALREADY_COMMITTED"
    ALREADY_FAILED = "ALREADY_FAILED"


@dataclass(frozen=True, slots=True)
class MarkerKey:
    transaction: TransactionKey
    step_id: str

    def params(self) -> list[object]:
        return [*self.transaction.params(), self.step_id]


@dataclass(frozen=True, slots=True)
class MarkerSnapshot:
    """A marker as read: its state and remaining TTL in seconds (None: no TTL, permanent)."""

    state: str
    ttl_seconds: int | None

    @property
    def final(self) -> MarkerState | None:
        if self.state in (MarkerState.COMMITTED.value, MarkerState.FAILED.value):
            return MarkerState(self.state)
        return None


@dataclass(frozen=True, slots=True)
class GuardResult(Generic[T]):
    """What happened to one delivery of a step invocation."""

    outcome: GuardOutcome
    value: T | None
    mode: ConsistencyMode
    lease_waits: int = 0


_SKIP = {
    MarkerState.COMMITTED: GuardOutcome.ALREADY_COMMITTED,
    MarkerState.FAILED: GuardOutcome.ALREADY_FAILED,
}


def strict_holder(key: MarkerKey, fence: Callable[[], str | None] | None) -> tuple[str, str | None]:
    """A STRICT attempt's lease holder (``LEASED:<id>[@<epoch>]``) and the range lease's epoch
    it starts under; :class:`LeaseFencedError` if the fence is already lost. Both modes'
    protections."""
    holder_id = f"{LEASE_PREFIX}{uuid.uuid4().hex}"
    epoch = fence() if fence is not None else None
    if fence is not None and epoch is None:
        raise LeaseFencedError(f"{key.transaction} step {key.step_id}: range lease gone")
    return (holder_id if epoch is None else f"{holder_id}@{epoch}"), epoch


def range_moved(
    key: MarkerKey, fence: Callable[[], str | None] | None, epoch: str | None
) -> LeaseLostError | None:
    """After the step ran: the error to raise (once the attempt's lease is dropped) if the
    range lease moved meanwhile, else None."""
    if fence is None:
        return None
    now_epoch = fence()
    if now_epoch == epoch:
        return None
    return LeaseLostError(
        f"{key.transaction} step {key.step_id}: the range lease moved while the step "
        f"ran (epoch {epoch} -> {now_epoch}); not committed"
    )


class WriteProtection:
    """Runs actions under STRICT or RELAXED_WITH_DEDUP markers. Call :meth:`prepare` first."""

    def __init__(
        self,
        cql: CqlSession,
        keyspace: str,
        *,
        lease_waits_max: int = 3,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        check_state(lease_waits_max >= 0, "lease_waits_max must be >= 0")
        self.cql = cql
        self.keyspace = keyspace
        self.lease_waits_max = lease_waits_max
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._statements: dict[str, Prepared] = {}

    async def prepare(self) -> None:
        table = f"{self.keyspace}.es_execution_markers"
        where = (
            "region = ? AND cluster = ? AND service_name = ? AND transaction_id = ? AND step_id = ?"
        )
        columns = "region, cluster, service_name, transaction_id, step_id, execution_state"
        specs = {
            "acquire": (
                f"INSERT INTO {table} ({columns}) VALUES (?, ?, ?, ?, ?, ?) "
                "IF NOT EXISTS USING TTL ?",
                StatementKind.LWT,
            ),
            "finish": (
                f"UPDATE {table} SET execution_state = ? WHERE {where} IF execution_state = ?",
                StatementKind.LWT,
            ),
            "claim": (
                f"UPDATE {table} SET execution_state = ? WHERE {where} IF execution_state <= ?",
                StatementKind.LWT,
            ),
            "create": (
                f"INSERT INTO {table} ({columns}) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
                StatementKind.LWT,
            ),
            "release": (
                f"DELETE FROM {table} WHERE {where} IF execution_state = ?",
                StatementKind.LWT,
            ),
            "inspect": (
                f"SELECT execution_state, TTL(execution_state) AS ttl FROM {table} WHERE {where}",
                StatementKind.SERIAL_READ,
            ),
            "read": (f"SELECT execution_state FROM {table} WHERE {where}", StatementKind.READ),
            "delete": (f"DELETE FROM {table} WHERE {where}", StatementKind.WRITE),
            "mark": (
                f"INSERT INTO {table} ({columns}) VALUES (?, ?, ?, ?, ?, ?)",
                StatementKind.WRITE,
            ),
        }
        for name, (cql, kind) in specs.items():
            self._statements[name] = await self.cql.prepare(
                cql, kind=kind, table="es_execution_markers"
            )

    def _statement(self, name: str) -> Prepared:
        statement = self._statements.get(name)
        if statement is None:
            raise StackSagaError("WriteProtection.prepare() was not awaited")
        return statement

    async def run(
        self,
        key: MarkerKey,
        policy: ProtectionPolicy,
        action: Callable[[], Awaitable[T]],
        *,
        result_writes: Callable[[T], Sequence[Write]],
        is_final_failure: Callable[[Exception], bool],
        fence: Callable[[], str | None] | None = None,
        epoch: int | None = None,
    ) -> GuardResult[T]:
        """Run ``action`` unless the marker says the invocation is done.

        ``result_writes(value)`` are the step's result statements (plain writes), made durable
        before (STRICT) or together with (RELAXED) the COMMITTED marker. If ``action`` raises,
        the marker becomes FAILED when ``is_final_failure(error)``, else the attempt leaves no
        trace, and the error propagates.

        ``fence()`` (a Retry-Node's dispatch) names the range lease's epoch while it holds, None
        once lost. STRICT writes it into the marker lease (``LEASED:<holder>@<epoch>``, which
        the commit's ``IF`` names) and checks it again after the step, before the result writes:
        a holder whose range moved while the step ran (lease lost or another epoch) writes
        nothing, drops its marker lease and gets :class:`LeaseLostError`. The check is on the
        node's own lease clock (the coordinator hands the range on only after that lease ended,
        plus a margin); a commit sent after a new holder took the marker is refused by the IF.

        ``epoch`` (the lease's epoch, when the coordinator persists it): STRICT claims the
        transaction's epoch row for it before the step runs and commits only while the row
        still holds it (module docstring, "Epoch fence"); a later epoch's claim refuses the
        attempt with :class:`LeaseFenceRefusedError`.
        """
        if policy.mode is ConsistencyMode.STRICT:
            return await self._run_strict(
                key, policy, action, result_writes, is_final_failure, fence, epoch
            )
        return await self._run_relaxed(key, action, result_writes, is_final_failure)

    async def reset_failed(self, key: MarkerKey, policy: ProtectionPolicy) -> bool:
        """Remove a FAILED marker so an admin restore can run the invocation again.

        Never touches a COMMITTED marker or a live lease. Uses the domain's own write path
        (LWT under STRICT, plain under RELAXED) so the marker is never written both ways.
        """
        if policy.mode is ConsistencyMode.STRICT:
            current = await self._inspect(key)
            if current is None or current.final is not MarkerState.FAILED:
                return False
            return await self._finish_delete(key, MarkerState.FAILED.value)
        rows = await self.cql.execute(self._statement("read"), key.params(), row_limit=1)
        if not rows or rows[0]["execution_state"] != MarkerState.FAILED.value:
            return False
        await self.cql.execute(self._statement("delete"), key.params())
        return True

    async def _finish_delete(self, key: MarkerKey, expected: str) -> bool:
        try:
            rows = await self._with_contention_retries(
                self._statement("release"), [*key.params(), expected]
            )
        except StoreUnavailableError as exc:
            if not exc.outcome_unknown:
                raise
            return await self._inspect(key) is None
        return bool(rows[0]["[applied]"])

    # -- RELAXED_WITH_DEDUP ---------------------------------------------------------------------

    async def _run_relaxed(
        self,
        key: MarkerKey,
        action: Callable[[], Awaitable[T]],
        result_writes: Callable[[T], Sequence[Write]],
        is_final_failure: Callable[[Exception], bool],
    ) -> GuardResult[T]:
        mode = ConsistencyMode.RELAXED_WITH_DEDUP
        rows = await self.cql.execute(self._statement("read"), key.params(), row_limit=1)
        state = rows[0]["execution_state"] if rows else None
        final = MarkerSnapshot(state, None).final if state else None
        if final is not None:
            return GuardResult(_SKIP[final], None, mode)
        try:
            value = await action()
        except Exception as error:
            if is_final_failure(error):
                await self.cql.execute(
                    self._statement("mark"), [*key.params(), MarkerState.FAILED.value]
                )
            raise
        marker = (self._statement("mark"), [*key.params(), MarkerState.COMMITTED.value])
        await self.cql.execute_batch([*result_writes(value), marker])
        return GuardResult(GuardOutcome.EXECUTED, value, mode)

    # -- STRICT ---------------------------------------------------------------------------------

    async def _run_strict(
        self,
        key: MarkerKey,
        policy: ProtectionPolicy,
        action: Callable[[], Awaitable[T]],
        result_writes: Callable[[T], Sequence[Write]],
        is_final_failure: Callable[[Exception], bool],
        fence: Callable[[], str | None] | None = None,
        range_epoch: int | None = None,
    ) -> GuardResult[T]:
        mode = ConsistencyMode.STRICT
        holder, epoch = strict_holder(key, fence)
        final, waits = await self._acquire(key, holder, policy)
        if final is not None:
            return GuardResult(_SKIP[final], None, mode, waits)
        if range_epoch is not None:
            try:
                await self._claim_epoch(key, range_epoch, fence)
            except LeaseFencedError:
                await self._after_failure(key, holder, None)
                raise
        try:
            value = await action()
        except Exception as error:
            target = MarkerState.FAILED if is_final_failure(error) else None
            await self._after_failure(key, holder, target)
            raise
        moved = range_moved(key, fence, epoch)
        if moved is not None:
            await self._after_failure(key, holder, None)
            raise moved
        await self._commit_strict(key, holder, policy, result_writes(value), range_epoch)
        return GuardResult(GuardOutcome.EXECUTED, value, mode, waits)

    async def _commit_strict(
        self,
        key: MarkerKey,
        holder: str,
        policy: ProtectionPolicy,
        writes: Sequence[Write],
        range_epoch: int | None = None,
    ) -> None:
        """The step's result, then our lease rewritten to COMMITTED if it is still ours (and,
        fenced, while the epoch row still holds our epoch: one conditional batch)."""
        for prepared, params in writes:
            await self.cql.execute(prepared, params)
        if range_epoch is not None:
            await self._commit_fenced(key, holder, policy, range_epoch)
            return
        if not await self._finish(key, holder, MarkerState.COMMITTED):
            raise LeaseLostError(
                f"{key.transaction} step {key.step_id}: the lease expired before the commit "
                f"(lease {policy.lease_seconds}s); another worker may have run it too"
            )

    # -- the epoch fence (module docstring) ----------------------------------------------------

    async def _claim_epoch(
        self, key: MarkerKey, range_epoch: int, fence: Callable[[], str | None] | None
    ) -> None:
        """Raise the transaction's epoch row to ``range_epoch``, or refuse the attempt if a
        later epoch claimed it (:class:`LeaseFenceRefusedError`). Checks the local lease once
        more first: the claim is the last check before the business logic runs."""
        if fence is not None and fence() is None:
            raise LeaseFencedError(f"{key.transaction} step {key.step_id}: range lease gone")
        row = MarkerKey(key.transaction, EPOCH_ROW).params()
        mine = epoch_text(range_epoch)
        for _ in range(CLAIM_ATTEMPTS_MAX):
            try:
                rows = await self._with_contention_retries(
                    self._statement("claim"), [mine, *row, mine]
                )
            except StoreUnavailableError as exc:
                if not exc.outcome_unknown:
                    raise
                rows = [{"[applied]": False, "execution_state": await self._epoch_state(key)}]
            if rows[0]["[applied]"]:
                return
            current = rows[0].get("execution_state")
            if current is None:
                # No row yet (the transaction's first fenced attempt): create it.
                try:
                    created = await self._with_contention_retries(
                        self._statement("create"), [*row, mine]
                    )
                except StoreUnavailableError as exc:
                    if not exc.outcome_unknown:
                        raise
                    created = [{"[applied]": await self._epoch_state(key) == mine}]
                if created[0]["[applied]"]:
                    return
                continue  # created meanwhile by another attempt: compare again
            if str(current) == mine:
                return  # a timed-out claim of ours (or an equal epoch's) that applied
            if str(current) > mine:
                raise LeaseFenceRefusedError(
                    f"{key.transaction} step {key.step_id}: resumed under range lease epoch "
                    f"{current.removeprefix(EPOCH_PREFIX).lstrip('0') or '0'} since; this "
                    f"attempt's epoch {range_epoch} is over, the step is not run"
                )
        raise StoreUnavailableError(
            f"{key.transaction}: epoch row not claimed after {CLAIM_ATTEMPTS_MAX} attempts",
            outcome_unknown=False,
        )

    async def _epoch_state(self, key: MarkerKey) -> str | None:
        current = await self._inspect(MarkerKey(key.transaction, EPOCH_ROW))
        return None if current is None else current.state

    async def _commit_fenced(
        self, key: MarkerKey, holder: str, policy: ProtectionPolicy, range_epoch: int
    ) -> None:
        """COMMITTED ``IF`` the lease is ours and the epoch row still holds our epoch."""
        finish = self._statement("finish")
        mine = epoch_text(range_epoch)
        batch = [
            (finish, [MarkerState.COMMITTED.value, *key.params(), holder]),
            (finish, [mine, *MarkerKey(key.transaction, EPOCH_ROW).params(), mine]),
        ]
        try:
            rows = await self.cql.execute_lwt_batch(batch)
        except StoreUnavailableError as exc:
            if not exc.outcome_unknown:
                raise
            # Resolved by the marker (a SERIAL read finishes the round): COMMITTED means the
            # batch applied, both conditions with it.
            current = await self._inspect(key)
            if current is not None and current.state == MarkerState.COMMITTED.value:
                return
            rows = [{"[applied]": False}]
        if rows and rows[0].get("[applied]"):
            return
        states = {row.get("step_id"): row.get("execution_state") for row in rows}
        epoch_now = states.get(EPOCH_ROW)
        if epoch_now is not None and str(epoch_now) != mine:
            await self._after_failure(key, holder, None)
            raise LeaseFenceRefusedError(
                f"{key.transaction} step {key.step_id}: a resume under a later range lease "
                f"epoch ({epoch_now}) claimed the transaction while the step ran "
                f"(epoch {range_epoch}); not committed"
            )
        raise LeaseLostError(
            f"{key.transaction} step {key.step_id}: the lease expired before the commit "
            f"(lease {policy.lease_seconds}s); another worker may have run it too"
        )

    async def _acquire(
        self, key: MarkerKey, holder: str, policy: ProtectionPolicy
    ) -> tuple[MarkerState | None, int]:
        """(None, waits) once we hold the lease; (final state, waits) if the step is done."""
        waits = 0
        # Each wait is followed by one attempt; an expiry between two reads costs one more.
        for _ in range(2 * self.lease_waits_max + 2):
            snapshot = await self._try_insert(key, holder, policy.lease_seconds)
            if snapshot is None:
                return None, waits
            if snapshot.final is not None:
                return snapshot.final, waits
            current = await self._inspect(key)
            if current is None:
                continue  # The lease expired since the insert was refused: try again now.
            if current.final is not None:
                return current.final, waits
            if waits >= self.lease_waits_max:
                break
            waits += 1
            # Wait out the holder's remaining TTL (seed: "back off and retry after TTL").
            remaining = current.ttl_seconds if current.ttl_seconds is not None else 0
            delay = min(remaining, policy.lease_seconds) + TTL_SLACK_SECONDS
            logger.info(
                "lease busy: txn=%s step=%s holder=%s ttl=%ss wait=%d/%d",
                key.transaction,
                key.step_id,
                current.state,
                remaining,
                waits,
                self.lease_waits_max,
            )
            await self._sleep(delay)
        raise LeaseBusyError(
            f"{key.transaction} step {key.step_id}: lease still held after {waits} waits"
        )

    async def _try_insert(self, key: MarkerKey, holder: str, ttl: int) -> MarkerSnapshot | None:
        """None if we now hold the lease, else the marker that was in the way."""
        params = [*key.params(), holder, ttl]
        try:
            rows = await self._with_contention_retries(self._statement("acquire"), params)
        except StoreUnavailableError as exc:
            if not exc.outcome_unknown:
                raise
            current = await self._inspect(key)
            if current is not None and current.state == holder:
                return None
            # Absent: our insert did not apply; report an empty lease so the caller re-reads.
            return current or MarkerSnapshot(state="", ttl_seconds=0)
        row = rows[0]
        if row["[applied]"]:
            return None
        return MarkerSnapshot(state=row.get("execution_state") or "", ttl_seconds=None)

    async def _inspect(self, key: MarkerKey) -> MarkerSnapshot | None:
        rows = await self._with_contention_retries(self._statement("inspect"), key.params())
        if not rows:
            return None
        return MarkerSnapshot(state=rows[0]["execution_state"], ttl_seconds=rows[0]["ttl"])

    async def _finish(self, key: MarkerKey, holder: str, target: MarkerState) -> bool:
        """Rewrite our lease to a permanent ``target``; False if the lease was no longer ours."""
        params = [target.value, *key.params(), holder]
        for _ in range(CONTENTION_RETRIES_MAX):
            try:
                rows = await self._with_contention_retries(self._statement("finish"), params)
            except StoreUnavailableError as exc:
                if not exc.outcome_unknown:
                    raise
                current = await self._inspect(key)
                if current is not None and current.state == holder:
                    continue  # The timed-out update did not apply; our lease is still there.
                return current is not None and current.state == target.value
            return bool(rows[0]["[applied]"])
        raise StoreUnavailableError(
            f"{key.transaction} step {key.step_id}: could not record {target.value}",
            outcome_unknown=True,
        )

    async def _after_failure(self, key: MarkerKey, holder: str, target: MarkerState | None) -> None:
        """FAILED for a permanent failure; drop the lease for a retryable one. Never raises
        over the step's own error: a lease left behind simply expires."""
        try:
            if target is not None:
                if not await self._finish(key, holder, target):
                    logger.warning(
                        "txn=%s step=%s: lease lost before FAILED was recorded",
                        key.transaction,
                        key.step_id,
                    )
                return
            await self._with_contention_retries(self._statement("release"), [*key.params(), holder])
        except StoreUnavailableError as exc:
            logger.warning(
                "txn=%s step=%s: could not update the marker after a failure (%s); "
                "the lease expires on its own",
                key.transaction,
                key.step_id,
                exc,
            )

    async def _with_contention_retries(
        self, prepared: Prepared, params: Sequence[Any]
    ) -> list[dict[str, Any]]:
        """Retry a Paxos statement that failed *without* side effects (Unavailable, a SERIAL
        read timing out). A write with an unknown outcome is returned to the caller."""
        for attempt in range(CONTENTION_RETRIES_MAX + 1):
            try:
                return await self.cql.execute(prepared, params, row_limit=1)
            except StoreUnavailableError as exc:
                if exc.outcome_unknown or attempt == CONTENTION_RETRIES_MAX:
                    raise
                await self._sleep(self._rng.uniform(*CONTENTION_BACKOFF_SECONDS))
        raise StoreUnavailableError("contention retries exhausted", outcome_unknown=False)
