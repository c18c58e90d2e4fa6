"""The live counters' arithmetic: what a pair of censuses counts as starts, completions,
retries, restores and freezes (no Cassandra: the scan is replaced by given rows)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from stacksaga_store.console.census import Census, CensusRow, SagaCensus
from stacksaga_store.store.states import RunningStatus as S

T0 = datetime(2031, 1, 1, tzinfo=UTC)


def _census(at: int, rows: dict[uuid.UUID, tuple[S, int]], partial: bool = False) -> Census:
    return Census(
        T0 + timedelta(seconds=at),
        {
            ("svc", tid): CensusRow("svc", tid, status, T0, T0 + timedelta(seconds=updated))
            for tid, (status, updated) in rows.items()
        },
        partial,
        len(rows),
    )


def _feed(*censuses: Census) -> SagaCensus:
    census = SagaCensus(cql=None, keyspace="ks", region="r", cluster="c")  # type: ignore[arg-type]
    for one in censuses:
        census._record(one)
        census.current = one
    return census


def test_transitions_between_censuses_are_counted_once() -> None:
    a, b, c, d, e = (uuid.uuid4() for _ in range(5))
    first = _census(0, {a: (S.IN_PROGRESS, 0), b: (S.COMPENSATING, 0), c: (S.FROZEN, 0)})
    second = _census(
        2,
        {
            a: (S.FAILED_WITH_RETRYABLE_ERROR, 1),  # a retry
            b: (S.FROZEN, 1),  # a freeze
            c: (S.COMPENSATING, 1),  # an admin restore
            d: (S.PROCESS_COMPLETED, 1),  # started and finished in between
            e: (S.STARTED, 1),  # a start
        },
    )
    third = _census(
        4,
        {
            a: (S.FAILED_WITH_RETRYABLE_ERROR, 3),  # retried again, failed again
            b: (S.FROZEN, 1),
            c: (S.REVERT_COMPLETED, 3),
            d: (S.PROCESS_COMPLETED, 1),
            e: (S.STARTED, 1),
        },
    )
    census = _feed(first, second, third)
    assert census.totals == {
        "starts": 2,
        "completions": 2,
        "retries": 2,
        "restores": 1,
        "freezes": 1,
    }
    last = census.samples[-1]
    assert (last.starts, last.completions, last.retries, last.frozen_now) == (0, 1, 1, 1)
    assert last.seconds == 2.0 and last.starts_per_second == 0.0
    assert census.samples[0].starts_per_second == 1.0


def test_rows_beyond_a_partial_census_are_not_starts() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    census = _feed(
        _census(0, {a: (S.STARTED, 0)}, partial=True),
        _census(1, {a: (S.STARTED, 0), b: (S.STARTED, 0)}),
    )
    assert census.totals["starts"] == 0
