"""Always-on invariant checks and the root of the library's error hierarchy.

Plain ``assert`` disappears under ``python -O``; a broken invariant in a consensus protocol
must stop the process in production too, so every check here raises regardless of flags.
"""

from __future__ import annotations

from typing import ClassVar, NoReturn, TypeVar

T = TypeVar("T")


class AccordError(Exception):
    """Root of every error this library raises on purpose: ``except accord.AccordError``
    catches them all (:class:`accord.codec.CodecError` and
    :class:`accord.messages.validate.InvalidMessage` included)."""

    retryable: ClassVar[bool] = False


class InvariantViolation(AccordError):
    """A condition the protocol guarantees does not hold: a bug, never an operating error."""


class InvalidTransaction(AccordError):
    """A transaction definition is malformed (unknown operator, wrong shape, no keys)."""


class ConfigurationError(AccordError):
    """A node or topology configuration is inconsistent."""


class InvalidArgument(AccordError, ValueError):
    """A caller passed something the API does not accept (a ``ValueError`` too, as it was
    before the library had one root)."""


def check_state(condition: bool, message: str, *args: object) -> None:
    """Raise :class:`InvariantViolation` unless ``condition`` holds.

    ``message`` is %-formatted with ``args`` only on failure so callers pay nothing on the
    happy path.
    """
    if not condition:
        fail(message, *args)


def fail(message: str, *args: object) -> NoReturn:
    """Raise :class:`InvariantViolation` with a %-formatted message."""
    raise InvariantViolation(message % args if args else message)


def check_argument(condition: bool, message: str, *args: object) -> None:
    """Raise :class:`InvalidArgument` unless ``condition`` holds (caller's mistake, not ours)."""
    if not condition:
        raise InvalidArgument(message % args if args else message)


def check_not_none(value: T | None, message: str, *args: object) -> T:
    """Return ``value``, raising :class:`InvariantViolation` if it is None.

    The always-on form of ``assert value is not None``: it narrows the type for mypy too.
    """
    if value is None:
        fail(message, *args)
    return value
