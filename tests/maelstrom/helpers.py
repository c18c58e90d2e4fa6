"""Shared test helpers: a hand-driven in-process cluster and a history builder.

:class:`LocalCluster` wires :class:`maelstrom.node.MaelstromNode` objects together with a
synchronous, loss-free router and a manual clock, so protocol tests run in milliseconds and
deterministically. :class:`HistoryBuilder` writes Jepsen events by hand for checker tests.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from maelstrom.history import Event, EventType
from maelstrom.node import MaelstromNode, NodeOptions
from tests.clocks import ManualClock


class LocalCluster:
    """Nodes ``n0..`` routed synchronously; replies to clients are collected per client."""

    def __init__(self, count: int = 3, options: NodeOptions | None = None) -> None:
        self.clock = ManualClock()
        self.names = [f"n{i}" for i in range(count)]
        self.nodes = {
            n: MaelstromNode(options or NodeOptions(), clock=self.clock) for n in self.names
        }
        self.client_inbox: dict[str, list[dict[str, Any]]] = {}
        self._msg_id = 0
        for name in self.names:
            body = {"type": "init", "msg_id": 1, "node_id": name, "node_ids": self.names}
            reply = self.request(name, body, client="c0")
            assert reply["type"] == "init_ok", reply

    def _route(self, lines: list[str]) -> None:
        queue = deque(lines)
        while queue:
            packet = json.loads(queue.popleft())
            dest = packet["dest"]
            if dest in self.nodes:
                node = self.nodes[dest]
                node.handle_line(json.dumps(packet))
                queue.extend(node.take_output())
            else:
                self.client_inbox.setdefault(dest, []).append(packet["body"])

    def send_line(self, node: str, line: str | bytes) -> None:
        self.nodes[node].handle_line(line)
        self._route(self.nodes[node].take_output())

    def request(
        self, node: str, body: dict[str, Any], *, client: str = "c1", ticks: int = 50
    ) -> dict[str, Any]:
        """Send ``body`` (a msg_id is added unless present) and run until it is answered."""
        if "msg_id" not in body:
            self._msg_id += 1
            body = {**body, "msg_id": self._msg_id}
        before = len(self.client_inbox.get(client, []))
        self.send_line(node, json.dumps({"src": client, "dest": node, "body": body}))
        for _ in range(ticks):
            replies = self.client_inbox.get(client, [])
            if len(replies) > before:
                return replies[before]
            self.tick()
        raise AssertionError(f"no reply to {body} within {ticks} ticks")

    def tick(self, micros: int = 10_000) -> None:
        self.clock.micros += micros
        for name in self.names:
            self.nodes[name].tick()
            self._route(self.nodes[name].take_output())


class HistoryBuilder:
    """Jepsen events written by hand; times are plain integers (ns)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def _add(
        self, kind: EventType, process: int, f: str, value: Any, time: int, error: Any = None
    ) -> HistoryBuilder:
        self.events.append(Event(len(self.events), kind, f, value, time, process, error))
        return self

    def invoke(self, process: int, f: str, value: Any, time: int) -> HistoryBuilder:
        return self._add("invoke", process, f, value, time)

    def ok(self, process: int, f: str, value: Any, time: int) -> HistoryBuilder:
        return self._add("ok", process, f, value, time)

    def fail(self, process: int, f: str, value: Any, time: int) -> HistoryBuilder:
        return self._add("fail", process, f, value, time, ("precondition-failed", "test"))

    def info(self, process: int, f: str, value: Any, time: int) -> HistoryBuilder:
        return self._add("info", process, f, value, time, ("timeout", "test"))

    def op(
        self,
        process: int,
        f: str,
        invoked: Any,
        completed: Any,
        start: int,
        end: int,
        status: EventType = "ok",
    ) -> HistoryBuilder:
        """An invocation at ``start`` and its completion at ``end`` (events kept in time
        order by the caller, or sorted with :meth:`sorted`)."""
        self.invoke(process, f, invoked, start)
        return self._add(status, process, f, completed if status == "ok" else invoked, end)

    def txn(
        self,
        process: int,
        mops: list[list[Any]],
        start: int,
        end: int,
        status: EventType = "ok",
    ) -> HistoryBuilder:
        """A txn whose completed micro-ops are ``mops``; the invocation has null reads."""
        invoked = [[f, k, None if f == "r" else v] for f, k, v in mops]
        return self.op(process, "txn", invoked, mops, start, end, status)

    def sorted(self) -> list[Event]:
        """Events in time order (invocations before completions at equal times), with
        indexes renumbered, as a real history would hold them."""
        order = sorted(self.events, key=lambda e: (e.time, e.type != "invoke", e.index))
        return [
            Event(i, e.type, e.f, e.value, e.time, e.process, e.error) for i, e in enumerate(order)
        ]
