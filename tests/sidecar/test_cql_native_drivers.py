"""Drivers with no code change but the contact point (issue 19): each of three sidecars fronts
its own Cassandra node; the Python driver with its default load-balancing policy and the Java
driver with its defaults, given one sidecar, find the other two through the endpoint's
system.peers_v2 answer, send every request to sidecars (counted at the endpoints), run
transactions, a CREATE TABLE with their own schema-agreement wait off and a read of the new
table at ALL, and carry on through the others when one sidecar is killed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from cassandra import ConsistencyLevel, ProtocolVersion
from cassandra.cluster import Cluster, Session
from cassandra.query import SimpleStatement

from accord_cassandra.cluster import metrics_of
from accord_cassandra.launcher import CassandraHandle
from tests.sidecar.conftest import (
    TRANSFER,
    CassandraSidecars,
    CqlSidecars,
    bank_sidecars_on_cassandra,
)

pytestmark = [pytest.mark.cassandra, pytest.mark.slow]


class FrontingCqlSidecars(CqlSidecars):
    """CQL sidecars each beside a Cassandra node of its own (cql_upstream, cassandra_hosts)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        settings = dict(self.cassandra or {})
        points = list(settings["contact_points"])
        hosts = {node: points[(node - 1) % len(points)] for node in range(1, self.nodes + 1)}
        self.extra = {**self.extra, "cassandra_hosts": hosts}
        self.node_extra = {
            node: {"cql_upstream": f"{host}:{settings['port']}"} for node, host in hosts.items()
        }


@pytest.fixture(scope="module")
def fronting(
    cassandra_cluster: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FrontingCqlSidecars, CassandraSidecars]]:
    if len(cassandra_cluster.contact_points) < 3:
        pytest.fail(
            "these driver tests need three Cassandra nodes behind three sidecars; "
            f"the cluster has {len(cassandra_cluster.contact_points)} contact point(s) "
            "(ACCORD_CASSANDRA_CLUSTER_CONTACT_POINTS)"
        )
    directory = tmp_path_factory.mktemp("cql-drivers")
    with bank_sidecars_on_cassandra(
        cassandra_cluster, directory, "cqldrv", FrontingCqlSidecars
    ) as pair:
        yield pair


def counters(sidecars: FrontingCqlSidecars) -> dict[int, dict[str, float]]:
    out = {}
    for node, sidecar in sidecars.sidecars.items():
        if not sidecar.alive():
            continue
        figures = metrics_of(sidecar.metrics_address)
        out[node] = {
            "transactions": figures.get("accord_cql_transactions_total", 0.0),
            "execute": figures.get('accord_cql_requests_total{opcode="EXECUTE"}', 0.0),
            "query": figures.get('accord_cql_requests_total{opcode="QUERY"}', 0.0),
        }
    return out


def delta(
    after: dict[int, dict[str, float]], before: dict[int, dict[str, float]], key: str
) -> dict[int, float]:
    return {node: after[node][key] - before.get(node, {}).get(key, 0.0) for node in after}


def endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def seed(bank: CassandraSidecars, ids: list[str], balance: int) -> None:
    for account in ids:
        bank.session.execute(
            SimpleStatement(
                f"INSERT INTO {bank.keyspace}.accounts (id, balance) VALUES (%s, %s)",
                consistency_level=ConsistencyLevel.ALL,
            ),
            (account, balance),
        )


def total(bank: CassandraSidecars, ids: list[str]) -> int:
    markers = ", ".join(["%s"] * len(ids))
    rows = bank.session.execute(
        SimpleStatement(
            f"SELECT balance FROM {bank.keyspace}.accounts WHERE id IN ({markers})",
            consistency_level=ConsistencyLevel.ALL,
        ),
        ids,
    )
    return sum(int(r.balance) for r in rows)


def wait_until(what: str, check: object, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.2)


def transfers(session: Session, ks: str, ids: list[str], count: int) -> None:
    prepared = session.prepare(TRANSFER.format(ks=ks))
    for i in range(count):
        src, dst = ids[i % len(ids)], ids[(i + 1) % len(ids)]
        row = session.execute(prepared, (src, dst, 1, 1, src, 1, dst), timeout=60).one()
        assert row is not None and row[0] is True, row


def test_python_driver_default_policy_discovers_the_sidecars_and_survives_one_killed(
    fronting: tuple[FrontingCqlSidecars, CassandraSidecars],
) -> None:
    sidecars, bank = fronting
    ks = bank.keyspace
    ids = [f"py-{i}" for i in range(6)]
    seed(bank, ids, 100)
    addresses = {endpoint(s.cql_address) for s in sidecars.sidecars.values()}
    first = endpoint(sidecars.sidecars[1].cql_address)
    # The driver's defaults but the contact point; its own schema-agreement wait off (0),
    # so the CREATE TABLE below relies on the endpoint's.
    cluster = Cluster(
        [first[0]],
        port=first[1],
        protocol_version=ProtocolVersion.V4,
        connect_timeout=30,
        control_connection_timeout=30,
        max_schema_agreement_wait=0,
    )
    try:
        session = cluster.connect()
        known = {(h.endpoint.address, h.endpoint.port) for h in cluster.metadata.all_hosts()}
        assert known == addresses, (known, addresses)
        wait_until("every sidecar up", lambda: all(h.is_up for h in cluster.metadata.all_hosts()))
        before = counters(sidecars)
        transfers(session, ks, ids, 12)
        table = f"notes_{uuid.uuid4().hex[:8]}"
        result = session.execute(f"CREATE TABLE {ks}.{table} (id text PRIMARY KEY, body text)")
        assert result.response_future.warnings is None, result.response_future.warnings
        insert = session.prepare(f"INSERT INTO {ks}.{table} (id, body) VALUES (?, ?)")
        insert.consistency_level = ConsistencyLevel.ALL
        select = session.prepare(f"SELECT body FROM {ks}.{table} WHERE id = ?")
        select.consistency_level = ConsistencyLevel.ALL
        for i in range(6):
            session.execute(insert, (f"n{i}", f"b{i}"))
            assert session.execute(select, (f"n{i}",)).one() == (f"b{i}",)
        after = counters(sidecars)
        executes = delta(after, before, "execute")
        done = delta(after, before, "transactions")
        # Every EXECUTE the test sent (12 transfers, 6 inserts, 6 reads) reached a sidecar.
        # The driver routes a transfer by the token of its last ``id`` marker (it reads the
        # partition key off the bind variables' names), so the transfers spread over the
        # sidecars that front those accounts' replicas, never only the contact point.
        assert sum(executes.values()) == 12 + 6 + 6, executes
        assert sum(done.values()) == 12, done
        assert sum(1 for n in done.values() if n > 0) >= 2, done
        assert total(bank, ids) == 600

        # SIGKILL the contact point (the control connection's sidecar): the driver goes on
        # through the others once it has seen the connections close.
        sidecars.sidecars[1].kill()
        dead = next(h for h in cluster.metadata.all_hosts() if h.endpoint.port == first[1])
        wait_until("the driver to see sidecar 1 down", lambda: not dead.is_up)
        before = counters(sidecars)
        transfers(session, ks, ids, 6)
        session.execute(insert, ("after-kill", "x"))
        assert session.execute(select, ("after-kill",)).one() == ("x",)
        after = counters(sidecars)
        assert set(after) == {2, 3}
        assert sum(delta(after, before, "transactions").values()) == 6
        assert sum(delta(after, before, "execute").values()) == 6 + 2
        assert total(bank, ids) == 600
    finally:
        cluster.shutdown()
        if not sidecars.sidecars[1].alive():
            sidecars.restart(1, timeout=90)


def test_java_driver_defaults_discover_the_sidecars(
    fronting: tuple[FrontingCqlSidecars, CassandraSidecars],
) -> None:
    from tests.clients.java_driver import run_probe

    sidecars, bank = fronting
    ks = bank.keyspace
    ids = ["java-a", "java-b"]
    seed(bank, ids, 50)
    dc = bank.session.execute("SELECT data_center FROM system.local").one().data_center
    host, port = endpoint(sidecars.sidecars[2].cql_address)
    wait_until(
        "every sidecar's endpoint to serve",
        lambda: all(s.alive() for s in sidecars.sidecars.values()),
    )
    before = counters(sidecars)
    table = f"jnotes_{uuid.uuid4().hex[:8]}"
    args = [host, str(port), dc, ks, "cluster", "java-a", "java-b", "5", table, "6"]
    status, lines, stderr = run_probe(args)
    assert status == 0, (lines, stderr[-3000:])
    nodes = next(line for line in lines if line["what"] == "nodes")["nodes"]
    found = {str(n).rpartition("/")[2] for n in nodes}  # type: ignore[union-attr]
    assert found == {s.cql_address for s in sidecars.sidecars.values()}, (found, nodes)
    read = next(line for line in lines if line["what"] == "read")
    assert read["rows"] == [["a", "b"]], read
    after = counters(sidecars)
    done = delta(after, before, "transactions")
    assert sum(done.values()) == 6 and sum(1 for n in done.values() if n > 0) >= 2, done
    assert total(bank, ids) == 100
