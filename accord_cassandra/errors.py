"""The root of the sidecar package's errors.

Every error ``accord_cassandra`` raises on purpose derives from :class:`AccordCassandraError`,
so ``except AccordCassandraError`` catches them all. Each keeps the standard base it had
before (``ValueError``, ``RuntimeError``, ``OSError``), so code that catches those still does:

* :class:`accord_cassandra.client.TransactionError` — a transaction failed or its outcome is
  unknown (``code`` is the gRPC status name);
* :class:`accord_cassandra.config.ConfigError`, :class:`accord_cassandra.server.StartupError`,
  :class:`accord_cassandra.topology.TopologyError`, :class:`accord_cassandra.schema.SchemaError`
  — a configuration, ring or schema the sidecar cannot run with; the message names the field;
* :class:`accord_cassandra.cql.CqlError` (``CqlSyntaxError``, with line, column and the
  expected tokens) — a transaction text that does not parse or bind; nothing was sent;
* :class:`accord_cassandra.journal.JournalCorrupt` — a damaged journal it refuses to guess about;
* :class:`accord_cassandra.ports.AddressInUse` — a fixed port that stayed taken;
* :class:`accord_cassandra.launcher.spec.LauncherError` (``PortBusyError``, ``NodeStartError``)
  — the local Cassandra launcher could not do what was asked.

Errors of the Accord core (:class:`accord.AccordError`) pass through as they are: they are
the library's, not the sidecar's.
"""

from __future__ import annotations

__all__ = ["AccordCassandraError"]


class AccordCassandraError(Exception):
    """Root of every error this package raises on purpose."""
