"""The CQL endpoint in-process against a stand-in Cassandra: a schema change's RESULT is held
until the agreement check says yes (other streams go on meanwhile), goes with a warning when
the check says no, and TOPOLOGY_CHANGE / STATUS_CHANGE events are not relayed while
SCHEMA_CHANGE events are."""

from __future__ import annotations

import asyncio

from accord_cassandra.native import frame as f
from accord_cassandra.native.endpoint import CqlEndpoint
from accord_cassandra.schema import Catalog
from accord_cassandra.v1 import client_pb2
from tests.unit.test_native_endpoint import exchange, query

DDL = "CREATE TABLE ks.t (id text PRIMARY KEY)"


def schema_change_body() -> bytes:
    return (
        f.Writer()
        .int32(f.SCHEMA_CHANGE)
        .string("CREATED")
        .string("TABLE")
        .string("ks")
        .string("t")
        .build()
    )


def event(kind: str, *rest: str) -> bytes:
    w = f.Writer().string(kind)
    for item in rest:
        w.string(item)
    return w.build()


async def stand_in(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    decoder = f.FrameDecoder()
    try:
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                assert isinstance(frame, f.Frame)
                if frame.opcode == f.STARTUP:
                    writer.write(f.encode_frame(0x84, 0, frame.stream, f.READY, b""))
                    continue
                text, _ = f.read_query(frame.body)
                if text == DDL:
                    body = schema_change_body()
                else:
                    if text == "events":
                        for item in (
                            event("TOPOLOGY_CHANGE", "NEW_NODE"),
                            event("STATUS_CHANGE", "DOWN"),
                            event("SCHEMA_CHANGE", "CREATED", "KEYSPACE", "ks"),
                        ):
                            writer.write(f.encode_frame(0x84, 0, -1, f.EVENT, item))
                    body = f.Writer().int32(f.VOID).build()
                writer.write(f.encode_frame(0x84, 0, frame.stream, f.RESULT, body))
            await writer.drain()
    finally:
        writer.close()


async def no_runner(request: client_pb2.TransactRequest) -> client_pb2.TransactResponse:
    raise AssertionError("no transaction in these tests")


async def read_frame(reader: asyncio.StreamReader) -> f.Frame:
    header = await reader.readexactly(f.HEADER_BYTES)
    version, flags, stream, opcode, length = f.HEADER.unpack(header)
    return f.Frame(version, flags, stream, opcode, await reader.readexactly(length))


def run_with(endpoint_check: object, body: object) -> None:
    async def run() -> None:
        upstream = await asyncio.start_server(stand_in, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        endpoint = CqlEndpoint(
            "127.0.0.1:0",
            f"127.0.0.1:{port}",
            agreement=endpoint_check,  # type: ignore[arg-type]
            schema_agreement_seconds=3.0,
        )
        address = await endpoint.bind()
        await endpoint.start(Catalog(), no_runner)
        host, _, cql_port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(cql_port))
        try:
            startup = f.Writer().string_map({"CQL_VERSION": "3.0.0"}).build()
            assert (await exchange(reader, writer, 1, f.STARTUP, startup)).opcode == f.READY
            await body(endpoint, reader, writer)  # type: ignore[operator]
        finally:
            writer.close()
            await endpoint.stop()
            upstream.close()

    asyncio.run(run())


def test_a_schema_change_is_held_until_the_nodes_agree() -> None:
    asked = asyncio.Event()
    release = asyncio.Event()

    async def agreement(seconds: float) -> bool:
        assert seconds == 3.0
        asked.set()
        await release.wait()
        return True

    async def body(
        endpoint: CqlEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(f.encode_frame(4, 0, 2, f.QUERY, query(DDL)))
        await asyncio.wait_for(asked.wait(), 30)
        # Held: another stream is answered meanwhile, and it is the next frame to arrive.
        other = await exchange(reader, writer, 3, f.QUERY, query("SELECT 1"))
        assert other.stream == 3
        release.set()
        held = await asyncio.wait_for(read_frame(reader), 30)
        assert (held.stream, held.opcode, held.flags & f.WARNING) == (2, f.RESULT, 0)
        assert held.body == schema_change_body()
        assert endpoint.agreement_timeouts == 0

    run_with(agreement, body)


def test_a_schema_change_without_agreement_goes_with_a_warning() -> None:
    async def agreement(seconds: float) -> bool:
        return False

    async def body(
        endpoint: CqlEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        reply = await exchange(reader, writer, 2, f.QUERY, query(DDL))
        assert reply.opcode == f.RESULT and reply.flags & f.WARNING
        r = f.Reader(reply.body)
        (warning,) = r.string_list()
        assert "did not agree on the schema within 3 s" in warning
        assert reply.body[r.at :] == schema_change_body()
        assert endpoint.agreement_timeouts == 1

    run_with(agreement, body)


def test_topology_and_status_events_are_not_relayed() -> None:
    async def agreement(seconds: float) -> bool:
        return True

    async def body(
        endpoint: CqlEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(f.encode_frame(4, 0, 2, f.QUERY, query("events")))
        first = await asyncio.wait_for(read_frame(reader), 30)
        second = await asyncio.wait_for(read_frame(reader), 30)
        assert (first.opcode, f.Reader(first.body).string()) == (f.EVENT, "SCHEMA_CHANGE")
        assert (second.stream, second.opcode) == (2, f.RESULT)
        assert endpoint.requests["QUERY"] == 1

    run_with(agreement, body)
