"""Deterministic cluster simulation and history checking for the Accord protocol."""
