"""What a driver learns of the cluster through the endpoint: the sidecars, not Cassandra.

A driver reads ``system.local`` and ``system.peers`` / ``system.peers_v2`` on its control
connection and listens for TOPOLOGY_CHANGE / STATUS_CHANGE events. Relayed as Cassandra
answers them they name the Cassandra nodes' own addresses, and the driver would send its
transactions there, where ``BEGIN TRANSACTION`` is a syntax error. So the endpoint forwards
these queries to Cassandra and rewrites the answer (:func:`rewrite_rows`):

- ``system.local``: ``rpc_address`` / ``rpc_port`` become this sidecar's CQL endpoint;
- ``system.peers`` / ``system.peers_v2``: one row per Cassandra node that another sidecar
  fronts, its ``rpc_address`` / ``native_address`` / ``native_port`` that sidecar's CQL
  endpoint; the rows of nodes no sidecar fronts are dropped.

Everything else in a row (host id, data center, rack, tokens, schema version, release
version) is the Cassandra node's, so token-aware routing and schema-agreement checks see
the node each sidecar fronts. ``peer`` / ``peer_port`` (the internode address) are kept:
drivers use them only as a name. TOPOLOGY_CHANGE and STATUS_CHANGE events are dropped
(:func:`is_peer_event`): a driver learns that a sidecar is gone from its connections.

``system.peers`` has no port column for the native port: a driver reading it (rather than
``peers_v2``, which Cassandra 4.0 and later have) reaches every sidecar at its own contact
port. Which sidecar fronts which node: :class:`Directory`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accord_cassandra.native import frame as f
from accord_cassandra.native.statements import tokens
from accord_cassandra.ports import split_address

logger = logging.getLogger(__name__)

LOCAL = "local"
PEERS = "peers"
PEERS_V2 = "peers_v2"
SYSTEM_TABLES = frozenset({LOCAL, PEERS, PEERS_V2})

# ROWS metadata flags (protocol v4, section 4.2.5.2).
GLOBAL_TABLES_SPEC = 0x0001
HAS_MORE_PAGES = 0x0002
NO_METADATA = 0x0004

# [option] ids that carry more than their id.
_CUSTOM, _LIST, _MAP, _SET, _UDT, _TUPLE = 0x0000, 0x0020, 0x0021, 0x0022, 0x0030, 0x0031
# Nesting deeper than this is not a type Cassandra sends; refusing it bounds the recursion.
MAX_TYPE_DEPTH = 64
# A cql_peers_file larger than this is refused (it holds one address per sidecar).
MAX_PEERS_FILE_BYTES = 1024 * 1024

_PEER_EVENTS = frozenset({"TOPOLOGY_CHANGE", "STATUS_CHANGE"})


def system_table(text: str) -> str | None:
    """``local``, ``peers`` or ``peers_v2`` when ``text`` is one SELECT from that table of
    keyspace ``system``; None otherwise.

    The table must be named with its keyspace (as drivers do), ``FROM`` followed by exactly
    ``system . <table>``, and the text one statement.
    """
    toks = tokens(text)
    if not toks or toks[0].upper != "SELECT":
        return None
    while toks and toks[-1].kind == "other" and toks[-1].text == ";":
        toks.pop()
    if any(t.kind == "other" and t.text == ";" for t in toks):
        return None
    froms = [i for i, t in enumerate(toks) if t.upper == "FROM"]
    if len(froms) != 1:
        return None
    named = toks[froms[0] + 1 : froms[0] + 4]
    if (
        len(named) == 3
        and named[0].identifier == "system"
        and named[1].kind == "other"
        and named[1].text == "."
        and named[2].identifier in SYSTEM_TABLES
    ):
        return named[2].identifier
    return None


def is_peer_event(body: bytes) -> bool:
    """Whether an EVENT body names the Cassandra nodes (TOPOLOGY_CHANGE, STATUS_CHANGE)."""
    try:
        return f.Reader(body).string() in _PEER_EVENTS
    except f.Malformed:
        return False


@dataclass(frozen=True)
class Endpoint:
    """A sidecar's CQL endpoint as rows carry it: an IP address and a port."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def inet(self) -> bytes:
        return self.address.packed

    @staticmethod
    def parse(text: str) -> Endpoint:
        """``host:port`` (a name is resolved once, here); ValueError naming the problem."""
        host, port = split_address(text)
        return Endpoint(_ip(host.strip("[]")), port)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise ValueError(f"cannot resolve {host!r}: {error}") from None
    return ipaddress.ip_address(infos[0][4][0])


class Directory:
    """Which sidecar's CQL endpoint fronts which Cassandra node.

    ``node_id``: this sidecar. ``cql_peers``: every sidecar's CQL endpoint (``host:port``,
    this one's may be left out), from the config, overridden by ``cql_peers_file`` (JSON
    ``{node_id: "host:port"}``, re-read whenever it changes). ``cassandra_hosts``: the
    Cassandra node (its address) each sidecar runs beside; a sidecar missing there is not
    advertised. Two sidecars beside one node: the lower node id is advertised.
    """

    def __init__(
        self,
        node_id: int,
        cql_peers: Mapping[int, str],
        cassandra_hosts: Mapping[int, str],
        cql_peers_file: Path | None = None,
    ) -> None:
        self.node_id = node_id
        self.configured = dict(cql_peers)
        self.cql_peers_file = cql_peers_file
        self.cassandra: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
        for node, host in cassandra_hosts.items():
            try:
                self.cassandra[node] = _ip(_host_part(host))
            except ValueError as error:
                logger.warning(
                    "CQL endpoint: cassandra_hosts[%d]: %s (not advertised)", node, error
                )
        self.local: Endpoint | None = None  # set by the endpoint once bound
        self._file_stamp: tuple[int, int] | None = None
        self._from_file: dict[int, str] | None = None
        self._endpoints: dict[int, Endpoint] = {}
        self._warned: set[str] = set()
        self._build(self.configured)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("CQL endpoint: %s", message)

    def _build(self, peers: Mapping[int, str]) -> None:
        endpoints = {}
        for node, address in peers.items():
            try:
                endpoints[node] = Endpoint.parse(address)
            except ValueError as error:
                self._warn_once(f"CQL peer {node} at {address!r}: {error} (not advertised)")
        self._endpoints = endpoints

    def _refresh(self) -> None:
        path = self.cql_peers_file
        if path is None:
            return
        try:
            stat = os.stat(path)
        except OSError:
            return  # not written yet: the configured peers stand
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            if stat.st_size > MAX_PEERS_FILE_BYTES:
                raise ValueError(f"larger than {MAX_PEERS_FILE_BYTES} bytes")
            loaded = json.loads(path.read_text())
            if not isinstance(loaded, dict):
                raise ValueError("not a JSON object {node_id: host:port}")
            peers = {int(node): str(address) for node, address in loaded.items()}
        except (OSError, ValueError) as error:
            self._warn_once(f"cql_peers_file {path}: {error}; keeping the peers known before")
            return
        self._from_file = peers
        self._build({**self.configured, **peers})

    def advertised(self) -> dict[ipaddress.IPv4Address | ipaddress.IPv6Address, Endpoint]:
        """Cassandra node address -> the CQL endpoint of the sidecar to reach it at (this
        sidecar's own node excluded: it is the ``system.local`` row)."""
        self._refresh()
        out: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, Endpoint] = {}
        for node in sorted(self._endpoints):
            if node == self.node_id:
                continue
            cassandra = self.cassandra.get(node)
            if cassandra is None:
                self._warn_once(
                    f"sidecar {node} has a CQL endpoint but no cassandra_hosts entry: "
                    "drivers are not told of it"
                )
                continue
            out.setdefault(cassandra, self._endpoints[node])
        return out

    def own(self) -> Endpoint | None:
        """This sidecar's CQL endpoint as drivers are to reach it."""
        self._refresh()
        return self._endpoints.get(self.node_id, self.local)


def _host_part(address: str) -> str:
    """The host of ``host`` or ``host:port`` (``[v6]:port`` too)."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    if address.count(":") == 1:
        return address.partition(":")[0]
    return address


@dataclass
class Rows:
    """A ROWS result taken apart: everything before the rows kept as bytes, the cells raw."""

    prefix: bytes  # tracing id, warnings, custom payload: as Cassandra sent them
    meta_flags: int
    paging_state: bytes | None
    specs: bytes  # the column specs, byte for byte
    names: list[str]
    rows: list[list[bytes | None]]
    columns: int

    def encode(self) -> bytes:
        w = f.Writer().raw(self.prefix).int32(f.ROWS).int32(self.meta_flags).int32(self.columns)
        if self.meta_flags & HAS_MORE_PAGES:
            w.blob(self.paging_state)
        w.raw(self.specs).int32(len(self.rows))
        for row in self.rows:
            for cell in row:
                w.blob(cell)
        return w.build()

    def with_rows(self, rows: list[list[bytes | None]]) -> Rows:
        return Rows(
            self.prefix, self.meta_flags, self.paging_state, self.specs, self.names, rows,
            self.columns,
        )  # fmt: skip


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


def _column_specs(reader: f.Reader, meta_flags: int, columns: int) -> list[str]:
    """Read (global table spec and) the column specs; their names."""
    names = []
    if meta_flags & GLOBAL_TABLES_SPEC:
        reader.string()
        reader.string()
    for _ in range(columns):
        if not meta_flags & GLOBAL_TABLES_SPEC:
            reader.string()
            reader.string()
        names.append(reader.string())
        _skip_option(reader)
    return names


def _prefix_end(reader: f.Reader, flags: int) -> int:
    if flags & f.TRACING:
        reader.take(16)
    if flags & f.WARNING:
        reader.string_list()
    if flags & f.CUSTOM_PAYLOAD:
        reader.bytes_map()
    return reader.at


def read_rows(flags: int, body: bytes, names: list[str] | None = None) -> Rows | None:
    """The ROWS result in ``body`` taken apart; None for another kind of RESULT.
    ``names``: the columns of a result sent without metadata (an EXECUTE that skipped it).
    :class:`~accord_cassandra.native.frame.Malformed` when it cannot be read."""
    reader = f.Reader(body)
    prefix = body[: _prefix_end(reader, flags)]
    if reader.int32() != f.ROWS:
        return None
    meta_flags = reader.int32()
    columns = reader.int32()
    if columns < 0:
        raise f.Malformed(f"a ROWS result of {columns} columns")
    paging_state = reader.blob() if meta_flags & HAS_MORE_PAGES else None
    specs_start = reader.at
    if meta_flags & NO_METADATA:
        if names is None or len(names) != columns:
            raise f.Malformed("a ROWS result without metadata, of a statement not prepared here")
        found = list(names)
    else:
        found = _column_specs(reader, meta_flags, columns)
    specs = body[specs_start : reader.at]
    count = reader.int32()
    if count < 0:
        raise f.Malformed(f"a ROWS result of {count} rows")
    rows = [[reader.blob() for _ in range(columns)] for _ in range(count)]
    reader.done()
    return Rows(prefix, meta_flags, paging_state, specs, found, rows, columns)


def prepared_columns(flags: int, body: bytes) -> tuple[bytes, list[str]] | None:
    """The statement id and result column names of a PREPARED result; None for another."""
    reader = f.Reader(body)
    _prefix_end(reader, flags)
    if reader.int32() != f.PREPARED:
        return None
    statement = reader.short_bytes()
    # The bind variables' metadata: flags, count, partition key indexes, specs.
    meta_flags = reader.int32()
    columns = reader.int32()
    for _ in range(reader.int32()):
        reader.short()
    _column_specs(reader, meta_flags, columns)
    meta_flags = reader.int32()
    columns = reader.int32()
    if meta_flags & HAS_MORE_PAGES:
        reader.blob()
    names = [] if meta_flags & NO_METADATA else _column_specs(reader, meta_flags, columns)
    return statement, names


def _inet(cell: bytes | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if cell is None or len(cell) not in (4, 16):
        return None
    return ipaddress.ip_address(cell)


_ADDRESS_COLUMNS = ("native_address", "rpc_address", "peer")


def rewrite_rows(table: str, rows: Rows, directory: Directory) -> Rows:
    """``rows`` of ``system.<table>`` as this endpoint answers them (the module's doc).

    A ``system.local`` row keeps all but its native address and port, which become this
    sidecar's (left as they are when the sidecar does not know its own address, e.g. bound
    to a wildcard address and absent from cql_peers). A peers row is kept when an address
    column names a Cassandra node another sidecar fronts (rewritten to that sidecar) or
    when the row has no address column at all (it names no node: a driver's
    ``SELECT host_id, schema_version``); any other row is dropped.
    """
    at = {name: i for i, name in enumerate(rows.names)}
    if table == LOCAL:
        own = directory.own()
        if own is None:
            return rows
        out = []
        for row in rows.rows:
            row = list(row)
            if "rpc_address" in at:
                row[at["rpc_address"]] = own.inet
            if "rpc_port" in at and row[at["rpc_port"]] is not None:
                row[at["rpc_port"]] = struct.pack(">i", own.port)
            out.append(row)
        return rows.with_rows(out)
    advertised = directory.advertised()
    addressed = [at[c] for c in _ADDRESS_COLUMNS if c in at]
    out = []
    for row in rows.rows:
        if not addressed:
            out.append(list(row))
            continue
        sidecar = None
        for i in addressed:
            node = _inet(row[i])
            if node is not None and node in advertised:
                sidecar = advertised[node]
                break
        if sidecar is None:
            continue
        row = list(row)
        for name in ("native_address", "rpc_address"):
            if name in at:
                row[at[name]] = sidecar.inet
        if "native_port" in at:
            row[at["native_port"]] = struct.pack(">i", sidecar.port)
        out.append(row)
    return rows.with_rows(out)


def with_warning(flags: int, body: bytes, warning: str) -> tuple[int, bytes]:
    """A response's flags and body with ``warning`` added to its warnings (drivers log
    them and hand them to the application). Malformed when the body cannot be read."""
    reader = f.Reader(body)
    tracing = reader.take(16) if flags & f.TRACING else b""
    warnings = reader.string_list() if flags & f.WARNING else []
    rest = body[reader.at :]
    added = f.Writer().raw(tracing).string_list([*warnings, warning]).raw(rest).build()
    return flags | f.WARNING, added


def result_kind(flags: int, body: bytes) -> int | None:
    """The kind of a RESULT body (VOID, ROWS, ..., SCHEMA_CHANGE); None when unreadable."""
    try:
        reader = f.Reader(body)
        _prefix_end(reader, flags)
        return reader.int32()
    except f.Malformed:
        return None
