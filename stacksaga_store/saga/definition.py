"""The saga API: ordered steps with async ``execute`` and ``compensate``.

A :class:`Saga` is a name, an optional write-protection domain and an ordered tuple of
:class:`Step`. Each step's ``execute(ctx)`` may return a mapping that is merged (shallowly) into
the saga's *aggregate*, the JSON document every later step sees; it may also put
*revert hints* (``ctx.revert_hints[...] = ...``) that compensations read back, e.g. the payment
id a refund needs. Hints are saved with the step's result, under the same marker, so a
compensation always sees the hints of the execution it undoes.

Errors a step raises (see :mod:`stacksaga_store.errors`):

* :class:`~stacksaga_store.errors.RetryableStepError` (or ``asyncio.TimeoutError`` from the
  step's own time limit): the saga pauses and the recovery engine retries the same invocation
  later, with the same idempotency key;
* :class:`~stacksaga_store.errors.NonRetryableStepError`, or any other exception: the step failed
  for good; completed steps are compensated in reverse order.

``ctx.idempotency_key`` is a UUID derived from (transaction id, step name, execute/compensate):
identical for every retry of one invocation, different between execute and compensate, so a
downstream service can deduplicate on it.

Definitions are checked when built (:class:`~stacksaga_store.errors.SagaDefinitionError` names
the saga and step): at least one step, unique names, coroutine functions, names that fit a
marker id.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from stacksaga_store.errors import SagaDefinitionError, StackSagaError
from stacksaga_store.saga.classify import ErrorClassifier
from stacksaga_store.store.states import ExecutionType

__all__ = [
    "IDEMPOTENCY_NAMESPACE",
    "STEPS_MAX",
    "Saga",
    "SagaPayload",
    "Step",
    "StepContext",
    "idempotency_key",
]

STEPS_MAX = 100
STEP_TIMEOUT_DEFAULT = timedelta(seconds=60)
STEP_TIMEOUT_MAX = timedelta(hours=1)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Fixed namespace so keys are stable across processes and versions of this package.
IDEMPOTENCY_NAMESPACE = uuid.UUID("6f1c3a52-8f3e-5d7b-9a0e-2c4b5e7d9f11")
PAYLOAD_FORMAT = 1

StepResult = Mapping[str, Any] | None
StepFunction = Callable[["StepContext"], Awaitable[StepResult]]


def idempotency_key(transaction_id: uuid.UUID, step_name: str, kind: ExecutionType) -> str:
    """Stable across retries of one invocation (uuid5 of transaction, step and kind)."""
    return str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{transaction_id}/{step_name}/{kind.value}"))


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step function gets.

    ``aggregate`` is read-only; return a mapping to change it. ``revert_hints`` is shared by
    the whole saga and writable; changes are saved only if the step succeeds.
    """

    transaction_id: uuid.UUID
    saga_name: str
    step_name: str
    execution_type: ExecutionType
    idempotency_key: str
    attempt: int
    aggregate: Mapping[str, Any]
    revert_hints: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Step:
    """One saga step. ``compensate`` None means nothing to undo (a query step)."""

    name: str
    execute: StepFunction
    compensate: StepFunction | None = None
    timeout: timedelta = STEP_TIMEOUT_DEFAULT
    # Retry or compensate? See stacksaga_store.saga.classify (step, then saga, then default).
    classify: ErrorClassifier | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SagaDefinitionError(
                f"step name {self.name!r} must be 1-64 characters of letters, digits, "
                "'_', '.', '-' and start with a letter or digit"
            )
        _check_coroutine(self.name, "execute", self.execute)
        if self.compensate is not None:
            _check_coroutine(self.name, "compensate", self.compensate)
        _check_classifier(f"step {self.name!r}", self.classify)
        if not timedelta(0) < self.timeout <= STEP_TIMEOUT_MAX:
            raise SagaDefinitionError(
                f"step {self.name!r}: timeout must be above 0 and at most 1h, got {self.timeout}"
            )


def _check_classifier(owner: str, classify: object) -> None:
    if classify is not None and not callable(classify):
        raise SagaDefinitionError(f"{owner}: classify must be a callable, got {classify!r}")


def _check_coroutine(step: str, role: str, function: object) -> None:
    if not callable(function):
        raise SagaDefinitionError(f"step {step!r}: {role} must be an async function")
    # An object with `async def __call__` is as good as a coroutine function.
    method = None if inspect.isroutine(function) else type(function).__call__
    if not (inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(method)):
        raise SagaDefinitionError(
            f"step {step!r}: {role} must be an async function (async def), got {function!r}"
        )


@dataclass(frozen=True, slots=True)
class Saga:
    """An ordered list of steps under a name (and a write-protection domain)."""

    name: str
    steps: tuple[Step, ...]
    domain: str | None = None
    classify: ErrorClassifier | None = None
    _by_name: Mapping[str, Step] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SagaDefinitionError(
                f"saga name {self.name!r} must be 1-64 characters of letters, digits, '_', '.', '-'"
            )
        _check_classifier(f"saga {self.name!r}", self.classify)
        steps = tuple(self.steps)
        object.__setattr__(self, "steps", steps)
        if not steps:
            raise SagaDefinitionError(f"saga {self.name!r} has no steps")
        if len(steps) > STEPS_MAX:
            raise SagaDefinitionError(f"saga {self.name!r} has {len(steps)} steps; max {STEPS_MAX}")
        by_name: dict[str, Step] = {}
        for index, step in enumerate(steps):
            if not isinstance(step, Step):
                raise SagaDefinitionError(
                    f"saga {self.name!r}: item {index} is {type(step).__name__}, not a Step"
                )
            if step.name in by_name:
                raise SagaDefinitionError(
                    f"saga {self.name!r}: step name {step.name!r} is used twice"
                )
            by_name[step.name] = step
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    @property
    def compensable(self) -> frozenset[str]:
        return frozenset(step.name for step in self.steps if step.compensate is not None)

    def step(self, name: str) -> Step:
        try:
            return self._by_name[name]
        except KeyError:
            raise SagaDefinitionError(f"saga {self.name!r} has no step {name!r}") from None


@dataclass(frozen=True, slots=True)
class SagaPayload:
    """The es_transaction.payload document (JSON, UTF-8).

    ``steps`` pins the step list the transaction started with: resuming it under a changed
    definition is refused rather than guessed. ``suspended_from`` remembers the status a
    quarantined transaction had.
    """

    saga: str
    steps: tuple[str, ...]
    aggregate: Mapping[str, Any]
    revert_hints: Mapping[str, Any]
    last_error: str | None = None
    suspended_from: str | None = None

    def encode(self) -> bytes:
        document = {
            "format": PAYLOAD_FORMAT,
            "saga": self.saga,
            "steps": list(self.steps),
            "aggregate": dict(self.aggregate),
            "revert_hints": dict(self.revert_hints),
            "last_error": self.last_error,
            "suspended_from": self.suspended_from,
        }
        try:
            return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
        except (TypeError, ValueError) as exc:
            raise SagaPayloadError(
                f"saga {self.saga!r}: aggregate or hints not JSON: {exc}"
            ) from None

    @classmethod
    def decode(cls, raw: bytes) -> SagaPayload:
        try:
            document = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise SagaPayloadError(f"payload is not saga JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != PAYLOAD_FORMAT:
            raise SagaPayloadError(f"payload format is not {PAYLOAD_FORMAT}")
        try:
            return cls(
                saga=str(document["saga"]),
                steps=tuple(str(name) for name in document["steps"]),
                aggregate=dict(document.get("aggregate") or {}),
                revert_hints=dict(document.get("revert_hints") or {}),
                last_error=document.get("last_error"),
                suspended_from=document.get("suspended_from"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SagaPayloadError(f"payload lacks or mistypes a field: {exc!r}") from None


class SagaPayloadError(StackSagaError):
    """A payload that cannot be written (not JSON) or read (not this package's format)."""
