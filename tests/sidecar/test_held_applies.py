"""SIGKILL a coordinator whose outgoing messages are held: it dies with Applies unsent.

tests/sidecar/test_cassandra.py kills a sidecar at a random instant. The double-applied
transfer that ``accord_history`` once papered over needs the kill to land after the victim
wrote a transaction's writes to Cassandra and before its Apply reached anyone, a window of
milliseconds that a random kill rarely hits (the planted early write passed it twice).
Here the victim's connections to its peers pass through a forwarder that stops forwarding
before the kill: replies still reach the victim, so the transactions it was coordinating
run up to their Apply, which never leaves. Correct, nothing of theirs is in Cassandra and
the survivors' recovery reads the data as it was; with ``write_before_durable`` planted
(``ACCORD_SIDECAR_PLANTED_BUGS='["write_before_durable"]'``) the recovery reads the
transfer's own writes and the bank's books stop balancing: the receipts bank's and the
clustered bank's (tests/sidecar/ledger.py) alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from accord_cassandra.cluster import LocalSidecars
from accord_cassandra.launcher import CassandraHandle
from tests.sidecar.conftest import CassandraSidecars, bank_sidecars_on_cassandra, log_tails
from tests.sidecar.ledger import Ledger
from tests.sidecar.test_cassandra import judge, new_bank, run_scenario, until
from tests.sidecar.test_rows_cassandra import settle_books

pytestmark = pytest.mark.cassandra

VICTIM = 2


@dataclass
class Forwarder:
    """Loopback TCP forwarder to ``target``; ``hold()`` stops moving bytes towards it."""

    target: tuple[str, int]
    held: threading.Event = field(default_factory=threading.Event)
    sockets: list[socket.socket] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            try:
                outbound = socket.create_connection(self.target, timeout=5)
            except OSError:
                inbound.close()
                continue
            outbound.settimeout(None)
            with self.lock:
                self.sockets += [inbound, outbound]
            for args in ((inbound, outbound, True), (outbound, inbound, False)):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, holdable: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                if holdable and self.held.is_set():
                    time.sleep(0.01)
                    continue
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.close()

    def hold(self) -> None:
        self.held.set()

    def drop_and_release(self) -> None:
        """Close every connection (what was held is lost), then forward again."""
        with self.lock:
            ends, self.sockets = self.sockets, []
        for end in ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                end.close()
        self.held.clear()

    def close(self) -> None:
        self.listener.close()
        self.drop_and_release()


@dataclass
class HeldSidecars(LocalSidecars):
    """The victim reaches its peers through forwarders: on gRPC and on the framed link
    (keyed by a negative node id), whichever its sender uses."""

    forwarders: dict[int, Forwarder] = field(default_factory=dict)

    def _forward(self, maps: dict[int, dict[int, str]], sign: int) -> dict[int, dict[int, str]]:
        for peer, address in maps[VICTIM].items():
            if peer != VICTIM:
                host, _, port = address.rpartition(":")
                self.forwarders[sign * peer] = Forwarder((host, int(port)))
                maps[VICTIM][peer] = self.forwarders[sign * peer].address
        return maps

    def peer_maps(self) -> dict[int, dict[int, str]]:
        return self._forward(super().peer_maps(), 1)

    def frame_maps(self) -> dict[int, dict[int, str]]:
        return self._forward(super().frame_maps(), -1)


@pytest.fixture(scope="module")
def held_sidecars(
    cassandra_cluster: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CassandraSidecars, HeldSidecars]]:
    directory = tmp_path_factory.mktemp("held-sidecars")
    with bank_sidecars_on_cassandra(cassandra_cluster, directory, "held", HeldSidecars) as (
        cluster,
        sidecars,
    ):
        try:
            yield sidecars, cluster
        finally:
            for forwarder in cluster.forwarders.values():
                forwarder.close()


def test_sigkill_a_coordinator_with_its_applies_held(
    held_sidecars: tuple[CassandraSidecars, HeldSidecars],
) -> None:
    sidecars, cluster = held_sidecars
    sidecars.all_serving()
    bank = new_bank(sidecars, "held", 4_000_000, seed=44)
    kills = 0

    victim = cluster.sidecars[VICTIM].address

    async def script(_: Callable[[], bool]) -> None:
        nonlocal kills
        for round_index in range(3):
            # Clients that fled the victim stay away: these ones use it and only it.
            stopped = asyncio.Event()
            start = time.monotonic()
            load = asyncio.create_task(
                bank.run(
                    3,
                    stopped.is_set,
                    addresses=[victim],
                    first_process=100 + 10 * round_index,
                )
            )

            def by_victim(start: float = start) -> int:
                return sum(1 for c in bank.commits if c.at > start and c.address == victim)

            await until(lambda: by_victim() >= 10, seconds=120)
            for forwarder in cluster.forwarders.values():
                forwarder.hold()
            await asyncio.sleep(1.0)  # its coordinations run up to an Apply that never leaves
            cluster.sidecars[VICTIM].kill()
            kills += 1
            for forwarder in cluster.forwarders.values():
                forwarder.drop_and_release()
            stopped.set()
            await load
            await asyncio.to_thread(cluster.restart, VICTIM, 60.0)

    audited, direct = run_scenario(sidecars, bank, script)
    assert kills == 3
    assert audited == direct
    judge(sidecars, bank, direct)
    print(f"held applies: {bank.statuses()} after {kills} kills")


def test_sigkill_a_coordinator_with_its_applies_held_clustered_bank(
    held_sidecars: tuple[CassandraSidecars, HeldSidecars],
) -> None:
    """The same kill under the clustered bank: a transfer re-executed after its writes
    reached Cassandra debits its balance twice while its ledger row (same clustering key)
    lands once, so the balance stops matching the sum of its ledger."""
    sidecars, cluster = held_sidecars
    sidecars.all_serving()
    ledger = Ledger(
        sidecars.addresses(), sidecars.keyspace, [f"hk{i}" for i in range(4)], seed=45, timeout=12
    )
    victim = cluster.sidecars[VICTIM].address

    async def scenario() -> dict[str, tuple[int | None, list[dict[str, object]]]]:
        await ledger.setup()
        for round_index in range(3):
            stopped = asyncio.Event()
            start = time.monotonic()
            load = asyncio.create_task(
                ledger.run(
                    3,
                    until=stopped.is_set,
                    addresses=[victim],
                    first_worker=100 + 10 * round_index,
                )
            )

            def by_victim(start: float = start) -> int:
                return sum(1 for at, a in ledger.answered if at > start and a == victim)

            await until(lambda: by_victim() >= 10, seconds=120)
            for forwarder in cluster.forwarders.values():
                forwarder.hold()
            await asyncio.sleep(1.0)  # its coordinations run up to an Apply that never leaves
            cluster.sidecars[VICTIM].kill()
            for forwarder in cluster.forwarders.values():
                forwarder.drop_and_release()
            stopped.set()
            await load
            await asyncio.to_thread(cluster.restart, VICTIM, 60.0)
        return await settle_books(sidecars, ledger)

    try:
        audit = asyncio.run(scenario())
    except BaseException:
        print(log_tails(sidecars.cluster))
        raise
    summary = f"acked={len(ledger.acked)} unknown={len(ledger.unknown)}"
    assert ledger.problems(audit) == [], summary
    assert len(ledger.acked) >= 10, summary
    print(f"held applies, clustered bank: {summary}")
