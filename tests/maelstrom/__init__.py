"""Tests of the Maelstrom node, harness and checkers (``maelstrom/``)."""
