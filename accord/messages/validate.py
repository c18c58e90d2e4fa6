"""Checks on a decoded message from another node, made before the node acts on it.

The codec guarantees shape and types; these checks guarantee that every value is one an
honest peer could have sent, so that nothing a peer says can make the receiving node mint,
journal or write something it cannot represent or keep:

* every timestamp (TxnId, executeAt, ballot, deps) names a node of the topology (or is the
  zero timestamp), an epoch the topology knows, known flags, and an HLC value no further
  ahead of the receiver's clock than ``max_future_skew_micros``. The HLC follows what it
  witnesses, so a far-future value would otherwise advance it for good: a TxnId at 2^63-10
  made the receiver's next HLC floor overflow the journal's integers;
* node ids are at most ``max_node_id`` (what the host's timestamp encoding can carry: an
  executeAt naming node 5000 made every data write of its transaction fail forever);
* keys per transaction, route, writes and reads, and transaction ids per deps are bounded,
  which bounds what a forged message can make a replica keep;
* a read answer (:class:`~accord.primitives.PartitionRead`) answers only selections on its
  own key, returns no more rows per slice than the slice may (its LIMIT, at most
  ``MAX_ROWS_PER_SLICE``) and no more than ``MAX_PARTITION_READ_BYTES`` per partition: what
  an honest data store gives, so a forged answer cannot pass a limit on a peer's behalf;
* executeAt is not below the TxnId, a transaction's kind matches its id, and its keys are
  within its route: what the replica would otherwise find out as a broken invariant.

A violation raises :class:`InvalidMessage`: the sender's fault, never the receiver's. Pure
and sans-IO: the caller supplies the clock reading.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from accord.invariants import AccordError
from accord.messages import Envelope
from accord.primitives import (
    MAX_PARTITION_READ_BYTES,
    MAX_ROWS_PER_SLICE,
    TOKEN_MAX,
    TOKEN_MIN,
    Deps,
    Key,
    PartitionRead,
    Route,
    Slice,
    Timestamp,
    Txn,
    WriteOp,
)
from accord.primitives.rows import value_size
from accord.topology import Topology


class InvalidMessage(AccordError):
    """A message from another node that no honest peer sends: drop it, blame the sender."""


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Bounds on what one message from a peer may carry."""

    max_future_skew_micros: int = 60_000_000
    max_node_id: int = 2**31 - 1
    max_keys: int = 1024
    max_deps: int = 100_000


def validate(
    envelope: Envelope, topology: Topology, now_micros: int, limits: MessageLimits
) -> None:
    """Raise :class:`InvalidMessage` unless ``envelope`` could come from an honest peer."""
    nodes = frozenset(topology.nodes())
    if envelope.src not in nodes or envelope.src == envelope.dest:
        raise InvalidMessage(f"sender {envelope.src} is not another node of the topology")
    check = _Checker(nodes, topology.epoch, now_micros + limits.max_future_skew_micros, limits)
    body = envelope.body
    name = type(body).__name__
    # Messages are msgspec Structs; a dataclass one (a branch's new message) still works.
    fields = getattr(body, "__struct_fields__", None) or [f.name for f in dataclasses.fields(body)]
    for field in fields:
        value = getattr(body, field)
        try:
            check.value(value)
        except InvalidMessage as error:
            raise InvalidMessage(f"{name}.{field}: {error}") from None
    txn_id = getattr(body, "txn_id", None)
    execute_at = getattr(body, "execute_at", None)
    txn = getattr(body, "txn", None)
    route = getattr(body, "route", None)
    if type(txn_id) is Timestamp:
        if type(execute_at) is Timestamp and execute_at < txn_id:
            raise InvalidMessage(f"{name}: executeAt {execute_at} is below txnId {txn_id}")
        if type(txn) is Txn and int(txn.kind) != txn_id.flags:
            raise InvalidMessage(f"{name}: txn kind {txn.kind.name} differs from txnId {txn_id}")
    if type(txn) is Txn and type(route) is Route and not set(txn.keys) <= set(route.keys):
        raise InvalidMessage(f"{name}: txn keys are not all within its route")


@dataclass(frozen=True, slots=True)
class _Checker:
    nodes: frozenset[int]
    epoch: int
    hlc_bound: int
    limits: MessageLimits

    def value(self, value: object) -> None:
        if isinstance(value, Timestamp):
            self.timestamp(value)
        elif isinstance(value, Deps):
            self.deps(value)
        elif isinstance(value, Txn):
            self.keys(value.keys, "txn keys")
            if len(value.selections) > self.limits.max_keys:
                raise InvalidMessage(
                    f"{len(value.selections)} selections exceed the limit of {self.limits.max_keys}"
                )
        elif isinstance(value, Route):
            self.keys(value.keys, "route keys")
        elif isinstance(value, tuple):
            self.items(value)

    def items(self, values: tuple[object, ...]) -> None:
        if len(values) > self.limits.max_deps:
            raise InvalidMessage(f"{len(values)} items exceed the limit of {self.limits.max_deps}")
        if values and len(values) > self.limits.max_keys and type(values[0]) is not Timestamp:
            raise InvalidMessage(f"{len(values)} items exceed the limit of {self.limits.max_keys}")
        for item in values:
            if isinstance(item, Timestamp):
                self.timestamp(item)
            elif isinstance(item, WriteOp):
                self.key(item.key)
            elif isinstance(item, tuple) and item and isinstance(item[0], Key):
                self.key(item[0])
                if len(item) == 2 and isinstance(item[1], PartitionRead):
                    self.partition_read(item[0], item[1])

    def partition_read(self, key: Key, read: PartitionRead) -> None:
        size = 0
        for selection, value in read.results:
            if selection.key != key:
                raise InvalidMessage(f"a read of {key.name!r} answers a selection of another key")
            if isinstance(selection, Slice):
                cap = selection.limit if selection.limit is not None else MAX_ROWS_PER_SLICE
                rows = value if isinstance(value, tuple) else ()
                if not isinstance(value, tuple) or len(rows) > cap:
                    raise InvalidMessage(
                        f"a slice of {key.name!r} answered with more than {cap} rows or no tuple"
                    )
            size += value_size(value)
        if size > MAX_PARTITION_READ_BYTES:
            raise InvalidMessage(
                f"a read of {key.name!r} exceeds "
                f"MAX_PARTITION_READ_BYTES={MAX_PARTITION_READ_BYTES}"
            )

    def keys(self, keys: tuple[Key, ...], what: str) -> None:
        if len(keys) > self.limits.max_keys:
            raise InvalidMessage(f"{len(keys)} {what} exceed the limit of {self.limits.max_keys}")
        for key in keys:
            self.key(key)

    def key(self, key: Key) -> None:
        if not TOKEN_MIN < key.token <= TOKEN_MAX:
            raise InvalidMessage(f"key {key.name!r} has token {key.token} outside the ring")

    def deps(self, deps: Deps) -> None:
        keys = deps.keys()
        self.keys(keys, "deps keys")
        total = 0
        for _, ids in deps.items():
            total += len(ids)
            if total > self.limits.max_deps:
                raise InvalidMessage(f"deps exceed the limit of {self.limits.max_deps} txn ids")
            for txn_id in ids:
                self.timestamp(txn_id)

    def timestamp(self, ts: Timestamp) -> None:
        epoch, hlc, flags, node = ts
        if ts == (0, 0, 0, 0):
            return
        if node not in self.nodes or node > self.limits.max_node_id:
            raise InvalidMessage(f"timestamp {ts} names node {node}, not in the topology")
        if not 0 <= epoch <= self.epoch:
            raise InvalidMessage(f"timestamp {ts} has epoch {epoch}, beyond {self.epoch}")
        if flags not in (0, 1):
            raise InvalidMessage(f"timestamp {ts} has unknown flags {flags}")
        if hlc < 0:
            raise InvalidMessage(f"timestamp {ts} has a negative hlc")
        if hlc > self.hlc_bound:
            raise InvalidMessage(
                f"timestamp {ts} is {(hlc - self.hlc_bound) // 1_000_000} s beyond the "
                "allowed clock skew"
            )


__all__ = ["InvalidMessage", "MessageLimits", "validate"]
