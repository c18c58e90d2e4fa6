"""Sagas on the event store: their definition (``definition``), the orchestrator that runs
them, the hand-off it makes to the recovery engine (``handoff``), and ``runtime``, which
connects it all from the settings."""
