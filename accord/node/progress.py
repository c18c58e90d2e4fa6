"""The progress log of a :class:`~accord.node.Node`: it notices stalled transactions and
starts the coordinators that finish them (reference: Accord ``ProgressLog``).

:func:`scan_progress` runs every ``progress_scan_micros`` from :meth:`Node.tick`. The delays it
waits come from the node's :class:`~accord.local.recover_delay.RecoverDelay`; the jitter and
backoff it adds are drawn from the node's rng.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accord.invariants import check_not_none
from accord.local.command import Command
from accord.primitives import Status, TxnId

if TYPE_CHECKING:
    from accord.node import Node

__all__ = ["scan_progress"]

# Enum members looked up once: a class attribute costs more than the checks using them.
_STATUS_ACCEPTED_INVALIDATE = Status.ACCEPTED_INVALIDATE
_STATUS_PRE_APPLIED = Status.PRE_APPLIED


def _txn_id_of(command: Command) -> TxnId:
    return command.txn_id


def scan_progress(node: Node, now: int) -> None:
    """Recover transactions that made no progress for a while (reference: Accord
    ``ProgressLog``): home-shard replicas act first, others later, with backoff and
    jitter. A txn that another coordinator drives stays quiet here, since every message
    of that coordinator which changes the replica's record counts as progress.

    At most ``max_progress_coordinators`` run at once, oldest txn first, undecided txns
    before re-sending decided outcomes; what does not fit waits for a later scan, so a
    restart or a burst cannot start a storm. A txn stable here that waits for its deps
    is left to them: they are what must progress first.
    """
    config = node.config
    budget = config.max_progress_coordinators - len(node._progress_cids)
    if budget <= 0:
        node.stats.progress_deferred += 1
        return
    recover_delay = node.recover_delay
    learned_home = recover_delay.home()
    learned_other = recover_delay.other()
    unreachable = node.unreachable
    for command in sorted(node.store.active(), key=_txn_id_of):
        if command.txn_id in node._coordinating:
            continue
        if command.waiting_on:
            # Decided here and executing once its deps are applied: recovering it again
            # cannot help before they are, and it held a slot the deps needed. A txn
            # waits for deps with a lower executeAt, which may have later txn ids: under
            # a burst the oldest waiting txns filled every slot while the ACCEPTED txn
            # they waited for was never recovered. The deps are active (or chased by key)
            # and are taken up here themselves.
            continue
        if command.txn_id.node in unreachable:
            # Its coordinator (and, under shared storage, its writer) cannot be reached:
            # the floors, not what live coordinators' latencies taught; and a chosen
            # outcome is written here after the home floor, as nobody else will sooner.
            delay_home = recover_delay.floor_micros
            delay_other = recover_delay.floor_other_micros
            delay_take_over = delay_home
        else:
            delay_home = learned_home
            delay_other = delay_take_over = learned_other
        home = command.route is not None and node.store.owns(command.route.home_key)
        if command.status is _STATUS_PRE_APPLIED and command.chosen:
            # Chosen and executable, so only the shared store's writer is awaited. Its
            # write may just be slow: taking over early costs a second write (a quick
            # bench run at load 20 took 1.23 writes per row with recover_delay_micros).
            if now - command.last_progress_micros >= delay_take_over:
                node.store.take_over(command.txn_id)
            continue
        delay = delay_home if home else delay_other
        delay = min(delay << min(command.recovery_attempts, 6), config.recover_backoff_max_micros)
        delay += node.rng.randrange(max(1, delay // 2))
        if now - command.last_progress_micros < delay:
            continue
        recover = command.txn is not None and command.route is not None
        hint = command.key_hint
        # Without the txn, chase it only through a key: when something here waits on
        # it, or when this replica holds an invalidation proposal for it.
        chase = node.store.is_blocking(command.txn_id) or (
            command.status is _STATUS_ACCEPTED_INVALIDATE
        )
        if not recover and (hint is None or not chase):
            continue
        command.recovery_attempts += 1
        command.last_progress_micros = now
        coordinator = node._new_coordinator(
            command.txn_id,
            command.txn if recover else None,
            command.route if recover else None,
            node.new_ballot(),
        )
        node._progress_cids.add(coordinator.cid)
        if recover:
            node.stats.recoveries += 1
            if node.store.shared_storage:
                # The writer is most likely the silent coordinator itself (a replica
                # coordinator writes its own txns): waiting for it cost a second delay,
                # and every txn on the same keys waited behind it.
                node.store.write_when_chosen(command.txn_id)
            coordinator.start_recovery()
        else:
            coordinator.start_invalidation(
                check_not_none(hint, "invalidation of %s without a key", command.txn_id)
            )
        budget -= 1
        if budget <= 0:
            node.stats.progress_deferred += 1
            return
    for command in sorted(node.store.undurable(), key=_txn_id_of):
        if command.txn_id in node._coordinating:
            continue
        delay = min(
            learned_home << min(command.recovery_attempts, 6), config.recover_backoff_max_micros
        )
        if now - command.last_progress_micros < delay + node.rng.randrange(max(1, delay // 2)):
            continue
        txn_id = command.txn_id
        execute_at = check_not_none(command.execute_at, "applied %s lacks executeAt", txn_id)
        writes = check_not_none(command.writes, "applied %s lacks writes", txn_id)
        result = check_not_none(command.result, "applied %s lacks a result", txn_id)
        command.recovery_attempts += 1
        command.last_progress_micros = now
        coordinator = node._new_coordinator(txn_id, command.txn, command.route)
        node._progress_cids.add(coordinator.cid)
        # Applied here, so chosen: re-sent as such, whatever the others promised.
        coordinator.start_persist(
            execute_at, command.deps, writes, result, ballot=command.accepted, chosen=True
        )
        budget -= 1
        if budget <= 0:
            node.stats.progress_deferred += 1
            return
