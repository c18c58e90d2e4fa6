"""Accord replica sidecars beside Cassandra: gRPC servers hosting :class:`accord.Node`, their
journal and data store, the sync and asyncio clients, and the local Cassandra launcher.

Every error this package raises on purpose derives from :class:`AccordCassandraError`
(:mod:`accord_cassandra.errors` lists them).
"""

from accord_cassandra.errors import AccordCassandraError

__all__ = ["AccordCassandraError"]
