"""Connecting to Cassandra from the settings and the driver file, with nothing prepared.

:func:`connect_sync` is for synchronous admin work (schema apply/check); :func:`open_cql`
gives an asyncio :class:`~stacksaga_store.store.cql.CqlSession` to whoever prepares its own
statements: the saga runtime (:mod:`stacksaga_store.saga.runtime`) and the ring coordinator
(:mod:`stacksaga_store.ring.server`), which needs no event store. Connecting blocks in the
driver, so :func:`open_cql` runs it in a worker thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from stacksaga_store.config.driver import DriverConfig, build_cluster, load_driver_config
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.store.cql import CqlSession, StoreUnavailableError

__all__ = ["CqlConnection", "connect_sync", "open_cql"]


def connect_sync(settings: StackSagaSettings, driver_config: DriverConfig | None = None) -> Any:
    """(cluster, session) for synchronous admin work such as schema apply/check."""
    from cassandra.cluster import NoHostAvailable

    config = driver_config or load_driver_config(settings)
    cluster = build_cluster(config, settings)
    try:
        return cluster, cluster.connect()
    except NoHostAvailable as exc:
        cluster.shutdown()
        points = ", ".join(f"{host}:{port}" for host, port in config.contact_points)
        raise StoreUnavailableError(
            f"cannot reach Cassandra at {points} ({config.origin}): {exc}", outcome_unknown=False
        ) from exc


@dataclass
class CqlConnection:
    """A connected cluster and its session. Close it to shut the driver's threads down."""

    driver_config: DriverConfig
    cluster: Any
    cql: CqlSession

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.cluster.shutdown)


async def open_cql(
    settings: StackSagaSettings, *, driver_config: DriverConfig | None = None
) -> CqlConnection:
    """Connect (in a worker thread) with the settings' read and write consistency levels."""
    config = driver_config or load_driver_config(settings)
    loop = asyncio.get_running_loop()
    cluster, session = await loop.run_in_executor(None, connect_sync, settings, config)
    cql = CqlSession(
        session,
        read_level=settings.cassandra.read_consistency_level,
        write_level=settings.cassandra.write_consistency_level,
    )
    return CqlConnection(config, cluster, cql)
