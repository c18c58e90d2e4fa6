"""Accord (CEP-15): leaderless, strict-serializable transactions over many keys.

A pure-Python, sans-IO implementation: no sockets, no threads, no wall clock. A host
drives :class:`accord.node.Node` through ``step``/``tick``/``submit`` and carries out what
``ready()`` asks (see :mod:`accord.api`). The same core runs in the deterministic simulator
(:mod:`accord.sim`), the Maelstrom adapter and the gRPC sidecars.

Layers, each importing only those before it (``a | b``: neither imports the other)::

    invariants -> primitives -> topology -> local -> messages -> api
      -> coordinate | codec -> node -> sim

The planted-bug switches that prove the burn test has teeth are not part of this API: they
are :class:`accord.sim.Bugs`.

Errors: every error the library raises on purpose derives from :class:`AccordError` —
:class:`InvariantViolation` (a bug; always on, also under ``python -O``),
:class:`InvalidTransaction`, :class:`ConfigurationError`, :class:`InvalidArgument` (also a
``ValueError``), :class:`accord.codec.CodecError` and
:class:`accord.messages.validate.InvalidMessage`.
"""

from accord.api import ClientReply, Clock, DataStore, HlcFloor, Journal, JournalRecord, Ready
from accord.invariants import (
    AccordError,
    ConfigurationError,
    InvalidArgument,
    InvalidTransaction,
    InvariantViolation,
)
from accord.node import Node, NodeConfig
from accord.primitives import (
    MAX_PARTITION_READ_BYTES,
    MAX_ROWS_PER_SLICE,
    MAX_TTL_SECONDS,
    TOKEN_MAX,
    TOKEN_MIN,
    BinOp,
    Bound,
    Const,
    CountOf,
    Delete,
    DeletePartition,
    DeleteRange,
    DeleteRow,
    Deps,
    Item,
    Key,
    Kind,
    MakeTuple,
    MemoryPartitions,
    PartitionRead,
    Predicate,
    Put,
    PutRow,
    PutStatic,
    ReadOf,
    RowAt,
    RowOf,
    Selection,
    Slice,
    SliceOf,
    StaticAt,
    StaticOf,
    Status,
    Timestamp,
    TokenRange,
    Txn,
    TxnId,
    TxnResult,
    Update,
    WriteOp,
    WriteScope,
    sim_key,
)
from accord.primitives.txn import BINARY_OPERATORS, COMPARE_OPERATORS, MAX_BATCH_PARTS, Expr
from accord.topology import Shard, Topology, preferred_electorate, ring_topology

__all__ = [
    "BINARY_OPERATORS",
    "COMPARE_OPERATORS",
    "MAX_BATCH_PARTS",
    "MAX_PARTITION_READ_BYTES",
    "MAX_ROWS_PER_SLICE",
    "MAX_TTL_SECONDS",
    "TOKEN_MAX",
    "TOKEN_MIN",
    "AccordError",
    "BinOp",
    "Bound",
    "ClientReply",
    "Clock",
    "ConfigurationError",
    "Const",
    "CountOf",
    "DataStore",
    "Delete",
    "DeletePartition",
    "DeleteRange",
    "DeleteRow",
    "Deps",
    "Expr",
    "HlcFloor",
    "InvalidArgument",
    "InvalidTransaction",
    "InvariantViolation",
    "Item",
    "Journal",
    "JournalRecord",
    "Key",
    "Kind",
    "MakeTuple",
    "MemoryPartitions",
    "Node",
    "NodeConfig",
    "PartitionRead",
    "Predicate",
    "Put",
    "PutRow",
    "PutStatic",
    "ReadOf",
    "Ready",
    "RowAt",
    "RowOf",
    "Selection",
    "Shard",
    "Slice",
    "SliceOf",
    "StaticAt",
    "StaticOf",
    "Status",
    "Timestamp",
    "TokenRange",
    "Topology",
    "Txn",
    "TxnId",
    "TxnResult",
    "Update",
    "WriteOp",
    "WriteScope",
    "preferred_electorate",
    "ring_topology",
    "sim_key",
]
