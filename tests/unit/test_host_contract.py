"""The host contract of :mod:`accord.api`: ``ready()`` hands out a batch, ``advance()``
acknowledges that its records are durable, and inputs that arrive while a host persists
belong to the next batch."""

from __future__ import annotations

import random

import pytest

from accord import Node, ring_topology, sim_key
from accord.api import Ready
from accord.invariants import InvariantViolation
from accord.messages import PreAccept
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
