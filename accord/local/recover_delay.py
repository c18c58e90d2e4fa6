"""How long a replica lets a transaction sit idle before it recovers it.

A fixed delay is wrong in both directions: under load a healthy transaction can take
longer than it between PreAccept and Apply, so replicas recover live transactions (a
saturated 3-sidecar run recovered 42 of 444 with 1 s), which costs CPU and contends for
the ballot with the coordinator still driving them; a delay long enough for that load
makes recovery after a real coordinator crash slow when the cluster is idle.

:class:`RecoverDelay` learns the delay from what this replica sees. It notes when a
PreAccept first reaches it and, when the transaction applies here with the outcome of its
original coordinator (accepted at ``BALLOT_ZERO``: no recovery proposed or delivered it),
records how long that took. The delay is then

    learned = min(max_micros, factor * (the percentile-th latency of the last window))
    home    = max(recover_delay_micros, learned)
    other   = max(recover_delay_other_micros, learned + recover_delay_other_micros
                                              - recover_delay_micros)

so it never drops below the configured floors, never exceeds the cap, and replicas of other
shards keep their lead time behind the home shard. Latencies of recovered transactions are
left out: they include the delay itself, and counting them would ratchet it up after every
crash. A healthy transaction that a recovery merely raced (promised a ballot, yet decided
and delivered by its coordinator) still counts: those are the slow ones to learn from.
Jitter and backoff stay with the caller (``accord.node.progress.scan_progress``), drawn
from the node's seeded rng, so a simulation stays deterministic.

Everything here is bounded: ``window`` samples, ``max_tracked`` transactions in flight
(the oldest forgotten first, so a txn that never applies here cannot grow it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Collection

from accord.invariants import check_argument
from accord.primitives import TxnId

MAX_TRACKED = 65_536


def learned_delay(
    latencies: Collection[int], *, factor: float, percentile: float, max_micros: int
) -> int:
    """``min(max_micros, factor * percentile-th of latencies)``; 0 without samples.

    The percentile is the nearest rank: the smallest sample with at least ``percentile``
    percent of the samples at or below it.
    """
    if not latencies:
        return 0
    count = len(latencies)
    index = min(count - 1, max(0, math.ceil(count * percentile / 100) - 1))
    above = count - index  # the sample wanted is the smallest of the largest `above`
    if above <= 16:
        # A high percentile of a full window: a partial selection, not a sort, since a
        # replica asks at every progress scan once a new sample came.
        sample = heapq.nlargest(above, latencies)[-1]
    else:
        sample = sorted(latencies)[index]
    return min(max_micros, int(factor * sample))


class RecoverDelay:
    """The recovery delays of one replica (see the module docstring)."""

    __slots__ = (
        "_dirty",
        "_learned",
        "_samples",
        "_witnessed",
        "adaptive",
        "factor",
        "floor_micros",
        "floor_other_micros",
        "max_micros",
        "max_tracked",
        "percentile",
    )

    def __init__(
        self,
        *,
        floor_micros: int,
        floor_other_micros: int,
        adaptive: bool,
        factor: float,
        percentile: float,
        max_micros: int,
        window: int,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        check_argument(floor_micros >= 0, "recover delay floor must not be negative")
        check_argument(factor >= 1, "recover delay latency factor must be at least 1")
        check_argument(0 < percentile <= 100, "recover delay percentile must be in (0, 100]")
        check_argument(
            max_micros >= floor_micros,
            "recover_delay_max_micros (%d) must be at least recover_delay_micros (%d)",
            max_micros,
            floor_micros,
        )
        check_argument(window >= 1, "recover delay window must be at least 1")
        check_argument(max_tracked >= 1, "max_tracked must be at least 1")
        self.floor_micros = floor_micros
        self.floor_other_micros = floor_other_micros
        self.adaptive = adaptive
        self.factor = factor
        self.percentile = percentile
        self.max_micros = max_micros
        self.max_tracked = max_tracked
        self._witnessed: dict[TxnId, int] = {}
        self._samples: deque[int] = deque(maxlen=window)
        self._learned = 0
        self._dirty = False

    def witnessed(self, txn_id: TxnId, now: int) -> None:
        """A PreAccept of ``txn_id`` reached this replica at ``now`` (the first one counts)."""
        if not self.adaptive or txn_id in self._witnessed:
            return
        witnessed = self._witnessed
        if len(witnessed) >= self.max_tracked:
            del witnessed[next(iter(witnessed))]
        witnessed[txn_id] = now

    def applied(self, txn_id: TxnId, now: int, *, recovered: bool) -> None:
        """``txn_id`` applied here at ``now``; ``recovered``: a recovery decided or delivered it."""
        start = self._witnessed.pop(txn_id, None)
        if start is None or recovered:
            return
        self._samples.append(max(0, now - start))
        self._dirty = True

    def learned(self) -> int:
        """The delay learned from latencies alone (0 when fixed or before any sample)."""
        if self._dirty:
            self._dirty = False
            self._learned = learned_delay(
                self._samples,
                factor=self.factor,
                percentile=self.percentile,
                max_micros=self.max_micros,
            )
        return self._learned

    def home(self) -> int:
        """Idle time after which a replica of the txn's home shard recovers it."""
        return max(self.floor_micros, self.learned())

    def other(self) -> int:
        """Idle time after which a replica of another shard recovers it."""
        learned = self.learned()
        lead = max(0, self.floor_other_micros - self.floor_micros)
        return max(self.floor_other_micros, learned + lead if learned else 0)

    def sample_count(self) -> int:
        return len(self._samples)
