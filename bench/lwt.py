"""Cassandra lightweight transactions for the comparison, driven from asyncio.

The statement is the single-partition conditional update of the comparison::

    UPDATE <ks>.lwt_accounts SET balance = ? WHERE id = ? IF balance >= ?

at ``serial_consistency`` SERIAL and commit consistency ONE (LWT at its cheapest: the
commit is still sent to every replica; ONE only means the coordinator does not wait for a
quorum of commit acknowledgements). The LWT table is separate from the Accord one because
tables written through Accord must be written only through Accord (its write timestamps are
not wall-clock microseconds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bench.workload import INITIAL_BALANCE, LoadError

LWT_TABLE = "lwt_accounts"


def schema(keyspace: str, *, replication: str) -> list[str]:
    return [
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}",
        f"CREATE TABLE IF NOT EXISTS {keyspace}.accounts (id text PRIMARY KEY, balance bigint)",
        f"CREATE TABLE IF NOT EXISTS {keyspace}.{LWT_TABLE} (id text PRIMARY KEY, balance bigint)",
    ]


def preload(session: Any, keyspace: str, keys: Sequence[str]) -> None:
    """Plain QUORUM inserts of INITIAL_BALANCE (the LWT table only)."""
    from cassandra import ConsistencyLevel
    from cassandra.concurrent import execute_concurrent_with_args

    insert = session.prepare(f"INSERT INTO {keyspace}.{LWT_TABLE} (id, balance) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.QUORUM
    execute_concurrent_with_args(
        session, insert, [(key, INITIAL_BALANCE) for key in keys], concurrency=32
    )


class LwtClient:
    """``UPDATE ... IF balance >= ?`` through one driver session, awaited from asyncio."""

    def __init__(self, session: Any, keyspace: str) -> None:
        from cassandra import ConsistencyLevel

        self.session = session
        self.statement = session.prepare(
            f"UPDATE {keyspace}.{LWT_TABLE} SET balance = ? WHERE id = ? IF balance >= ?"
        )
        self.statement.consistency_level = ConsistencyLevel.ONE
        self.statement.serial_consistency_level = ConsistencyLevel.SERIAL

    async def conditional_set(self, key: str, value: int, threshold: int) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()

        def done(rows: Any) -> None:
            # An LWT answers one row whose first column is ``[applied]``.
            applied = bool(rows[0][0]) if rows else False
            loop.call_soon_threadsafe(_resolve, future, applied, None)

        def failed(error: BaseException) -> None:
            loop.call_soon_threadsafe(_resolve, future, False, error)

        response = self.session.execute_async(self.statement, (value, key, threshold))
        # The driver calls back on its own I/O thread; the asyncio future is set on the loop.
        response.add_callbacks(done, failed)
        return await future


def _resolve(future: asyncio.Future[bool], applied: bool, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(applied)
    else:
        future.set_exception(LoadError(error_code(error)))


def error_code(error: BaseException) -> str:
    """The exception's class name; a WriteTimeout also names its write type: for an LWT,
    ``WriteTimeout(CAS)`` is Paxos giving up (contention past ``cas_contention_timeout``, or
    no quorum in time), an outcome the client cannot know."""
    name = type(error).__name__
    write_type = getattr(error, "write_type", None)
    if write_type is None:
        return name
    from cassandra import WriteType

    return f"{name}({WriteType.value_to_name.get(write_type, write_type)})"
