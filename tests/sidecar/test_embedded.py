"""Three sidecar processes on the embedded store: the client API's errors, authentication,
health, metrics and the peer protocol's version check, with the cluster serving throughout."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accord import MAX_ROWS_PER_SLICE
from accord.codec import encode_message
from accord.messages import Envelope, InformDurable
from accord.primitives import Timestamp
from accord_cassandra.client import Client, Transaction, TransactionError
from accord_cassandra.cluster import LocalSidecars, metrics_of
from accord_cassandra.peerauth import BatchStamper, PeerKey
from accord_cassandra.transport import CODEC_VERSION
from accord_cassandra.v1 import client_pb2 as pb
from accord_cassandra.v1 import peer_pb2, peer_pb2_grpc
from tests.sidecar.bank import Bank, verify_ledger
from tests.sidecar.conftest import EMBEDDED_TABLES, TIMING, TOKEN, _stop, log_tails
from tests.sidecar.ledger import Ledger
from tests.sidecar.saga_tables import write_and_read_all_nine

TRANSACT = "/accord_cassandra.v1.Transactions/Transact"


def client(address: str, token: str | None = TOKEN) -> Client:
    return Client(address, token=token, timeout=20)


def serving_everywhere(cluster: LocalSidecars) -> None:
    """A transaction through every sidecar commits: the cluster still serves."""
    for index, address in enumerate(cluster.addresses()):
        t = Transaction().update("bank", "accounts", f"probe-{index}", balance=index, tag=0)
        with client(address) as c:
            assert c.transact(t).applied


def transact_error(address: str, request: Transaction | pb.TransactRequest) -> TransactionError:
    with client(address) as c, pytest.raises(TransactionError) as caught:
        c.transact(request)
    return caught.value


# ---------------------------------------------------------------------------- bad requests


def test_health_is_serving(embedded: LocalSidecars) -> None:
    for address in embedded.addresses():
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "accord_cassandra.v1.Transactions"):
                response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_malformed_bytes_are_invalid_argument(embedded: LocalSidecars) -> None:
    address = embedded.addresses()[0]
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(address) as channel:
        raw = channel.unary_unary(TRANSACT)  # no serializers: bytes on the wire as given
        for garbage in (b"\xff\xff\xff", b"\x0a\x05abc", b"\x12\x80"):
            with pytest.raises(grpc.RpcError) as caught:
                raw(garbage, timeout=10, metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed TransactRequest" in (caught.value.details() or "")
    serving_everywhere(embedded)


def _oversize_request() -> Transaction:
    return Transaction().update("shop", "items", ("eu", 1), photo=b"x" * (2 * 1024 * 1024))


def _unknown_keyspace() -> Transaction:
    t = Transaction()
    t.let("x", "nowhere", "accounts", "a")
    return t


def _unknown_table() -> Transaction:
    t = Transaction()
    t.let("x", "bank", "vaults", "a")
    return t


def _unknown_column() -> Transaction:
    t = Transaction()
    a = t.let("a", "bank", "accounts", "a")
    return t.where(a["colour"] == "red")


def _wrong_type() -> Transaction:
    return Transaction().update("bank", "accounts", "a", balance="a lot")


def _wrong_key_type() -> Transaction:
    return Transaction().update("shop", "items", ("eu", "one"), qty=1)


def _text_arithmetic() -> Transaction:
    t = Transaction()
    item = t.let("item", "shop", "items", ("eu", 1))
    return t.update("shop", "items", ("eu", 1), name=item["name"] - 1)


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (_oversize_request, ["exceeds 1048576"]),
        (_unknown_keyspace, ["unknown keyspace 'nowhere'"]),
        (_unknown_table, ["unknown table bank.vaults"]),
        (_unknown_column, ["unknown column 'colour' in bank.accounts"]),
        (_wrong_type, ["bank.accounts.balance is bigint", "'a lot'"]),
        (_wrong_key_type, ["shop.items.sku is int", "'one'"]),
        (_text_arithmetic, ["needs integers", "item.name is text"]),
        (Transaction, ["must read (LET) or write"]),
    ],
)
def test_bad_requests_are_invalid_argument_and_the_cluster_serves_on(
    embedded: LocalSidecars, build: Callable[[], Transaction], fragments: list[str]
) -> None:
    error = transact_error(embedded.addresses()[1], build())
    assert error.code == "INVALID_ARGUMENT" and error.definite
    for fragment in fragments:
        assert fragment in error.message, error.message
    serving_everywhere(embedded)


def test_a_request_beyond_the_grpc_limit_is_refused_by_size(embedded: LocalSidecars) -> None:
    huge = Transaction().update("shop", "items", ("eu", 1), photo=b"x" * (9 * 1024 * 1024))
    error = transact_error(embedded.addresses()[2], huge)
    assert error.code == "RESOURCE_EXHAUSTED" and "larger than max" in error.message
    serving_everywhere(embedded)


# ---------------------------------------------------------------------------- authentication


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", ""])
def test_a_missing_or_wrong_token_is_unauthenticated(
    embedded: LocalSidecars, token: str | None
) -> None:
    t = Transaction().update("bank", "accounts", "auth", balance=1, tag=0)
    for address in embedded.addresses():
        with client(address, token=token) as c, pytest.raises(TransactionError) as caught:
            c.transact(t)
        assert caught.value.code == "UNAUTHENTICATED"
    # Nothing was written: the row is still absent.
    reader = Transaction()
    reader.let("row", "bank", "accounts", "auth")
    with client(embedded.addresses()[0]) as c:
        assert c.transact(reader).rows == {"row": None}


def test_two_authorization_headers_are_unauthenticated(embedded: LocalSidecars) -> None:
    # Before: the last one won, so a proxy checking the first could be bypassed.
    t = Transaction().update("bank", "accounts", "two-headers", balance=1, tag=0)
    with grpc.insecure_channel(embedded.addresses()[0]) as channel:
        call = channel.unary_unary(
            TRANSACT,
            request_serializer=pb.TransactRequest.SerializeToString,
            response_deserializer=pb.TransactResponse.FromString,
        )
        for headers in (
            [("authorization", "Bearer wrong"), ("authorization", f"Bearer {TOKEN}")],
            [("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")],
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call(t.request, metadata=headers, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "more than one authorization header" in (caught.value.details() or "")


def test_an_error_echoing_a_64_kib_value_still_arrives_whole(embedded: LocalSidecars) -> None:
    # Before: the details overflowed gRPC's metadata limit and the client saw
    # RESOURCE_EXHAUSTED "received metadata size exceeds hard limit".
    huge = "x" * 65536
    error = transact_error(
        embedded.addresses()[0], Transaction().update("bank", "accounts", "a", balance=huge)
    )
    assert error.code == "INVALID_ARGUMENT", error
    assert "bank.accounts.balance is bigint" in str(error) and "truncated" in str(error)


def test_an_unauthenticated_malformed_request_learns_nothing(embedded: LocalSidecars) -> None:
    with grpc.insecure_channel(embedded.addresses()[0]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(TRANSACT)(b"\xff", timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_right_token_reads_what_it_wrote(embedded: LocalSidecars) -> None:
    first, second = embedded.addresses()[:2]
    t = Transaction()
    t.update("shop", "items", ("eu", 7), qty=3, name="ключ", photo=b"\x00\xff", active=True)
    with client(first) as c:
        assert c.transact(t).applied
    reader = Transaction()
    item = reader.let("item", "shop", "items", ("eu", 7))
    reader.where(item["qty"] == 3)
    reader.update("shop", "items", ("eu", 7), qty=item["qty"] + 1)
    with client(second) as c:
        result = c.transact(reader)
    assert result.applied
    assert result.rows["item"] == {"qty": 3, "name": "ключ", "photo": b"\x00\xff", "active": True}


# ---------------------------------------------------------------------------- metrics


def _http_get(address: str, path: str) -> bytes:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_metrics_expose_the_counters(embedded: LocalSidecars) -> None:
    sidecar = embedded.sidecars[1]
    before = metrics_of(sidecar.metrics_address)
    t = Transaction().update("bank", "accounts", "metrics", balance=1, tag=0)
    with client(sidecar.address) as c:
        c.transact(t)
    after = metrics_of(sidecar.metrics_address)
    for name in (
        'accord_transactions_total{outcome="ok"}',
        "accord_fast_path_total",
        "accord_slow_path_total",
        "accord_recoveries_total",
        "accord_journal_syncs_total",
        "accord_journal_sync_seconds_total",
        "accord_journal_records_total",
        "accord_pending_clients",
        "accord_commit_latency_seconds_count",
        'accord_commit_latency_seconds_bucket{le="+Inf"}',
        "accord_peer_messages_refused_total",
    ):
        assert name in after, name
    assert (
        after['accord_transactions_total{outcome="ok"}']
        >= before.get('accord_transactions_total{outcome="ok"}', 0) + 1
    )
    assert after["accord_journal_syncs_total"] > before["accord_journal_syncs_total"]
    assert after["accord_journal_records_total"] >= after["accord_journal_syncs_total"]
    assert after["accord_journal_sync_seconds_total"] > 0
    assert after["accord_commit_latency_seconds_count"] >= 1
    assert b"404 Not Found" in _http_get(sidecar.metrics_address, "/nothing-here")


def test_concurrent_clients_each_get_their_own_result_and_parts_are_counted(
    embedded: LocalSidecars,
) -> None:
    """Group commit (batch_max_parts, default 32): transactions submitted together may share
    one Accord transaction, and each client still reads its own row in its own result."""
    from concurrent.futures import ThreadPoolExecutor

    sidecar = embedded.sidecars[2]
    accounts = 48
    with client(sidecar.address) as c:
        for i in range(accounts):
            c.transact(
                Transaction().update("bank", "accounts", f"batch-{i}", balance=10 * i, tag=0)
            )
        before = metrics_of(sidecar.metrics_address)

        def step(i: int) -> tuple[int, object, bool]:
            t = Transaction()
            row = t.let("row", "bank", "accounts", f"batch-{i}")
            t.where(row["balance"] == 10 * i)
            t.update("bank", "accounts", f"batch-{i}", balance=row["balance"] + 1, tag=1)
            result = c.transact(t)
            return i, result.rows["row"]["balance"], result.applied

        with ThreadPoolExecutor(max_workers=accounts) as pool:
            outcomes = list(pool.map(step, range(accounts)))
        after = metrics_of(sidecar.metrics_address)
        assert outcomes == [(i, 10 * i, True) for i in range(accounts)]
        for i in range(accounts):
            read = Transaction()
            read.let("row", "bank", "accounts", f"batch-{i}")
            assert c.transact(read).rows["row"]["balance"] == 10 * i + 1
    # Every client transaction is one part of exactly one coordinated transaction.
    parts = after["accord_batch_parts_sum"] - before["accord_batch_parts_sum"]
    batches = after["accord_batch_parts_count"] - before["accord_batch_parts_count"]
    assert parts == accounts and 1 <= batches <= parts
    assert after['accord_batch_parts_bucket{le="+Inf"}'] == after["accord_batch_parts_count"]


def test_concurrent_wide_disjoint_transactions_form_batches_every_peer_accepts(
    embedded: LocalSidecars,
) -> None:
    """48 disjoint 16-key transactions at once are batched into Accord transactions of up
    to batch_max_keys (256) keys, more than one client transaction may name (128). Peers
    refused such a batch's PreAccept and BeginRecovery as invalid, so it stalled until the
    client deadline (DEADLINE_EXCEEDED, outcome unknown) and no replica could recover it."""
    from concurrent.futures import ThreadPoolExecutor

    sidecar = embedded.sidecars[1]
    wide, width = 48, 16

    def refused() -> float:
        return sum(
            metrics_of(s.metrics_address)["accord_peer_messages_invalid_total"]
            for s in embedded.sidecars.values()
        )

    before = metrics_of(sidecar.metrics_address)
    refused_before = refused()
    with client(sidecar.address) as c:

        def write(i: int) -> tuple[int, str]:
            t = Transaction()
            for k in range(width):
                t.update("bank", "accounts", f"wide-{i}-{k}", balance=i, tag=k)
            try:
                return i, "applied" if c.transact(t).applied else "not applied"
            except TransactionError as error:
                return i, str(error.code)

        with ThreadPoolExecutor(max_workers=wide) as pool:
            outcomes = list(pool.map(write, range(wide)))
    after = metrics_of(sidecar.metrics_address)
    assert outcomes == [(i, "applied") for i in range(wide)], log_tails(embedded)
    assert refused() == refused_before
    parts = after["accord_batch_parts_sum"] - before["accord_batch_parts_sum"]
    batches = after["accord_batch_parts_count"] - before["accord_batch_parts_count"]
    assert parts == wide and 1 <= batches <= parts


# ---------------------------------------------------------------------------- peer protocol


def test_a_peer_batch_with_another_codec_version_is_failed_precondition(
    embedded: LocalSidecars,
) -> None:
    with grpc.insecure_channel(embedded.sidecars[1].address) as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        batch = peer_pb2.PeerBatch(codec_version=CODEC_VERSION + 1, source=2, payloads=[b"x"])
        BatchStamper(PeerKey("local", embedded.peer_secret.encode())).stamp(batch, 1)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Deliver(batch, timeout=10)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"codec version {CODEC_VERSION + 1}" in (caught.value.details() or "")
    serving_everywhere(embedded)


def test_bad_peer_payloads_are_refused_and_counted(embedded: LocalSidecars) -> None:
    sidecar = embedded.sidecars[1]
    before = metrics_of(sidecar.metrics_address)["accord_peer_messages_refused_total"]
    body = InformDurable(1, Timestamp(1, 1, 1, 2))
    payloads = [
        b"\xc1 not msgpack",
        encode_message(Envelope(2, 3, body)),  # addressed to another node
        encode_message(Envelope(3, 1, body)),  # from a node other than the batch's source
    ]
    with grpc.insecure_channel(sidecar.address) as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        batch = peer_pb2.PeerBatch(codec_version=CODEC_VERSION, source=2, payloads=payloads)
        BatchStamper(PeerKey("local", embedded.peer_secret.encode())).stamp(batch, 1)
        ack = stub.Deliver(batch, timeout=10)
        assert ack.accepted == 0
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/accord_cassandra.v1.Peer/Deliver")(b"\xff\xff", timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = metrics_of(sidecar.metrics_address)["accord_peer_messages_refused_total"]
    assert after == before + 4
    serving_everywhere(embedded)


# ---------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accord_cassandra", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_txn_prints_the_result_and_reports_errors(embedded: LocalSidecars) -> None:
    address = embedded.addresses()[0]
    write = {
        "mutations": [
            {
                "row": {"keyspace": "bank", "table": "accounts", "partitionKey": [{"text": "cli"}]},
                "upsert": {"set": [{"column": "balance", "value": {"literal": {"int": "7"}}}]},
            }
        ]
    }
    done = _cli("txn", "--address", address, "--token", TOKEN, json.dumps(write))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["applied"] is True
    read = {"lets": [{"name": "a", "row": write["mutations"][0]["row"]}]}
    done = _cli("txn", "--address", address, "--token", TOKEN, json.dumps(read))
    assert json.loads(done.stdout)["rows"] == {"a": {"balance": 7, "tag": None}}
    done = _cli("txn", "--address", address, json.dumps(read))
    assert done.returncode == 1 and "UNAUTHENTICATED" in done.stderr
    done = _cli("txn", "--address", address, "{not json")
    assert done.returncode == 2 and "not a TransactRequest" in done.stderr


def test_cli_txn_writes_a_clustered_row_with_a_ttl_and_reads_a_slice(
    embedded: LocalSidecars,
) -> None:
    address = embedded.addresses()[0]
    row = {
        "keyspace": "bank",
        "table": "ledger",
        "partitionKey": [{"text": "cli"}],
        "clustering": [{"int": "5"}, {"text": "t"}],
    }
    write = {
        "mutations": [
            {
                "row": row,
                "upsert": {"set": [{"column": "amount", "value": {"literal": {"int": "3"}}}]},
                "ttl": 3600,
            }
        ]
    }
    done = _cli("txn", "--address", address, "--token", TOKEN, json.dumps(write))
    assert done.returncode == 0 and json.loads(done.stdout)["applied"] is True, done.stderr
    partition = {k: v for k, v in row.items() if k != "clustering"}
    read = {
        "lets": [
            {
                "name": "s",
                "row": partition,
                "slice": {"column": "at", "lower": {"value": {"int": "1"}}, "limit": 10},
            }
        ]
    }
    done = _cli("txn", "--address", address, "--token", TOKEN, json.dumps(read))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["slices"] == {
        "s": [{"at": 5, "transfer": "t", "amount": 3, "memo": None}]
    }


def test_cli_sidecar_names_the_bad_field(tmp_path: object) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "bad.yaml"
    config.write_text("node_id: 1\nlisten: nowhere\npeers: {1: '127.0.0.1:1'}\njournal_dir: /x\n")
    done = _cli("sidecar", "--config", str(config))
    assert done.returncode == 2
    assert "listen" in done.stderr and "'nowhere' is not host:port" in done.stderr


def test_cli_cluster_up_refuses_a_cassandra_address_off_loopback(tmp_path: object) -> None:
    done = _cli(
        "cluster",
        "up",
        "--cassandra",
        "--nodes",
        "1",
        "--cassandra-first-ip",
        "10.0.0.1",
        "--dir",
        str(tmp_path),
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "accord-cassandra: cannot start Cassandra: node addresses must stay inside 127.0.0.0/8"
    ]


# ---------------------------------------------------------------------------- bank


def test_concurrent_transfers_on_the_embedded_store(embedded: LocalSidecars) -> None:
    bank = Bank(embedded.addresses(), "bank", [f"e{i}" for i in range(6)], token=TOKEN, seed=7)

    async def scenario() -> tuple[dict[str, tuple[int, int]], dict[int, tuple[int, int]]]:
        try:
            await bank.setup()
            deadline = time.monotonic() + 4
            await bank.run(6, lambda: time.monotonic() > deadline)
            final = await bank.audit()
            receipts = await bank.read_receipts(sorted(bank.transfers))
            return final, receipts
        finally:
            await bank.close()

    final, receipts = asyncio.run(scenario())
    statuses = bank.statuses()
    assert statuses["ok"] >= 20, (statuses, bank.errors, log_tails(embedded))
    assert sum(balance for balance, _ in final.values()) == 6 * bank.initial
    verdict = bank.verdict()
    assert verdict.valid, verdict.summary()
    assert verify_ledger(bank, final, receipts) == []


def test_a_restarted_embedded_sidecar_still_has_its_rows(embedded: LocalSidecars) -> None:
    # The in-memory store dies with the process; the journal holds every applied write.
    t = Transaction()
    for i in range(6):
        t.update("bank", "accounts", f"kept{i}", balance=100 + i, tag=i)
    with client(embedded.addresses()[0]) as c:
        assert c.transact(t).applied
    reader = Transaction()
    for i in range(6):
        reader.let(f"kept{i}", "bank", "accounts", f"kept{i}")
    expected = {f"kept{i}": {"balance": 100 + i, "tag": i} for i in range(6)}
    # A coordinator that replicates the rows reads them itself: through sidecar 2 this reads
    # sidecar 2's store, so the write is applied (and journaled as such) there.
    with client(embedded.sidecars[2].address) as c:
        assert c.transact(reader).rows == expected
    embedded.sidecars[2].kill()
    embedded.restart(2, timeout=60)
    with client(embedded.sidecars[2].address) as c:
        assert c.transact(reader).rows == expected


def _unreachable_seen(address: str) -> float:
    return metrics_of(address)["accord_peers_unreachable"]


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f} s: {what}")
        time.sleep(0.05)


def test_survivors_learn_a_killed_peer_is_unreachable_and_reachable_again(
    embedded: LocalSidecars,
) -> None:
    # The transport's word reaches the node: a dead coordinator's transactions are then
    # recovered after the floor delay, not the one learned from live latencies
    # (tests/scenarios/test_adaptive_recover_delay.py has the timing).
    survivors = [embedded.sidecars[1], embedded.sidecars[2]]
    for sidecar in survivors:
        assert _unreachable_seen(sidecar.metrics_address) == 0
    embedded.sidecars[3].kill()
    try:
        # Every transaction is sent to the dead replica too; those sends find nobody.
        for index, sidecar in enumerate(survivors):
            t = Transaction().update("bank", "accounts", f"reach-{index}", balance=1, tag=0)
            with client(sidecar.address) as c:
                assert c.transact(t).applied
        for sidecar in survivors:
            _wait_for(
                lambda s=sidecar: _unreachable_seen(s.metrics_address) == 1,
                f"sidecar {sidecar.address} reports the killed peer unreachable",
            )
    finally:
        embedded.restart(3, timeout=60)
    serving_everywhere(embedded)
    for sidecar in survivors:
        _wait_for(
            lambda s=sidecar: _unreachable_seen(s.metrics_address) == 0,
            f"sidecar {sidecar.address} reports the restarted peer reachable",
        )


def test_peers_on_grpc_with_keepalive_stay_reachable_while_idle(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The gRPC peer path with its keepalive pings as the sidecar sets them (server and
    # channels, transport.keepalive_options): pinging every second, idle peers answer, stay
    # reachable and serve. tests/sidecar/test_vanished_peers.py cuts a vanished one off.
    cluster = LocalSidecars(
        tmp_path_factory.mktemp("grpc-peers"),
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"timing": TIMING, "peer_frames_listen": None, "peer_dead_seconds": 2},
    )
    try:
        cluster.start(timeout=60)
        serving_everywhere(cluster)
        time.sleep(6)  # idle: three ping periods, nothing else on the connections
        for sidecar in cluster.sidecars.values():
            assert _unreachable_seen(sidecar.metrics_address) == 0, log_tails(cluster)
        serving_everywhere(cluster)
        frames = sum(
            metrics_of(s.metrics_address).get("accord_peer_frame_connections", 0)
            for s in cluster.sidecars.values()
        )
        assert frames == 0  # on gRPC indeed
    finally:
        _stop(cluster)


# ---------------------------------------------------------------------------- clustered bank


def test_clustered_bank_ledger_matches_balances_under_concurrency(
    embedded: LocalSidecars,
) -> None:
    ledger = Ledger(embedded.addresses(), "bank", [f"acct{i}" for i in range(4)], token=TOKEN)

    async def scenario() -> dict[str, tuple[int | None, list[dict[str, object]]]]:
        await ledger.setup()
        await ledger.run(workers=4, transfers=8)
        return await ledger.audit()

    audit = asyncio.run(scenario())
    assert len(ledger.acked) >= 10, (ledger.errors, log_tails(embedded))
    assert ledger.problems(audit) == [], ledger.errors
    serving_everywhere(embedded)


def test_bad_clustered_requests_are_invalid_argument_and_the_cluster_serves_on(
    embedded: LocalSidecars,
) -> None:
    unknown_column = Transaction()
    unknown_column.let_slice("s", "bank", "ledger", "acct0", column="when", ge=1)
    no_partition_key = Transaction()
    no_partition_key.let_slice("s", "bank", "ledger", [], column="at", ge=1)
    regular_range = Transaction()
    regular_range.let_slice("s", "bank", "ledger", "acct0", column="amount", ge=1)
    over_cap = Transaction()
    over_cap.let_slice("s", "bank", "ledger", "acct0", limit=MAX_ROWS_PER_SLICE + 1)
    for request, culprit in (
        (unknown_column, "unknown clustering column 'when'"),
        (no_partition_key, "whole partition key"),
        (regular_range, "bank.ledger.amount is not a clustering column"),
        (over_cap, "MAX_ROWS_PER_SLICE"),
    ):
        error = transact_error(embedded.addresses()[0], request)
        assert error.code == "INVALID_ARGUMENT" and culprit in error.message, error.message
    serving_everywhere(embedded)
    with client(embedded.addresses()[1]) as c:
        t = Transaction()
        t.let_slice("s", "bank", "ledger", "nobody")
        assert c.transact(t).slices["s"] == []


def test_the_saga_stores_nine_tables_in_one_transaction(embedded: LocalSidecars) -> None:
    with client(embedded.addresses()[2]) as c:
        read = write_and_read_all_nine(c, "saga")
    assert len(read) == 9
