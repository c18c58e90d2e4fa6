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

The transactions themselves (the gateway to the sidecars, state changes, group commit,
retries, crash injection) are :mod:`stacksaga_store.store.accord_changes`; this module holds
what the accord mode writes and reads with them: es_transaction, tryouts and frozen rows
(:class:`AccordEventStore`) and the execution markers (:class:`AccordProtection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

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
from stacksaga_store.store.accord_changes import (
    ACCORD_COMMIT_ATTEMPTS_MAX,
    AccordChange,
    AccordCommitError,
    AccordGateway,
    AccordOutcome,
    ChangeRunner,
    CommitCrashes,
    Part,
    SimulatedCommitCrash,
    StateChangeConflict,
    after_commit,
    current_change,
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

# The state-change machinery's names are exported here too: the mode's one import.
__all__ = [
    "ACCORD_COMMIT_ATTEMPTS_MAX",
    "FENCE_PART",
    "SLICE_ROWS_MAX",
    "AccordChange",
    "AccordCommitError",
    "AccordEventStore",
    "AccordGateway",
    "AccordOutcome",
    "AccordProtection",
    "ChangeRunner",
    "CommitCrashes",
    "Part",
    "SimulatedCommitCrash",
    "StateChangeConflict",
    "after_commit",
    "current_change",
    "ms",
    "uuid_of",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Rows per Accord slice read: the sidecars' MAX_ROWS_PER_SLICE.
SLICE_ROWS_MAX = 1000
TRANSACTION = "es_transaction"
TRYOUT = "es_transaction_tryout"
FROZEN = "es_frozen_transaction"
MARKERS = "es_execution_markers"
RING_STATE = "es_ring_state"
# The part of a state change that fences it by its range lease's epoch (see fence_part).
FENCE_PART = "range lease still at"


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


def _fence_of(change: AccordChange | None) -> Part | None:
    """The epoch condition the open state change carries (a fenced dispatch), if any."""
    if change is None:
        return None
    return next((p for p in change.parts if p.guard and p.what.startswith(FENCE_PART)), None)


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
