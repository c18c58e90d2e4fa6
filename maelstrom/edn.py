"""A minimal EDN writer: enough for Jepsen's ``history.edn`` and ``results.edn``.

EDN (extensible data notation, https://github.com/edn-format/edn) is what Jepsen, Knossos
and Elle read. Only the subset they need is written: nil, booleans, integers, floats,
strings, keywords (:class:`Keyword`), vectors (lists and tuples), sets and maps. Map keys
that are Python strings become keywords where EDN allows it, so ``{"valid?": True}`` renders as
``{:valid? true}``, which is how Jepsen spells its results.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

_KEYWORD: Final = re.compile(r"^[A-Za-z*+!_?<>=/.\-][A-Za-z0-9*+!_?<>=/.\-#:']*$")


class Keyword(str):
    """An EDN keyword; ``Keyword("ok")`` renders as ``:ok``."""

    __slots__ = ()


def _string(text: str) -> str:
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    )
    return f'"{escaped}"'


def _keyword(name: str) -> str:
    if not _KEYWORD.match(name):
        raise ValueError(f"{name!r} cannot be an EDN keyword")
    return f":{name}"


def dumps(value: object) -> str:
    """``value`` as EDN text on one line; ValueError for values EDN cannot hold."""
    if value is None:
        return "nil"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, Keyword):
        return _keyword(str(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("EDN has no NaN or infinity")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            # Jepsen's maps have keyword keys; a string that cannot be one stays a string.
            keyword = isinstance(key, str) and _KEYWORD.match(key) is not None
            rendered = f":{key}" if keyword else dumps(key)
            items.append(f"{rendered} {dumps(item)}")
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + " ".join(dumps(v) for v in value) + "]"
    if isinstance(value, set | frozenset):
        return "#{" + " ".join(sorted(dumps(v) for v in value)) + "}"
    raise ValueError(f"no EDN form for {type(value).__name__}")


__all__ = ["Keyword", "dumps"]
