"""The events on the wire: JSON documents, keyed by transaction id.

A *step command* asks for one step invocation (``Orchestrator.deliver``); an *outcome* says what
one delivery came to and which command, if any, it published next. Both carry a format
version: a document of another version, or any other bytes, is undecodable and goes to the
dead-letter topic instead of being guessed at.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from stacksaga_store.errors import StackSagaError
from stacksaga_store.saga.orchestrator import StepEvent
from stacksaga_store.store.states import ExecutionType

__all__ = ["FORMAT", "Outcome", "UndecodableEvent", "decode_step", "encode_outcome", "encode_step"]

FORMAT = 1
STEP_KIND = "step"
OUTCOME_KIND = "outcome"


class UndecodableEvent(StackSagaError):
    """Bytes on a steps topic that are not a step command of this format."""


def encode_step(event: StepEvent) -> bytes:
    document = {
        "format": FORMAT,
        "kind": STEP_KIND,
        "transaction_id": str(event.transaction_id),
        "step": event.step_name,
        "execution_type": event.execution_type.value,
    }
    if event.heal:
        document["heal"] = True
    return json.dumps(document, separators=(",", ":")).encode()


def decode_step(value: bytes | None) -> StepEvent:
    if value is None:
        raise UndecodableEvent("empty record (no value)")
    try:
        document = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UndecodableEvent(f"not UTF-8 JSON: {exc}") from None
    if not isinstance(document, dict):
        raise UndecodableEvent("not a JSON object")
    if document.get("format") != FORMAT or document.get("kind") != STEP_KIND:
        raise UndecodableEvent(
            f"format {document.get('format')!r} kind {document.get('kind')!r}; "
            f"expected format {FORMAT} kind {STEP_KIND!r}"
        )
    try:
        transaction_id = uuid.UUID(str(document["transaction_id"]))
        step = document["step"]
        kind = ExecutionType(document["execution_type"])
    except (KeyError, ValueError) as exc:
        raise UndecodableEvent(f"bad field: {exc}") from None
    heal = document.get("heal", False)
    if not isinstance(heal, bool):
        raise UndecodableEvent(f"bad heal flag {heal!r}")
    if not isinstance(step, str) or not step or kind not in _STEP_TYPES:
        raise UndecodableEvent(f"bad step {step!r} / execution type {kind.value}")
    return StepEvent(transaction_id, step, kind, heal=heal)


_STEP_TYPES = (ExecutionType.EXECUTE, ExecutionType.COMPENSATE)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one delivery came to (published on the outcomes topic)."""

    transaction_id: uuid.UUID
    step: str
    execution_type: ExecutionType
    outcome: str
    status: str
    worker: str
    next_step: str | None = None
    next_type: ExecutionType | None = None

    @classmethod
    def decode(cls, value: bytes) -> Outcome:
        document = json.loads(value.decode("utf-8"))
        next_type = document.get("next_type")
        return cls(
            transaction_id=uuid.UUID(document["transaction_id"]),
            step=document["step"],
            execution_type=ExecutionType(document["execution_type"]),
            outcome=document["outcome"],
            status=document["status"],
            worker=document["worker"],
            next_step=document.get("next_step"),
            next_type=ExecutionType(next_type) if next_type else None,
        )


def encode_outcome(outcome: Outcome) -> bytes:
    document = {
        "format": FORMAT,
        "kind": OUTCOME_KIND,
        "transaction_id": str(outcome.transaction_id),
        "step": outcome.step,
        "execution_type": outcome.execution_type.value,
        "outcome": outcome.outcome,
        "status": outcome.status,
        "worker": outcome.worker,
        "next_step": outcome.next_step,
        "next_type": outcome.next_type.value if outcome.next_type else None,
    }
    return json.dumps(document, separators=(",", ":")).encode()
