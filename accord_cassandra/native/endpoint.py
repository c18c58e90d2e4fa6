"""The sidecar's CQL native-protocol endpoint (protocol v4): a driver or cqlsh connects to
it as if it were Cassandra.

Each client connection gets a connection of its own to the co-located Cassandra node
(``cql_upstream``). ``BEGIN TRANSACTION … COMMIT TRANSACTION`` in QUERY, and in PREPARE /
EXECUTE, runs through Accord here (accord_cassandra.cql) and is answered with a ROWS result:
``[applied]`` and the columns of the transaction's SELECT. Every other frame goes to
Cassandra as it came and its answer comes back as Cassandra sent it, stream id and all, with
these rewrites: SUPPORTED offers no compression and protocol v4 only, since this endpoint
speaks neither other; ``system.local`` / ``system.peers`` / ``system.peers_v2`` answers
describe the sidecars, and TOPOLOGY_CHANGE / STATUS_CHANGE events are dropped
(accord_cassandra.native.peers), so a driver given one sidecar finds the others and never
Cassandra; a schema change's RESULT is held until the Cassandra nodes agree on the schema
(bounded by ``schema_agreement_seconds``; past it the RESULT goes with a warning), so the
next statement meets no node without the change. STARTUP, AUTHENTICATE and AUTH_RESPONSE
pass through, and transactions run only on a connection Cassandra has answered READY or
AUTH_SUCCESS.

Refused here (docs/sidecars.md, "The CQL endpoint"): a plain INSERT / UPDATE / DELETE /
BATCH / TRUNCATE naming an Accord-managed table (its writes would race the transactions'),
unless the table is in ``cql_plain_writes``; compression; protocol versions other than 4;
frames over ``cql_max_frame_bytes``; malformed frames. Each is an ERROR frame with the code
Cassandra gives the like; only a frame after which the byte stream cannot be cut into frames
(another protocol version, a response sent as a request, a frame cut short by the end of the
connection) closes the connection, after its ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from accord.invariants import check_not_none
from accord_cassandra.client import Result
from accord_cassandra.cql import CqlError, CqlSyntaxError, Prepared, prepare
from accord_cassandra.cql import ast as cql_ast
from accord_cassandra.cql.build import SELECT_LET
from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.native import frame as f
from accord_cassandra.native.frame import BadFrame, Frame, Malformed, QueryParameters, Writer
from accord_cassandra.native.peers import (
    Directory,
    Endpoint,
    is_peer_event,
    prepared_columns,
    read_rows,
    result_kind,
    rewrite_rows,
    system_table,
    with_warning,
)
from accord_cassandra.native.statements import is_transaction, written_tables
from accord_cassandra.native.values import decode, encode, encode_type, is_not_set
from accord_cassandra.ports import check_dead_seconds, keep_alive, split_address
from accord_cassandra.schema import Catalog, SchemaError, TableSchema
from accord_cassandra.v1 import client_pb2

logger = logging.getLogger(__name__)

# Our prepared ids: this prefix and the MD5 of the text, 20 bytes, where Cassandra's are
# 16 (an MD5): an id is ours by its length and prefix alone, so an EXECUTE of one this
# endpoint no longer holds is answered UNPREPARED here and never reaches Cassandra.
ID_PREFIX = b"ACRD"
ID_BYTES = len(ID_PREFIX) + 16
MAX_PREPARED = 1024
# A transaction text longer than this is refused before it is parsed.
MAX_TRANSACTION_TEXT = 64 * 1024
# Transactions one connection may have running at once; more are refused OVERLOADED.
MAX_IN_FLIGHT_PER_CONNECTION = 1024
# Responses from Cassandra may be as large as it allows (its max frame, 256 MiB at most).
MAX_UPSTREAM_FRAME_BYTES = 256 * 1024 * 1024
READ_BYTES = 64 * 1024
UPSTREAM_CONNECT_SECONDS = 10.0
# Cassandra's ids of prepared system.local/peers queries remembered (a driver has a few).
MAX_SYSTEM_STATEMENTS = 256
SCHEMA_AGREEMENT_SECONDS = 60.0
# The defaults of config cql_max_connections and cql_dead_client_seconds. Each connection
# holds one to Cassandra and may buffer up to cql_max_frame_bytes, so the limit bounds both
# (256 x 16 MiB at worst); drivers open one or two per host and client. A client gone
# without a word (power, network) is dropped after about a minute, not kept for good.
MAX_CONNECTIONS = 256
DEAD_CLIENT_SECONDS = 60.0


class Failure(AccordCassandraError):
    """A transaction that got no result: ``kind`` is ``invalid`` (refused, nothing ran),
    ``overloaded`` (refused, nothing ran), ``invalidated`` (it did not and will not apply)
    or ``unknown`` (it may still commit)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# Runs one translated client request through Accord (the sidecar's own path).
Runner = Callable[[client_pb2.TransactRequest], Awaitable[client_pb2.TransactResponse]]
# Waits up to the seconds given for every live Cassandra node to report one schema
# version; whether they did.
Agreement = Callable[[float], Awaitable[bool]]


@dataclass(frozen=True)
class Column:
    keyspace: str
    table: str
    name: str
    cql_type: str

    def spec(self) -> bytes:
        return (
            Writer()
            .string(self.keyspace)
            .string(self.table)
            .string(self.name)
            .raw(encode_type(self.cql_type, self.keyspace))
            .build()
        )


@dataclass(frozen=True)
class Statement:
    """A transaction text prepared here: its id, its bind variables and result columns."""

    id: bytes
    prepared: Prepared
    variables: list[Column]
    columns: list[Column]  # [applied] first


def statement_id(text: str) -> bytes:
    return ID_PREFIX + hashlib.md5(text.encode("utf-8"), usedforsecurity=False).digest()


def _kinds(table: TableSchema) -> dict[str, str]:
    kinds = dict(table.partition_key) | {n: t for n, t, _ in table.clustering}
    return kinds | dict(table.columns) | dict(table.static)


def _table(catalog: Catalog, table: cql_ast.Table) -> TableSchema:
    if table.keyspace is None:
        raise CqlError(
            f"{table.pos}: name the keyspace of table {table.name} (keyspace.table): "
            "a transaction has no current keyspace"
        )
    try:
        return catalog.table(table.keyspace, table.name)
    except SchemaError as error:
        raise CqlError(f"{table.pos}: {error}") from None


def describe(text: str, catalog: Catalog) -> Statement:
    """Parse ``text`` and say what a PREPARED result says of it; :class:`CqlError` when it
    does not parse, names what the catalog lacks, or has a marker whose type it cannot tell."""
    prepared = prepare(text, catalog)
    tree = prepared.tree
    tables = [let.select.table for let in tree.lets]
    tables += [tree.select.table] if tree.select is not None else []
    tables += [m.table for m in tree.modifications]
    schemas = [_table(catalog, t) for t in tables]
    variables = []
    for marker, spec in zip(tree.markers, prepared.bind_columns(), strict=True):
        if spec is None:
            raise CqlError(
                f"{marker.pos}: cannot tell the CQL type of this bind marker (it is not "
                "compared with, or assigned to, a column); give the value as a literal"
            )
        variables.append(Column(spec.keyspace, spec.table, marker.name or spec.name, spec.cql_type))
    first = schemas[0] if schemas else None
    ks, tb = (first.keyspace, first.table) if first else ("system", "accord")
    columns = [Column(ks, tb, "[applied]", "boolean")]
    if tree.select is not None:
        table = _table(catalog, tree.select.table)
        kinds = _kinds(table)
        names = tree.select.columns
        if names is None:
            rest = sorted([n for n, _ in table.columns] + [n for n, _ in table.static])
            names = (
                *(n for n, _ in table.partition_key),
                *(n for n, _, _ in table.clustering),
                *rest,
            )
        for name in names:
            if name not in kinds:
                raise CqlError(f"{tree.select.pos}: unknown column {name!r} in {table.qualified}")
            columns.append(Column(table.keyspace, table.table, name, kinds[name]))
    lets = {let.name: let for let in tree.lets}
    for ref in tree.returning or ():
        let = lets.get(ref.name)
        if let is None or ref.name == SELECT_LET:
            raise CqlError(f"{ref.pos}: unknown LET name {ref.name!r}")
        table = _table(catalog, let.select.table)
        kinds = _kinds(table)
        column = ref.column or ""
        if column not in kinds:
            raise CqlError(f"{ref.pos}: unknown column {column!r} in {table.qualified}")
        label = f"{ref.name}.{column}"
        columns.append(Column(table.keyspace, table.table, label, kinds[column]))
    return Statement(statement_id(text), prepared, variables, columns)


def prepared_body(statement: Statement) -> bytes:
    w = Writer().int32(f.PREPARED).short_bytes(statement.id)
    # Bind variables: flags (no global table spec), count, no partition key indexes.
    w.int32(0).int32(len(statement.variables)).int32(0)
    for column in statement.variables:
        w.raw(column.spec())
    w.int32(0).int32(len(statement.columns))
    for column in statement.columns:
        w.raw(column.spec())
    return w.build()


def rows_body(columns: list[Column], rows: Iterable[tuple[object, ...]]) -> bytes:
    w = Writer().int32(f.ROWS).int32(0).int32(len(columns))
    for column in columns:
        w.raw(column.spec())
    materialized = list(rows)
    w.int32(len(materialized))
    for row in materialized:
        for column, value in zip(columns, row, strict=True):
            w.blob(encode(column.cql_type, value))
    return w.build()


def rewrite_supported(body: bytes) -> bytes:
    """SUPPORTED as this endpoint honours it: no compression, protocol v4 alone."""
    options = f.Reader(body).string_multimap()
    options["COMPRESSION"] = []
    if "PROTOCOL_VERSIONS" in options:
        options["PROTOCOL_VERSIONS"] = ["4/v4"]
    return Writer().string_multimap(options).build()


class PreparedCache:
    """Transaction statements by id, least recently used first out."""

    def __init__(self, capacity: int = MAX_PREPARED) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Statement] = OrderedDict()

    def get(self, statement: bytes) -> Statement | None:
        found = self._entries.get(statement)
        if found is not None:
            self._entries.move_to_end(statement)
        return found

    def put(self, statement: Statement) -> None:
        self._entries[statement.id] = statement
        self._entries.move_to_end(statement.id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class CqlEndpoint:
    """Listens on ``listen`` (host:port, port 0 for any) and serves every connection:
    :meth:`bind` first (the port is known, nothing is served), then :meth:`start`."""

    def __init__(
        self,
        listen: str,
        upstream: str,
        *,
        plain_writes: Iterable[str] = (),
        max_frame_bytes: int = f.MAX_FRAME_BYTES,
        prepared_capacity: int = MAX_PREPARED,
        max_transaction_text: int = MAX_TRANSACTION_TEXT,
        directory: Directory | None = None,
        agreement: Agreement | None = None,
        schema_agreement_seconds: float = SCHEMA_AGREEMENT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        dead_client_seconds: float = DEAD_CLIENT_SECONDS,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        check_dead_seconds(dead_client_seconds, "dead_client_seconds")
        self.max_connections = max_connections
        self.dead_client_seconds = dead_client_seconds
        self.listen = listen
        self.upstream = upstream
        self.catalog = Catalog()
        self.runner: Runner | None = None
        self.plain_writes = frozenset(plain_writes)
        self.max_frame_bytes = max_frame_bytes
        self.max_transaction_text = max_transaction_text
        self.prepared = PreparedCache(prepared_capacity)
        self.server: asyncio.Server | None = None
        self.bound: str | None = None
        self.connections: set[asyncio.Task[None]] = set()
        # With no directory the endpoint knows no other sidecar: peers answers are empty.
        self.directory = directory if directory is not None else Directory(0, {}, {})
        self.agreement = agreement
        self.schema_agreement_seconds = schema_agreement_seconds
        # Cassandra's ids of prepared system-table queries: the table and result columns.
        self.system_statements: OrderedDict[bytes, tuple[str, list[str]]] = OrderedDict()
        # Requests by opcode name, transactions run, schema changes whose agreement wait
        # ran out (the metrics: accord_cql_*).
        self.requests: Counter[str] = Counter()
        self.transactions = 0
        self.agreement_timeouts = 0
        self.refused_connections = 0  # closed on arrival, max_connections being open

    async def bind(self) -> str:
        """Bind ``listen``; the address bound (its port chosen by the kernel for port 0)."""
        host, port = split_address(self.listen)
        self.server = await asyncio.start_server(
            self._accept, host.strip("[]"), port, start_serving=False
        )
        sockname = self.server.sockets[0].getsockname()
        bound_host = f"[{sockname[0]}]" if ":" in sockname[0] else sockname[0]
        self.bound = f"{bound_host}:{sockname[1]}"
        with contextlib.suppress(ValueError):
            own = Endpoint.parse(self.bound)
            if not own.address.is_unspecified:
                self.directory.local = own
        return self.bound

    async def start(self, catalog: Catalog, runner: Runner) -> None:
        """Serve transactions on ``catalog``'s tables through ``runner``."""
        if self.server is None:
            await self.bind()
        self.catalog = catalog
        self.runner = runner
        server = check_not_none(self.server, "CQL endpoint without a server")
        await server.start_serving()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        for task in list(self.connections):
            with contextlib.suppress(BaseException):
                await task
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)

    def remember_system_statement(self, statement: bytes, table: str, names: list[str]) -> None:
        self.system_statements[statement] = (table, names)
        self.system_statements.move_to_end(statement)
        while len(self.system_statements) > MAX_SYSTEM_STATEMENTS:
            self.system_statements.popitem(last=False)

    async def agreed(self) -> str | None:
        """Wait for schema agreement after a schema change; a warning when it was not seen."""
        agreement = self.agreement
        if agreement is None:
            return None
        limit = self.schema_agreement_seconds
        try:
            agreed = await asyncio.wait_for(agreement(limit), limit + 5.0)
        except TimeoutError:
            agreed = False
        except Exception as error:  # the change is made: say so, with why agreement is unknown
            logger.warning(
                "CQL endpoint: checking schema agreement failed: %r", error, exc_info=True
            )
            agreed = False
        if agreed:
            return None
        self.agreement_timeouts += 1
        warning = (
            f"the Cassandra nodes did not agree on the schema within {limit:g} s after this "
            "change (cql_schema_agreement_seconds): a statement on a node that lacks it yet "
            "may fail; retry it, or wait for agreement"
        )
        logger.warning("CQL endpoint: %s", warning)
        return warning

    def accord_table(self, name: str) -> bool:
        keyspace, _, table = name.partition(".")
        try:
            self.catalog.table(keyspace, table)
        except SchemaError:
            return False
        return name not in self.plain_writes

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= self.max_connections:
            # As Cassandra past native_transport_max_concurrent_connections: closed before a
            # byte is read or a connection to Cassandra opened.
            self.refused_connections += 1
            if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                logger.warning(
                    "CQL endpoint: %d connection(s) closed on arrival, %d being open "
                    "(cql_max_connections)",
                    self.refused_connections,
                    self.max_connections,
                )
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            keep_alive(sock, self.dead_client_seconds)
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        try:
            await Connection(self, reader, writer).run()
        except asyncio.CancelledError:
            pass
        except OSError as error:  # reset, or the client vanished (keepalive's TimeoutError)
            logger.info("CQL connection ended: %r", error)
        except Exception:
            logger.exception("CQL connection failed")
        finally:
            if task is not None:
                self.connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class Connection:
    """One client connection and its connection to Cassandra."""

    def __init__(
        self, endpoint: CqlEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.endpoint = endpoint
        self.reader = reader
        self.writer = writer
        self.decoder = f.FrameDecoder(endpoint.max_frame_bytes)
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.started = False  # STARTUP sent
        self.authenticated = False  # Cassandra answered READY or AUTH_SUCCESS
        self.keyspace: str | None = None  # the current keyspace (USE), as Cassandra says
        self.running: set[asyncio.Task[None]] = set()
        # Streams awaiting Cassandra's answer to a system.local/peers query (QUERY or
        # EXECUTE): the table, and the columns of a prepared one; and to a PREPARE of one.
        self.system_queries: dict[int, tuple[str, list[str] | None]] = {}
        self.system_prepares: dict[int, str] = {}
        self.held: set[asyncio.Task[None]] = set()  # schema changes awaiting agreement

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def error(self, stream: int, code: int, message: str) -> None:
        self.send(f.error_frame(stream, code, message))

    async def run(self) -> None:
        host, port = split_address(self.endpoint.upstream)
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), port), UPSTREAM_CONNECT_SECONDS
            )
        except (OSError, TimeoutError) as error:
            await self._unreachable(error)
            return
        self.upstream_writer = upstream_writer
        relay = asyncio.create_task(self._relay(upstream_reader))
        try:
            await self._serve_client()
        finally:
            for task in [*self.running, *self.held]:
                task.cancel()
            upstream_writer.close()
            relay.cancel()
            with contextlib.suppress(BaseException):
                await relay
            with contextlib.suppress(Exception):
                await upstream_writer.wait_closed()

    async def _unreachable(self, error: BaseException) -> None:
        """Answer the first frame with why nothing can be served, then close."""
        why = f"the CQL endpoint cannot reach Cassandra at {self.endpoint.upstream}: {error}"
        logger.warning("%s", why)
        with contextlib.suppress(Exception):
            data = await asyncio.wait_for(self.reader.read(f.HEADER_BYTES), 5.0)
            stream = f.HEADER.unpack_from(data)[2] if len(data) >= f.HEADER_BYTES else 0
            self.error(stream, f.SERVER_ERROR, why)
            await self.writer.drain()

    async def _serve_client(self) -> None:
        while True:
            data = await self.reader.read(READ_BYTES)
            if not data:
                bad = self.decoder.eof()
                if bad is not None:
                    self.error(bad.stream, bad.code, bad.message)
                    await self.writer.drain()
                return
            for item in self.decoder.feed(data):
                if isinstance(item, BadFrame):
                    self.error(item.stream, item.code, item.message)
                    if item.fatal:
                        await self.writer.drain()
                        return
                else:
                    self._handle(item)
            await self.writer.drain()
            if self.upstream_writer is not None:
                await self.upstream_writer.drain()

    def _forward(self, frame: Frame) -> None:
        if self.upstream_writer is not None and not self.upstream_writer.is_closing():
            self.upstream_writer.write(frame.encode())

    def _handle(self, frame: Frame) -> None:
        stream = frame.stream
        if frame.flags & f.COMPRESSED:
            self.error(
                stream, f.PROTOCOL_ERROR, "a compressed frame, but no compression was agreed"
            )
            return
        if frame.opcode not in f.REQUEST_OPCODES:
            self.error(stream, f.PROTOCOL_ERROR, f"unknown request opcode 0x{frame.opcode:02X}")
            return
        self.endpoint.requests[_opname(frame.opcode)] += 1
        # A stream id is free again once answered: no mark of an earlier request stays.
        self.system_queries.pop(stream, None)
        self.system_prepares.pop(stream, None)
        try:
            if frame.opcode == f.STARTUP:
                self._startup(frame)
            elif frame.opcode == f.QUERY:
                self._query(frame)
            elif frame.opcode == f.PREPARE:
                self._prepare(frame)
            elif frame.opcode == f.EXECUTE:
                self._execute(frame)
            elif frame.opcode == f.BATCH:
                self._batch(frame)
            else:
                self._forward(frame)
        except Malformed as error:
            self.error(stream, f.PROTOCOL_ERROR, f"malformed {_opname(frame.opcode)}: {error}")
        except Exception as error:  # answered, never a request left without a word
            logger.exception("CQL endpoint: handling %s", _opname(frame.opcode))
            self.error(stream, f.SERVER_ERROR, f"{_opname(frame.opcode)} failed here: {error!r}")

    def _startup(self, frame: Frame) -> None:
        reader = f.Reader(frame.body)
        options = reader.string_map()
        reader.done()
        compression = options.get("COMPRESSION")
        if compression:
            self.error(
                frame.stream,
                f.PROTOCOL_ERROR,
                f"compression {compression!r} is not supported by the Accord CQL endpoint; "
                "connect without compression",
            )
            return
        self.started = True
        self._forward(frame)

    def _refused_write(self, stream: int, texts: Iterable[str]) -> bool:
        """Refuse (INVALID) a plain write to an Accord-managed table; whether it was."""
        if not self.authenticated:
            return False  # Cassandra refuses it anyway, and says nothing of our tables
        for text in texts:
            for table in written_tables(text, self.keyspace):
                if self.endpoint.accord_table(table):
                    self.error(
                        stream,
                        f.INVALID,
                        f"{table} is managed by Accord: write it inside BEGIN TRANSACTION … "
                        "COMMIT TRANSACTION (a plain write would race the transactions' "
                        "writes), or list it in the sidecar's cql_plain_writes",
                    )
                    return True
        return False

    def _ready_for_transactions(self, stream: int) -> bool:
        if self.authenticated:
            return True
        self.error(
            stream,
            f.PROTOCOL_ERROR,
            "a transaction before the connection is ready: send STARTUP first"
            if not self.started
            else "a transaction before authentication succeeded (AUTH_SUCCESS)",
        )
        return False

    def _describe(self, stream: int, text: str) -> Statement | None:
        limit = self.endpoint.max_transaction_text
        if len(text.encode("utf-8")) > limit:
            self.error(
                stream,
                f.INVALID,
                f"a transaction text of {len(text.encode('utf-8'))} bytes exceeds the limit "
                f"of {limit} bytes",
            )
            return None
        try:
            return describe(text, self.endpoint.catalog)
        except CqlSyntaxError as error:
            self.error(stream, f.SYNTAX_ERROR, str(error))
        except CqlError as error:
            self.error(stream, f.INVALID, str(error))
        return None

    def _query(self, frame: Frame) -> None:
        text, params = f.read_query(frame.body)
        if not is_transaction(text):
            if not self._refused_write(frame.stream, [text]):
                table = system_table(text)
                if table is not None:
                    self.system_queries[frame.stream] = (table, None)
                self._forward(frame)
            return
        if not self._ready_for_transactions(frame.stream):
            return
        statement = self._describe(frame.stream, text)
        if statement is not None:
            self._start(frame.stream, statement, params)

    def _prepare(self, frame: Frame) -> None:
        text = f.read_prepare(frame.body)
        if not is_transaction(text):
            if not self._refused_write(frame.stream, [text]):
                table = system_table(text)
                if table is not None:
                    self.system_prepares[frame.stream] = table
                self._forward(frame)
            return
        if not self._ready_for_transactions(frame.stream):
            return
        statement = self._describe(frame.stream, text)
        if statement is not None:
            self.endpoint.prepared.put(statement)
            self.send(
                f.encode_frame(
                    f.V4 | f.RESPONSE, 0, frame.stream, f.RESULT, prepared_body(statement)
                )
            )

    def _execute(self, frame: Frame) -> None:
        statement_id_, params = f.read_execute(frame.body)
        if len(statement_id_) != ID_BYTES or not statement_id_.startswith(ID_PREFIX):
            # Cassandra's own prepared statement
            system = self.endpoint.system_statements.get(statement_id_)
            if system is not None:
                self.system_queries[frame.stream] = (system[0], system[1])
            self._forward(frame)
            return
        if not self._ready_for_transactions(frame.stream):
            return
        statement = self.endpoint.prepared.get(statement_id_)
        if statement is None:
            self.send(
                f.unprepared_frame(
                    frame.stream,
                    statement_id_,
                    f"prepared transaction 0x{statement_id_.hex()} is not (or no longer) "
                    "known here: prepare it again",
                )
            )
            return
        self._start(frame.stream, statement, params)

    def _batch(self, frame: Frame) -> None:
        texts = f.read_batch_texts(frame.body)
        if any(is_transaction(t) for t in texts):
            self.error(
                frame.stream,
                f.INVALID,
                "BEGIN TRANSACTION cannot be part of a BATCH: send it as a QUERY or EXECUTE",
            )
            return
        if not self._refused_write(frame.stream, texts):
            self._forward(frame)

    def _start(self, stream: int, statement: Statement, params: QueryParameters) -> None:
        if len(self.running) >= MAX_IN_FLIGHT_PER_CONNECTION:
            self.error(
                stream,
                f.OVERLOADED,
                f"{MAX_IN_FLIGHT_PER_CONNECTION} transactions already running on this "
                "connection; nothing was submitted",
            )
            return
        self.endpoint.transactions += 1
        task = asyncio.create_task(self._transaction(stream, statement, params))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _transaction(
        self, stream: int, statement: Statement, params: QueryParameters
    ) -> None:
        try:
            body = await self._run(statement, params)
        except _Answer as answer:
            self.send(answer.frame(stream))
        except Exception as error:  # answered, never a request left without a word
            logger.exception("CQL endpoint: a transaction failed unexpectedly")
            self.send(
                f.error_frame(
                    stream,
                    f.SERVER_ERROR,
                    f"the transaction failed here ({error!r}); its outcome is unknown: it may "
                    "still commit",
                )
            )
        else:
            self.send(f.encode_frame(f.V4 | f.RESPONSE, 0, stream, f.RESULT, body))
        with contextlib.suppress(Exception):
            await self.writer.drain()

    async def _run(self, statement: Statement, params: QueryParameters) -> bytes:
        values = _bind_values(statement, params)
        try:
            bound = statement.prepared.bind(values)
        except CqlError as error:
            raise _Answer(f.INVALID, str(error)) from None
        request = bound.transaction.request
        runner = check_not_none(self.endpoint.runner, "CQL endpoint serving without a runner")
        try:
            response = await runner(request)
        except Failure as failure:
            raise _Answer.of(failure, params.consistency) from None
        try:
            result = bound.result(Result.from_proto(response, read_only=not request.mutations))
        except Exception as error:  # the outcome is known; only its reading failed
            logger.exception("CQL endpoint: reading a transaction's result")
            raise _Answer(
                f.SERVER_ERROR,
                f"the transaction {response.txn_id} committed but its result could not be "
                f"read: {error!r}",
            ) from None
        names = [c.name for c in statement.columns[1:]]
        if result.columns != names:
            raise _Answer(
                f.SERVER_ERROR,
                f"the transaction {response.txn_id} committed but its columns {result.columns} "
                f"are not the prepared {names}",
            )
        rows = [(result.applied, *row) for row in result.rows] or [
            (result.applied, *(None for _ in names))
        ]
        try:
            return rows_body(statement.columns, rows)
        except (ValueError, TypeError, OverflowError) as error:
            raise _Answer(
                f.SERVER_ERROR,
                f"the transaction {response.txn_id} committed but a value of its result "
                f"cannot be sent: {error}",
            ) from None

    async def _relay(self, upstream: asyncio.StreamReader) -> None:
        """Cassandra's frames back to the client, as they came (SUPPORTED rewritten)."""
        decoder = f.FrameDecoder(MAX_UPSTREAM_FRAME_BYTES, requests=False)
        try:
            while True:
                data = await upstream.read(READ_BYTES)
                if not data:
                    break
                for item in decoder.feed(data):
                    if isinstance(item, BadFrame):
                        logger.warning("CQL endpoint: Cassandra sent a bad frame: %s", item.message)
                        self.writer.close()
                        return
                    relayed = self._from_cassandra(item)
                    if relayed is not None:
                        self.send(relayed)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        # Cassandra closed its side: so does this endpoint (the driver reconnects).
        self.writer.close()

    def _from_cassandra(self, frame: Frame) -> bytes | None:
        """The frame to relay for one of Cassandra's; None when it is not relayed now."""
        if frame.opcode == f.EVENT:
            # They name Cassandra's nodes (docs/sidecars.md); SCHEMA_CHANGE passes.
            return None if is_peer_event(frame.body) else frame.encode()
        system = self.system_queries.pop(frame.stream, None)
        prepare = self.system_prepares.pop(frame.stream, None)
        if system is not None and frame.opcode == f.RESULT:
            return self._system_rows(frame, *system)
        if frame.opcode == f.RESULT and frame.flags & f.COMPRESSED:
            pass  # never agreed with a client of this endpoint: relayed as it is
        elif prepare is not None and frame.opcode == f.RESULT:
            with contextlib.suppress(Malformed):
                found = prepared_columns(frame.flags, frame.body)
                if found is not None:
                    self.endpoint.remember_system_statement(found[0], prepare, found[1])
        elif (
            frame.opcode == f.RESULT
            and self.endpoint.agreement is not None
            and result_kind(frame.flags, frame.body) == f.SCHEMA_CHANGE
        ):
            task = asyncio.create_task(self._after_agreement(frame))
            self.held.add(task)
            task.add_done_callback(self.held.discard)
            return None
        if frame.opcode in (f.READY, f.AUTH_SUCCESS):
            self.authenticated = True
        elif frame.opcode == f.SUPPORTED and not frame.flags & f.COMPRESSED:
            with contextlib.suppress(Malformed):
                return Frame(
                    frame.version,
                    frame.flags,
                    frame.stream,
                    frame.opcode,
                    rewrite_supported(frame.body),
                ).encode()
        elif frame.opcode == f.RESULT and not frame.flags & f.COMPRESSED:
            keyspace = _set_keyspace(frame)
            if keyspace is not None:
                self.keyspace = keyspace
        return frame.encode()

    async def _after_agreement(self, frame: Frame) -> None:
        warning = await self.endpoint.agreed()
        flags, body = frame.flags, frame.body
        if warning is not None:
            with contextlib.suppress(Malformed):
                flags, body = with_warning(flags, body, warning)
        self.send(Frame(frame.version, flags, frame.stream, frame.opcode, body).encode())
        with contextlib.suppress(Exception):
            await self.writer.drain()

    def _system_rows(self, frame: Frame, table: str, names: list[str] | None) -> bytes:
        """A system.local/peers answer describing the sidecars; an ERROR when unreadable
        (Cassandra's node addresses are never passed on)."""
        try:
            if frame.flags & f.COMPRESSED:
                raise Malformed("a compressed frame, but no compression was agreed")
            rows = read_rows(frame.flags, frame.body, names)
        except Malformed as error:
            logger.warning("CQL endpoint: Cassandra's system.%s answer: %s", table, error)
            return f.error_frame(
                frame.stream,
                f.SERVER_ERROR,
                f"the CQL endpoint could not read Cassandra's system.{table} answer ({error}) "
                "and does not pass Cassandra's node addresses on",
            )
        if rows is None:
            return frame.encode()
        body = rewrite_rows(table, rows, self.endpoint.directory).encode()
        return Frame(frame.version, frame.flags, frame.stream, frame.opcode, body).encode()


def _set_keyspace(frame: Frame) -> str | None:
    """The keyspace of a SET_KEYSPACE result (after its tracing id, warnings and custom
    payload, when the flags say it has them); None for any other result."""
    try:
        reader = f.Reader(frame.body)
        if frame.flags & f.TRACING:
            reader.take(16)
        if frame.flags & f.WARNING:
            reader.string_list()
        if frame.flags & f.CUSTOM_PAYLOAD:
            reader.bytes_map()
        if reader.int32() != f.SET_KEYSPACE:
            return None
        return reader.string()
    except Malformed:
        return None


def _opname(opcode: int) -> str:
    names = {
        f.STARTUP: "STARTUP",
        f.QUERY: "QUERY",
        f.PREPARE: "PREPARE",
        f.EXECUTE: "EXECUTE",
        f.BATCH: "BATCH",
        f.REGISTER: "REGISTER",
        f.OPTIONS: "OPTIONS",
        f.AUTH_RESPONSE: "AUTH_RESPONSE",
    }
    return names.get(opcode, f"opcode 0x{opcode:02X}")


class _Answer(Exception):
    """An ERROR frame to answer a transaction with."""

    def __init__(self, code: int, message: str, consistency: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.consistency = consistency

    @staticmethod
    def of(failure: Failure, consistency: int) -> _Answer:
        code = {
            "invalid": f.INVALID,
            "overloaded": f.OVERLOADED,
            "invalidated": f.SERVER_ERROR,
            "unknown": f.WRITE_TIMEOUT,
        }[failure.kind]
        message = failure.message
        if failure.kind == "invalidated":
            message += " (safe to retry)"
        return _Answer(code, message, consistency)

    def frame(self, stream: int) -> bytes:
        if self.code == f.WRITE_TIMEOUT:
            return f.write_timeout_frame(stream, self.consistency, self.message)
        return f.error_frame(stream, self.code, self.message)


def _bind_values(statement: Statement, params: QueryParameters) -> list[object] | None:
    """The bound values in marker order, decoded by the markers' types."""
    markers = statement.prepared.markers
    raw = params.values
    if params.names is not None:
        by_name = dict(zip(params.names, raw, strict=True))
        missing = sorted({m.name or "?" for m in markers if m.name not in by_name})
        if missing:
            raise _Answer(f.INVALID, f"no value bound for {', '.join(missing)}")
        unused = sorted(set(by_name) - {m.name for m in markers})
        if unused:
            raise _Answer(f.INVALID, f"values bound for names the text has no marker for: {unused}")
        raw = [by_name[m.name or ""] for m in markers]
    if len(raw) != len(markers):
        raise _Answer(
            f.INVALID,
            f"the text has {len(markers)} bind marker(s) but {len(raw)} value(s) were given",
        )
    values: list[object] = []
    for marker, variable, data in zip(markers, statement.variables, raw, strict=True):
        if is_not_set(data):
            raise _Answer(f.INVALID, f"{marker.pos}: an unset value is not supported here")
        try:
            values.append(decode(variable.cql_type, data if isinstance(data, bytes) else None))
        except Malformed as error:
            raise _Answer(
                f.INVALID, f"{marker.pos}: the value bound for {variable.name}: {error}"
            ) from None
    return values
