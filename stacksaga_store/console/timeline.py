"""One saga's history as a timeline: rows for the table and an inline SVG picture, drawn
server-side from the tryouts, the restore watchdog and the retry windows.

What is known and what is derived: a tryout row has its step (``executor``), kind, outcome and
time. Its *duration* is the time since the previous record (the creation for the first): the
store writes a tryout when the invocation ended, so that span is the invocation plus the gap
before it. The error text is the payload's ``last_error`` (the store keeps the latest only),
shown on the last failed tryout. A retryable failure's pointer went to the window after the
one it failed in (W+1, docs/recovery-engine.md); it is due at that window's start plus the
read grace. The restore watchdog is es_transaction.restore_*; it fires at that window's start
plus the grace, unless the saga has finished by then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from html import escape
from typing import Any

from stacksaga_store.recovery.windows import WindowMath
from stacksaga_store.saga.definition import SagaPayload
from stacksaga_store.store.model import TransactionView
from stacksaga_store.store.states import (
    FINAL_STATUSES,
    PARKED_STATUSES,
    ExecutionType,
    TryoutStatus,
)

__all__ = ["saga_timeline"]

_COLOURS = {
    TryoutStatus.SUCCESS: "#2e7d32",
    TryoutStatus.ALREADY_COMMITTED: "#66bb6a",
    TryoutStatus.RETRYABLE_ERROR: "#f9a825",
    TryoutStatus.NON_RETRYABLE_ERROR: "#c62828",
    TryoutStatus.QUARANTINED: "#6a1b9a",
    TryoutStatus.RESTORED: "#1565c0",
}
WIDTH, LANE, TOP, LEFT = 900, 26, 30, 150


def saga_timeline(
    view: TransactionView,
    payload: SagaPayload | None,
    markers: Sequence[dict[str, Any]],
    *,
    windows: WindowMath,
    grace: timedelta,
    now: datetime,
) -> dict[str, Any]:
    created = view.record.created_at
    tryouts = []
    previous = created
    last_failed = max(
        (
            t.tryout_index
            for t in view.tryouts
            if t.status in (TryoutStatus.RETRYABLE_ERROR, TryoutStatus.NON_RETRYABLE_ERROR)
        ),
        default=None,
    )
    retries = []
    for t in view.tryouts:
        item: dict[str, Any] = {
            "index": t.tryout_index,
            "step": t.executor,
            "kind": t.execution_type.value,
            "outcome": t.status.value,
            "at": t.created_at.isoformat(),
            "duration_ms": round((t.created_at - previous).total_seconds() * 1000, 1),
            "error": payload.last_error if payload and t.tryout_index == last_failed else None,
            "compensation": t.execution_type is ExecutionType.COMPENSATE,
            "retry_window": None,
        }
        if t.status is TryoutStatus.RETRYABLE_ERROR:
            window = windows.shift(windows.window_at(t.created_at), 1)
            due = windows.start(window) + grace
            item["retry_window"] = {
                "date": window.date_of_year,
                "minute_of_day": windows.minute_of_day(window),
                "due_at": due.isoformat(),
            }
            retries.append({"tryout": t.tryout_index, "step": t.executor, **item["retry_window"]})
        tryouts.append(item)
        previous = t.created_at
    compensation = [t["step"] for t in tryouts if t["compensation"]]
    watchdog = None
    path = view.record.restore_path
    if path is not None:
        window = windows.from_key(path.date_of_year, path.window)
        fires = windows.start(window) + grace
        settled = view.status in FINAL_STATUSES or view.status in PARKED_STATUSES
        watchdog = {
            "date": path.date_of_year,
            "minute_of_day": path.window,
            "instance_id": path.instance_id,
            "bucket": path.bucket,
            "fires_at": fires.isoformat(),
            "fires_in_seconds": round((fires - now).total_seconds(), 1),
            "released": settled,
        }
    svg = _svg(view, tryouts, watchdog, retries, now)
    return {
        "tryouts": tryouts,
        "compensation_path": compensation,
        "retries": retries,
        "watchdog": watchdog,
        "timeline_svg": svg,
    }


def _svg(
    view: TransactionView,
    tryouts: Sequence[dict[str, Any]],
    watchdog: dict[str, Any] | None,
    retries: Sequence[dict[str, Any]],
    now: datetime,
) -> str:
    """Lanes per step (forward above, compensation in the same lane, hatched), time left to
    right from the creation to the last event (or the watchdog/retry due time, if sooner
    than an hour ahead)."""
    created = view.record.created_at
    times = [created, *(datetime.fromisoformat(t["at"]) for t in tryouts)]
    marks = [datetime.fromisoformat(r["due_at"]) for r in retries]
    if watchdog is not None and not watchdog["released"]:
        marks.append(datetime.fromisoformat(watchdog["fires_at"]))
    horizon = max([*times, *(m for m in marks if m - created <= timedelta(hours=1))])
    if view.status not in FINAL_STATUSES and view.status not in PARKED_STATUSES:
        horizon = max(horizon, min(now, created + timedelta(hours=1)))
    span = max((horizon - created).total_seconds(), 0.001)

    def x(instant: datetime) -> float:
        return LEFT + (instant - created).total_seconds() / span * (WIDTH - LEFT - 30)

    steps: list[str] = []
    for t in tryouts:
        if t["step"] not in steps:
            steps.append(t["step"])
    height = TOP + LANE * (len(steps) + 1) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="saga-timeline" data-testid="saga-timeline" '
        f'role="img" aria-label="timeline of saga {view.key.transaction_id}" '
        f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" class="timeline">',
        f'<text x="4" y="18" class="tl-title">created {escape(created.isoformat())} '
        f"&#8594; {escape(view.status.value)}</text>",
    ]
    axis_y = TOP + LANE * len(steps) + 10
    parts.append(
        f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - 30}" y2="{axis_y}" stroke="#888"/>'
        f'<text x="{LEFT}" y="{axis_y + 16}" class="tl-axis">0 s</text>'
        f'<text x="{WIDTH - 30}" y="{axis_y + 16}" text-anchor="end" class="tl-axis">'
        f"+{span:.1f} s</text>"
    )
    for lane, step in enumerate(steps):
        y = TOP + LANE * lane
        parts.append(
            f'<text x="4" y="{y + 16}" class="tl-lane">{escape(step)}</text>'
            f'<line x1="{LEFT}" y1="{y + LANE - 2}" x2="{WIDTH - 30}" y2="{y + LANE - 2}" '
            'stroke="#eee"/>'
        )
    previous = created
    for t in tryouts:
        at = datetime.fromisoformat(t["at"])
        lane = steps.index(t["step"])
        y = TOP + LANE * lane + 3
        x0, x1 = x(previous), x(at)
        colour = _COLOURS.get(TryoutStatus(t["outcome"]), "#555")
        dash = ' stroke-dasharray="3,2" stroke="#000"' if t["compensation"] else ""
        title = f"#{t['index']} {t['step']} {t['kind']} {t['outcome']} ({t['duration_ms']} ms)"
        if t["error"]:
            title += f": {t['error']}"
        parts.append(
            f'<g class="tl-tryout" data-testid="timeline-tryout-{t["index"]}">'
            f"<title>{escape(title)}</title>"
            f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 3):.1f}" height="{LANE - 8}" '
            f'fill="{colour}"{dash}/>'
            f'<circle cx="{x1:.1f}" cy="{y + (LANE - 8) / 2}" r="4" fill="{colour}"/></g>'
        )
        previous = at
    for r in retries:
        due = datetime.fromisoformat(r["due_at"])
        if due - created > timedelta(hours=1):
            continue
        xd = x(due)
        parts.append(
            f'<g class="tl-retry" data-testid="timeline-retry-{r["tryout"]}"><title>retry of '
            f"{escape(r['step'])} due {escape(r['due_at'])} (window {r['minute_of_day']})</title>"
            f'<line x1="{xd:.1f}" y1="{TOP - 6}" x2="{xd:.1f}" y2="{axis_y}" stroke="#f9a825" '
            'stroke-dasharray="4,3"/>'
            f'<text x="{xd + 3:.1f}" y="{TOP - 8}" class="tl-mark">retry</text></g>'
        )
    if watchdog is not None:
        fires = datetime.fromisoformat(watchdog["fires_at"])
        label = "watchdog (released)" if watchdog["released"] else "watchdog fires"
        if fires - created <= timedelta(hours=1):
            xw = x(fires)
            parts.append(
                f'<g class="tl-watchdog" data-testid="timeline-watchdog"><title>restore '
                f"watchdog {escape(watchdog['fires_at'])}</title>"
                f'<line x1="{xw:.1f}" y1="{TOP - 6}" x2="{xw:.1f}" y2="{axis_y}" stroke="#1565c0"/>'
                f'<text x="{xw - 3:.1f}" y="{axis_y + 30}" text-anchor="end" class="tl-mark">'
                f"{label}</text></g>"
            )
        else:
            parts.append(
                f'<g class="tl-watchdog" data-testid="timeline-watchdog">'
                f'<text x="{WIDTH - 30}" y="{axis_y + 30}" text-anchor="end" class="tl-mark">'
                f"{label} at {escape(watchdog['fires_at'])} &#8594;</text></g>"
            )
    parts.append("</svg>")
    return "".join(parts)
