"""An in-repo stand-in for Maelstrom: runs Maelstrom-protocol nodes and checks what they did.

Maelstrom itself (and Knossos and Elle behind it) lives on Clojars, out of this project's
reach, so this package reproduces the parts of it a test depends on, for any binary that
speaks the protocol (``python -m maelstrom.node`` by default, or ``--bin``):

* ``runner``: spawns the nodes, sends ``init``, routes every message (client links with no
  latency, node links with a seeded latency distribution and partitions that drop on
  receive), drives clients ``c1...`` with one request in flight each at a seeded rate,
  applies Maelstrom's timeouts and its ok/fail/info mapping, and records a Jepsen history;
* ``net``: latency distributions and partition shapes (halves, majorities ring, bridge,
  one isolated node);
* ``generators``: lin-kv (``jepsen.independent`` groups of 2n threads per key) and Elle's
  txn generators;
* ``report``: in-repo checker plus Porcupine, merged ``:valid?``, stats, result files;
* ``__main__``: the CLI, ``python -m maelstrom.harness --workload lin-kv ...``, which exits
  0 (valid), 1 (invalid) or 2 (unknown), as Maelstrom does.

A seed fixes every random choice the harness makes (operations, latencies, partitions);
the nodes and the OS scheduler still decide timing, so a seed reproduces the workload and
the fault schedule, not the exact interleaving.
"""
