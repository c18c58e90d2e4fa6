"""The host contract of :mod:`accord.api`: ``ready()`` hands out a batch, ``advance()``
acknowledges that its records are durable, and inputs that arrive while a host persists
belong to the next batch."""

from __future__ import annotations

import random

import pytest

from accord import Node, ring_topology, sim_key
from accord.api import HlcFloor, Ready
from accord.invariants import InvariantViolation
from accord.messages import REPLY_TYPES, REQUEST_TYPES, PreAccept
from accord.primitives import Const, Put, Txn, Update
from tests.clocks import ManualClock

KEY = sim_key("k")


def _write(value: int) -> Txn:
    return Txn(reads=(), update=Update(condition=(), writes=(Put(KEY, Const(value)),)))


def _node() -> Node:
    return Node(1, ring_topology([1, 2, 3], 3), ManualClock(), random.Random(0))


def _preaccepts(ready: Ready) -> list[PreAccept]:
    return [e.body for e in ready.messages if isinstance(e.body, PreAccept)]


def test_the_next_batch_waits_for_the_acknowledgement() -> None:
    node = _node()
    node.submit(1, _write(1))
    first = node.ready()
    assert first.persist and _preaccepts(first)
    with pytest.raises(InvariantViolation, match="advance"):
        node.ready()
    node.advance(first)
    node.submit(2, _write(2))
    second = node.ready()
    assert second is not first and _preaccepts(second)


def test_inputs_during_a_persist_land_in_the_next_batch() -> None:
    # An asyncio host awaits its fsync between ready() and advance(); a client transaction
    # submitted meanwhile must not join the batch being persisted, or its PreAccepts would
    # be sent before the records that back them are durable.
    node = _node()
    node.submit(1, _write(1))
    first = node.ready()
    sent_first = list(first.messages)
    persisted_first = list(first.persist)
    node.submit(2, _write(2))
    assert first.messages == sent_first and first.persist == persisted_first
    node.advance(first)
    second = node.ready()
    (txn_first,) = {m.txn_id for m in _preaccepts(first)}
    (txn_second,) = {m.txn_id for m in _preaccepts(second)}
    assert txn_first != txn_second
    assert any(getattr(r, "txn_id", None) == txn_second for r in second.persist)


def test_advance_takes_only_the_outstanding_batch() -> None:
    node = _node()
    node.submit(1, _write(1))
    ready = node.ready()
    with pytest.raises(ValueError, match="batch of the last ready"):
        node.advance(Ready())
    node.advance(ready)
    with pytest.raises(ValueError, match="batch of the last ready"):
        node.advance(ready)


def _run(nodes: dict[int, Node], batches: list[tuple[int, Ready]]) -> None:
    """Deliver every message until the cluster is quiet, recording each batch."""
    while any(n.has_ready() for n in nodes.values()):
        for node_id, node in nodes.items():
            if not node.has_ready():
                continue
            ready = node.ready()
            node.advance(ready)
            batches.append((node_id, ready))
            for envelope in ready.messages:
                nodes[envelope.dest].step(envelope)


def test_early_messages_are_requests_that_rest_on_no_record_of_their_batch() -> None:
    topology = ring_topology([1, 2, 3], 3)
    clock = ManualClock()
    nodes = {i: Node(i, topology, clock, random.Random(i)) for i in (1, 2, 3)}
    batches: list[tuple[int, Ready]] = []
    for request in range(1, 4):
        nodes[1].submit(request, _write(request))
        _run(nodes, batches)
    early_kinds: set[str] = set()
    for _node_id, ready in batches:
        early = ready.early
        assert all(any(e is m for m in ready.messages) for e in early)
        if ready.early and any(type(r) is HlcFloor for r in ready.persist):
            pytest.fail("a batch that raises the HLC floor sent early")
        for envelope in early:
            assert type(envelope.body) in REQUEST_TYPES, envelope
            early_kinds.add(type(envelope.body).__name__)
    # The first submission raised the floor: nothing of its first batch went early.
    first = next(r for node_id, r in batches if node_id == 1)
    assert not first.early and _preaccepts(first)
    # Later ones: the PreAccepts, the fast path's stable Commit (caused by a peer's vote)
    # and the outcome proposal (caused by the coordinator's own read) overlap the fsync.
    assert {"PreAccept", "Commit", "Apply"} <= early_kinds
    # Every reply waited for its batch's records.
    assert not any(type(e.body) in REPLY_TYPES for _n, r in batches for e in r.early)
