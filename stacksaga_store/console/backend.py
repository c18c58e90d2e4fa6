"""What the console reads and does, independent of HTTP: the JSON-ready answers behind every
page (``app.py`` renders them as HTML and serves them under ``/api``).

Reads: a saga through the store's own read path (``runtime.events.read``, so the accord
mode's Accord reads too), its execution markers with one single-partition read, the recovery
directory walked tier by tier as ``directory show`` does (no scans), the ring's persisted
state (es_ring_state) and the coordinators' ``Status``, the sidecars' Prometheus text.
Search, counts, the frozen list and the live counters come from the census (``census.py``).

The one write is the admin restore, ``Orchestrator.admin_restore``: it needs the saga's
definition (``--sagas``) because it drives the saga again at once, as the Python call does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from accord_cassandra.tokens import MAX_TOKEN, MIN_TOKEN
from stacksaga_store.clock import Clock, SystemClock
from stacksaga_store.console.census import CensusRow, SagaCensus
from stacksaga_store.console.timeline import saga_timeline
from stacksaga_store.errors import StackSagaError, TransactionNotFoundError
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.windows import date_text, reader_grace
from stacksaga_store.saga.definition import SagaPayload, SagaPayloadError
from stacksaga_store.saga.orchestrator import Orchestrator
from stacksaga_store.store.cql import StatementKind
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.states import PARKED_STATUSES, RunningStatus

__all__ = ["ConsoleBackend", "NotFound", "SearchQuery", "Unavailable"]

logger = logging.getLogger(__name__)

PAGE_SIZE = 25
PAGE_MAX = 10_000
ROWS_COUNTED_PER_BUCKET_MAX = 100_000
DIRECTORY_NODES_MAX = 5_000
METRICS_FETCH_TIMEOUT = 2.0
METRICS_BYTES_MAX = 4 * 1024 * 1024
RING_STATE_ROWS_MAX = 1000


class NotFound(StackSagaError):
    """No such saga (or nothing to act on)."""


class Unavailable(StackSagaError):
    """The console cannot do this as configured (e.g. a restore without saga definitions)."""


@dataclass(frozen=True, slots=True)
class SearchQuery:
    transaction_id: uuid.UUID | None = None
    status: RunningStatus | None = None
    service: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    page: int = 1


@dataclass
class ConsoleBackend:
    engine: RecoveryEngine
    orchestrator: Orchestrator | None
    census: SagaCensus
    sidecars: tuple[str, ...] = ()
    recovery_metrics: tuple[str, ...] = ()
    clock: Clock = field(default_factory=SystemClock)
    census_max_age: float = 0.0  # searches see every write acknowledged before them
    # None: the settings' recovery.coordinator.addresses
    coordinators: tuple[str, ...] | None = None
    restores: list[dict[str, Any]] = field(default_factory=list)
    _markers: Any = None
    _previous_scrapes: dict[str, tuple[float, float]] = field(default_factory=dict)
    _ring_state: Any = None

    @property
    def settings(self) -> Any:
        return self.engine.runtime.settings

    @property
    def service(self) -> str:
        return str(self.settings.instance.service_name)

    async def prepare(self) -> None:
        cql, ks = self.engine.runtime.cql, self.engine.runtime.driver_config.keyspace
        self._markers = await cql.prepare(
            f"SELECT step_id, execution_state, TTL(execution_state) AS ttl "
            f"FROM {ks}.es_execution_markers WHERE region = ? AND cluster = ? "
            "AND service_name = ? AND transaction_id = ? LIMIT 1000",
            kind=StatementKind.READ,
            table="es_execution_markers",
        )
        try:
            self._ring_state = await cql.prepare(
                f"SELECT name, holder, term, epoch FROM {ks}.es_ring_state "
                f"WHERE region = ? AND cluster = ? LIMIT {RING_STATE_ROWS_MAX}",
                kind=StatementKind.READ,
                table="es_ring_state",
            )
        except Exception:  # noqa: BLE001 - the extension table is optional (schema apply makes it)
            logger.warning("es_ring_state is missing: the ring's persisted state is not shown")
        await self.census.prepare()

    def now(self) -> datetime:
        return self.clock.now()

    # -- search ------------------------------------------------------------------------------

    async def search(self, query: SearchQuery) -> dict[str, Any]:
        census = await self.census.fresh(self.census_max_age, self.now)
        rows: list[CensusRow] = list(census.rows.values())
        if query.transaction_id is not None:
            rows = [r for r in rows if r.transaction_id == query.transaction_id]
        if query.status is not None:
            rows = [r for r in rows if r.status is query.status]
        if query.service:
            rows = [r for r in rows if r.service_name == query.service]
        if query.since is not None:
            since = query.since
            rows = [r for r in rows if r.created_at >= since]
        if query.until is not None:
            until = query.until
            rows = [r for r in rows if r.created_at < until]
        rows.sort(key=lambda r: (r.created_at, str(r.transaction_id)), reverse=True)
        total = len(rows)
        pages = max(1, math.ceil(total / PAGE_SIZE))
        start = (query.page - 1) * PAGE_SIZE
        by_status: dict[str, int] = {}
        for row in rows:
            by_status[row.status.value] = by_status.get(row.status.value, 0) + 1
        return {
            "total": total,
            "page": query.page,
            "pages": pages,
            "page_size": PAGE_SIZE,
            "by_status": by_status,
            "census": {
                "taken_at": census.taken_at.isoformat(),
                "partial": census.partial,
                "scanned": census.scanned,
            },
            "services": census.services(),
            "results": [_row_json(r) for r in rows[start : start + PAGE_SIZE]],
        }

    async def find_service(self, transaction_id: uuid.UUID) -> str:
        """The service a transaction id belongs to (census), else this console's own."""
        census = await self.census.fresh(self.census_max_age, self.now)
        for service, tid in census.rows:
            if tid == transaction_id:
                return service
        return self.service

    # -- one saga ----------------------------------------------------------------------------

    async def saga(self, transaction_id: uuid.UUID, service: str | None) -> dict[str, Any]:
        service = service or await self.find_service(transaction_id)
        instance = self.settings.instance
        key = TransactionKey(instance.region, instance.cluster, service, transaction_id)
        try:
            view = await self.engine.runtime.events.read(key)
        except TransactionNotFoundError:
            raise NotFound(
                f"no saga {transaction_id} in {key.region}/{key.cluster}/{service}"
            ) from None
        rows = await self.engine.runtime.cql.execute(self._markers, key.params())
        markers = [
            {"step_id": r["step_id"], "state": r["execution_state"], "ttl_seconds": r["ttl"]}
            for r in rows
        ]
        try:
            payload: SagaPayload | None = SagaPayload.decode(view.record.payload)
        except SagaPayloadError:
            payload = None
        recovery = self.settings.cassandra.recovery
        timeline = saga_timeline(
            view,
            payload,
            markers,
            windows=self.engine.writer.windows,
            grace=reader_grace(recovery.read_grace),
            now=self.now(),
        )
        restorable = view.status in PARKED_STATUSES
        return {
            "transaction_id": str(transaction_id),
            "region": key.region,
            "cluster": key.cluster,
            "service": service,
            "status": view.status.value,
            "saga": payload.saga if payload else None,
            "steps": list(payload.steps) if payload else [],
            "aggregate": dict(payload.aggregate) if payload else {},
            "last_error": payload.last_error if payload else None,
            "created_at": view.record.created_at.isoformat(),
            "updated_at": view.record.updated_at.isoformat(),
            "frozen": (
                {"frozen_at": view.frozen.frozen_at.isoformat(), "reason": view.frozen.reason}
                if view.frozen
                else None
            ),
            "markers": markers,
            "restorable": restorable,
            "restore_available": restorable and self._can_restore(payload, service),
            "restores": [r for r in self.restores if r["transaction_id"] == str(transaction_id)],
            **timeline,
        }

    def _can_restore(self, payload: SagaPayload | None, service: str) -> bool:
        if self.orchestrator is None or payload is None or service != self.service:
            return False
        return any(saga.name == payload.saga for saga in self.orchestrator.sagas)

    # -- frozen + restore --------------------------------------------------------------------

    async def frozen(self, page: int) -> dict[str, Any]:
        census = await self.census.fresh(self.census_max_age, self.now)
        rows = sorted(
            (r for r in census.rows.values() if r.status in PARKED_STATUSES),
            key=lambda r: (r.updated_at, str(r.transaction_id)),
            reverse=True,
        )
        total = len(rows)
        chosen = rows[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        instance = self.settings.instance
        frozen_rows = await asyncio.gather(
            *(
                self.engine.runtime.events.read_frozen(
                    TransactionKey(
                        instance.region, instance.cluster, r.service_name, r.transaction_id
                    )
                )
                for r in chosen
            )
        )
        results = []
        for row, frozen in zip(chosen, frozen_rows, strict=True):
            item = _row_json(row)
            item["frozen_at"] = frozen.frozen_at.isoformat() if frozen else None
            item["reason"] = frozen.reason if frozen else None
            results.append(item)
        return {
            "total": total,
            "page": page,
            "pages": max(1, math.ceil(total / PAGE_SIZE)),
            "restore_enabled": self.orchestrator is not None,
            "results": results,
        }

    async def restore(self, transaction_id: uuid.UUID) -> dict[str, Any]:
        """Admin restore: FROZEN/QUARANTINED back to work, driven at once (as far as it goes)."""
        if self.orchestrator is None:
            raise Unavailable(
                "admin restore needs the saga definitions: start the console with --sagas"
            )
        view = await self.orchestrator.read(transaction_id)  # TransactionNotFoundError -> 404
        if view.status not in PARKED_STATUSES:
            raise Unavailable(
                f"saga {transaction_id} is {view.status.value}; only FROZEN or QUARANTINED "
                "sagas can be restored"
            )
        before = view.status.value
        started = self.now()
        try:
            outcome = await self.orchestrator.admin_restore(transaction_id)
            result = {"ok": True, "status": outcome.status.value, "error": outcome.last_error}
        except StackSagaError as exc:
            result = {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"}
        entry = {
            "transaction_id": str(transaction_id),
            "at": started.isoformat(),
            "before": before,
            **result,
        }
        self.restores.append(entry)
        del self.restores[:-1000]
        return entry

    # -- recovery directory ------------------------------------------------------------------

    async def directory(self, service: str | None) -> dict[str, Any]:
        engine = self.engine
        recovery = self.settings.cassandra.recovery
        windows = engine.writer.windows
        now = self.now()
        census = await self.census.fresh(self.census_max_age, self.now)
        services = sorted({self.service, *census.services()})
        chosen = [service] if service else services
        limit = windows.read_limit(now, reader_grace(recovery.read_grace))
        today = windows.window_at(now).day
        ahead = math.ceil(recovery.restore.delay_windows * windows.interval_minutes / 1440) + 1
        first = today - timedelta(days=recovery.retry.lookback_days)
        last = today + timedelta(days=ahead)
        instance = self.settings.instance
        out = []
        nodes = 0
        truncated = False
        for name in chosen:
            scope = DirectoryScope(instance.region, instance.cluster, name)
            days = []
            oldest_due: datetime | None = None
            totals = {"days": 0, "windows": 0, "instances": 0, "buckets": 0, "rows": 0}
            for day in await engine.directory.active_days(scope, date_text(first), date_text(last)):
                totals["days"] += 1
                day_windows = []
                for window in await engine.directory.windows_of_day(scope, day):
                    totals["windows"] += 1
                    due = window <= limit
                    instances = []
                    window_rows = 0
                    async for ref in engine.directory.instances(
                        scope, window, MIN_TOKEN, MAX_TOKEN
                    ):
                        nodes += 1
                        if nodes > DIRECTORY_NODES_MAX:
                            truncated = True
                            break
                        totals["instances"] += 1
                        buckets = []
                        for bucket in await engine.directory.buckets(scope, ref):
                            totals["buckets"] += 1
                            rows = 0
                            async for page in engine.directory.entries(scope, bucket):
                                rows += len(page)
                                if rows >= ROWS_COUNTED_PER_BUCKET_MAX:
                                    break
                            totals["rows"] += rows
                            window_rows += rows
                            live = await engine.commit.bucket_live(scope, bucket)
                            buckets.append(
                                {
                                    "bucket": bucket.bucket_index,
                                    "kind": bucket.kind.value,
                                    "rows": rows,
                                    "live": live,
                                }
                            )
                        instances.append(
                            {
                                "instance_id": ref.instance_id,
                                "token": ref.instance_id_token,
                                "buckets": buckets,
                            }
                        )
                    if due and instances and oldest_due is None:
                        oldest_due = windows.start(window)
                    day_windows.append(
                        {
                            "minute_of_day": windows.minute_of_day(window),
                            "start": windows.start(window).isoformat(),
                            "end": windows.end(window).isoformat(),
                            "due": due,
                            "rows": window_rows,
                            "instances": instances,
                        }
                    )
                days.append({"date": day, "windows": day_windows})
            lag = (now - oldest_due).total_seconds() if oldest_due is not None else 0.0
            out.append(
                {
                    "service": name,
                    "days": days,
                    "totals": totals,
                    "oldest_unprocessed_window": oldest_due.isoformat() if oldest_due else None,
                    "lag_seconds": round(max(lag, 0.0), 3),
                }
            )
        return {
            "now": now.isoformat(),
            "region": instance.region,
            "cluster": instance.cluster,
            "window_interval_minutes": windows.interval_minutes,
            "commit_mode": engine.commit.name.value,
            "services": out,
            "known_services": services,
            "truncated": truncated,
            "ring": await self.ring(),
        }

    async def ring(self) -> dict[str, Any]:
        """es_ring_state (leader row, persisted epochs) and each coordinator's Status."""
        instance = self.settings.instance
        leader: dict[str, Any] | None = None
        epochs: dict[str, int] = {}
        if self._ring_state is not None:
            rows = await self.engine.runtime.cql.execute(
                self._ring_state, [instance.region, instance.cluster]
            )
            for row in rows:
                if row["name"] == "leader":
                    if row["holder"]:
                        leader = {"holder": row["holder"], "term": row["term"]}
                elif str(row["name"]).startswith("ring:") and row["epoch"] is not None:
                    epochs[str(row["name"])[5:]] = int(row["epoch"])
        coordinators = await asyncio.gather(
            *(self._coordinator_status(a) for a in self._coordinator_addresses())
        )
        return {"leader": leader, "epochs": epochs, "coordinators": list(coordinators)}

    def _coordinator_addresses(self) -> Sequence[str]:
        if self.coordinators is not None:
            return self.coordinators
        return tuple(self.settings.cassandra.recovery.coordinator.addresses)

    async def _coordinator_status(self, address: str) -> dict[str, Any]:
        from stacksaga_store.console.ring_status import coordinator_status

        return await coordinator_status(self.settings, address)

    # -- sidecars ----------------------------------------------------------------------------

    async def sidecar_metrics(self) -> dict[str, Any]:
        from stacksaga_store.console.prometheus import scrape

        sidecars = await asyncio.gather(*(scrape(url) for url in self.sidecars))
        recovery = await asyncio.gather(*(scrape(url) for url in self.recovery_metrics))
        rows = []
        for scraped in sidecars:
            row = _sidecar_json(scraped)
            # The commit rate: commits between this scrape and the previous one of the URL.
            row["commit_rate_per_second"] = None
            if scraped.error is None:
                at = time.monotonic()
                before = self._previous_scrapes.get(scraped.url)
                if before is not None and at > before[0] and row["commits"] >= before[1]:
                    row["commit_rate_per_second"] = round(
                        (row["commits"] - before[1]) / (at - before[0]), 3
                    )
                self._previous_scrapes[scraped.url] = (at, row["commits"])
            rows.append(row)
        return {
            "sidecars": rows,
            "recovery": [_recovery_json(s) for s in recovery],
        }

    # -- live ----------------------------------------------------------------------------------

    async def live(self, *, refresh: bool = True) -> dict[str, Any]:
        """Totals since the console started, counts now, and the recent samples (the census the
        background task took last, unless ``refresh`` or there is none yet)."""
        census = self.census.current
        if refresh or census is None:
            census = await self.census.fresh(self.census_max_age, self.now)
        samples = [s.as_json() for s in self.census.samples]
        latest = samples[-1] if samples else None
        counts = census.counts()
        return {
            "taken_at": census.taken_at.isoformat(),
            "totals": dict(self.census.totals),
            "counts": counts,
            "frozen": counts["FROZEN"] + counts["QUARANTINED"],
            "starts_per_second": latest["starts_per_second"] if latest else 0.0,
            "samples": samples,
            "partial": census.partial,
        }


def _row_json(row: CensusRow) -> dict[str, Any]:
    return {
        "transaction_id": str(row.transaction_id),
        "service": row.service_name,
        "status": row.status.value,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
    }


_SAFE_URL = re.compile(r"^https?://[^\s\"'<>]+$")


def _sidecar_json(scraped: Any) -> dict[str, Any]:
    values = scraped.values
    fast, slow = (
        values.get("accord_fast_path_total", 0.0),
        values.get("accord_slow_path_total", 0.0),
    )
    committed = sum(v for k, v in values.items() if k.startswith("accord_transactions_total"))
    syncs = values.get("accord_journal_syncs_total", 0.0)
    sync_seconds = values.get("accord_journal_sync_seconds_total", 0.0)
    return {
        "url": scraped.url,
        "healthy": scraped.error is None,
        "error": scraped.error,
        "transactions": committed,
        "commits": values.get('accord_transactions_total{outcome="ok"}', 0.0),
        "commit_latency_count": values.get("accord_commit_latency_seconds_count", 0.0),
        "fast_path_share": (fast / (fast + slow)) if fast + slow else None,
        "recoveries": values.get("accord_recoveries_total", 0.0),
        "journal_syncs": syncs,
        "journal_sync_mean_ms": (sync_seconds / syncs * 1000) if syncs else None,
        "fetched_at": scraped.fetched_at,
    }


def _recovery_json(scraped: Any) -> dict[str, Any]:
    values = scraped.values
    dispatched: dict[str, float] = {}
    for name, value in values.items():
        if name.startswith("stacksaga_recovery_dispatch_total{"):
            kind = re.search(r'kind="([^"]*)"', name)
            label = kind.group(1) if kind else "?"
            dispatched[label] = dispatched.get(label, 0.0) + value
    return {
        "url": scraped.url,
        "healthy": scraped.error is None,
        "error": scraped.error,
        "dispatched": dispatched,
        "cycles": values.get("stacksaga_recovery_cycles_total", 0.0),
        "lease_lost": values.get("stacksaga_recovery_lease_lost_total", 0.0),
        "fetched_at": scraped.fetched_at,
    }
