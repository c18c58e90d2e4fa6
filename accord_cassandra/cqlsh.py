"""``accord-cassandra cqlsh``: the installed cqlsh, taught where an Accord transaction ends.

cqlsh 6.2 (the Cassandra 5.0 line) opens a block at any statement starting with BEGIN and
closes it only at ``APPLY …;``, so ``BEGIN TRANSACTION … COMMIT TRANSACTION;`` never reaches
the server ("Incomplete statement at end of file"). This wrapper replaces that splitter on
cqlsh's rule set, at import, with one that closes a ``BEGIN TRANSACTION`` block at
``COMMIT TRANSACTION ;`` and a ``BEGIN [UNLOGGED | COUNTER] BATCH`` block at ``APPLY …;``
as before. It patches only the splitter whose behaviour it has checked: any other cqlsh is
refused with a message, never run unpatched.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

from accord_cassandra.errors import AccordCassandraError

KNOWN_VERSIONS = ("6.2.",)

_PROBE_TRANSACTION = "BEGIN TRANSACTION\n  SELECT 1;\nCOMMIT TRANSACTION;\n"
_PROBE_BATCH = "BEGIN BATCH\n  INSERT INTO t (a) VALUES (1);\nAPPLY BATCH;\n"


class CqlshUnavailable(AccordCassandraError):
    """cqlsh is missing, or its splitter is not the one this wrapper knows how to patch."""


def _import(name: str) -> Any:
    with warnings.catch_warnings():
        # cqlshlib imports sre_constants, deprecated since Python 3.11.
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


def _split(self: Any, text: str) -> tuple[list[list[tuple[Any, ...]]], bool]:
    util = _import("cqlshlib.util")
    tokens = self.cql_massage_tokens(self.lex(text))
    stmts = util.split_list(tokens, lambda t: t[0] == "endtoken")
    output: list[list[tuple[Any, ...]]] = []
    # None outside a block, else the words that close it: ("APPLY",) for a batch,
    # ("COMMIT", "TRANSACTION") for a transaction.
    closer: tuple[str, ...] | None = None
    in_pg_string = len([st for st in tokens if len(st) > 0 and st[0] == "unclosedPgString"]) == 1
    for stmt in stmts:
        if closer is not None:
            output[-1].extend(stmt)
        else:
            output.append(stmt)
        words = [str(t[1]).upper() for t in stmt[:-1]] if stmt else []
        if closer is None:
            if len(stmt) > 2 and words[0] == "BEGIN":
                closer = ("COMMIT", "TRANSACTION") if words[1] == "TRANSACTION" else ("APPLY",)
                # A one-statement block (BEGIN … APPLY BATCH; on one line) closes at once.
                if _closes(stmt, words, closer):
                    closer = None
        elif _closes(stmt, words, closer):
            closer = None
    return output, closer is not None or in_pg_string


def _closes(stmt: list[tuple[Any, ...]], words: list[str], closer: tuple[str, ...]) -> bool:
    if not stmt or stmt[-1][0] != "endtoken":
        return False
    if closer == ("APPLY",):
        # Upstream's rule: the statement's third-last token is APPLY (APPLY BATCH ;).
        return len(stmt) > 2 and str(stmt[-3][1]).upper() == "APPLY"
    return words[-2:] == list(closer)


def patch() -> Any:
    """Install the splitter on cqlsh's rule set; return the rule set. Idempotent."""
    try:
        version = importlib.metadata.version("cqlsh")
        cql3 = _import("cqlshlib.cql3handling")
    except (ImportError, importlib.metadata.PackageNotFoundError) as error:
        raise CqlshUnavailable(
            f"cqlsh is not installed ({error}): install cqlsh==6.2.2 (the dev extra)"
        ) from error
    ruleset = cql3.CqlRuleSet
    if getattr(ruleset.cql_split_statements, "__func__", None) is _split:
        return ruleset
    if not version.startswith(KNOWN_VERSIONS):
        raise CqlshUnavailable(f"cqlsh {version}: only {', '.join(KNOWN_VERSIONS)}x is known")
    try:
        _, txn_open = ruleset.cql_split_statements(_PROBE_TRANSACTION)
        batch, batch_open = ruleset.cql_split_statements(_PROBE_BATCH)
    except Exception as error:
        raise CqlshUnavailable(f"cqlsh {version}: its splitter failed a probe: {error}") from error
    if not (txn_open and not batch_open and len([s for s in batch if s]) == 1):
        raise CqlshUnavailable(
            f"cqlsh {version}: its splitter does not behave as 6.2.2's does "
            f"(transaction left open: {txn_open}, batch closed: {not batch_open}); not patched"
        )
    ruleset.cql_split_statements = types.MethodType(_split, ruleset)
    return ruleset


def main(argv: Sequence[str] | None = None) -> int:
    try:
        patch()
    except CqlshUnavailable as error:
        sys.stderr.write(f"accord-cassandra cqlsh: {error}\n")
        return 2
    cqlshmain = _import("cqlshlib.cqlshmain")
    args = list(sys.argv[1:] if argv is None else argv)
    cqlshmain.main(args, "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
