"""Duration strings as Spring Boot and the DataStax driver config accept them.

Accepted forms (whitespace between number and unit is allowed, units are case-insensitive):

* ``500ms``, ``5s``, ``10m``, ``24h``, ``2d`` and also ``ns``/``us`` (Spring's short units);
* HOCON's long units: ``1 second``, ``60 seconds``, ``5 minutes``, ``2 hours``, ``1 day``,
  ``250 milliseconds`` (singular or plural);
* ISO-8601 ``PT5S``, ``PT1H30M``, ``P1D`` (Spring accepts these too);
* a bare number, which is milliseconds: Spring's and the DataStax driver's default unit.

Fractions are allowed (``1.5s``); negative durations are not.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_UNIT_SECONDS: dict[str, float] = {}
for _names, _seconds in (
    (("ns", "nanos", "nanosecond", "nanoseconds"), 1e-9),
    (("us", "micros", "microsecond", "microseconds"), 1e-6),
    (("ms", "millis", "milli", "millisecond", "milliseconds"), 1e-3),
    (("s", "second", "seconds"), 1.0),
    (("m", "minute", "minutes"), 60.0),
    (("h", "hour", "hours"), 3600.0),
    (("d", "day", "days"), 86400.0),
):
    for _name in _names:
        _UNIT_SECONDS[_name] = _seconds

_SIMPLE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_ISO = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$",
    re.IGNORECASE,
)


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """Parse one duration; raises ValueError with the accepted forms on anything else."""
    if isinstance(text, timedelta):
        return _non_negative(text, str(text))
    if isinstance(text, bool):
        # bool is an int subclass; `true` as a duration is a typo, not one millisecond.
        raise ValueError(f"expected a duration such as 5s or 24h, got {text!r}")
    if isinstance(text, int | float):
        return _non_negative(timedelta(milliseconds=text), repr(text))
    iso = _ISO.match(text.strip())
    if iso and any(iso.group(g) for g in "dhms"):
        parts = {g: float(iso.group(g) or 0) for g in "dhms"}
        return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    simple = _SIMPLE.match(text)
    if simple is None:
        raise ValueError(f"expected a duration such as 5s, 24h, 1 second or PT5S, got {text!r}")
    number, unit = float(simple.group(1)), simple.group(2).lower() or "ms"
    if unit not in _UNIT_SECONDS:
        known = "ns, us, ms, s, m, h, d (or second(s), minute(s), hour(s), day(s))"
        raise ValueError(f"unknown duration unit {simple.group(2)!r} in {text!r}; use {known}")
    return timedelta(seconds=number * _UNIT_SECONDS[unit])


def _non_negative(value: timedelta, shown: str) -> timedelta:
    if value < timedelta(0):
        raise ValueError(f"a duration cannot be negative, got {shown}")
    return value


def format_duration(value: timedelta) -> str:
    """The shortest exact spelling in the units above (``5s``, ``24h``, ``1500ms``)."""
    milliseconds = round(value.total_seconds() * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if milliseconds and milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"
