"""Values of the protocol: timestamps, keys, dependencies, transactions, statuses.

Glossary:
    TxnId      the timestamp t0 a coordinator proposes for a transaction; unique.
    executeAt  the timestamp at which a transaction executes; ``>= TxnId``.
    Ballot     orders competing coordinators of one transaction; ZERO is the original.
    Deps       per key, the conflicting transactions to execute before, if earlier.
    Route      the transaction's keys plus a home key whose shard tracks its progress.
"""

from accord.primitives.deps import EMPTY_DEPS, Deps
from accord.primitives.keys import TOKEN_MAX, TOKEN_MIN, Key, Route, TokenRange, sim_key
from accord.primitives.status import Status
from accord.primitives.timestamp import (
    BALLOT_ZERO,
    TIMESTAMP_MIN,
    Ballot,
    Hlc,
    Kind,
    Timestamp,
    TxnId,
    merge_max,
    txn_id_of,
)
from accord.primitives.txn import (
    BinOp,
    Const,
    Delete,
    Expr,
    Item,
    MakeTuple,
    Predicate,
    Put,
    ReadOf,
    Txn,
    TxnResult,
    Update,
    Value,
    Write,
    WriteOp,
    execute,
)

__all__ = [
    "BALLOT_ZERO",
    "EMPTY_DEPS",
    "TIMESTAMP_MIN",
    "TOKEN_MAX",
    "TOKEN_MIN",
    "Ballot",
    "BinOp",
    "Const",
    "Delete",
    "Deps",
    "Expr",
    "Hlc",
    "Item",
    "Key",
    "Kind",
    "MakeTuple",
    "Predicate",
    "Put",
    "ReadOf",
    "Route",
    "Status",
    "Timestamp",
    "TokenRange",
    "Txn",
    "TxnId",
    "TxnResult",
    "Update",
    "Value",
    "Write",
    "WriteOp",
    "execute",
    "merge_max",
    "sim_key",
    "txn_id_of",
]
