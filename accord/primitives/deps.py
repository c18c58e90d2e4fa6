"""Dependencies: for each key, the conflicting transactions a transaction must respect.

Deps are kept per key because a replica only waits on dependencies through keys it owns:
a dependency that conflicts on a key of another shard is never delivered to this replica,
and waiting on it would block forever.

Deps form a join-semilattice under :meth:`Deps.merge` (per-key set union): merge is
associative, commutative and idempotent, which is what lets coordinators combine replies
in any order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import lt as _lt

from accord.primitives.keys import Key
from accord.primitives.timestamp import TxnId


class Deps:
    """An immutable mapping Key -> sorted tuple of TxnIds. Empty keys are not stored."""

    __slots__ = ("_by_key",)

    _by_key: dict[Key, tuple[TxnId, ...]]

    def __init__(self, by_key: Mapping[Key, Iterable[TxnId]] | None = None) -> None:
        normalised: dict[Key, tuple[TxnId, ...]] = {}
        if by_key:
            for key in sorted(by_key):
                ids = tuple(sorted(set(by_key[key])))
                if ids:
                    normalised[key] = ids
        self._by_key = normalised

    @staticmethod
    def _trusted(by_key: dict[Key, tuple[TxnId, ...]]) -> Deps:
        # Callers guarantee sorted keys, sorted unique ids and no empty entries.
        deps = Deps.__new__(Deps)
        deps._by_key = by_key
        return deps

    @staticmethod
    def of(by_key: dict[Key, tuple[TxnId, ...]]) -> Deps:
        """``Deps(by_key)``, without re-sorting when ``by_key`` is already normal (keys and
        each key's ids strictly increasing, no empty entry), as every decoded Deps is."""
        keys = tuple(by_key)
        if all(map(_lt, keys, keys[1:])):
            for ids in by_key.values():
                if not ids or not all(map(_lt, ids, ids[1:])):
                    return Deps(by_key)
            return Deps._trusted(by_key)
        return Deps(by_key)

    def keys(self) -> tuple[Key, ...]:
        return tuple(self._by_key)

    def for_key(self, key: Key) -> tuple[TxnId, ...]:
        return self._by_key.get(key, ())

    def items(self) -> Iterator[tuple[Key, tuple[TxnId, ...]]]:
        return iter(self._by_key.items())

    def txn_ids(self) -> tuple[TxnId, ...]:
        ids: set[TxnId] = set()
        for deps in self._by_key.values():
            ids.update(deps)
        return tuple(sorted(ids))

    def is_empty(self) -> bool:
        return not self._by_key

    def contains(self, txn_id: TxnId) -> bool:
        return any(txn_id in ids for ids in self._by_key.values())

    def merge(self, *others: Deps) -> Deps:
        """Per-key union with every other Deps."""
        parts = [self, *others]
        parts = [p for p in parts if p._by_key]
        if not parts:
            return EMPTY_DEPS
        if len(parts) == 1:
            return parts[0]
        union: dict[Key, set[TxnId]] = {}
        for part in parts:
            for key, ids in part._by_key.items():
                union.setdefault(key, set()).update(ids)
        return Deps._trusted({k: tuple(sorted(union[k])) for k in sorted(union)})

    def filter(self, keep: Callable[[Key, TxnId], bool]) -> Deps:
        kept: dict[Key, tuple[TxnId, ...]] = {}
        for key, ids in self._by_key.items():
            chosen = tuple(t for t in ids if keep(key, t))
            if chosen:
                kept[key] = chosen
        return Deps._trusted(kept)

    def slice(self, keys: Iterable[Key]) -> Deps:
        wanted = set(keys)
        return Deps._trusted({k: v for k, v in self._by_key.items() if k in wanted})

    def max_txn_id(self) -> TxnId | None:
        tops = [ids[-1] for ids in self._by_key.values()]
        return max(tops) if tops else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deps) and self._by_key == other._by_key

    def __hash__(self) -> int:
        return hash(tuple(self._by_key.items()))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: [{', '.join(map(str, v))}]" for k, v in self._by_key.items())
        return f"Deps({{{inner}}})"


EMPTY_DEPS = Deps()
