"""Keeping drivers on the endpoints the user gave them.

A driver learns the cluster from ``system.peers`` / ``system.peers_v2`` and from
TOPOLOGY_CHANGE / STATUS_CHANGE events. Relayed as Cassandra answers them they name the
Cassandra nodes' own addresses, and the driver would send its transactions there, where
``BEGIN TRANSACTION`` is a syntax error. So the endpoint answers a peer query with
Cassandra's ROWS metadata but no rows, and drops those events: the driver knows only the
sidecars it was given as contact points (``system.local`` needs nothing: drivers take the
address they connected to).
"""

from __future__ import annotations

import struct

from accord_cassandra.native import frame as f
from accord_cassandra.native.statements import tokens

PEER_TABLES = frozenset({"peers", "peers_v2"})

# ROWS metadata flags (protocol v4, section 4.2.5.2).
GLOBAL_TABLES_SPEC = 0x0001
HAS_MORE_PAGES = 0x0002
NO_METADATA = 0x0004

# [option] ids that carry more than their id.
_CUSTOM, _LIST, _MAP, _SET, _UDT, _TUPLE = 0x0000, 0x0020, 0x0021, 0x0022, 0x0030, 0x0031
# Nesting deeper than this is not a type Cassandra sends; refusing it bounds the recursion.
MAX_TYPE_DEPTH = 64

_PEER_EVENTS = frozenset({"TOPOLOGY_CHANGE", "STATUS_CHANGE"})


def is_peer_query(text: str) -> bool:
    """Whether ``text`` is one SELECT from ``system.peers`` or ``system.peers_v2``.

    Conservative: the table must be named with its keyspace (as drivers do), ``FROM`` must
    be followed by exactly ``system . peers[_v2]`` and the text holds one statement.
    """
    toks = tokens(text)
    if not toks or toks[0].upper != "SELECT":
        return False
    while toks and toks[-1].kind == "other" and toks[-1].text == ";":
        toks.pop()
    if any(t.kind == "other" and t.text == ";" for t in toks):
        return False
    froms = [i for i, t in enumerate(toks) if t.upper == "FROM"]
    if len(froms) != 1:
        return False
    at = froms[0]
    named = toks[at + 1 : at + 4]
    return (
        len(named) == 3
        and named[0].identifier == "system"
        and named[1].kind == "other"
        and named[1].text == "."
        and named[2].identifier in PEER_TABLES
    )


def is_peer_event(body: bytes) -> bool:
    """Whether an EVENT body names the Cassandra nodes (TOPOLOGY_CHANGE, STATUS_CHANGE)."""
    try:
        return f.Reader(body).string() in _PEER_EVENTS
    except f.Malformed:
        return False


def _skip_option(reader: f.Reader, depth: int = 0) -> None:
    if depth > MAX_TYPE_DEPTH:
        raise f.Malformed(f"a column type nested deeper than {MAX_TYPE_DEPTH}")
    kind = reader.short()
    if kind == _CUSTOM:
        reader.string()
    elif kind in (_LIST, _SET):
        _skip_option(reader, depth + 1)
    elif kind == _MAP:
        _skip_option(reader, depth + 1)
        _skip_option(reader, depth + 1)
    elif kind == _UDT:
        reader.string()
        reader.string()
        for _ in range(reader.short()):
            reader.string()
            _skip_option(reader, depth + 1)
    elif kind == _TUPLE:
        for _ in range(reader.short()):
            _skip_option(reader, depth + 1)


def without_rows(flags: int, body: bytes) -> bytes | None:
    """A RESULT body as Cassandra sent it but with no rows and no further pages; None when
    it is not a ROWS result. Its tracing id, warnings, custom payload and column
    metadata are kept byte for byte. :class:`~accord_cassandra.native.frame.Malformed`
    when the body cannot be read."""
    reader = f.Reader(body)
    if flags & f.TRACING:
        reader.take(16)
    if flags & f.WARNING:
        reader.string_list()
    if flags & f.CUSTOM_PAYLOAD:
        reader.bytes_map()
    prefix_end = reader.at
    if reader.int32() != f.ROWS:
        return None
    meta_flags = reader.int32()
    columns = reader.int32()
    if columns < 0:
        raise f.Malformed(f"a ROWS result of {columns} columns")
    if meta_flags & HAS_MORE_PAGES:
        reader.blob()
    specs_start = reader.at
    if not meta_flags & NO_METADATA:
        if meta_flags & GLOBAL_TABLES_SPEC:
            reader.string()
            reader.string()
        for _ in range(columns):
            if not meta_flags & GLOBAL_TABLES_SPEC:
                reader.string()
                reader.string()
            reader.string()
            _skip_option(reader)
    specs = body[specs_start : reader.at]
    rows = reader.int32()
    if rows < 0:
        raise f.Malformed(f"a ROWS result of {rows} rows")
    return (
        body[:prefix_end]
        + struct.pack(">iii", f.ROWS, meta_flags & ~HAS_MORE_PAGES, columns)
        + specs
        + struct.pack(">i", 0)
    )
