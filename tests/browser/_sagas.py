"""Saga definitions for the console subprocess (``--sagas tests.browser._sagas:sagas``): the
console's sample ``order`` saga with refunds working again, so an admin restore of a saga the
test process froze finishes its compensation inside the console."""

from __future__ import annotations

from stacksaga_store.console.sample import SampleWorld, sample_saga
from stacksaga_store.saga.definition import Saga


def sagas() -> list[Saga]:
    return [sample_saga(SampleWorld(refunds_fixed=True))]
