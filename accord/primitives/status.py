"""A replica's knowledge of one transaction, in the order knowledge only grows.

``ACCEPTED_INVALIDATE`` and ``ACCEPTED`` are the proposal phase: between them the accepted
ballot, not this order, decides which proposal is current. Everything from ``COMMITTED``
on is decided and never changes its executeAt; ``INVALIDATED`` is terminal.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    NOT_DEFINED = 0
    PRE_ACCEPTED = 10
    ACCEPTED_INVALIDATE = 20
    ACCEPTED = 30
    COMMITTED = 40
    STABLE = 50
    PRE_APPLIED = 60
    APPLIED = 70
    INVALIDATED = 90

    # These run on every transition: they compare plain ints held in module globals, because
    # looking members up on the enum class costs more than the comparison itself.
    @property
    def is_decided(self) -> bool:
        """executeAt (or invalidation) is final."""
        return self >= _COMMITTED

    @property
    def has_execute_at(self) -> bool:
        return _COMMITTED <= self <= _APPLIED

    @property
    def is_proposal(self) -> bool:
        return self in (_ACCEPTED, _ACCEPTED_INVALIDATE)

    @property
    def is_terminal(self) -> bool:
        return self in (_APPLIED, _INVALIDATED)


_COMMITTED = int(Status.COMMITTED)
_APPLIED = int(Status.APPLIED)
_ACCEPTED = int(Status.ACCEPTED)
_ACCEPTED_INVALIDATE = int(Status.ACCEPTED_INVALIDATE)
_INVALIDATED = int(Status.INVALIDATED)
