"""Errors of the saga store, split by whose fault they are.

Every operating error derives from :class:`StackSagaError` and says through the class attribute
``retryable`` whether trying the same thing again later can succeed (the aiokafka habit). Three
families matter to callers:

* configuration and definition mistakes (:class:`ConfigError`, :class:`SagaDefinitionError`,
  :class:`SchemaMismatchError`): a person must fix a file or code; the message names the
  property, step or column;
* store conditions (:class:`LeaseBusyError`, :class:`LeaseLostError`,
  :class:`TransactionNotFoundError`, :class:`IllegalTransitionError`, ...): what the event
  store or write protection found in Cassandra;
* step outcomes raised by *user* code (:class:`RetryableStepError`,
  :class:`NonRetryableStepError`): the only two a step's ``execute``/``compensate`` should raise
  on purpose. Any other exception escaping user code counts as non-retryable, as in StackSaga.

Bugs in this package raise :class:`InvariantViolation` from :func:`check_state`, which stays on
under ``python -O`` (plain ``assert`` does not).

``except StackSagaError`` catches every error the package raises on purpose, bugs included.
The one family outside it is :class:`StepError`: user code raises it, and the orchestrator
catches it.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "IllegalTransitionError",
    "InvariantViolation",
    "LeaseBusyError",
    "LeaseFenceRefusedError",
    "LeaseFencedError",
    "LeaseLostError",
    "NonRetryableStepError",
    "RetryableStepError",
    "SagaDefinitionError",
    "SchemaMismatchError",
    "StackSagaError",
    "StepError",
    "TransactionHistoryFullError",
    "TransactionNotFoundError",
    "check_not_none",
    "check_state",
]


class StackSagaError(Exception):
    """Root of every error this package raises on purpose."""

    retryable: ClassVar[bool] = False


class ConfigError(StackSagaError, ValueError):
    """A configuration value is missing, malformed or out of range.

    ``problems`` holds one ``(property, message)`` pair per fault, the property spelled as in
    the YAML file (``stacksaga.cassandra.recovery.window-interval-minutes``) or the HOCON file
    (``datastax-java-driver.basic.contact-points``).
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        check_state(bool(problems), "ConfigError needs at least one problem")
        self.problems = problems
        lines = [f"{name}: {message}" for name, message in problems]
        super().__init__("invalid configuration:\n  " + "\n  ".join(lines))

    @classmethod
    def single(cls, name: str, message: str) -> ConfigError:
        """One problem with one property."""
        return cls([(name, message)])


class SagaDefinitionError(StackSagaError, ValueError):
    """A saga definition cannot run: empty, duplicate step names, a sync callable, ..."""


class SchemaMismatchError(StackSagaError):
    """The keyspace lacks a table or column the store needs, or one has the wrong type."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("schema check failed:\n  " + "\n  ".join(problems))


class TransactionNotFoundError(StackSagaError, LookupError):
    """No es_transaction row for this transaction id in this region/cluster/service."""


class IllegalTransitionError(StackSagaError):
    """A running-status change that states.TRANSITIONS does not allow."""


class TransactionHistoryFullError(StackSagaError):
    """The transaction reached TRYOUTS_PER_TRANSACTION_MAX tryouts; no more are recorded."""


class LeaseBusyError(StackSagaError):
    """STRICT mode: another worker held the step's lease for every attempt we were allowed.

    Retryable: the holder either commits (a later delivery then skips) or its lease expires.
    """

    retryable: ClassVar[bool] = True


class LeaseLostError(StackSagaError):
    """STRICT mode: our lease expired while the step ran, so our commit was refused.

    The business logic did run; another worker may have run it too. This is the seed's
    documented weak spot (a holder that outlives its TTL); the fenced commit turns a silent
    double-commit into this error.
    """


class LeaseFencedError(StackSagaError):
    """A Retry-Node's resume stopped between steps: the range lease it dispatched under is
    gone (expired, revoked or replaced by a later epoch), so another node may own the saga now.

    Retryable: the row stays in its bucket for the range's new holder.
    """

    retryable: ClassVar[bool] = True


class LeaseFenceRefusedError(LeaseFencedError):
    """The store refused a write of a Retry-Node's dispatch on its range lease's epoch (the
    accord mode's in-transaction fence, or the ordered mode's STRICT epoch row): the range
    moved to a later epoch, whatever the node's own lease clock says. The node must treat the
    lease as lost for good: stop, drop it, never dispatch under that epoch again.
    """


class StepError(Exception):
    """Base of the two errors a step raises on purpose. Not a StackSagaError: user code owns it."""

    retryable: ClassVar[bool] = False


class RetryableStepError(StepError):
    """A transient fault (HTTP 503, timeout): the saga pauses and the recovery engine retries
    the same step invocation later, with the same idempotency key."""

    retryable: ClassVar[bool] = True


class NonRetryableStepError(StepError):
    """A permanent fault: the saga compensates completed steps in reverse order."""


class InvariantViolation(StackSagaError, AssertionError):
    """A bug: something this package guarantees did not hold (still an ``AssertionError``, as
    before the package had one root)."""


def check_state(condition: bool, message: str) -> None:
    """Always-on assertion (kept under ``python -O``); raises :class:`InvariantViolation`."""
    if not condition:
        raise InvariantViolation(message)


def check_not_none(value: T | None, message: str) -> T:
    """``value``, or :class:`InvariantViolation` if it is None: the always-on form of
    ``assert value is not None`` that narrows the type for mypy too."""
    if value is None:
        raise InvariantViolation(message)
    return value
