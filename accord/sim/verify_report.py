"""Verdict and anomaly values shared by the history checkers (see :mod:`accord.sim.verify`).

Checkers may find thousands of instances of one anomaly (every read of a
corrupted list, say); a verdict keeps the exact count per anomaly name in
``stats`` but only the first few concrete examples, so that a failing test
prints something a human can read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accord.sim.history import History

__all__ = ["MAX_EXAMPLES", "Anomaly", "CycleEdge", "Verdict"]

#: Concrete examples kept per anomaly name; the full count is in ``stats``.
MAX_EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class CycleEdge:
    """One dependency edge of a reported cycle: ``src`` must precede ``dst``.

    ``kind`` is ``ww``, ``wr``, ``rw`` or ``rt`` (real time); ``key`` names the
    key the data dependency is about (``None`` for real-time edges).
    """

    src: int
    dst: int
    kind: str
    key: str | None = None

    def render(self) -> str:
        label = self.kind if self.key is None else f"{self.kind}[{self.key}]"
        return f"-{label}->"


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One concrete violation: its (Elle-style) name, a human explanation, the ops involved.

    For dependency cycles, ``cycle`` lists the edges in order, starting and
    ending at ``op_ids[0]``.
    """

    name: str
    explanation: str
    op_ids: tuple[int, ...]
    cycle: tuple[CycleEdge, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of a check: ``valid`` iff no anomaly of any kind was found."""

    valid: bool
    anomalies: tuple[Anomaly, ...]
    stats: Mapping[str, int] = field(hash=False, default_factory=dict)

    @property
    def anomaly_names(self) -> tuple[str, ...]:
        """Distinct anomaly names found, sorted."""
        return tuple(sorted({a.name for a in self.anomalies}))

    def summary(self) -> str:
        """A short multi-line human summary: verdict, counts, then the examples."""
        ops = self.stats.get("ops", 0)
        head = (
            f"ops={ops} ok={self.stats.get('ok', 0)} fail={self.stats.get('fail', 0)} "
            f"info={self.stats.get('info', 0)}"
        )
        if self.valid:
            return f"valid: {head}, no anomalies"
        counts = sorted(
            (name[len("anomaly.") :], n)
            for name, n in self.stats.items()
            if name.startswith("anomaly.")
        )
        listing = ", ".join(f"{name} x{n}" for name, n in counts) or "see examples"
        lines = [f"INVALID: {head}; {listing}"]
        lines.extend(f"  {a.name}: {a.explanation}" for a in self.anomalies)
        return "\n".join(lines)


class Collector:
    """Accumulates anomalies with a per-name example cap and exact counts."""

    __slots__ = ("_counts", "_examples")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._examples: list[Anomaly] = []

    def add(
        self,
        name: str,
        explanation: str,
        op_ids: tuple[int, ...],
        cycle: tuple[CycleEdge, ...] = (),
    ) -> None:
        n = self._counts.get(name, 0)
        self._counts[name] = n + 1
        if n < MAX_EXAMPLES:
            self._examples.append(Anomaly(name, explanation, op_ids, cycle))

    def extend(self, other: Verdict) -> None:
        """Fold another verdict's anomalies (and their exact counts) into this one."""
        for name, n in other.stats.items():
            if name.startswith("anomaly."):
                short = name[len("anomaly.") :]
                self._counts[short] = self._counts.get(short, 0) + n
        self._examples.extend(other.anomalies)

    @property
    def empty(self) -> bool:
        return not self._counts

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._counts))

    def verdict(self, stats: Mapping[str, int]) -> Verdict:
        merged = dict(stats)
        for name, n in self._counts.items():
            merged[f"anomaly.{name}"] = n
        merged["anomalies"] = sum(self._counts.values())
        frozen = MappingProxyType(dict(sorted(merged.items())))
        return Verdict(valid=not self._counts, anomalies=tuple(self._examples), stats=frozen)


def base_stats(history: History) -> dict[str, int]:
    """Operation counts every verdict reports."""
    ops = history.operations
    return {
        "ops": len(ops),
        "ok": sum(1 for op in ops if op.status == "ok"),
        "fail": sum(1 for op in ops if op.status == "fail"),
        "info": sum(1 for op in ops if op.status == "info"),
    }
