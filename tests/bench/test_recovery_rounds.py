"""bench/recovery_engine.py's rounds: medians per figure, and each mode's rate relative to
the ordered mode's in the same round (the two ran side by side there)."""

from __future__ import annotations

from typing import Any

from bench.recovery_engine import median_rounds


def _round(ordered: float, accord: float, cpu: float) -> dict[str, Any]:
    def kind(rate: float) -> dict[str, Any]:
        return {"starts_per_second": rate, "sidecar_cpu_ms_per_start": cpu, "note": "x"}

    return {
        "ordered": {"concurrency": 32, "create": kind(ordered), "saga": kind(ordered / 4)},
        "accord": {"concurrency": 32, "create": kind(accord), "saga": kind(accord / 2)},
    }


def test_medians_per_figure_and_ratios_paired_by_round() -> None:
    # Round 2 is slow for both modes (a compaction, say): paired ratios stay near a third,
    # while the ratio of the medians would say 300 / 1200 = 25%.
    rounds = [_round(1200, 400, 1.0), _round(600, 210, 3.0), _round(1300, 300, 2.0)]
    merged = median_rounds(rounds)
    create = merged["accord"]["create"]
    assert create["starts_per_second"] == 300
    assert create["sidecar_cpu_ms_per_start"] == 2.0
    assert create["note"] == "x"
    assert create["of_ordered"] == {"median": 0.333, "min": 0.231, "max": 0.35}
    assert merged["ordered"]["create"]["of_ordered"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert merged["accord"]["saga"]["of_ordered"]["median"] == round(2 * 0.333333, 3)
    assert merged["accord"]["concurrency"] == 32


def test_one_round_is_itself() -> None:
    merged = median_rounds([_round(1000, 250, 1.5)])
    assert merged["accord"]["create"]["starts_per_second"] == 250
    assert merged["accord"]["create"]["of_ordered"] == {"median": 0.25, "min": 0.25, "max": 0.25}
