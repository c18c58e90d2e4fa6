"""What the public ``accord`` package exports, and what it must not."""

from __future__ import annotations

import random

import accord
import accord.sim
from accord.node import Node
from tests.clocks import ManualClock


def test_every_public_name_resolves() -> None:
    for name in accord.__all__:
        assert getattr(accord, name) is not None, name


def test_planted_bug_switches_are_not_public() -> None:
    # A host builds a Node from the public API and runs the correct protocol; the switches
    # that break it on purpose belong to the simulator.
    assert "Bugs" not in accord.__all__
    assert not hasattr(accord, "Bugs")
    assert "Bugs" in accord.sim.__all__
    assert not accord.sim.NO_BUGS.any()
    assert accord.sim.Bugs(witness_any_key=True).any()


def test_a_node_runs_the_correct_protocol_unless_told_otherwise() -> None:
    topology = accord.ring_topology([1, 2, 3], 3)

    node = Node(1, topology, ManualClock(), random.Random(0))
    assert node.bugs == accord.sim.NO_BUGS
    assert node.store.bugs == accord.sim.NO_BUGS
