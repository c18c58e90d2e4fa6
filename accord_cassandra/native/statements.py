"""A light look at CQL text the endpoint forwards: is it an Accord transaction, and which
tables does it write?

Not a CQL parser. It tokenizes (quoted strings, quoted identifiers, comments, dollar strings)
and reads the table after ``INSERT INTO``, ``UPDATE`` and ``DELETE … FROM`` (each statement
of a ``BEGIN BATCH`` too) and ``TRUNCATE [TABLE]``. Outside a batch these words count only
where a statement begins (the text's start, after ``;``), so a column called ``update`` in a
SELECT is not a write; inside a batch, whose statements need no ``;`` between them, they
count anywhere (erring towards finding a write).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<line_comment>(?:--|//)[^\n]*)
    | (?P<block_comment>/\*.*?(?:\*/|\Z))
    | (?P<string>'(?:[^']|'')*(?:'|\Z))
    | (?P<dollar>\$\$.*?(?:\$\$|\Z))
    | (?P<quoted>"(?:[^"]|"")*(?:"|\Z))
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_TRANSACTION = re.compile(
    r"\A\s*(?:(?:--|//)[^\n]*\n\s*|/\*.*?\*/\s*)*BEGIN\s+TRANSACTION\b", re.I | re.S
)


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "quoted", "other", "string"
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def identifier(self) -> str | None:
        """The name as Cassandra reads it: unquoted folds to lower case."""
        if self.kind == "word":
            return self.text.lower()
        if self.kind == "quoted":
            return self.text[1:-1].replace('""', '"')
        return None


def tokens(text: str) -> list[Token]:
    out = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        if kind in ("space", "line_comment", "block_comment"):
            continue
        if kind == "dollar":
            kind = "string"
        out.append(Token(kind, match.group()))
    return out


def is_transaction(text: str) -> bool:
    """Whether ``text`` is an Accord transaction (``BEGIN TRANSACTION …``)."""
    return _TRANSACTION.match(text) is not None


def written_tables(text: str, keyspace: str | None) -> list[str]:
    """``keyspace.table`` of every table ``text`` writes (an unqualified name is in
    ``keyspace``, the connection's current one; left out when there is none)."""
    found: list[str] = []
    toks = tokens(text)
    i = 0
    start = True  # a statement may begin at toks[i]
    in_batch = False

    def table_at(j: int) -> tuple[str | None, int]:
        """The table named at toks[j] (``ks.t`` or ``t``), and the index after it."""
        if j >= len(toks):
            return None, j
        first = toks[j].identifier
        if first is None:
            return None, j + 1
        if j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].identifier is not None:
            return f"{first}.{toks[j + 2].identifier}", j + 3
        return (f"{keyspace}.{first}" if keyspace else None), j + 1

    while i < len(toks):
        token = toks[i]
        word = token.upper
        if token.text == ";":
            start = True
            i += 1
            continue
        if start and word == "BEGIN":
            # BEGIN [UNLOGGED | COUNTER] BATCH [USING TIMESTAMP n]: statements follow.
            j = i + 1
            if j < len(toks) and toks[j].upper in ("UNLOGGED", "COUNTER"):
                j += 1
            if j < len(toks) and toks[j].upper == "BATCH":
                j += 1
                if j < len(toks) and toks[j].upper == "USING":
                    j += 3  # USING TIMESTAMP n
                i = j
                in_batch = True
                continue
        start = start or in_batch
        if start and word == "INSERT" and i + 1 < len(toks) and toks[i + 1].upper == "INTO":
            name, i = table_at(i + 2)
            if name:
                found.append(name)
            start = False
            continue
        if start and word == "UPDATE":
            name, i = table_at(i + 1)
            if name:
                found.append(name)
            start = False
            continue
        if start and word == "DELETE":
            j = i + 1
            while j < len(toks) and toks[j].upper != "FROM" and toks[j].text != ";":
                j += 1
            if j < len(toks) and toks[j].upper == "FROM":
                name, i = table_at(j + 1)
                if name:
                    found.append(name)
            else:
                i = j
            start = False
            continue
        if start and word == "TRUNCATE":
            j = i + 1
            if j < len(toks) and toks[j].upper == "TABLE":
                j += 1
            name, i = table_at(j)
            if name:
                found.append(name)
            start = False
            continue
        if word == "APPLY":
            in_batch = False
        start = False
        i += 1
    return found
