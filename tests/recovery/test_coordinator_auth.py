"""The ring coordinator against impersonation and bad input (issue 12, item 6).

Without authentication a ``Hello`` with an existing node's id disconnected that node and
handed the caller its lease, made-up node ids forced epoch bumps, garbage answered UNKNOWN
and a 1 MB node id was accepted. These run the real gRPC service and lease client over
loopback; leadership (an LWT row in Cassandra, covered by test_coordinator.py) is replaced by
an in-memory stand-in that always leads and records every epoch bump.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from stacksaga_store.config.settings import load_settings
from stacksaga_store.errors import ConfigError
from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient
from stacksaga_store.ring.auth import RingAuthenticator, auth_metadata, node_key, server_security
from stacksaga_store.ring.leases import Lease
from stacksaga_store.ring.server import RingCoordinator
from stacksaga_store.v1 import ring_pb2 as pb
from tests.certs import make_ca, make_cert
from tests.stacksaga.conftest import run

# Long enough that renewals (every third of it) stay on time on a loaded 2-core machine:
# the assertions below are about who holds a lease, not about how fast it is renewed.
LEASE_SECONDS = 6.0
SECRET = b"coordinator-secret-" + b"0" * 32
SERVICE = "order-service"
SESSION = "/stacksaga_store.v1.RingCoordinator/Session"
STATUS = "/stacksaga_store.v1.RingCoordinator/Status"


class FakeLeadership:
    """Always the master; epochs in memory."""

    ttl_seconds = 3

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}
        self.bumps: list[tuple[str, int]] = []

    async def prepare(self) -> None:
        return None

    def leading(self) -> bool:
        return True

    async def try_acquire(self) -> bool:
        return True

    async def renew(self) -> bool:
        return True

    async def resign(self) -> None:
        return None

    async def read_epoch(self, service_name: str) -> int:
        return self.epochs.get(service_name, 0)

    async def bump_epoch(self, service_name: str, previous: int, epoch: int) -> bool:
        self.bumps.append((service_name, epoch))
        self.epochs[service_name] = epoch
        return True


async def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@asynccontextmanager
async def serving(
    auth: RingAuthenticator | None = None, credentials: grpc.ServerCredentials | None = None
) -> AsyncIterator[tuple[RingCoordinator, FakeLeadership, str]]:
    leadership = FakeLeadership()
    server = RingCoordinator(
        leadership=leadership,  # type: ignore[arg-type]
        coordinator_id="solo",
        lease_seconds=LEASE_SECONDS,
        auth=auth,
        credentials=credentials,
    )
    port = await server.start("127.0.0.1:0")
    try:
        await wait_until(lambda: server.is_leader, 10, "leadership")
        yield server, leadership, f"127.0.0.1:{port}"
    finally:
        await server.stop(resign=True)


def hello(node_id: str, service: str = SERVICE) -> bytes:
    message = pb.NodeMessage(sequence=1, hello=pb.Hello(node_id=node_id, service_name=service))
    return message.SerializeToString()


async def session_attempt(
    address: str,
    messages: list[bytes],
    metadata: tuple[tuple[str, str], ...] = (),
    credentials: grpc.ChannelCredentials | None = None,
    seconds: float = 10.0,
) -> tuple[grpc.StatusCode | None, list[bytes]]:
    """Open a raw Session, send ``messages``, keep it open ``seconds``: the status it ended
    with (None: still open) and every message the coordinator sent on it."""
    channel = (
        grpc.aio.insecure_channel(address)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials)
    )
    received: list[bytes] = []
    async with channel:
        call: Any = channel.stream_stream(SESSION)(metadata=metadata)
        try:
            for message in messages:
                await call.write(message)

            async def read() -> None:
                while (message := await call.read()) is not grpc.aio.EOF:
                    received.append(message)

            await asyncio.wait_for(read(), seconds)
        except TimeoutError:
            call.cancel()
            return None, received
        except grpc.aio.AioRpcError as error:
            return error.code(), received
        code = await call.code()
        return code, received


def lease_client(address: str, node_id: str, **options: Any) -> CoordinatorLeaseClient:
    client = CoordinatorLeaseClient([address], node_id=node_id, service_name=SERVICE, **options)
    client.start()
    return client


def same_lease(before: Lease, client: CoordinatorLeaseClient) -> bool:
    now = client.current()
    return now is not None and (now.range, now.epoch) == (before.range, before.epoch)


def test_impersonation_and_made_up_nodes_are_refused() -> None:
    async def body() -> None:
        async with serving(RingAuthenticator(secret=SECRET)) as (server, leadership, address):
            node_a = lease_client(address, "node-a", key=node_key(SECRET, "node-a"))
            try:
                before = await node_a.wait_for_lease(10 * LEASE_SECONDS)
                bumps = list(leadership.bumps)
                # 1. No credentials, node-a's id: must not end node-a's session nor get a lease.
                code, received = await session_attempt(address, [hello("node-a")])
                assert (code, received) == (grpc.StatusCode.UNAUTHENTICATED, [])
                # 2. Node-b's genuine key, claiming to be node-a.
                as_b = auth_metadata(node_key(SECRET, "node-b"), "node-b")
                code, received = await session_attempt(address, [hello("node-a")], as_b)
                assert (code, received) == (grpc.StatusCode.PERMISSION_DENIED, [])
                # 3. A key derived from another secret; the secret itself used as a key.
                for key in (node_key(b"x" * 48, "node-a"), SECRET):
                    forged = auth_metadata(key, "node-a")
                    code, received = await session_attempt(address, [hello("node-a")], forged)
                    assert (code, received) == (grpc.StatusCode.UNAUTHENTICATED, [])
                # 4. Thirty made-up nodes: none joins, so no rebalance and no epoch bump.
                codes = await asyncio.gather(
                    *(session_attempt(address, [hello(f"ghost-{i}")]) for i in range(30))
                )
                assert codes == [(grpc.StatusCode.UNAUTHENTICATED, [])] * 30
                assert set(server._sessions) == {"node-a"}
                assert node_a.connected_to == address
                # Past a whole lease: node-a renewed the very same lease throughout.
                await asyncio.sleep(LEASE_SECONDS * 1.2)
                assert same_lease(before, node_a)
                assert len(node_a.leases_seen) == 1
                assert leadership.bumps == bumps
            finally:
                await node_a.stop()

    run(body())


def test_a_credential_is_accepted_once_and_only_while_fresh() -> None:
    async def body() -> None:
        clock = [time.time()]
        auth = RingAuthenticator(secret=SECRET)
        async with serving(auth) as (_, _, address), grpc.aio.insecure_channel(address) as channel:
            status = channel.unary_unary(STATUS)
            credential = auth_metadata(node_key(SECRET, "operator"), "operator")
            await status(pb.StatusRequest().SerializeToString(), metadata=credential)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await status(pb.StatusRequest().SerializeToString(), metadata=credential)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "replayed" in (caught.value.details() or "")
            stale = auth_metadata(node_key(SECRET, "operator"), "operator", lambda: clock[0] - 120)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await status(pb.StatusRequest().SerializeToString(), metadata=stale)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "window" in (caught.value.details() or "")
            # Two credentials at once: refused, whichever is genuine.
            both = (*auth_metadata(node_key(SECRET, "a"), "a"), *auth_metadata(b"k", "b"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await status(pb.StatusRequest().SerializeToString(), metadata=both)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

    run(body())


def test_garbage_is_invalid_argument_and_node_ids_are_bounded() -> None:
    async def body() -> None:
        async with serving() as (server, _, address):
            for garbage in (b"\xff\xff\xff", b"\x12\x80"):
                code, received = await session_attempt(address, [garbage])
                assert (code, received) == (grpc.StatusCode.INVALID_ARGUMENT, [])
            async with grpc.aio.insecure_channel(address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(STATUS)(b"\xff\xff")
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # Garbage after a good Hello ends that session with INVALID_ARGUMENT too.
            code, _ = await session_attempt(address, [hello("node-g"), b"\xff\xff"])
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # A node id over 256 bytes is refused by name; 1 MB never gets that far.
            code, received = await session_attempt(address, [hello("n" * 300)])
            assert (code, received) == (grpc.StatusCode.INVALID_ARGUMENT, [])
            code, received = await session_attempt(address, [hello("n" * 1_000_000)])
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert received == []
            code, received = await session_attempt(address, [hello("node-x", "s" * 300)])
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            await asyncio.sleep(0.2)
            assert not server._sessions
            assert all(len(m) <= 256 for ring in server.rings.values() for m in ring.members)

    run(body())


def test_mutual_tls_binds_the_certificate_to_the_node_id(tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "ring-ca")
    server_key, server_cert = make_cert(tmp_path, ca, "coordinator", "localhost")
    for node in ("node-a", "node-b"):
        make_cert(tmp_path, ca, node)

    def channel_credentials(node: str | None) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=ca[1].read_bytes(),
            private_key=(tmp_path / f"{node}.key").read_bytes() if node else None,
            certificate_chain=(tmp_path / f"{node}.crt").read_bytes() if node else None,
        )

    async def body() -> None:
        credentials = grpc.ssl_server_credentials(
            [(server_key.read_bytes(), server_cert.read_bytes())],
            root_certificates=ca[1].read_bytes(),
            require_client_auth=True,
        )
        auth = RingAuthenticator(certificate_identity="{node_id}")
        async with serving(auth, credentials) as (server, leadership, address):
            node_a = lease_client(
                address, "node-a", channel_credentials=channel_credentials("node-a")
            )
            try:
                before = await node_a.wait_for_lease(10 * LEASE_SECONDS)
                bumps = list(leadership.bumps)
                as_b = channel_credentials("node-b")
                code, received = await session_attempt(address, [hello("node-a")], (), as_b)
                assert (code, received) == (grpc.StatusCode.PERMISSION_DENIED, [])
                anonymous = channel_credentials(None)
                code, received = await session_attempt(address, [hello("node-a")], (), anonymous)
                assert code == grpc.StatusCode.UNAVAILABLE and received == []
                assert set(server._sessions) == {"node-a"}
                await asyncio.sleep(LEASE_SECONDS)
                assert same_lease(before, node_a) and len(node_a.leases_seen) == 1
                assert leadership.bumps == bumps
            finally:
                await node_a.stop()

    run(body())


def test_the_lease_client_takes_its_credentials_from_the_settings(tmp_path: Path) -> None:
    secret = "s" * 40
    settings = load_settings(
        instance={"service-name": SERVICE},
        cassandra={"recovery": {"coordinator": {"addresses": ["127.0.0.1:1"], "secret": secret}}},
    )
    client = CoordinatorLeaseClient.from_settings(settings, node_id="node-a")
    assert client.key == node_key(secret.encode(), "node-a")
    # A node given only its node key (what coordinator-key prints) has that key, no secret.
    config = tmp_path / "stacksaga.yaml"
    config.write_text(
        f"stacksaga:\n  cassandra:\n    recovery:\n      coordinator:\n        secret: {secret}\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacksaga_store",
            "--config",
            str(config),
            "coordinator-key",
            "--node-id",
            "node-a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == node_key(secret.encode(), "node-a").hex()
    keyed = load_settings(
        instance={"service-name": SERVICE},
        cassandra={
            "recovery": {
                "coordinator": {"addresses": ["127.0.0.1:1"], "node-key": done.stdout.strip()}
            }
        },
    )
    assert CoordinatorLeaseClient.from_settings(keyed, node_id="node-a").key == client.key


@pytest.mark.parametrize("listen", ["0.0.0.0:7690", "10.0.0.5:7690", "coordinator-a:7690"])
def test_no_authentication_beyond_loopback_is_refused(listen: str, tmp_path: Path) -> None:
    def coordinator(**props: Any) -> Any:
        return load_settings(
            cassandra={"recovery": {"coordinator": props}}
        ).cassandra.recovery.coordinator

    with pytest.raises(ConfigError) as caught:
        server_security(coordinator(), listen)
    assert "coordinator.secret" in str(caught.value) and listen in str(caught.value)
    assert not server_security(coordinator(allow_insecure=True), listen)[0].enabled
    assert server_security(coordinator(secret="s" * 40), listen)[0].enabled
    assert not server_security(coordinator(), "127.0.0.1:7690")[0].enabled
    # The command refuses before it connects to anything.
    done = subprocess.run(
        [sys.executable, "-m", "stacksaga_store", "coordinator", "--listen", listen],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "allow-insecure" in done.stderr
