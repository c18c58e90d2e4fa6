"""Per-transaction stage timestamps of a sidecar, for splitting a latency into its stages.

``install(directory)`` patches the host, the journal and the peer router of this process so
that each event of a transaction (a peer message in or out, a journal append started and
made durable, a data read or write, the client answered) is noted with
``time.monotonic()``, which on Linux is one clock for every process of the machine: the
traces of all sidecars merge into one timeline per transaction. The events are written to
``directory/trace-<node>-<pid>.jsonl`` when the process exits. ``python -m bench.stage_trace
DIR`` merges them and prints, per stage, the median and p90 offset from the client's
submit at its coordinator.

A bench tool, off unless the sidecar wrapper is given ``--trace-dir``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def install(directory: str) -> None:
    from accord.api import CommandSnapshot
    from accord_cassandra import host as host_module
    from accord_cassandra import journal as journal_module
    from accord_cassandra import transport

    events: list[tuple[str, str, float]] = []
    node_of: dict[str, int] = {}
    now = time.monotonic

    def note(txn_id: object, what: str, at: float | None = None) -> None:
        events.append((str(txn_id), what, now() if at is None else at))

    def note_message(envelope: Any, direction: str, peer: str) -> None:
        txn_id = getattr(envelope.body, "txn_id", None)
        if txn_id is not None:
            note(txn_id, f"{direction} {type(envelope.body).__name__} {peer}")

    Host = host_module.SidecarHost
    deliver = Host.deliver
    answer = Host._answer
    run_data = Host._run_data

    def traced_deliver(self: Any, envelope: Any) -> None:
        note_message(envelope, "in", f"from {envelope.src}")
        deliver(self, envelope)

    def traced_answer(self: Any, reply: Any) -> None:
        entry = self._clients.get(reply.request_id)
        node_of["node"] = self.node.node_id
        if entry is not None:
            started = entry[1]
            # perf_counter and monotonic are both CLOCK_MONOTONIC on Linux.
            note(reply.txn_id, "client submitted", started)
            note(reply.txn_id, f"client answered {reply.outcome}")
        answer(self, reply)

    async def traced_run_data(self: Any, previous: Any, op: Any) -> None:
        kind = type(op).__name__
        note(op.txn_id, f"{kind} scheduled ({len(previous)} before it)")
        try:
            await run_data(self, previous, op)
        finally:
            note(op.txn_id, f"{kind} done")

    Host.deliver = traced_deliver  # type: ignore[method-assign]
    Host._answer = traced_answer  # type: ignore[method-assign]
    Host._run_data = traced_run_data  # type: ignore[method-assign]

    Journal = journal_module.FileJournal
    append = Journal.append

    async def traced_append(self: Any, records: Sequence[Any]) -> None:
        named = [(r.txn_id, r.status.name) for r in records if isinstance(r, CommandSnapshot)]
        size = len(records)
        for txn_id, status in named:
            note(txn_id, f"journal {status} queued (batch of {size})")
        await append(self, records)
        for txn_id, status in named:
            note(txn_id, f"journal {status} durable")

    Journal.append = traced_append  # type: ignore[method-assign]

    Peers = transport.Peers
    send = Peers.send

    def traced_send(self: Any, envelope: Any) -> None:
        note_message(envelope, "out", f"to {envelope.dest}")
        send(self, envelope)

    Peers.send = traced_send  # type: ignore[method-assign]

    from accord_cassandra import cql_requests, datastore

    async def traced_execute(
        session: Any,
        statement: Any,
        values: Sequence[object] | None,
        now_in_seconds: int | None = None,
        warned: Any = None,
    ) -> list[Any]:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        sent = now()
        query = getattr(statement, "query_string", None)
        tag = f"cql {query.split()[0] if query else 'BATCH'}"

        def done(rows: Any) -> None:
            called = now()
            loop.call_soon_threadsafe(settle, list(rows or []), None, called)

        def failed(error: BaseException) -> None:
            loop.call_soon_threadsafe(settle, None, error, now())

        def settle(rows: Any, error: BaseException | None, called: float) -> None:
            events.append((tag, "callback", called - sent))
            events.append((tag, "settled", now() - sent))
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(rows or [])

        response = session.execute_async(
            statement,
            None if values is None else list(values),
            custom_payload=cql_requests.now_payload(now_in_seconds),
            timeout=cql_requests.REQUEST_TIMEOUT_SECONDS,
        )
        events.append((tag, "execute_async returned", now() - sent))
        response.add_callbacks(done, failed)
        return await future

    datastore.execute = traced_execute  # type: ignore[attr-defined]

    def dump() -> None:
        node = node_of.get("node", 0)
        path = Path(directory) / f"trace-{node}-{os.getpid()}.jsonl"
        with open(path, "w") as out:
            for txn_id, what, at in events:
                out.write(json.dumps([txn_id, what, at]) + "\n")

    atexit.register(dump)


def _load(
    directory: Path,
) -> tuple[dict[str, dict[str, dict[str, float]]], list[tuple[str, float]]]:
    """Per transaction, per node, the first time of each event (its detail in brackets
    dropped); and the driver call spans."""
    events: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    spans: list[tuple[str, float]] = []
    for path in sorted(directory.glob("trace-*.jsonl")):
        node = path.name.split("-")[1]
        for line in path.read_text().splitlines():
            txn_id, what, at = json.loads(line)
            if txn_id.startswith("cql "):
                spans.append((f"{txn_id} {what}", 1000 * at))
                continue
            what = re.sub(r" \(.*\)", "", what)
            events[txn_id][node].setdefault(what, at)
    return events, spans


def _first(events: dict[str, float], prefix: str) -> float | None:
    found = [at for what, at in events.items() if what.startswith(prefix)]
    return min(found) if found else None


def report(directory: Path, skip_seconds: float = 0.0) -> list[str]:
    """Median, p90 and mean of each stage (ms) over the transactions answered after the
    first ``skip_seconds`` of the trace (the preload and warm-up). C is the coordinator,
    R each other replica (one sample per replica)."""
    events, spans = _load(directory)
    starts = [
        e["client submitted"]
        for t in events.values()
        for e in t.values()
        if "client submitted" in e
    ]
    if not starts:
        return ["no answered transactions traced"]
    first = min(starts) + skip_seconds
    stages: dict[str, list[float]] = defaultdict(list)

    def add(name: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None:
            stages[name].append(1000 * (end - start))

    for nodes in events.values():
        coordinator = next((n for n, e in nodes.items() if "client submitted" in e), None)
        if coordinator is None or nodes[coordinator]["client submitted"] < first:
            continue
        c = nodes[coordinator]
        submitted = c["client submitted"]
        preaccept = _first(c, "out PreAccept ")
        commit = _first(c, "out Commit ")
        apply = _first(c, "out Apply ")
        applied_ok = _first(c, "in ApplyOk ")
        add("01 C submit -> PreAccept out", submitted, preaccept)
        oks = []
        for node, r in nodes.items():
            if node == coordinator:
                continue
            got = r.get(f"in PreAccept from {coordinator}")
            add("02 R PreAccept hop", c.get(f"out PreAccept to {node}"), got)
            add("03 R PreAccept in -> journal queued", got, r.get("journal PRE_ACCEPTED queued"))
            add(
                "04 R journal PRE_ACCEPTED",
                r.get("journal PRE_ACCEPTED queued"),
                r.get("journal PRE_ACCEPTED durable"),
            )
            add(
                "05 R PreAcceptOk hop",
                r.get(f"out PreAcceptOk to {coordinator}"),
                c.get(f"in PreAcceptOk from {node}"),
            )
            if (ok := c.get(f"in PreAcceptOk from {node}")) is not None:
                oks.append(ok)
            add(
                "10 R Apply in -> journal queued",
                r.get(f"in Apply from {coordinator}"),
                r.get("journal PRE_APPLIED queued"),
            )
            add(
                "11 R journal PRE_APPLIED",
                r.get("journal PRE_APPLIED queued"),
                r.get("journal PRE_APPLIED durable"),
            )
        add(
            "04 C journal PRE_ACCEPTED",
            c.get("journal PRE_ACCEPTED queued"),
            c.get("journal PRE_ACCEPTED durable"),
        )
        if oks:
            add("06 C submit -> last PreAcceptOk", submitted, max(oks))
            add("07 C last PreAcceptOk -> Commit out", max(oks), commit)
        add("08 C Commit out -> DataRead scheduled", commit, c.get("DataRead scheduled"))
        add("09 C DataRead", c.get("DataRead scheduled"), c.get("DataRead done"))
        add("09 C journal STABLE", c.get("journal STABLE queued"), c.get("journal STABLE durable"))
        add("10 C DataRead done -> Apply out", c.get("DataRead done"), apply)
        add(
            "11 C journal PRE_APPLIED",
            c.get("journal PRE_APPLIED queued"),
            c.get("journal PRE_APPLIED durable"),
        )
        add("12 C Apply out -> first ApplyOk", apply, applied_ok)
        add("13 C first ApplyOk -> answered", applied_ok, c.get("client answered ok"))
        add("14 C submit -> answered (total)", submitted, c.get("client answered ok"))
    lines = ["stage (ms)                                     n      p50      p90     mean"]
    for name, values in sorted(stages.items()):
        values.sort()
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        lines.append(
            f"{name:42s} {len(values):5d} {statistics.median(values):8.2f} {p90:8.2f} "
            f"{statistics.mean(values):8.2f}"
        )
    by_span: dict[str, list[float]] = defaultdict(list)
    for label, value in spans:
        by_span[label].append(value)
    for label, values in sorted(by_span.items()):
        values.sort()
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        lines.append(f"driver {label}: p50 {statistics.median(values):.2f} p90 {p90:.2f} ms")
    return lines


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python -m bench.stage_trace DIR [SKIP_SECONDS]")
    skip = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    print("\n".join(report(Path(sys.argv[1]), skip)))
