"""The CQL endpoint in-process against a stand-in Cassandra that asks for a password: the
AUTHENTICATE exchange passes through, and transactions run only once it answered
AUTH_SUCCESS (the launcher's nodes run without an authenticator)."""

from __future__ import annotations

import asyncio

from accord_cassandra.native import frame as f
from accord_cassandra.native.endpoint import CqlEndpoint, Failure
from accord_cassandra.schema import Catalog
from accord_cassandra.v1 import client_pb2

CATALOG = Catalog.from_mapping(
    {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["balance", "bigint"]]}}
)
TXN = "BEGIN TRANSACTION SELECT balance FROM bank.accounts WHERE id = 'a'; COMMIT TRANSACTION"


async def fake_cassandra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await _answer(reader, writer)
    finally:
        writer.close()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    decoder = f.FrameDecoder()
    while data := await reader.read(65536):
        for frame in decoder.feed(data):
            assert isinstance(frame, f.Frame)
            if frame.opcode == f.STARTUP:
                body = f.Writer().string("org.apache.cassandra.auth.PasswordAuthenticator")
                reply = (f.AUTHENTICATE, body.build())
            elif frame.opcode == f.AUTH_RESPONSE:
                token = f.Reader(frame.body).blob()
                if token == b"\0cassandra\0cassandra":
                    reply = (f.AUTH_SUCCESS, f.Writer().blob(None).build())
                else:
                    reply = (
                        f.ERROR,
                        f.error_body(
                            f.AUTHENTICATION_ERROR,
                            "Provided username and/or password are incorrect",
                        ),
                    )
            else:
                reply = (f.RESULT, f.Writer().int32(f.VOID).build())
            writer.write(f.encode_frame(0x84, 0, frame.stream, *reply))
        await writer.drain()


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stream: int,
    opcode: int,
    body: bytes,
) -> f.Frame:
    writer.write(f.encode_frame(4, 0, stream, opcode, body))
    header = await reader.readexactly(f.HEADER_BYTES)
    version, flags, got, op, length = f.HEADER.unpack(header)
    assert got == stream
    return f.Frame(version, flags, got, op, await reader.readexactly(length))


def query(text: str) -> bytes:
    return f.Writer().long_string(text).short(1).byte(0).build()


def test_authentication_passes_through_and_gates_transactions() -> None:
    calls: list[client_pb2.TransactRequest] = []

    async def runner(request: client_pb2.TransactRequest) -> client_pb2.TransactResponse:
        calls.append(request)
        raise Failure("overloaded", "stand-in: reached Accord")

    async def run() -> None:
        upstream = await asyncio.start_server(fake_cassandra, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        endpoint = CqlEndpoint("127.0.0.1:0", f"127.0.0.1:{port}")
        address = await endpoint.bind()
        await endpoint.start(CATALOG, runner)
        host, _, cql_port = address.rpartition(":")
        try:
            reader, writer = await asyncio.open_connection(host, int(cql_port))
            startup = f.Writer().string_map({"CQL_VERSION": "3.0.0"}).build()
            reply = await exchange(reader, writer, 1, f.STARTUP, startup)
            assert reply.opcode == f.AUTHENTICATE
            # Before AUTH_SUCCESS: refused here, Accord never asked.
            reply = await exchange(reader, writer, 2, f.QUERY, query(TXN))
            code, message = f.read_error(reply.body)
            assert code == f.PROTOCOL_ERROR and "authentication" in message
            wrong = f.Writer().blob(b"\0cassandra\0nope").build()
            reply = await exchange(reader, writer, 3, f.AUTH_RESPONSE, wrong)
            assert f.read_error(reply.body)[0] == f.AUTHENTICATION_ERROR
            reply = await exchange(reader, writer, 4, f.QUERY, query(TXN))
            assert f.read_error(reply.body)[0] == f.PROTOCOL_ERROR
            assert calls == []
            right = f.Writer().blob(b"\0cassandra\0cassandra").build()
            reply = await exchange(reader, writer, 5, f.AUTH_RESPONSE, right)
            assert reply.opcode == f.AUTH_SUCCESS
            reply = await exchange(reader, writer, 6, f.QUERY, query(TXN))
            code, message = f.read_error(reply.body)
            assert (code, message) == (f.OVERLOADED, "stand-in: reached Accord")
            assert len(calls) == 1
            # A plain write to the Accord table is refused once authenticated.
            reply = await exchange(
                reader,
                writer,
                7,
                f.QUERY,
                query("UPDATE bank.accounts SET balance = 1 WHERE id = 'a'"),
            )
            code, message = f.read_error(reply.body)
            assert code == f.INVALID and "managed by Accord" in message
            writer.close()
            await writer.wait_closed()
        finally:
            await endpoint.stop()
            upstream.close()
            await upstream.wait_closed()
            await asyncio.sleep(0.1)  # the stand-in's handlers see their connections end

    asyncio.run(run())


def test_connections_past_the_limit_are_closed_at_once_and_the_others_serve() -> None:
    async def runner(request: client_pb2.TransactRequest) -> client_pb2.TransactResponse:
        raise Failure("overloaded", "stand-in")

    async def startup(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        body = f.Writer().string_map({"CQL_VERSION": "3.0.0"}).build()
        return (await exchange(reader, writer, 1, f.STARTUP, body)).opcode

    async def run() -> None:
        upstream = await asyncio.start_server(fake_cassandra, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        endpoint = CqlEndpoint("127.0.0.1:0", f"127.0.0.1:{port}", max_connections=2)
        host, _, cql_port = (await endpoint.bind()).rpartition(":")
        await endpoint.start(CATALOG, runner)
        opened: list[asyncio.StreamWriter] = []
        try:
            clients = [await asyncio.open_connection(host, int(cql_port)) for _ in range(2)]
            opened += [writer for _, writer in clients]
            for reader, writer in clients:
                assert await startup(reader, writer) == f.AUTHENTICATE
            # One more: closed before a byte of it is read, and counted.
            reader, writer = await asyncio.open_connection(host, int(cql_port))
            opened.append(writer)
            assert await asyncio.wait_for(reader.read(), 10) == b""
            assert endpoint.refused_connections == 1
            assert len(endpoint.connections) == 2
            # The two admitted serve on; once one leaves, a newcomer is admitted.
            assert await startup(*clients[1]) == f.AUTHENTICATE
            clients[0][1].close()
            deadline = asyncio.get_running_loop().time() + 10
            while len(endpoint.connections) > 1:
                assert asyncio.get_running_loop().time() < deadline, endpoint.connections
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(host, int(cql_port))
            opened.append(writer)
            assert await startup(reader, writer) == f.AUTHENTICATE
            assert endpoint.refused_connections == 1
        finally:
            for writer in opened:
                writer.close()
            await endpoint.stop()
            upstream.close()
            await upstream.wait_closed()
            await asyncio.sleep(0.1)  # the stand-in's handlers see their connections end

    asyncio.run(run())
