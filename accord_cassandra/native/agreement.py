"""The CQL endpoint's wait for schema agreement after a schema change, on the sidecar's own
driver session to Cassandra.

Each live Cassandra node is asked for its own ``schema_version`` (``system.local``, sent to
that node alone) until all answers, the node the endpoint fronts included, are one. Asking
each node rather than reading one node's ``system.peers`` matters: a node that has not yet
applied the change reports the old version for itself and its peers, so its view alone
could "agree" on the schema the change replaced. A node that does not answer within
``QUERY_SECONDS`` counts as not live (it cannot serve the next statement either, so a
coordinator routes around it). The nodes asked are those the session holds connections to:
with the sidecar's policy (DC-aware, no remote hosts), those of its local data center.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from typing import Any

from accord_cassandra.native.endpoint import Agreement
from accord_cassandra.ports import split_address

logger = logging.getLogger(__name__)

LOCAL_SCHEMA = "SELECT schema_version FROM system.local WHERE key = 'local'"
QUERY_SECONDS = 5.0
POLL_SECONDS = 0.2


def _same_host(address: str, host: str) -> bool:
    try:
        return ipaddress.ip_address(address) == ipaddress.ip_address(host)
    except ValueError:
        return address == host


def versions(session: Any, upstream_host: str) -> tuple[set[object], bool]:
    """The schema versions the live nodes report, and whether the fronted node answered."""
    from cassandra.query import SimpleStatement

    found: set[object] = set()
    upstream_answered = False
    for host in list(session.cluster.metadata.all_hosts()):
        if host.is_up is False:
            continue
        try:
            row = session.execute(
                SimpleStatement(LOCAL_SCHEMA), host=host, timeout=QUERY_SECONDS
            ).one()
        except Exception as error:  # not live for this round; logged, not fatal
            logger.debug("schema agreement: %s did not answer: %r", host, error, exc_info=True)
            continue
        if row is None:
            continue
        found.add(row[0])
        upstream_answered |= _same_host(str(host.address), upstream_host)
    return found, upstream_answered


def schema_agreement(session: Any, upstream: str) -> Agreement:
    """Wait for agreement through ``session`` (a cassandra-driver Session); ``upstream`` is
    the node the endpoint fronts (host:port), whose answer is required."""
    upstream_host = split_address(upstream)[0].strip("[]")

    def wait(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            found, upstream_answered = versions(session, upstream_host)
            if len(found) == 1 and upstream_answered:
                return True
            if time.monotonic() >= deadline:
                logger.warning(
                    "schema agreement: after %.1f s the live nodes report versions %s%s",
                    seconds,
                    sorted(map(str, found)),
                    "" if upstream_answered else f" (and {upstream} did not answer)",
                )
                return False
            time.sleep(POLL_SECONDS)

    async def agreement(seconds: float) -> bool:
        return await asyncio.to_thread(wait, seconds)

    return agreement
