"""Switches a host may set only in tests: the planted protocol bugs.

The simulator's burn test plants them to prove its checkers catch each one; a sidecar takes
them from its ``planted_bugs`` setting so that its SIGKILL tests can prove the same against
real Cassandra. Kept out of :mod:`accord`'s public API so that no production code reaches
them by accident.
"""

from accord.local.bugs import NO_BUGS, Bugs

__all__ = ["NO_BUGS", "Bugs"]
