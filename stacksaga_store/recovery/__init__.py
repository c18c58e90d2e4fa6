"""The recovery engine (seed Part 4): window math, the 5-tier directory, the Standard-Node
writer and its commit modes, the Retry-Node with its lease client, compaction, metrics, and
``engine``, which wires them onto a connected runtime."""
