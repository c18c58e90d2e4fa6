"""The planted-bug switches: deliberately broken protocol variants that prove the burn test
and the scenarios have teeth.

They live beside the replica state that reads them, but they are not part of the public
:mod:`accord` API: the simulator re-exports them (``from accord.sim import Bugs``), and a
host that does not pass ``bugs=`` to :class:`accord.node.Node` runs the correct protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class Bugs:
    """Deliberately broken protocol variants, for proving the burn test has teeth.

    Never set outside tests: each one breaks strict serializability.
    """

    execute_without_waiting: bool = False
    fast_quorum_is_slow_quorum: bool = False
    deps_omit_uncommitted: bool = False
    recovery_ignores_earlier_accepted: bool = False
    forget_promise_on_restart: bool = False
    fast_vote_ignores_conflicts: bool = False
    witness_any_key: bool = False
    write_before_durable: bool = False
    # An applied replica acks any proposal, counting it toward a second outcome.
    applied_acks_any_proposal: bool = False
    # Batches take any waiting submissions, even parts that write a key another part
    # reads or writes (NodeConfig.batch_max_parts > 1 only).
    batch_ignores_disjointness: bool = False
    # Replies, and what a local reply causes, count as early too (Ready.early): votes that
    # leave before they are durable.
    early_votes: bool = False

    def any(self) -> bool:
        return any(getattr(self, bug.name) for bug in fields(self))


NO_BUGS = Bugs()
