"""Commit modes: how a restore watchdog's directory rows and its transaction agree after a crash.

Theory of operation
-------------------
A saga's restore watchdog lives in two places that no single Cassandra write covers: the
Tier-5 row in its odd bucket (plus Tiers 1-4 above it), and the transaction's own record of
it (``es_transaction.restore_*``). A crash between the two writes must never orphan a saga, i.e.
leave a non-final transaction without a live watchdog. Two modes, chosen by
``stacksaga.cassandra.recovery.commit-mode``:

``ordered`` (no Accord; the seed's writes, put in an order that is safe at every crash point)
    ========================  ==============================================================
    when                      order and why a crash in between is harmless
    ========================  ==============================================================
    saga start                Tier 1-4 (once per bucket), Tier-5 watchdog row, *then*
                              es_transaction. A crash after the watchdog leaves a row whose
                              transaction does not exist: restore pickup reads no
                              es_transaction and deletes the row.
    transient failure         the retry pointer, *then* the failed tryout and the status
                              FAILED_WITH_RETRYABLE_ERROR. A crash before the pointer is a
                              crash mid-step (the watchdog restores the saga); after it, the
                              pointer resumes the saga at W+1 whatever its status says.
    completion                the final status, *then* the watchdog delete. A crash in between
                              leaves a watchdog of a finished saga: pickup reads the status
                              (final) and deletes the row, never re-runs it.
    restore pickup            a *new* watchdog (Tier 5, then es_transaction.restore_*), then
                              re-invoke; the old row goes with its bucket. The saga is covered
                              by a watchdog at every instant.
    ========================  ==============================================================

``accord`` (the watchdog's liveness commits atomically through the Accord sidecars)
    Accord can only write tables whose partitions are single rows, and such tables must be
    written *only* through Accord (the sidecars' write timestamps come from Accord's
    executeAt, which no plain write may mix with). Tiers 1-5 are clustered and es_transaction
    is written by the event store with plain writes (and holds ``timestamp`` columns the
    sidecars cannot type), so neither can move into Accord. Instead two single-row tables in
    a keyspace of their own (``<keyspace>_accord``, served by the sidecars and written by
    nothing else) hold what the watchdog *means*:

    * ``es_watchdog_ledger`` (one row per transaction with a live watchdog): the watchdog's
      path, i.e. the es_transaction.restore_* columns, authoritative in this mode;
    * ``es_watchdog_bucket_live`` (one row per odd bucket): how many live watchdogs it holds.

    Every change of a watchdog is *one* Accord transaction over both partitions:

    * arm (saga start): ``IF ledger IS NULL``: ledger := path, bucket.live += 1;
    * release (completion, freeze, quarantine): ``IF ledger = path``: delete ledger,
      bucket.live -= 1. No Tier-5 cell is deleted, so odd buckets carry no cell tombstones;
    * move (restore pickup re-arms): ``IF ledger = old``: ledger := new, old.live -= 1,
      new.live += 1: the saga is never without a watchdog and never has two.

    The Tier 1-5 rows stay plain writes, written *before* the Accord transaction: they are
    the index a Retry-Node walks; the ledger says whether an index row is live. So a crash
    before the commit leaves an index row without a ledger (pickup skips it, no status read),
    and a crash after it leaves a ledger whose es_transaction is missing (pickup releases it).
    A Retry-Node drops an odd bucket whose live count is 0 *without reading it*: zero
    tombstones read for restore buckets whose sagas all finished, which is the common case.
    Retry pointers (even buckets) are the same in both modes: they are never deleted one by
    one, so they make no tombstones, and the watchdog already covers their crash window.

    Each Accord transaction is idempotent under its condition, so a call whose outcome is
    unknown (timeout, sidecar crash) is simply sent again (:class:`AccordGateway`). Plain CQL
    reads of the two tables are safe where this module uses them: the ledger is read at a
    restore window, ``delay-windows`` after it was written, and a stale live count can only
    be too high (it makes a reader look at a bucket it could have skipped).

:class:`CrashPoints` lets tests stop a writer at each boundary above (a *simulated crash*: the
process's memory is abandoned, nothing after the point runs).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from stacksaga_store.config.settings import CommitModeName
from stacksaga_store.errors import (
    InvariantViolation,
    StackSagaError,
    check_not_none,
    check_state,
)
from stacksaga_store.recovery.directory import BucketRef, Directory, DirectoryScope
from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.store.cql import CqlSession, Prepared, StatementKind
from stacksaga_store.store.model import RestorePath, TransactionKey

__all__ = [
    "ACCORD_COMMIT_ATTEMPTS_MAX",
    "AccordCommit",
    "AccordGateway",
    "CommitMode",
    "CommitModeName",
    "CrashPoint",
    "CrashPoints",
    "OrderedCommit",
    "SimulatedCrash",
    "WatchdogLiveness",
    "bucket_of",
    "path_of",
]

logger = logging.getLogger(__name__)

ACCORD_COMMIT_ATTEMPTS_MAX = 8
ACCORD_RETRY_SECONDS = (0.05, 1.0)
LEDGER_TABLE = "es_watchdog_ledger"
BUCKET_LIVE_TABLE = "es_watchdog_bucket_live"


class WatchdogLiveness(StrEnum):
    LIVE = "LIVE"  # this row is the transaction's current watchdog
    GONE = "GONE"  # released or moved: the row is an index leftover
    UNKNOWN = "UNKNOWN"  # the mode cannot tell; decide by the transaction's status


# -- crash injection -----------------------------------------------------------------------


class CrashPoint(StrEnum):
    """Boundaries between the writes of a commit (see the module docstring's tables)."""

    WATCHDOG_INDEXED = "watchdog-indexed"  # Tier 1-5 written; accord: ledger not committed
    WATCHDOG_ARMED = "watchdog-armed"  # watchdog complete; es_transaction not written
    RETRY_BEFORE_POINTER = "retry-before-pointer"  # step failed; nothing of it written yet
    RELEASE_BEFORE = "release-before"  # final status written; watchdog still there
    REARM_BEFORE_RESUME = "rearm-before-resume"  # restore pickup re-armed; not re-invoked


class SimulatedCrash(BaseException):
    """Raised at an armed :class:`CrashPoint`. A BaseException so no ``except Exception`` in
    the code under test can swallow it: like a SIGKILL, nothing after the point runs."""

    def __init__(self, point: CrashPoint) -> None:
        super().__init__(f"simulated crash at {point.value}")
        self.point = point


class CrashPoints:
    """Armed points fire once each. Production code holds an empty instance."""

    def __init__(self, *points: CrashPoint) -> None:
        self._armed = set(points)
        self.fired: list[CrashPoint] = []

    def arm(self, point: CrashPoint) -> None:
        self._armed.add(point)

    def hit(self, point: CrashPoint) -> None:
        if point in self._armed:
            self._armed.discard(point)
            self.fired.append(point)
            raise SimulatedCrash(point)


# -- paths ---------------------------------------------------------------------------------


def path_of(bucket: BucketRef, windows: WindowMath) -> RestorePath:
    """The es_transaction.restore_* value of a watchdog row in ``bucket``."""
    check_state(bucket.bucket_index % 2 == 1, "a watchdog lives in an odd bucket")
    return RestorePath(
        date_of_year=bucket.window.date_of_year,
        window=windows.minute_of_day(bucket.window),
        instance_id=bucket.instance_id,
        bucket=bucket.bucket_index,
    )


def bucket_of(path: RestorePath, windows: WindowMath) -> BucketRef:
    return BucketRef(
        windows.from_key(path.date_of_year, path.window), path.instance_id, path.bucket
    )


class CommitMode(Protocol):
    """What the writer and the Retry-Node need from a mode. Every method is idempotent."""

    name: ClassVar[CommitModeName]

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """Once per odd bucket a writer opens, after its Tier 1-4 rows."""
        ...

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        """After the Tier-5 watchdog row of a new transaction is written."""
        ...

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        """The transaction ended (or was parked): its watchdog must not fire."""
        ...

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        """A restore pickup re-armed the watchdog at ``new`` (its Tier-5 row is written)."""
        ...

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        """Is the watchdog row at ``path`` the transaction's live watchdog?"""
        ...

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        """Live watchdogs in an odd bucket, or None when the mode does not count them."""
        ...

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        """After a Retry-Node dropped the bucket's Tier-5 partition and Tier-4 row."""
        ...


class OrderedCommit:
    """No Accord: the Tier-5 row *is* the watchdog; the writes are ordered (module doc)."""

    name: ClassVar[CommitModeName] = CommitModeName.ORDERED

    def __init__(self, directory: Directory, scope: DirectoryScope) -> None:
        self.directory = directory
        self.scope = scope

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        return None

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        # The seed's O(1) delete: one row of the odd partition, by its full primary key.
        bucket = bucket_of(path, self.directory.windows)
        await self.directory.delete_entry(self.scope, bucket, key.transaction_id)

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        # The old row is dropped with its bucket once the Retry-Node dispatched all of it.
        return None

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        return WatchdogLiveness.UNKNOWN

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        return None

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        return None


# -- accord ----------------------------------------------------------------------------------


class AccordCommitError(StackSagaError):
    """An Accord transaction was refused for good (a bug or a misconfigured sidecar) or did
    not get an answer after :data:`ACCORD_COMMIT_ATTEMPTS_MAX` attempts."""

    retryable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class AccordOutcome:
    applied: bool
    rows: dict[str, dict[str, object] | None]


# Definite refusals that another sidecar, or the same one a moment later, may accept.
RETRIED_DEFINITE_CODES = ("RESOURCE_EXHAUSTED", "NOT_SENT")


class AccordGateway:
    """The sidecars' client API (``accord_cassandra.client.AsyncClient``) with failover.

    A transaction whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED), or that was
    refused for load (RESOURCE_EXHAUSTED) or never sent (NOT_SENT: the sidecar refused the
    connection), is sent again, to the next sidecar: every transaction this module builds
    is conditional, so a second copy of one that did commit is refused by its own
    condition and changes nothing.
    """

    def __init__(
        self, addresses: Sequence[str], *, token: str | None = None, timeout: float = 15.0
    ) -> None:
        check_state(bool(addresses), "the accord commit mode needs at least one sidecar")
        client_module = _sidecar_client()
        self._error_type: type[Exception] = client_module.TransactionError
        self._clients = [
            client_module.AsyncClient(a, token=token, timeout=timeout) for a in addresses
        ]
        self._next = 0
        self.transactions = 0
        self.retries = 0

    async def transact(self, build: Any) -> AccordOutcome:
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
            return AccordOutcome(result.applied, dict(result.rows))
        raise AccordCommitError(f"no accord outcome after {ACCORD_COMMIT_ATTEMPTS_MAX} attempts")

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


class AccordCommit:
    """Watchdog liveness in Accord-only single-row tables (module docstring)."""

    name: ClassVar[CommitModeName] = CommitModeName.ACCORD

    def __init__(
        self,
        *,
        gateway: AccordGateway,
        cql: CqlSession,
        accord_keyspace: str,
        windows: WindowMath,
    ) -> None:
        self.gateway = gateway
        self.cql = cql
        self.keyspace = accord_keyspace
        self.windows = windows
        self._statements: dict[str, Prepared] = {}

    async def prepare(self) -> None:
        ks = self.keyspace
        txn = "region = ? AND cluster = ? AND service_name = ? AND transaction_id = ?"
        bucket = (
            "region = ? AND cluster = ? AND service_name = ? AND date_of_year = ? AND "
            "minute_of_day = ? AND instance_id = ? AND bucket_index = ?"
        )
        specs = {
            "ledger": (
                f"SELECT restore_date, restore_window, restore_instance_id, restore_bucket "
                f"FROM {ks}.{LEDGER_TABLE} WHERE {txn}",
                LEDGER_TABLE,
            ),
            "live": (
                f"SELECT live FROM {ks}.{BUCKET_LIVE_TABLE} WHERE {bucket}",
                BUCKET_LIVE_TABLE,
            ),
        }
        for name, (text, table) in specs.items():
            self._statements[name] = await self.cql.prepare(
                text, kind=StatementKind.READ, table=table
            )

    # -- keys ------------------------------------------------------------------------------

    @staticmethod
    def _ledger_key(key: TransactionKey) -> list[object]:
        return [key.region, key.cluster, key.service_name, str(key.transaction_id)]

    def _live_key(self, scope: DirectoryScope, bucket: BucketRef) -> list[object]:
        return [
            *scope.params(),
            bucket.window.date_of_year,
            self.windows.minute_of_day(bucket.window),
            bucket.instance_id,
            bucket.bucket_index,
        ]

    def _path_live_key(self, key: TransactionKey, path: RestorePath) -> list[object]:
        scope = DirectoryScope(key.region, key.cluster, key.service_name)
        return self._live_key(scope, bucket_of(path, self.windows))

    def _transaction(self) -> Any:
        return _sidecar_client().Transaction()

    def _ledger_matches(self, ledger: Any, path: RestorePath) -> list[Any]:
        return [
            ledger["restore_date"] == path.date_of_year,
            ledger["restore_window"] == path.window,
            ledger["restore_instance_id"] == path.instance_id,
            ledger["restore_bucket"] == path.bucket,
        ]

    def _set_ledger(self, txn: Any, key: TransactionKey, path: RestorePath) -> None:
        txn.update(
            self.keyspace,
            LEDGER_TABLE,
            self._ledger_key(key),
            restore_date=path.date_of_year,
            restore_window=path.window,
            restore_instance_id=path.instance_id,
            restore_bucket=path.bucket,
        )

    # -- CommitMode --------------------------------------------------------------------------

    async def prepare_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        if bucket.bucket_index % 2 == 0:
            return  # retry buckets are not counted
        live_key = self._live_key(scope, bucket)

        def build() -> Any:
            txn = self._transaction()
            head = txn.let("head", self.keyspace, BUCKET_LIVE_TABLE, live_key)
            txn.where(head["live"].is_null())
            txn.update(self.keyspace, BUCKET_LIVE_TABLE, live_key, live=0)
            return txn

        # Not applied means the row exists already: fine either way.
        await self.gateway.transact(build)

    async def arm(self, key: TransactionKey, path: RestorePath) -> None:
        ledger_key, live_key = self._ledger_key(key), self._path_live_key(key, path)

        def build() -> Any:
            txn = self._transaction()
            ledger = txn.let("ledger", self.keyspace, LEDGER_TABLE, ledger_key)
            head = txn.let("head", self.keyspace, BUCKET_LIVE_TABLE, live_key)
            txn.where(ledger["restore_bucket"].is_null(), head["live"].not_null())
            self._set_ledger(txn, key, path)
            txn.update(self.keyspace, BUCKET_LIVE_TABLE, live_key, live=head["live"] + 1)
            return txn

        outcome = await self.gateway.transact(build)
        if outcome.applied:
            return
        current = _ledger_path(outcome.rows.get("ledger"))
        if current == path:
            return  # an earlier attempt of this very call committed
        check_state(
            outcome.rows.get("head") is not None, f"bucket counter of {path} was not prepared"
        )
        current = check_not_none(current, f"arm of {key} refused without a ledger row")
        # Re-armed while an older watchdog is still live (an admin restore of a transaction
        # whose watchdog was never released): move it, so one watchdog remains.
        await self.move(key, current, path)

    async def release(self, key: TransactionKey, path: RestorePath) -> None:
        for _ in range(2):
            ledger_key, live_key = self._ledger_key(key), self._path_live_key(key, path)

            def build(
                ledger_key: list[object] = ledger_key,
                live_key: list[object] = live_key,
                target: RestorePath = path,
            ) -> Any:
                txn = self._transaction()
                ledger = txn.let("ledger", self.keyspace, LEDGER_TABLE, ledger_key)
                head = txn.let("head", self.keyspace, BUCKET_LIVE_TABLE, live_key)
                txn.where(*self._ledger_matches(ledger, target), head["live"].not_null())
                txn.delete(self.keyspace, LEDGER_TABLE, ledger_key)
                txn.update(self.keyspace, BUCKET_LIVE_TABLE, live_key, live=head["live"] - 1)
                return txn

            outcome = await self.gateway.transact(build)
            if outcome.applied:
                return
            current = _ledger_path(outcome.rows.get("ledger"))
            if current is None or current == path:
                return  # already released (an earlier attempt, or a Retry-Node's pickup)
            # es_transaction still named an older path (a crash between a move and the
            # es_transaction update): release the watchdog the ledger says is live.
            path = current
        logger.warning("release of %s kept moving; the restore pickup will finish it", key)

    async def move(self, key: TransactionKey, old: RestorePath, new: RestorePath) -> None:
        check_state(old != new, "move to the same watchdog")
        ledger_key = self._ledger_key(key)
        old_key, new_key = self._path_live_key(key, old), self._path_live_key(key, new)

        def build() -> Any:
            txn = self._transaction()
            ledger = txn.let("ledger", self.keyspace, LEDGER_TABLE, ledger_key)
            old_head = txn.let("old", self.keyspace, BUCKET_LIVE_TABLE, old_key)
            new_head = txn.let("new", self.keyspace, BUCKET_LIVE_TABLE, new_key)
            txn.where(
                *self._ledger_matches(ledger, old),
                old_head["live"].not_null(),
                new_head["live"].not_null(),
            )
            self._set_ledger(txn, key, new)
            txn.update(self.keyspace, BUCKET_LIVE_TABLE, old_key, live=old_head["live"] - 1)
            txn.update(self.keyspace, BUCKET_LIVE_TABLE, new_key, live=new_head["live"] + 1)
            return txn

        outcome = await self.gateway.transact(build)
        if outcome.applied:
            return
        current = _ledger_path(outcome.rows.get("ledger"))
        if current == new:
            return  # an earlier attempt committed
        if current is None:
            # Released meanwhile (the transaction finished): arm the new one afresh.
            await self.arm(key, new)
            return
        raise AccordCommitError(f"{key}: watchdog is at {current}, not {old}; move refused")

    async def liveness(self, key: TransactionKey, path: RestorePath) -> WatchdogLiveness:
        rows = await self.cql.execute(
            self._statement("ledger"), self._ledger_key_cql(key), row_limit=1
        )
        current = _ledger_path(rows[0] if rows else None)
        return WatchdogLiveness.LIVE if current == path else WatchdogLiveness.GONE

    async def bucket_live(self, scope: DirectoryScope, bucket: BucketRef) -> int | None:
        if bucket.bucket_index % 2 == 0:
            return None
        rows = await self.cql.execute(
            self._statement("live"), self._live_key(scope, bucket), row_limit=1
        )
        if not rows or rows[0]["live"] is None:
            return None  # never prepared (crash before it): read the bucket
        return int(rows[0]["live"])

    async def retire_bucket(self, scope: DirectoryScope, bucket: BucketRef) -> None:
        if bucket.bucket_index % 2 == 0:
            return
        live_key = self._live_key(scope, bucket)

        def build() -> Any:
            txn = self._transaction()
            head = txn.let("head", self.keyspace, BUCKET_LIVE_TABLE, live_key)
            txn.where(head["live"] == 0)
            txn.delete(self.keyspace, BUCKET_LIVE_TABLE, live_key)
            return txn

        await self.gateway.transact(build)

    def _statement(self, name: str) -> Prepared:
        found = self._statements.get(name)
        if found is None:
            raise StackSagaError("AccordCommit.prepare() was not awaited")
        return found

    @staticmethod
    def _ledger_key_cql(key: TransactionKey) -> list[object]:
        return [key.region, key.cluster, key.service_name, key.transaction_id]


def _sidecar_client() -> Any:
    """``accord_cassandra.client``, imported on first use of the accord mode.

    Dynamically, for two reasons: the sidecar client (grpc) is only needed in this mode, and
    its generated gRPC code is untyped, which must not fail ``mypy --strict`` of this package
    (the import-linter contract allows stacksaga_store -> accord_cassandra.client only).
    """
    return importlib.import_module("accord_cassandra.client")


def _ledger_path(row: dict[str, object] | None) -> RestorePath | None:
    if row is None or row.get("restore_bucket") is None:
        return None
    window, bucket = row["restore_window"], row["restore_bucket"]
    if not (isinstance(window, int) and isinstance(bucket, int)):
        raise InvariantViolation(f"ledger restore path is not two ints: {window!r}, {bucket!r}")
    return RestorePath(
        date_of_year=str(row["restore_date"]),
        window=window,
        instance_id=str(row["restore_instance_id"]),
        bucket=bucket,
    )
