"""The in-memory journal shared by the simulator and the Maelstrom node.

It keeps what restores a node, not every record: the latest snapshot of each command (as
Accord's command store keeps every command record, memory grows with the length of a run),
the highest HLC floor, and every transaction learned durable. In the simulator it stands in
for the disk and outlives the node's crashes; Maelstrom never restarts a node, so there it
only has to outlive every message the node sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from accord.api import Durable, HlcFloor, Journal, JournalRecord
from accord.invariants import fail
from accord.local.command import CommandSnapshot
from accord.primitives import TxnId


class MemoryJournal:
    """:class:`accord.api.Journal` in memory: durable as soon as ``append`` returns."""

    __slots__ = ("_closed", "_commands", "_durable", "_hlc_floor")

    def __init__(self) -> None:
        self._commands: dict[TxnId, CommandSnapshot] = {}
        self._hlc_floor = 0
        self._durable: dict[TxnId, None] = {}
        self._closed = False

    def append(self, records: Sequence[JournalRecord]) -> None:
        if self._closed:
            fail("append to a closed journal")
        commands = self._commands
        for record in records:
            if type(record) is CommandSnapshot or isinstance(record, CommandSnapshot):
                # The exact type first: nearly every record is one.
                commands[record.txn_id] = record
            elif isinstance(record, HlcFloor):
                self._hlc_floor = max(self._hlc_floor, record.value)
            else:
                self._durable.update(dict.fromkeys(record.txn_ids))

    def replay(self) -> list[JournalRecord]:
        return [
            HlcFloor(self._hlc_floor),
            *self._commands.values(),
            Durable(tuple(self._durable)),
        ]

    def close(self) -> None:
        self._closed = True

    def snapshot(self, txn_id: TxnId) -> CommandSnapshot | None:
        """The latest journaled state of ``txn_id`` (what a restart would restore)."""
        return self._commands.get(txn_id)

    def __len__(self) -> int:
        """Commands journaled."""
        return len(self._commands)


# mypy checks the class against the Protocol the hosts are typed with.
_JOURNAL: type[Journal] = MemoryJournal

__all__ = ["MemoryJournal"]
