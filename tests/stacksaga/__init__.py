"""Tests of stacksaga_store (seed 000, Parts 1-3)."""
