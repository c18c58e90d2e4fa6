"""Peer input is untrusted: forged and garbage ``Peer.Deliver`` batches against three sidecars
on the embedded store. Each message an honest peer could never send is refused on its own
(counted, logged at a bounded rate), the rest of its batch is handled, and the cluster keeps
serving the keys the forged messages named.

Forged batches are built by :func:`forged_batch`, the one place that decides how a batch is
presented as coming from a peer (an authenticated transport signs it there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from accord.codec import encode_message
from accord.messages import Apply, Commit, Envelope, InformDurable, PreAccept
from accord.primitives import (
    Const,
    Deps,
    Key,
    Put,
    Route,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
)
from accord_cassandra.client import Client, Transaction, TransactionError
from accord_cassandra.cluster import LocalSidecars, metrics_of
from accord_cassandra.config import TimingSettings
from accord_cassandra.peerauth import BatchStamper, PeerKey
from accord_cassandra.schema import Catalog
from accord_cassandra.transport import CODEC_VERSION
from accord_cassandra.v1 import peer_pb2, peer_pb2_grpc
from tests.sidecar.conftest import EMBEDDED_TABLES, TIMING, TOKEN, _stop, log_tails

ACCOUNTS = Catalog.from_mapping(EMBEDDED_TABLES).table("bank", "accounts")
RECOVER_DELAY_SECONDS = TimingSettings().recover_delay_ms / 1000
EPOCH = 1  # the static topology's


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSidecars]:
    # Its own cluster: before the fixes these attacks killed or wedged sidecars for good.
    sidecars = LocalSidecars(
        tmp_path_factory.mktemp("peer-input"),
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"timing": TIMING, "drain_seconds": 2},
    )
    try:
        sidecars.start(timeout=60)
        yield sidecars
    finally:
        _stop(sidecars)


# One stamper per (cluster secret, claimed source), as a real sender has one per process: its
# incarnation stays put and its sequences count up, so the replay guard sees one sender.
_STAMPERS: dict[tuple[str, int], BatchStamper] = {}


def forged_batch(
    cluster: LocalSidecars, source: int, destination: int, envelopes: Sequence[Envelope | bytes]
) -> peer_pb2.PeerBatch:
    """A batch as peer ``source`` sends it to ``destination`` (envelopes encoded, bytes
    verbatim), signed with the cluster's shared secret: these tests are about what an
    authenticated peer (or one whose key leaked) can send, past the MAC check."""
    payloads = [e if isinstance(e, bytes) else encode_message(e) for e in envelopes]
    batch = peer_pb2.PeerBatch(codec_version=CODEC_VERSION, source=source, payloads=payloads)
    stamper = _STAMPERS.get((cluster.peer_secret, source))
    if stamper is None:
        stamper = BatchStamper(PeerKey("local", cluster.peer_secret.encode()))
        _STAMPERS[(cluster.peer_secret, source)] = stamper
    stamper.stamp(batch, destination)
    return batch


def deliver(address: str, batch: peer_pb2.PeerBatch) -> peer_pb2.PeerAck:
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(address, options=options) as channel:
        ack: peer_pb2.PeerAck = peer_pb2_grpc.PeerStub(channel).Deliver(batch, timeout=60)
        return ack


def now_micros() -> int:
    return time.time_ns() // 1000


def account(name: str) -> Key:
    return ACCOUNTS.key([name])


def write_txn(key: Key) -> Txn:
    return Txn(reads=(key,), update=Update((Put(key, Const((1_000_000, 0))),)))


def client(address: str) -> Client:
    return Client(address, token=TOKEN, timeout=20)


def serves(cluster: LocalSidecars, name: str) -> None:
    """Every sidecar is alive and commits a write to, then reads, account ``name``."""
    for index, sidecar in enumerate(cluster.sidecars.values()):
        assert sidecar.alive(), log_tails(cluster)
        with client(sidecar.address) as c:
            write = Transaction().update("bank", "accounts", name, balance=index, tag=index)
            assert c.transact(write).applied, log_tails(cluster)
            read = Transaction()
            read.let("a", "bank", "accounts", name)
            assert c.transact(read).rows["a"] == {"balance": index, "tag": index}


def counter(cluster: LocalSidecars, node: int, name: str) -> float:
    return metrics_of(cluster.sidecars[node].metrics_address).get(name, 0.0)


def each_sidecar_from_a_peer(cluster: LocalSidecars) -> Iterator[tuple[int, int, str]]:
    """(receiver, a peer of it, the receiver's peer address) for every sidecar."""
    nodes = sorted(cluster.sidecars)
    for index, node in enumerate(nodes):
        sidecar = cluster.sidecars[node]
        yield node, nodes[(index + 1) % len(nodes)], sidecar.peer_address or sidecar.address


def test_a_preaccept_with_an_hlc_near_2_63_is_refused_and_the_key_serves(
    cluster: LocalSidecars,
) -> None:
    # Before: the next transaction on the key overflowed the HLC floor written to the
    # journal (CodecError at HlcFloor.value) and killed the sidecar; recovery of the forged
    # txn then killed the others.
    key = account("hlc-overflow")
    txn = write_txn(key)
    for node, peer, address in each_sidecar_from_a_peer(cluster):
        txn_id = Timestamp(EPOCH, 2**63 - 10, 1, peer)
        body = PreAccept(1, txn_id, txn, Route(key, (key,)))
        before = counter(cluster, node, "accord_peer_messages_invalid_total")
        ack = deliver(address, forged_batch(cluster, peer, node, [Envelope(peer, node, body)]))
        assert ack.accepted == 0
        assert counter(cluster, node, "accord_peer_messages_invalid_total") == before + 1
    # Had the forged txn got in, the progress log would recover it once the recovery delay
    # passed, and that recovery killed the node. Keep transacting until two delays have
    # passed since the forgery: every round must commit (the wait ends by itself; what is
    # asserted is that the cluster serves, never how fast).
    window_ends = time.monotonic() + 2 * RECOVER_DELAY_SECONDS
    serves(cluster, "hlc-overflow")
    while time.monotonic() < window_ends:
        serves(cluster, "hlc-overflow")


def test_an_apply_naming_node_5000_is_refused_and_the_key_serves(cluster: LocalSidecars) -> None:
    # Before: its write could not be stamped (node id > 1023), every replica retried it
    # forever and every transaction on the key timed out.
    key = account("node-overflow")
    txn = write_txn(key)
    for node, peer, address in each_sidecar_from_a_peer(cluster):
        txn_id = Timestamp(EPOCH, now_micros(), 1, peer)
        body = Apply(
            1,
            txn_id,
            txn,
            Route(key, (key,)),
            Timestamp(EPOCH, txn_id.hlc + 1, 0, 5000),
            Deps({}),
            (WriteOp(key, (1_000_000, 0)),),
            TxnResult((), True),
        )
        ack = deliver(address, forged_batch(cluster, peer, node, [Envelope(peer, node, body)]))
        assert ack.accepted == 0
    serves(cluster, "node-overflow")
    assert all(counter(cluster, n, "accord_data_retries_total") == 0 for n in cluster.sidecars)


def test_conflicting_commits_refuse_one_message_not_the_batch(cluster: LocalSidecars) -> None:
    # Before: the second Commit broke an invariant, the exception left Deliver, and the
    # rest of the batch (here an InformDurable) was dropped with it.
    key = account("two-commits")
    txn = write_txn(key)
    node, peer, address = next(each_sidecar_from_a_peer(cluster))
    txn_id = Timestamp(EPOCH, now_micros(), 1, peer)
    route = Route(key, (key,))

    def commit(execute_at: Timestamp) -> Envelope:
        body = Commit(1, txn_id, execute_at, Deps({}), False, False, txn, route)
        return Envelope(peer, node, body)

    batch = forged_batch(
        cluster,
        peer,
        node,
        [
            commit(txn_id),
            commit(Timestamp(EPOCH, txn_id.hlc + 5, 0, peer)),
            Envelope(peer, node, InformDurable(2, Timestamp(EPOCH, 1, 1, peer))),
        ],
    )
    before = counter(cluster, node, "accord_peer_messages_invalid_total")
    ack = deliver(address, batch)
    assert ack.accepted == 2
    assert counter(cluster, node, "accord_peer_messages_invalid_total") == before + 1
    assert cluster.sidecars[node].alive()


def _refusal_lines(log: Path) -> int:
    return sum("refused a peer message" in line for line in log.read_text().splitlines())


def test_a_garbage_batch_is_counted_with_a_bounded_number_of_log_lines(
    cluster: LocalSidecars,
) -> None:
    # Before: 200k one-byte payloads wrote a WARNING line each (26 MB of log).
    node, peer, address = next(each_sidecar_from_a_peer(cluster))
    log = cluster.sidecars[node].log_path
    lines_before = _refusal_lines(log)
    refused_before = counter(cluster, node, "accord_peer_messages_refused_total")
    garbage = 200_000
    ack = deliver(address, forged_batch(cluster, peer, node, [b"\xc1"] * garbage))
    assert ack.accepted == 0
    assert counter(cluster, node, "accord_peer_messages_refused_total") == (
        refused_before + garbage
    )
    assert _refusal_lines(log) - lines_before <= 2
    serves(cluster, "after-garbage")


@pytest.mark.parametrize(
    ("row", "key_of"),
    [
        pytest.param(("a lot", 0), account, id="text-in-bigint"),
        pytest.param((1, 2, 3), account, id="row-too-wide"),
        pytest.param((1, 0), lambda name: account(name)._replace(token=12345), id="wrong-token"),
        pytest.param((1, 0), lambda name: Key(777, "bank.vaults:00"), id="no-such-table"),
    ],
)
def test_an_apply_whose_write_cannot_land_is_refused(
    cluster: LocalSidecars, row: tuple[object, ...], key_of: Callable[[str], Key]
) -> None:
    # With Cassandra such a write failed on every replica forever; in memory it was kept.
    name = f"cannot-land-{len(row)}-{row[0]}-{key_of is account}"
    key = key_of(name)
    txn = Txn(reads=(key,), update=Update((Put(key, Const(row)),)))
    for node, peer, address in each_sidecar_from_a_peer(cluster):
        txn_id = Timestamp(EPOCH, now_micros(), 1, peer)
        body = Apply(
            1,
            txn_id,
            txn,
            Route(key, (key,)),
            txn_id,
            Deps({}),
            (WriteOp(key, row),),
            TxnResult((), True),
        )
        assert (
            deliver(
                address, forged_batch(cluster, peer, node, [Envelope(peer, node, body)])
            ).accepted
            == 0
        )
    if key_of is account:
        read = Transaction()
        read.let("a", "bank", "accounts", name)
        for sidecar in cluster.sidecars.values():
            with client(sidecar.address) as c:
                assert c.transact(read).rows["a"] is None
        serves(cluster, name)


def _rss_kib(cluster: LocalSidecars, node: int) -> int:
    process = cluster.sidecars[node].process
    assert process is not None
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_forged_preaccepts_cannot_grow_a_node_without_bound(cluster: LocalSidecars) -> None:
    # Before: 20 PreAccepts of 2,000 keys each took a node from 82 MB to 258-363 MB, and
    # every further one stayed too (never committed, never released).
    node, peer, address = next(each_sidecar_from_a_peer(cluster))
    names = [f"bulk-{i}" for i in range(2000)]
    keys = tuple(sorted(account(name) for name in names))
    wide = Txn(reads=keys)
    batch = [
        Envelope(
            peer,
            node,
            PreAccept(1, Timestamp(EPOCH, now_micros() + i, 0, peer), wide, Route(keys[0], keys)),
        )
        for i in range(20)
    ]
    ack = deliver(address, forged_batch(cluster, peer, node, batch))
    assert ack.accepted == 0  # far more keys than any client transaction can name
    rss_before = _rss_kib(cluster, node)
    # Within the per-transaction limit, on the same 100 keys: each one's deps name all
    # before it, so what the node keeps grows quadratically until the per-peer bound.
    narrow_keys = keys[:100]
    narrow = Txn(reads=(), update=Update(tuple(Put(k, Const((1, 1))) for k in narrow_keys)))
    accepted = 0
    for round_ in range(10):
        batch = [
            Envelope(
                peer,
                node,
                PreAccept(
                    1,
                    Timestamp(EPOCH, now_micros() + i, 1, peer),
                    narrow,
                    Route(narrow_keys[0], narrow_keys),
                ),
            )
            for i in range(round_ * 100, round_ * 100 + 100)
        ]
        accepted += deliver(address, forged_batch(cluster, peer, node, batch)).accepted
    assert accepted < 1000  # the per-peer bound refused the rest
    grown_mib = (_rss_kib(cluster, node) - rss_before) / 1024
    assert grown_mib < 200, f"RSS grew {grown_mib:.0f} MiB"


# Last in this module: it may leave the cluster busy for the rest of it.
def test_the_cluster_serves_soon_after_forged_preaccepts(cluster: LocalSidecars) -> None:
    # The forged txns that got in are recovered (and invalidated) by a progress log that
    # runs at most max_progress_coordinators at once, so they cannot starve real work.
    # Each attempt is a real transaction with the client's own 20 s timeout, so retrying at
    # once is the wait: it ends as soon as the cluster serves, at the latest after 120 s.
    deadline = time.monotonic() + 120
    while True:
        try:
            serves(cluster, "after-bulk")
            return
        except (TransactionError, grpc.RpcError, AssertionError):
            if time.monotonic() > deadline:
                raise
