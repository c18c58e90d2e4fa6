"""Deterministic cluster simulation and history checking for the Accord protocol.

:class:`Bugs` (the planted protocol bugs the burn test must catch) is exported here and not
from :mod:`accord`: it is a testing switch, never something a host sets. The core reads it
from :mod:`accord.local.bugs`, the layer that needs it.
"""

from accord.local.bugs import NO_BUGS, Bugs

__all__ = ["NO_BUGS", "Bugs"]
