"""Accord under Jepsen's Maelstrom: a protocol node, an in-repo harness, and checkers.

Theory of operation
-------------------
Maelstrom runs a *node binary* that speaks JSON lines on stdin/stdout, drives clients
against it, injects network faults, and checks the recorded history. This package holds
both sides of that contract and keeps them apart:

* the node side, which real Maelstrom runs unchanged: :mod:`maelstrom.protocol` (wire
  format, error codes), :mod:`maelstrom.operations` (client requests as Accord
  transactions), :mod:`maelstrom.node` (the process hosting :class:`accord.Node`);
* the test side, standing in for Maelstrom, Knossos and Elle, which this project cannot
  install: :mod:`maelstrom.harness` (processes, network, nemesis, clients, results),
  :mod:`maelstrom.history` and :mod:`maelstrom.edn` (Jepsen histories),
  :mod:`maelstrom.checker` and :mod:`maelstrom.linearizable` (in-repo checkers), and
  :mod:`maelstrom.porcupine_driver` with ``maelstrom/porcupine/`` (an external checker).

The harness talks to nodes only through processes and the protocol, so it can test any
Maelstrom binary; the checkers look only at client-observed histories, never at replica
state, so a protocol bug cannot hide behind a bug-compatible reading of its internals.

Only the standard library, msgpack (through :mod:`accord`) and, for Porcupine, a Go
toolchain are needed. See ``docs/maelstrom.md`` for commands and figures.
"""
