"""Profiles for the reports: sidecars' cProfile dumps merged, top entries as text lines."""

from __future__ import annotations

import io
import pstats
from collections.abc import Sequence
from pathlib import Path

PROFILE_ENTRIES = 25


def top_lines(
    stats: pstats.Stats, *, sort: str = "tottime", entries: int = PROFILE_ENTRIES
) -> list[str]:
    stream = io.StringIO()
    stats.stream = stream  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(entries)
    lines = [line.rstrip() for line in stream.getvalue().splitlines() if line.strip()]
    # Drop pstats' banner (file names, "Ordered by"); keep the totals line and the table.
    return [line for line in lines if not line.startswith(("Ordered by", "   List reduced"))]


def sidecar_profile(paths: Sequence[Path], *, entries: int = PROFILE_ENTRIES) -> list[str]:
    """The sidecars' profiles merged (all sidecars' time together), by own time."""
    present = [str(p) for p in paths if p.exists()]
    if not present:
        return ["(no profile was written: did the sidecars stop cleanly?)"]
    stats = pstats.Stats(present[0])
    for path in present[1:]:
        stats.add(path)
    header = f"sidecars {len(present)} merged, sorted by own time"
    # The sidecar runs uvloop, whose C event loop cProfile cannot see into: its time (mostly
    # waiting for I/O) lands on the Python frame that entered it.
    idle = (
        "note: server.py(stop) and lock acquire = time inside uvloop's C event loop and "
        "threads (mostly idle waits), not Python work"
    )
    return [header, idle, *top_lines(stats, entries=entries)]
