"""Pure quorum counters, kept apart from the coordinators that send messages.

A node that replicates several shards of a transaction answers once for all of them, so
every response counts in each shard the node belongs to.
"""

from __future__ import annotations

import enum

from accord.topology import Shard


class Progress(enum.Enum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILED = "failed"


_FAILED = Progress.FAILED
_PENDING = Progress.PENDING
_SUCCESS = Progress.SUCCESS


class QuorumTracker:
    """A simple (slow) quorum in every shard."""

    __slots__ = ("failures", "shards", "successes")

    def __init__(self, shards: tuple[Shard, ...]) -> None:
        self.shards = shards
        self.successes: list[set[int]] = [set() for _ in shards]
        self.failures: list[set[int]] = [set() for _ in shards]

    def _each(self, node: int) -> list[int]:
        return [i for i, shard in enumerate(self.shards) if node in shard.replicas]

    def success(self, node: int) -> Progress:
        successes, failures = self.successes, self.failures
        for i, shard in enumerate(self.shards):
            if node in shard.replicas:
                successes[i].add(node)
                failures[i].discard(node)
        return self.progress()

    def failure(self, node: int) -> Progress:
        for i in self._each(node):
            if node not in self.successes[i]:
                self.failures[i].add(node)
        return self.progress()

    def progress(self) -> Progress:
        # Loops rather than all()/any() over generators: this runs for every reply.
        shards = self.shards
        successes = self.successes
        for i in range(len(shards)):
            if len(successes[i]) < shards[i].slow_quorum:
                break
        else:
            return _SUCCESS
        failures = self.failures
        for i in range(len(shards)):
            shard = shards[i]
            if len(failures[i]) > len(shard.replicas) - shard.slow_quorum:
                return _FAILED
        return _PENDING

    def responded(self) -> set[int]:
        return set().union(*self.successes, *self.failures)

    def shard_successes(self, index: int) -> set[int]:
        return self.successes[index]


class FastPathTracker(QuorumTracker):
    """Fast votes (witnessedAt == txnId) among each shard's electorate.

    The fast path succeeds with ``fast_quorum`` votes in every shard and is impossible once
    ``fast_reject`` electorate members of some shard voted against it or failed
    (reference: Accord ``FastPathTracker``; accord.md pitfall 3).
    """

    __slots__ = ("fast_rejects", "fast_votes", "slow_quorum_suffices")

    def __init__(self, shards: tuple[Shard, ...], *, slow_quorum_suffices: bool = False) -> None:
        super().__init__(shards)
        # Only for the burn test's deliberately broken variant (pitfall 3: wrong fq).
        self.slow_quorum_suffices = slow_quorum_suffices
        self.fast_votes: list[set[int]] = [set() for _ in shards]
        self.fast_rejects: list[set[int]] = [set() for _ in shards]

    def vote(self, node: int, *, fast: bool) -> Progress:
        for i in self._each(node):
            if node in self.shards[i].electorate:
                # A real answer supersedes a timeout counted against the fast path.
                (self.fast_votes if fast else self.fast_rejects)[i].add(node)
                if fast:
                    self.fast_rejects[i].discard(node)
        return self.success(node)

    def failure(self, node: int) -> Progress:
        for i in self._each(node):
            if node in self.shards[i].electorate and node not in self.fast_votes[i]:
                self.fast_rejects[i].add(node)
        return super().failure(node)

    def fast_path_succeeded(self) -> bool:
        return all(
            len(votes) >= (shard.slow_quorum if self.slow_quorum_suffices else shard.fast_quorum)
            for votes, shard in zip(self.fast_votes, self.shards, strict=True)
        )

    def fast_path_impossible(self) -> bool:
        return any(
            len(rejects) >= shard.fast_reject
            for rejects, shard in zip(self.fast_rejects, self.shards, strict=True)
        )

    def fast_voters(self) -> set[int]:
        return set().union(*self.fast_votes)


class AllTracker:
    """Every replica of every shard (used to learn that an outcome is durable everywhere)."""

    __slots__ = ("pending",)

    def __init__(self, nodes: tuple[int, ...]) -> None:
        self.pending = set(nodes)

    def success(self, node: int) -> bool:
        self.pending.discard(node)
        return not self.pending
