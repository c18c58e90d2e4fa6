"""A Maelstrom node serving lin-kv, txn-rw-register and txn-list-append on Accord.

Run it as ``python -m maelstrom.node [options]``; Maelstrom (or :mod:`maelstrom.harness`)
writes one JSON message per line to its stdin and reads replies from its stdout.

Theory of operation
-------------------
The process has two threads. A reader thread only moves stdin lines into a bounded queue
(so a slow node pushes back on its sender instead of buffering without limit). The main
thread owns everything else and is the only writer to stdout, so replies are never
interleaved: it takes lines from the queue with a timeout and runs
:meth:`MaelstromNode.tick` every ``--tick-ms`` (10 ms), which is what drives Accord's
retries, recovery and progress log.

:class:`MaelstromNode` is the host of one :class:`accord.Node` and follows the contract in
:mod:`accord.api` after every input::

    node.step / submit / tick -> ready = node.ready()
    journal.append(ready.persist)        durable first (in memory: Maelstrom never restarts
                                         a node, so memory outlives every message we send)
    node.advance(ready)                  acknowledge the batch as persisted
    send ready.messages                  as Maelstrom node-to-node messages
    answer ready.replies                 as *_ok or error bodies to the clients
    perform ready.reads, ready.writes    in order, against the in-memory store, feeding
                                         results back with read_done / write_done

Node-to-node messages are ``{"type": "accord", "data": <base64 msgpack>}``, encoded by
:mod:`accord.codec`; Maelstrom may delay, reorder or drop them, which Accord
tolerates by design. Client requests become one Accord transaction each
(:mod:`maelstrom.operations`). Accord's clock is ``time.monotonic_ns() // 1000``: monotonic
microseconds injected through :class:`accord.Clock`, never the wall clock.

Error discipline: a definite error code is sent only when the operation certainly never
takes effect (a refused request, a failed ``cas`` condition, an invalidated transaction);
when the outcome is unknown the node says so with the indefinite code 0 (timeout).

``--unsafe-local-reads`` is a deliberate bug for proving the checkers have teeth: read-only
requests are answered from the local store without consensus, which returns stale values
whenever this replica lags. Never use it outside tests.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import logging
import queue
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from accord import (
    ClientReply,
    Clock,
    MemoryPartitions,
    Node,
    NodeConfig,
    RowAt,
    TxnResult,
    ring_topology,
)
from accord.api import DataRead, DataStore, DataWrite, Journal, Ready
from accord.codec import CodecError, decode_message, encode_message
from accord.invariants import check_not_none, fail
from accord.messages import Envelope, Message
from accord.sim.journal import MemoryJournal
from maelstrom.operations import (
    CLIENT_TYPES,
    ClientRequest,
    RequestError,
    is_read_only,
    parse_request,
    reply_body,
    to_txn,
)
from maelstrom.protocol import (
    MAX_LINE_BYTES,
    ErrorCode,
    Packet,
    ProtocolError,
    error_body,
    parse_line,
    render,
)

logger = logging.getLogger(__name__)

MAX_NODES: Final = 64
"""Most nodes an ``init`` may name."""
MAX_PENDING_REQUESTS: Final = 4096
"""Client requests a node coordinates at once; more are refused with error 11 (definite,
because they were never submitted)."""
INBOX_MAX_LINES: Final = 10_000
"""Lines the reader thread may queue ahead of the main loop before it stops reading."""
INPUT_BATCH_MAX: Final = 256
"""Lines handled between two checks of the tick timer, so ticks are never starved."""
ACCORD_TYPE: Final = "accord"


class MonotonicClock:
    """Accord's :class:`accord.Clock`: monotonic microseconds. Every process on one machine
    shares CLOCK_MONOTONIC, so peers' clocks agree closely; the HLC copes if they do not."""

    def now_micros(self) -> int:
        return time.monotonic_ns() // 1000


class MemoryStore(MemoryPartitions):
    """User data: last-write-wins by executeAt, so writes are idempotent and order-free
    (the :class:`accord.DataStore` contract), with Accord's partition model
    (:class:`accord.MemoryPartitions`); Maelstrom's workloads use each key's row at ``()``."""

    __slots__ = ()


if TYPE_CHECKING:  # Maelstrom's store is an accord.api.DataStore (checked by mypy)
    _MAELSTROM_STORE: DataStore = MemoryStore()


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """Command-line options of the node (after ``--`` in a ``maelstrom test`` command)."""

    replication_factor: int = 3
    tick_ms: int = 10
    unsafe_local_reads: bool = False
    seed: int = 0


@dataclass(slots=True)
class _Pending:
    client: str
    msg_id: int
    request: ClientRequest


@dataclass(slots=True)
class NodeCounters:
    """What the node did, logged at exit (stderr ends up in Maelstrom's node logs)."""

    client_requests: int = 0
    replies_ok: int = 0
    replies_error: int = 0
    peer_messages_in: int = 0
    peer_messages_out: int = 0
    malformed: int = 0
    refused_overload: int = 0


class MaelstromNode:
    """One Maelstrom node: protocol handling around an :class:`accord.Node`.

    Not thread-safe: the run loop feeds it lines (:meth:`handle_line`) and ticks
    (:meth:`tick`) from one thread and drains :meth:`take_output`.
    """

    def __init__(
        self,
        options: NodeOptions = NodeOptions(),
        *,
        clock: Clock | None = None,
    ) -> None:
        self.options = options
        self.clock: Clock = clock or MonotonicClock()
        self.node_name: str | None = None
        self.node_names: tuple[str, ...] = ()
        self._accord_ids: dict[str, int] = {}
        self.accord: Node | None = None
        self.store = MemoryStore()
        self.journal: Journal = MemoryJournal()
        self.counters = NodeCounters()
        self._out: list[str] = []
        self._next_msg_id = 1
        self._next_request_id = 1
        self._pending: dict[int, _Pending] = {}
        self._data_ops: deque[DataRead | DataWrite] = deque()

    # ------------------------------------------------------------------ inputs

    def handle_line(self, line: bytes | str) -> None:
        """Handle one protocol line; malformed input is answered with error 12 when the
        sender can be named, and logged otherwise."""
        try:
            packet = parse_line(line)
        except ProtocolError as error:
            self.counters.malformed += 1
            logger.warning("malformed input: %s", error.problem)
            if error.src is not None:
                self._reply_error(error.src, error.msg_id, error.code, error.problem)
            return
        self.handle(packet)

    def handle(self, packet: Packet) -> None:
        """Dispatch one well-formed message by its body type."""
        kind = packet.type
        if self.node_name is not None and packet.dest != self.node_name:
            # Maelstrom routes by dest; a mismatch is a harness bug worth a loud log line.
            logger.error("message for %s delivered to %s: dropped", packet.dest, self.node_name)
            return
        if kind == "init":
            self._on_init(packet)
        elif kind == ACCORD_TYPE:
            self._on_peer(packet)
        elif kind in CLIENT_TYPES:
            self._on_client(packet)
        elif packet.in_reply_to is not None:
            # This node sends no RPCs, so a reply is stale or misrouted; answering a reply
            # would only start a ping-pong of errors.
            logger.info("ignoring unexpected reply %s from %s", kind, packet.src)
        else:
            self._reply_error(
                packet.src,
                packet.msg_id,
                ErrorCode.NOT_SUPPORTED,
                f"unsupported message type {kind!r}; this node serves init, read, write, "
                "cas and txn",
            )

    def tick(self) -> None:
        """Let time pass for Accord: retries, recovery, client deadlines."""
        if self.accord is not None:
            self.accord.tick()
            self._flush()

    def take_output(self) -> list[str]:
        """Protocol lines to write to stdout, in order; clears the buffer."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ init

    def _on_init(self, packet: Packet) -> None:
        body = packet.body
        node_id, node_ids = body.get("node_id"), body.get("node_ids")
        valid = (
            isinstance(node_id, str)
            and isinstance(node_ids, list)
            and 0 < len(node_ids) <= MAX_NODES
            and all(isinstance(n, str) and n for n in node_ids)
            and len(set(node_ids)) == len(node_ids)
            and node_id in node_ids
        )
        if not valid:
            self._reply_error(
                packet.src,
                packet.msg_id,
                ErrorCode.MALFORMED_REQUEST,
                "init needs node_id (a string) and node_ids (1 to "
                f"{MAX_NODES} distinct strings that include node_id)",
            )
            return
        if not (isinstance(node_id, str) and isinstance(node_ids, list)):
            fail("init passed validation with node_id %r, node_ids %r", node_id, node_ids)
        if self.node_name is not None:
            if (node_id, tuple(node_ids)) != (self.node_name, self.node_names):
                self._reply_error(
                    packet.src,
                    packet.msg_id,
                    ErrorCode.MALFORMED_REQUEST,
                    f"already initialised as {self.node_name} of {list(self.node_names)}",
                )
                return
        else:
            self._start(node_id, tuple(node_ids))
        self._send(packet.src, {"type": "init_ok", "in_reply_to": packet.msg_id})

    def _start(self, node_id: str, node_ids: tuple[str, ...]) -> None:
        # Accord ids are positions in node_ids (every node gets the same list) counted from
        # 1, so that no real node shares the all-zero ballot's node field.
        self.node_name, self.node_names = node_id, node_ids
        self._accord_ids = {name: i + 1 for i, name in enumerate(node_ids)}
        replication = min(self.options.replication_factor, len(node_ids))
        topology = ring_topology(list(range(1, len(node_ids) + 1)), replication)
        accord_id = self._accord_ids[node_id]
        self.accord = Node(
            accord_id,
            topology,
            self.clock,
            random.Random(self.options.seed * 1_000_003 + accord_id),
            config=NodeConfig(),
        )
        logger.info(
            "initialised %s (accord id %d) of %d nodes, rf=%d, unsafe_local_reads=%s",
            node_id,
            accord_id,
            len(node_ids),
            replication,
            self.options.unsafe_local_reads,
        )
        self._flush()

    # ------------------------------------------------------------------ clients

    def _on_client(self, packet: Packet) -> None:
        self.counters.client_requests += 1
        msg_id = packet.msg_id
        if msg_id is None:
            self._reply_error(
                packet.src, None, ErrorCode.MALFORMED_REQUEST, "a request needs an integer msg_id"
            )
            return
        accord = self.accord
        if accord is None:
            self._reply_error(
                packet.src, msg_id, ErrorCode.TEMPORARILY_UNAVAILABLE, "node is not initialised"
            )
            return
        try:
            request = parse_request(packet.body)
        except RequestError as error:
            self.counters.malformed += 1
            self._reply_error(packet.src, msg_id, error.code, error.text)
            return
        if self.options.unsafe_local_reads and is_read_only(request):
            self._answer_locally(packet.src, msg_id, request)
            return
        if len(self._pending) >= MAX_PENDING_REQUESTS:
            self.counters.refused_overload += 1
            self._reply_error(
                packet.src,
                msg_id,
                ErrorCode.TEMPORARILY_UNAVAILABLE,
                f"{len(self._pending)} requests in flight (MAX_PENDING_REQUESTS); retry later",
            )
            return
        request_id = self._next_request_id
        self._next_request_id += 1
        self._pending[request_id] = _Pending(packet.src, msg_id, request)
        accord.submit(request_id, to_txn(request))
        self._flush()

    def _answer_locally(self, client: str, msg_id: int, request: ClientRequest) -> None:
        """The ``--unsafe-local-reads`` bug: a read served from this replica's store with
        no consensus, so it may miss writes other replicas have already acknowledged."""
        txn = to_txn(request)
        result = TxnResult(tuple((k, self.store.value(k)) for k in txn.reads), applied=True)
        self._answer(client, msg_id, reply_body(request, result))

    def _on_reply(self, reply: ClientReply) -> None:
        pending = self._pending.pop(reply.request_id, None)
        if pending is None:
            logger.warning("reply for unknown request %d dropped", reply.request_id)
            return
        if reply.outcome == "ok" and reply.result is not None:
            body = reply_body(pending.request, reply.result)
        elif reply.outcome == "invalidated":
            body = error_body(
                ErrorCode.TXN_CONFLICT,
                f"transaction {reply.txn_id} was invalidated and will never execute",
                None,
            )
        else:
            # The coordinator could not learn the outcome in time; the txn may still commit.
            body = error_body(
                ErrorCode.TIMEOUT,
                f"outcome of transaction {reply.txn_id} is unknown (it may still commit)",
                None,
            )
        self._answer(pending.client, pending.msg_id, body)

    def _answer(self, client: str, msg_id: int, body: dict[str, Any]) -> None:
        body["in_reply_to"] = msg_id
        if body["type"] == "error":
            self.counters.replies_error += 1
        else:
            self.counters.replies_ok += 1
        self._send(client, body)

    # ------------------------------------------------------------------ peers

    def _on_peer(self, packet: Packet) -> None:
        accord = self.accord
        src = self._accord_ids.get(packet.src)
        if accord is None or src is None:
            logger.warning("accord message from %s before init or from a stranger", packet.src)
            return
        data = packet.body.get("data")
        try:
            if not isinstance(data, str):
                raise CodecError("body.data must be a base64 string")
            message = decode_message(base64.b64decode(data, validate=True))
            if isinstance(message, Envelope):
                raise CodecError("expected a bare message, got an envelope")
        except (CodecError, binascii.Error) as error:
            # Peers are other copies of this program, so this is a bug or corruption; it
            # has no msg_id to answer, and Accord treats it as a lost message.
            self.counters.malformed += 1
            logger.error("undecodable accord message from %s: %s", packet.src, error)
            return
        self.counters.peer_messages_in += 1
        node_name = check_not_none(self.node_name, "an accord message handled before init")
        accord.step(Envelope(src, self._accord_ids[node_name], message))
        self._flush()

    def _send_peer(self, dest: int, message: Message) -> None:
        data = base64.b64encode(encode_message(message)).decode("ascii")
        self.counters.peer_messages_out += 1
        self._send(self.node_names[dest - 1], {"type": ACCORD_TYPE, "data": data})

    # ------------------------------------------------------------------ the host loop

    def _flush(self) -> None:
        """Run the accord.api host contract until the node has nothing left to ask."""
        accord = check_not_none(self.accord, "the accord node runs only after init")
        while True:
            if accord.has_ready():
                ready = accord.ready()
                # Durable before anything leaves the process: replies and messages promise
                # what the journal records.
                self.journal.append(ready.persist)
                accord.advance(ready)
                self._carry_out(ready)
            if not self._data_ops:
                return
            # Data work runs after the batch, one operation at a time in issue order, which
            # is the per-key order accord.api requires; each result may produce more ready.
            op = self._data_ops.popleft()
            if isinstance(op, DataRead):
                selections = op.selections or tuple(RowAt(k) for k in op.keys)
                accord.read_done(op.txn_id, self.store.read(selections, op.execute_at))
            else:
                self.store.write(op.writes, op.execute_at)
                accord.write_done(op.txn_id)

    def _carry_out(self, ready: Ready) -> None:
        for envelope in ready.messages:
            self._send_peer(envelope.dest, envelope.body)
        for reply in ready.replies:
            self._on_reply(reply)
        self._data_ops.extend(ready.reads)
        self._data_ops.extend(ready.writes)

    # ------------------------------------------------------------------ output

    def _send(self, dest: str, body: dict[str, Any]) -> None:
        body["msg_id"] = self._next_msg_id
        self._next_msg_id += 1
        self._out.append(render(Packet(self.node_name or "", dest, body)))

    def _reply_error(self, dest: str, msg_id: int | None, code: ErrorCode, text: str) -> None:
        self.counters.replies_error += 1
        self._send(dest, error_body(code, text, msg_id))


# ---------------------------------------------------------------------------- I/O


_EOF: Final = b""


def _read_lines(stream: BinaryIO, inbox: queue.Queue[bytes]) -> None:
    """Reader thread: move stdin lines into ``inbox``; an empty bytes object means EOF."""
    try:
        while True:
            line = stream.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                # Skip the rest of an oversized line rather than misread its tail as a
                # message; parse_line reports the (truncated) line as too long.
                while True:
                    rest = stream.readline(MAX_LINE_BYTES + 1)
                    if not rest or rest.endswith(b"\n"):
                        break
            if line.strip():
                inbox.put(line)
    finally:
        inbox.put(_EOF)


def serve(
    options: NodeOptions,
    stdin: BinaryIO,
    stdout: BinaryIO,
) -> int:
    """Run the node until stdin closes; returns the process exit status."""
    node = MaelstromNode(options)
    inbox: queue.Queue[bytes] = queue.Queue(maxsize=INBOX_MAX_LINES)
    reader = threading.Thread(target=_read_lines, args=(stdin, inbox), daemon=True)
    reader.start()
    tick_seconds = options.tick_ms / 1000
    next_tick = time.monotonic() + tick_seconds
    running = True
    while running:
        timeout = max(0.0, next_tick - time.monotonic())
        try:
            line = inbox.get(timeout=timeout)
        except queue.Empty:
            line = None
        handled = 0
        while line is not None:
            if line == _EOF:
                running = False
                break
            node.handle_line(line)
            handled += 1
            if handled >= INPUT_BATCH_MAX:
                break
            try:
                line = inbox.get_nowait()
            except queue.Empty:
                line = None
        now = time.monotonic()
        if now >= next_tick:
            node.tick()
            next_tick = now + tick_seconds
        out = node.take_output()
        if out:
            try:
                stdout.write("".join(out).encode("utf-8"))
                stdout.flush()
            except BrokenPipeError:
                logger.info("stdout closed; exiting")
                return 0
    logger.info("stdin closed; counters: %s", node.counters)
    return 0


def _parse_args(argv: Sequence[str] | None) -> tuple[NodeOptions, str]:
    parser = argparse.ArgumentParser(
        prog="python -m maelstrom.node",
        description="A Maelstrom node (lin-kv, txn-rw-register, txn-list-append) on Accord.",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="replicas per shard, capped at the node count (default 3)",
    )
    parser.add_argument("--tick-ms", type=int, default=10, help="Accord tick period (10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of Accord's backoff jitter")
    parser.add_argument(
        "--unsafe-local-reads",
        action="store_true",
        help="TEST ONLY: answer read-only requests from the local store without consensus "
        "(breaks linearizability on purpose)",
    )
    parser.add_argument("--log-level", default="WARNING", help="stderr log level (WARNING)")
    args = parser.parse_args(argv)
    if args.replication_factor < 1:
        parser.error("--replication-factor must be at least 1")
    if not 1 <= args.tick_ms <= 1000:
        parser.error("--tick-ms must be between 1 and 1000")
    options = NodeOptions(
        replication_factor=args.replication_factor,
        tick_ms=args.tick_ms,
        unsafe_local_reads=args.unsafe_local_reads,
        seed=args.seed,
    )
    return options, str(args.log_level).upper()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m maelstrom.node``."""
    options, level = _parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return serve(options, sys.stdin.buffer, sys.stdout.buffer)


__all__ = [
    "MaelstromNode",
    "MemoryStore",
    "MonotonicClock",
    "NodeOptions",
    "main",
    "serve",
]

if __name__ == "__main__":
    sys.exit(main())
