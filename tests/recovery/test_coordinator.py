"""The ring coordinator over gRPC with LWT leadership on real Cassandra.

Reference: seed 000 Part 4, "The RSocket Ring Coordinator" (master/standby, leases, Retry-Nodes
keep working while it restarts) and peers.md section 1 (no fencing token in StackSaga: ours
adds epochs).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from stacksaga_store.clock import ManualClock
from stacksaga_store.config.settings import load_settings
from stacksaga_store.recovery.directory import DirectoryScope
from stacksaga_store.recovery.engine import RecoveryEngine
from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient
from stacksaga_store.recovery.retry_node import RetryNode
from stacksaga_store.recovery.writer import RecoveryWriter
from stacksaga_store.ring.leases import covers_ring
from stacksaga_store.ring.server import Leadership, RingCoordinator
from stacksaga_store.saga.handoff import RetryRequest
from stacksaga_store.saga.runtime import StoreRuntime, open_runtime
from stacksaga_store.store.model import TransactionKey
from stacksaga_store.store.states import ExecutionType
from stacksaga_store.v1 import ring_pb2 as pb
from stacksaga_store.v1 import ring_pb2_grpc
from tests.recovery._helpers import DispatchRecord, RecordingDispatcher, dump_directory
from tests.recovery._processes import children, write_config
from tests.recovery._worker import LoggingDispatcher, read_lines
from tests.recovery.conftest import T0, recovery_overrides
from tests.stacksaga.conftest import run

pytestmark = pytest.mark.cassandra

LEASE_SECONDS = 5.0
TTL_SECONDS = 2


async def wait_until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@asynccontextmanager
async def coordinator(runtime: StoreRuntime, name: str) -> AsyncIterator[RingCoordinator]:
    leadership = Leadership(
        runtime.cql,
        runtime.driver_config.keyspace,
        region=runtime.settings.instance.region,
        cluster=runtime.settings.instance.cluster,
        holder=name,
        ttl_seconds=TTL_SECONDS,
    )
    server = RingCoordinator(
        leadership=leadership, coordinator_id=name, lease_seconds=LEASE_SECONDS
    )
    await server.start("127.0.0.1:0")
    try:
        yield server
    finally:
        await server.stop(resign=True)


def test_failover_keeps_leases_and_epochs(recovery_driver: object, service_name: str) -> None:
    """Master and standby; two nodes get disjoint leases covering the ring; the master dies
    without resigning; the standby adopts the same leases (same epoch) with no gap."""

    async def body() -> None:
        # A cluster name of its own: the leadership row is per (region, cluster).
        overrides = recovery_overrides(service_name)
        overrides["instance"]["cluster"] = f"cluster-{uuid.uuid4().hex[:8]}"
        runtime = await open_runtime(load_settings(**overrides), driver_config=recovery_driver)  # type: ignore[arg-type]
        clients: list[CoordinatorLeaseClient] = []
        try:
            async with coordinator(runtime, "master") as master:
                await wait_until(lambda: master.is_leader, 10, "the master's leadership")
                async with coordinator(runtime, "standby") as standby:
                    addresses = [f"127.0.0.1:{master.port}", f"127.0.0.1:{standby.port}"]
                    for name in ("node-a", "node-b"):
                        client = CoordinatorLeaseClient(
                            addresses, node_id=name, service_name=service_name
                        )
                        client.start()
                        clients.append(client)

                    def settled() -> bool:
                        leases = [c.current() for c in clients]
                        return all(leases) and covers_ring(
                            [lease.range for lease in leases if lease]
                        )

                    await wait_until(settled, 20, "two leases covering the ring")
                    before = [c.current() for c in clients]
                    assert before[0] is not None and before[1] is not None
                    assert before[0].epoch == before[1].epoch
                    assert sorted(lease.ordinal for lease in before if lease) == [0, 1]
                    assert not standby.is_leader

                    # The master dies (no resignation): its row expires after the TTL.
                    for task in master._tasks:
                        task.cancel()
                    master._leader = False
                    assert master._server is not None
                    await master._server.stop(grace=0)
                    lost_at = time.monotonic()
                    await wait_until(lambda: standby.is_leader, 15, "the standby's takeover")
                    # Leases stayed valid throughout and were adopted unchanged.
                    for client, lease in zip(clients, before, strict=True):
                        assert lease is not None
                        await wait_until(
                            lambda c=client: c.connected_to == addresses[1], 10, "reconnect"
                        )
                        now_lease = client.current()
                        assert now_lease is not None
                        assert (now_lease.range, now_lease.epoch) == (lease.range, lease.epoch)
                    await asyncio.sleep(LEASE_SECONDS)  # past the adoption window
                    after = [c.current() for c in clients]
                    assert all(after)
                    assert [(x.range, x.epoch) for x in after if x] == [
                        (x.range, x.epoch) for x in before if x
                    ]
                    assert all(len(c.leases_seen) == 1 for c in clients), "no lease change"
                    assert time.monotonic() - lost_at > TTL_SECONDS * 0.5
        finally:
            for client in clients:
                await client.stop()
            await runtime.close()

    run(body())


def test_two_retry_nodes_survive_a_coordinator_restart(
    recovery_driver_text: str,
    recovery_driver: object,
    service_name: str,
    tmp_path: Path,
) -> None:
    """Issue test 5: two Retry-Nodes on leases from a master coordinator *process* that is
    SIGKILLed mid-window; the standby process takes over (and the killed one comes back as a
    standby). Every row is dispatched exactly once, by the node whose lease covered it."""

    async def body() -> None:
        cluster = f"cluster-{uuid.uuid4().hex[:8]}"
        overrides = recovery_overrides(
            service_name,
            concurrency=2,
            # Longer than any failover under load: the test asserts the failover was adopted
            # (one lease per node), and a lease that lapses while the standby takes over
            # would be re-granted, which is correct but not what this test checks.
            coordinator={"lease-duration": "20s", "leadership-ttl": "2s"},
        )
        overrides["instance"]["cluster"] = cluster
        config = write_config(tmp_path / "config", overrides, recovery_driver_text)
        settings = load_settings(config)
        runtime = await open_runtime(settings, driver_config=recovery_driver)  # type: ignore[arg-type]
        clock = ManualClock(T0)
        with children(tmp_path) as group:
            master = group.coordinator("master", config)
            master_address = master.wait_for_address(60)
            standby = group.coordinator("standby", config)
            addresses = [master_address, standby.wait_for_address(60)]
            master_port = int(master_address.rpartition(":")[2])
            engine = await RecoveryEngine.open(runtime, clock=clock)
            try:
                # 60 writer instances, 5 retry pointers each, in window W+1 of T0.
                txns = await write_pointers(runtime, clock, engine, instances=60, per_instance=5)
                clock.advance(timedelta(minutes=1))
                log: list[DispatchRecord] = []
                nodes, clients, dispatchers = [], [], []
                for name in ("node-a", "node-b"):
                    client = CoordinatorLeaseClient(
                        addresses, node_id=name, service_name=service_name
                    )
                    client.start()
                    dispatcher = RecordingDispatcher(name, client, log, seconds=0.05)
                    node = engine.retry_node(
                        engine.orchestrator(), client, node_id=name, dispatcher=dispatcher
                    )
                    clients.append(client)
                    dispatchers.append(dispatcher)
                    nodes.append(node)
                stop = asyncio.Event()
                runners = [asyncio.create_task(n.run(stop=stop, idle_seconds=0.2)) for n in nodes]
                try:
                    await wait_until(lambda: len(log) >= 40, 60, "the first 40 dispatches")
                    master.kill()  # the coordinator master dies mid-window
                    killed_at = len(log)
                    restarted = group.coordinator("master-again", config, master_port)
                    await wait_until(
                        lambda: len({r.transaction_id for r in log}) == len(txns),
                        90,
                        "every row dispatched",
                    )
                    restarted.wait_for_output("serving on", 60)
                    # Node-0 compacts the window once both nodes dropped their markers and the
                    # window has ended (Gate 2).
                    clock.advance(timedelta(minutes=1))
                    await wait_until(lambda: compacted(nodes), 30, "node-0 compaction")
                finally:
                    stop.set()
                    await asyncio.gather(*runners)
                    for client in clients:
                        await client.stop()
                assert killed_at < len(txns), "the kill happened mid-window"
                dispatched = [r.transaction_id for r in log]
                assert len(dispatched) == len(set(dispatched)), "a row was dispatched twice"
                assert set(dispatched) == set(txns), "a row was skipped"
                assert [v for d in dispatchers for v in d.violations] == []
                assert {r.node_id for r in log} == {"node-a", "node-b"}
                # The failover was adopted: one lease per node for the whole test, same epoch.
                assert [len(c.leases_seen) for c in clients] == [1, 1]
                assert len({r.epoch for r in log}) == 1
                # Once the dead master's leadership row expires, exactly one coordinator leads:
                # the standby, or the restarted master if it wins the LWT race (both happen).
                # Every row may be dispatched on the leases already held before that, so wait.
                leaders = await eventual_leaders(addresses, 90)
                assert sum(leaders) == 1, (
                    f"exactly one coordinator leads after the failover: {leaders}"
                )
                # Each instance was handled by one node only: the leases never overlapped.
                by_instance: dict[str, set[str]] = {}
                for record in log:
                    by_instance.setdefault(record.instance_id, set()).add(record.node_id)
                assert all(len(owners) == 1 for owners in by_instance.values())
                dump = await dump_directory(runtime, DirectoryScope.of(settings.instance))
                assert dump.count("es_recovery_windows_by_day") == 0
                assert dump.empty_below_tier2
            finally:
                await engine.close()
                await runtime.close()

    run(body())


async def eventual_leaders(addresses: list[str], seconds: float) -> list[bool]:
    deadline = time.monotonic() + seconds
    leaders = [await leader_of(a) for a in addresses]
    while not any(leaders) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        leaders = [await leader_of(a) for a in addresses]
    return leaders


async def leader_of(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await ring_pb2_grpc.RingCoordinatorStub(channel).Status(pb.StatusRequest())
        return bool(reply.leader)


def compacted(nodes: list[RetryNode]) -> bool:
    return any(n.metrics.compaction["tier2_windows"] >= 1 for n in nodes)


async def write_pointers(
    runtime: StoreRuntime,
    clock: ManualClock,
    engine: RecoveryEngine,
    *,
    instances: int,
    per_instance: int,
) -> list[uuid.UUID]:
    """Retry pointers from ``instances`` writer processes (one RecoveryWriter each)."""
    txns: list[uuid.UUID] = []
    instance = runtime.settings.instance
    for _ in range(instances):
        writer = RecoveryWriter(
            directory=engine.directory,
            events=runtime.events,
            settings=runtime.settings,
            commit=engine.commit,
            clock=clock,
        )
        for _ in range(per_instance):
            key = TransactionKey.of(instance, uuid.uuid4())
            await writer.schedule_retry(
                RetryRequest(key, "step", ExecutionType.EXECUTE, 1, "503", clock.now())
            )
            txns.append(key.transaction_id)
    return txns


def test_join_and_leave_rebalance_with_a_new_epoch(
    recovery_driver: object, service_name: str
) -> None:
    """A third node joins: every lease is revoked and released, then three disjoint leases at
    the next epoch cover the ring. One leaves gracefully: two leases at the epoch after."""

    async def body() -> None:
        overrides = recovery_overrides(service_name)
        overrides["instance"]["cluster"] = f"cluster-{uuid.uuid4().hex[:8]}"
        runtime = await open_runtime(load_settings(**overrides), driver_config=recovery_driver)  # type: ignore[arg-type]
        clients: dict[str, CoordinatorLeaseClient] = {}

        def leases() -> list[Any]:
            return [c.current() for c in clients.values()]

        def settled(count: int) -> bool:
            current = leases()
            return (
                len(current) == count
                and all(current)
                and covers_ring([x.range for x in current if x])
                and len({x.epoch for x in current if x}) == 1
            )

        try:
            async with coordinator(runtime, "solo") as server:
                await wait_until(lambda: server.is_leader, 10, "leadership")
                address = [f"127.0.0.1:{server.port}"]
                for name in ("node-a", "node-b"):
                    clients[name] = CoordinatorLeaseClient(
                        address, node_id=name, service_name=service_name
                    )
                    clients[name].start()
                await wait_until(lambda: settled(2), 20, "two leases")
                two = leases()[0]
                assert two is not None
                clients["node-c"] = CoordinatorLeaseClient(
                    address, node_id="node-c", service_name=service_name
                )
                clients["node-c"].start()
                await wait_until(lambda: settled(3), 20, "three leases")
                three = leases()[0]
                assert three is not None and three.epoch == two.epoch + 1
                assert sorted(x.ordinal for x in leases() if x) == [0, 1, 2]
                leaving = clients.pop("node-b")
                await leaving.stop(release=True)
                await wait_until(lambda: settled(2), 20, "two leases again")
                again = leases()[0]
                assert again is not None and again.epoch == three.epoch + 1
                # Node-0 is node-a (sorted by node id): the range starting at -2^63.
                node_a = clients["node-a"].current()
                assert node_a is not None and node_a.is_node_zero
        finally:
            for client in clients.values():
                await client.stop()
            await runtime.close()

    run(body())


def test_a_paused_retry_node_never_acts_on_an_expired_lease(
    recovery_driver_text: str,
    recovery_driver: object,
    service_name: str,
    tmp_path: Path,
) -> None:
    """Beyond the seed: Retry-Node A (a process) is SIGSTOPped while holding half the ring.
    Its lease runs out, the coordinator evicts it and gives node B the whole ring; A is then
    SIGCONTed. A starts nothing under its old lease after waking, and B starts nothing in A's
    old range before A's lease had ended (times on the machine-wide monotonic clock)."""
    log = str(tmp_path / "dispatch.log")

    async def body() -> None:
        overrides = recovery_overrides(service_name, concurrency=2)
        overrides["instance"]["cluster"] = f"cluster-{uuid.uuid4().hex[:8]}"
        settings = load_settings(**overrides)
        runtime = await open_runtime(settings, driver_config=recovery_driver)  # type: ignore[arg-type]
        clock = ManualClock(T0)
        engine = await RecoveryEngine.open(runtime, clock=clock)
        try:
            async with coordinator(runtime, "solo") as server:
                await wait_until(lambda: server.is_leader, 10, "leadership")
                address = f"127.0.0.1:{server.port}"
                txns = await write_pointers(runtime, clock, engine, instances=40, per_instance=4)
                job = {
                    "kind": "coordinated",
                    "overrides": overrides,
                    "driver_text": recovery_driver_text,
                    "clock": (T0 + timedelta(minutes=1)).isoformat(),
                    "log": log,
                    "coordinator": address,
                    "node_id": "node-a",
                    "seconds": 0.1,
                }
                clock.advance(timedelta(minutes=1))
                with children(tmp_path) as group:
                    node_a = group.worker("node-a", job)
                    await wait_until(lambda: len(dispatches(log)) >= 3, 60, "A dispatching")
                    client = CoordinatorLeaseClient(
                        [address], node_id="node-b", service_name=service_name
                    )
                    client.start()
                    node_b = engine.retry_node(
                        engine.orchestrator(),
                        client,
                        node_id="node-b",
                        dispatcher=LoggingDispatcher("node-b", client, log, 0.1),
                    )
                    stop = asyncio.Event()
                    runner = asyncio.create_task(node_b.run(stop=stop, idle_seconds=0.1))
                    try:
                        await wait_until(
                            lambda: any(r[2] == "node-a" and r[4] >= 2 for r in dispatches(log)),
                            30,
                            "A dispatching on the split ring",
                        )
                        os.kill(node_a.pid, signal.SIGSTOP)
                        stopped_at = time.monotonic()
                        await asyncio.sleep(LEASE_SECONDS + 2)  # A's lease runs out meanwhile
                        os.kill(node_a.pid, signal.SIGCONT)
                        resumed_at = time.monotonic()
                        await wait_until(
                            lambda: {r[0] for r in dispatches(log)} >= {str(t) for t in txns},
                            120,
                            "every row dispatched",
                        )
                    finally:
                        stop.set()
                        await runner
                        await client.stop()
        finally:
            await engine.close()
            await runtime.close()
        records = dispatches(log)
        a_before = [r for r in records if r[2] == "node-a" and r[3] < stopped_at]
        paused_epoch = max(r[4] for r in a_before)
        paused_valid_until = max(r[5] for r in a_before if r[4] == paused_epoch)
        # 1. Nothing started by A while stopped, and nothing under the old lease after waking.
        assert not [r for r in records if r[2] == "node-a" and stopped_at < r[3] < resumed_at]
        assert not [
            r for r in records if r[2] == "node-a" and r[3] >= resumed_at and r[4] <= paused_epoch
        ]
        # 2. Every dispatch started inside the lease it was checked against.
        assert all(r[3] < r[5] for r in records), "a dispatch started on an expired lease"
        # 3. B touched the instances A held when paused only after A's lease had ended.
        a_instances = {r[1] for r in a_before if r[4] == paused_epoch}
        b_on_a = [r for r in records if r[2] == "node-b" and r[1] in a_instances]
        assert b_on_a, "B took over A's range"
        assert min(r[3] for r in b_on_a if r[4] > paused_epoch) > paused_valid_until
        assert all(r[4] > paused_epoch for r in b_on_a if r[3] > stopped_at)

    run(body())


def dispatches(log: str) -> list[tuple[str, str, str, float, int, float]]:
    """(txn, instance, node, monotonic, epoch, valid_until) per logged dispatch start."""
    rows = []
    for line in read_lines(log):
        parts = line.split()
        if parts and parts[0] == "dispatch":
            rows.append(
                (parts[1], parts[2], parts[3], float(parts[4]), int(parts[5]), float(parts[6]))
            )
    return rows
