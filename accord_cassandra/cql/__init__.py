"""Accord CQL transaction text (``BEGIN TRANSACTION … COMMIT TRANSACTION``, Cassandra's
syntax) for the client API: :func:`bind` parses a text, binds its markers and returns the
client :class:`~accord_cassandra.client.Transaction`; :func:`prepare` parses once for many
binds; :func:`to_cql` prints a transaction back as text. docs/sidecars.md ("CQL transaction
text") lists the grammar and what is refused."""

from accord_cassandra.cql.build import (
    BindColumn,
    Bound,
    CqlResult,
    Params,
    Prepared,
    as_catalog,
    bind,
    prepare,
)
from accord_cassandra.cql.parser import CqlError, CqlSyntaxError, parse
from accord_cassandra.cql.pretty import to_cql

__all__ = [
    "BindColumn",
    "Bound",
    "CqlError",
    "CqlResult",
    "CqlSyntaxError",
    "Params",
    "Prepared",
    "as_catalog",
    "bind",
    "parse",
    "prepare",
    "to_cql",
]
