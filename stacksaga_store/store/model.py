"""Values the store reads and writes: keys, records and the restore path.

Plain frozen dataclasses with slots (h11's "don't subclass these"); no I/O here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from stacksaga_store.config.settings import InstanceProperties
from stacksaga_store.store.states import RunningStatus, TryoutRecord

__all__ = [
    "FencingRow",
    "FrozenRecord",
    "RestorePath",
    "TransactionKey",
    "TransactionRecord",
    "TransactionView",
]


@dataclass(frozen=True, slots=True)
class FencingRow:
    """Where a range lease's epoch is persisted, and the epoch a dispatch started under:
    ``es_ring_state(region, cluster, name).epoch`` (the ring coordinator writes it before it
    grants the epoch's leases). The accord mode refuses a fenced dispatch's state change
    inside its transaction once the row holds another epoch."""

    region: str
    cluster: str
    name: str
    epoch: int


@dataclass(frozen=True, slots=True, order=True)
class TransactionKey:
    """The partition key shared by es_transaction, its tryouts, markers and frozen row."""

    region: str
    cluster: str
    service_name: str
    transaction_id: uuid.UUID

    @classmethod
    def of(cls, instance: InstanceProperties, transaction_id: uuid.UUID) -> TransactionKey:
        return cls(instance.region, instance.cluster, instance.service_name, transaction_id)

    def params(self) -> list[object]:
        """Bind values in the column order every statement uses."""
        return [self.region, self.cluster, self.service_name, self.transaction_id]

    def __str__(self) -> str:
        return f"{self.region}/{self.cluster}/{self.service_name}/{self.transaction_id}"


@dataclass(frozen=True, slots=True)
class RestorePath:
    """Where the restore watchdog row lives (es_transaction.restore_* columns, seed Part 4).

    Written by the recovery engine's ``register_watchdog``; this package only stores it.
    """

    date_of_year: str
    window: int
    instance_id: str
    bucket: int


@dataclass(frozen=True, slots=True)
class TransactionRecord:
    """One es_transaction row."""

    key: TransactionKey
    running_status: RunningStatus
    created_at: datetime
    updated_at: datetime
    payload: bytes
    restore_path: RestorePath | None = None


@dataclass(frozen=True, slots=True)
class FrozenRecord:
    """One es_frozen_transaction row."""

    frozen_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class TransactionView:
    """A transaction with its whole history, as one read returns it."""

    record: TransactionRecord
    tryouts: tuple[TryoutRecord, ...]
    frozen: FrozenRecord | None = None

    @property
    def key(self) -> TransactionKey:
        return self.record.key

    @property
    def status(self) -> RunningStatus:
        return self.record.running_status

    @property
    def next_tryout_index(self) -> int:
        return len(self.tryouts)
