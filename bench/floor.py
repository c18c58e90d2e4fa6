"""``python -m bench floor``: where the CPU per operation goes, and the least it can be.

The single-partition conditional set (``UPDATE … IF balance >= ?`` for LWT; the same
statement as an Accord transaction through the sidecars) on one 3-node Cassandra, in one
run, measured three ways:

* **at equal op/s**: an open loop at fixed rates (``BENCH_FLOOR_RATES``, default 100,150
  op/s, below Accord's saturation), so Cassandra's CPU per operation for Accord and for
  LWT is compared at the same rate (Cassandra's CPU per op falls as its op rate rises: a
  comparison at different rates says little);
* **at saturation**: a closed loop of ``BENCH_FLOOR_INFLIGHT`` (default 96) in flight;
* **the null sidecar** (bench/null_sidecar.py): NOT a transaction system, the least any
  Python sidecar must do per operation (gRPC aio edge, one prepared QUORUM read, one
  prepared QUORUM write through cassandra-driver), driven like the sidecars. Its op/s is an
  upper bound for any design with a Python gRPC edge and the Python driver as data path.

With the sidecars' compiled build of accord/ present (``python -m bench.accel
build-sidecar``; bench/accel.py) the Accord sidecars also run on it
(``BENCH_FLOOR_COMPILED``: ``auto`` (default) when ready, ``0`` never, ``1`` fails without
it), back to back with the pure ones.

Every figure gives CPU milliseconds per completed operation from /proc: the servers (3
sidecars or 3 null sidecars summed), Cassandra's 3 JVMs above their idle rate (measured
with nothing running at the start of each round), and the client (this process: the gRPC
client for Accord and the null sidecar, the cassandra-driver session for LWT). Rounds
(``BENCH_FLOOR_ROUNDS``, default 2) repeat every measurement back to back; figures give
the median and the min-max over rounds. From them the suite computes the bound: with C
cores, op/s cannot exceed ``C x 1000 / (CPU ms per op)``; what the null sidecar leaves for
any design, and what Accord's sidecar CPU per op would have to be for 1x and 2x LWT.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from accord_cassandra.client import AsyncClient, TransactionError
from accord_cassandra.ports import read_json
from bench.clusters import DDL_TIMEOUT, BenchSidecars, CassandraHandle, bench_cassandra
from bench.interrupts import cleanup
from bench.lwt import LwtClient, schema
from bench.lwt import preload as lwt_preload
from bench.report import figure, machine, note
from bench.wan import LAYER_NONE, percentiles
from bench.workload import (
    INITIAL_BALANCE,
    TABLE,
    LoadError,
    LoadResult,
    OpenLoopResult,
    closed_loop_calls,
    conditional_set,
    cpu_seconds,
    open_loop_calls,
    run_queue_seconds,
)

LWT = "LWT"
ACCORD = "Accord (pure accord/)"
ACCORD_COMPILED = "Accord (compiled accord/)"
NULL = "null sidecar (floor: not a transaction system)"
NULL_KEYSPACE_SUFFIX = "_null"
SERVERS = 3
NULL_READY_SECONDS = 60.0
CORES = 2
Phase = tuple[str, float]  # ("rate", op/s) or ("inflight", n)


def _env_list(name: str, default: str) -> list[float]:
    text = os.environ.get(name, default)
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"{name}={text!r}: a comma-separated list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"{name}={text!r}: positive numbers, at least one")
    return values


def plan_of(quick: bool) -> dict[str, Any]:
    compiled = os.environ.get("BENCH_FLOOR_COMPILED", "auto")
    if compiled not in ("auto", "0", "1"):
        raise SystemExit(f"BENCH_FLOOR_COMPILED={compiled!r}: auto, 0 or 1")
    return {
        "keys": 200 if quick else 2000,
        "rates": [20.0] if quick else _env_list("BENCH_FLOOR_RATES", "100,150"),
        "inflight": 8 if quick else int(_env_list("BENCH_FLOOR_INFLIGHT", "96")[0]),
        "rounds": 1 if quick else int(_env_list("BENCH_FLOOR_ROUNDS", "2")[0]),
        "seconds": 2.0 if quick else _env_list("BENCH_FLOOR_SECONDS", "20")[0],
        "warmup_seconds": 0.0 if quick else _env_list("BENCH_FLOOR_WARMUP", "10")[0],
        "idle_seconds": 1.0 if quick else 8.0,
        "compiled": compiled,
    }


# ------------------------------------------------------------------------------------------
# Null sidecars


class NullSidecars:
    """``count`` null sidecars (bench/null_sidecar.py), each with its own driver session."""

    def __init__(
        self, folder: Path, cassandra: CassandraHandle, keyspaces: Sequence[str], count: int
    ) -> None:
        self.folder = folder
        self.cassandra = cassandra
        self.keyspaces = list(keyspaces)
        self.count = count
        self.processes: list[subprocess.Popen[bytes]] = []
        self.addresses: list[str] = []

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def __enter__(self) -> NullSidecars:
        self.folder.mkdir(parents=True, exist_ok=True)
        readies = []
        try:
            for index in range(self.count):
                ready = self.folder / f"null{index}.ready.json"
                command = [sys.executable, "-m", "bench.null_sidecar"]
                command += ["--contact-points", ",".join(self.cassandra.contact_points)]
                command += ["--port", str(self.cassandra.native_port), "--ready", str(ready)]
                for keyspace in self.keyspaces:
                    command += ["--keyspace", keyspace]
                with open(self.folder / f"null{index}.log", "ab") as log:
                    self.processes.append(
                        subprocess.Popen(
                            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                        )
                    )
                readies.append(ready)
            deadline = time.monotonic() + NULL_READY_SECONDS
            for ready, process in zip(readies, self.processes, strict=True):
                while (found := read_json(ready)) is None:
                    if process.poll() is not None:
                        text = (self.folder / f"{ready.name.split('.')[0]}.log").read_text()
                        raise RuntimeError(f"null sidecar exited {process.returncode}:\n{text}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"null sidecar not ready in {NULL_READY_SECONDS} s")
                    time.sleep(0.1)
                self.addresses.append(str(found["address"]))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        with cleanup():
            for process in self.processes:
                if process.poll() is None:
                    process.terminate()
            for process in self.processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)


# ------------------------------------------------------------------------------------------
# Measuring


async def _phase(
    call: Callable[[int], Awaitable[bool]],
    phase: Phase,
    seconds: float,
    servers: list[int],
    cassandra: CassandraHandle,
    idle: dict[str, float | None],
) -> dict[str, Any]:
    kind, level = phase
    before = cpu_seconds(servers), cpu_seconds(cassandra.pids), time.process_time()
    waited_before = run_queue_seconds(servers), run_queue_seconds(cassandra.pids)
    waited_before_client = run_queue_seconds([os.getpid()])
    result: LoadResult
    if kind == "rate":
        result = await open_loop_calls(call, rate=level, seconds=seconds)
    else:
        result = await closed_loop_calls(call, inflight=int(level), seconds=seconds)
    after = cpu_seconds(servers), cpu_seconds(cassandra.pids), time.process_time()
    waited = (
        run_queue_seconds(servers) - waited_before[0],
        run_queue_seconds(cassandra.pids) - waited_before[1],
        run_queue_seconds([os.getpid()]) - waited_before_client,
    )
    done = max(1, result.committed)
    server_cpu = after[0] - before[0]
    cassandra_cpu = after[1] - before[1] if cassandra.pids else None
    client_cpu = after[2] - before[2]
    idle_cassandra, idle_server = idle.get("cassandra"), idle.get("servers") or 0.0

    def per_op(seconds_of_cpu: float | None) -> float | None:
        return None if seconds_of_cpu is None else round(1000 * seconds_of_cpu / done, 3)

    above = (
        None
        if cassandra_cpu is None or idle_cassandra is None
        else cassandra_cpu - idle_cassandra * result.seconds
    )
    row: dict[str, Any] = {
        "phase": kind,
        "level": level,
        "ops_per_second": round(result.committed / result.seconds, 1),
        "committed": result.committed,
        "errors": dict(result.errors),
        "latency_ms": percentiles(result.latencies_ms),
        "seconds": round(result.seconds, 2),
        "cpu_ms_per_op": {
            "servers": per_op(server_cpu) if servers else None,
            "servers_above_idle": (
                per_op(server_cpu - idle_server * result.seconds) if servers else None
            ),
            "cassandra": per_op(cassandra_cpu),
            "cassandra_above_idle": per_op(above),
            "client": per_op(client_cpu),
        },
        # CPU-seconds per wall second of everything measured: the cores this run got.
        "cores_used": round((server_cpu + (cassandra_cpu or 0.0) + client_cpu) / result.seconds, 2),
        "load_average": os.getloadavg()[0],
        # Time the measured processes' threads were runnable but had no CPU, per op: on
        # this shared 2-core machine it, not the code, set most of Accord's latency at
        # 50 op/s (issue 15: 30-75 ms of the sidecars' per txn at loads 9-16).
        "run_queue_ms_per_op": {
            "servers": per_op(waited[0]) if servers else None,
            "cassandra": per_op(waited[1]) if cassandra.pids else None,
            "client": per_op(waited[2]),
        },
    }
    if isinstance(result, OpenLoopResult):
        row["offered"] = {
            "issued": result.issued,
            "skipped": result.skipped,
            "start_lag_ms": percentiles(result.start_lag_ms),
        }
    return row


async def _system(
    name: str,
    call: Callable[[int], Awaitable[bool]],
    servers: list[int],
    cassandra: CassandraHandle,
    cassandra_idle: float | None,
    plan: dict[str, Any],
    round_index: int,
) -> list[dict[str, Any]]:
    """One system's phases back to back: its servers' idle CPU, a warm-up, then every rate
    and the saturation level."""
    idle: dict[str, float | None] = {"cassandra": cassandra_idle, "servers": 0.0}
    if servers:
        before = cpu_seconds(servers)
        await asyncio.sleep(plan["idle_seconds"])
        idle["servers"] = (cpu_seconds(servers) - before) / plan["idle_seconds"]
    if plan["warmup_seconds"]:
        note(f"{name}: warm-up {plan['warmup_seconds']:g} s")
        await closed_loop_calls(call, inflight=plan["inflight"], seconds=plan["warmup_seconds"])
    phases: list[Phase] = [("rate", r) for r in plan["rates"]] + [("inflight", plan["inflight"])]
    rows = []
    for phase in phases:
        row = await _phase(call, phase, plan["seconds"], servers, cassandra, idle)
        row.update(
            system=name,
            round=round_index,
            server_idle_cpu_ms_per_second=round(1000 * (idle["servers"] or 0.0), 1),
        )
        cpu = row["cpu_ms_per_op"]
        note(
            f"{name} {phase[0]} {phase[1]:g}: {row['ops_per_second']} op/s, CPU ms/op servers "
            f"{cpu['servers']} Cassandra above idle {cpu['cassandra_above_idle']} client "
            f"{cpu['client']}; p50 {row['latency_ms'].get('p50')} ms; run-queue ms/op servers "
            f"{row['run_queue_ms_per_op']['servers']} Cassandra "
            f"{row['run_queue_ms_per_op']['cassandra']}; load {row['load_average']:.1f}"
        )
        rows.append(row)
    return rows


def _caller(
    clients: list[AsyncClient], keyspace: str, keys: list[str], rng: random.Random
) -> Callable[[int], Awaitable[bool]]:
    async def call(index: int) -> bool:
        txn = conditional_set(rng.choice(keys), INITIAL_BALANCE + rng.randrange(1000), 0, keyspace)
        try:
            answer = await clients[index % len(clients)].transact(txn)
        except TransactionError as error:
            raise LoadError(error.code) from None
        return answer.applied

    return call


def _compiled_path(plan: dict[str, Any]) -> Path | None:
    from bench import accel

    if plan["compiled"] == "0":
        return None
    state = accel.status(accel.SIDECAR_ACCEL_DIR)
    if state != "ready":
        if plan["compiled"] == "1":
            raise SystemExit(
                f"BENCH_FLOOR_COMPILED=1 but the sidecars' compiled build is {state}: "
                f"run `python -m bench.accel build-sidecar`"
            )
        return None
    return accel.SIDECAR_ACCEL_DIR


def compiled_modules(pid: int, build: Path) -> int:
    """How many extension modules of ``build`` the process has mapped: 0 means it runs the
    pure source whatever its PYTHONPATH says."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return 0
    return len({line.split()[-1] for line in maps.splitlines() if str(build) in line})


@contextmanager
def _accord_sidecars(
    folder: Path, cassandra: CassandraHandle, keyspace: str, pythonpath: Path | None
) -> Iterator[BenchSidecars]:
    sidecars = BenchSidecars(
        folder,
        nodes=SERVERS,
        store="cassandra",
        cassandra={
            "contact_points": cassandra.contact_points,
            "port": cassandra.native_port,
            "keyspaces": [keyspace],
        },
        pythonpath=pythonpath,
    )
    with sidecars:
        yield sidecars


async def _through_clients(
    name: str,
    addresses: list[str],
    pids: list[int],
    cassandra: CassandraHandle,
    keyspace: str,
    keys: list[str],
    plan: dict[str, Any],
    cassandra_idle: float | None,
    round_index: int,
    *,
    preload: bool = False,
) -> list[dict[str, Any]]:
    """One system's phases through a client per server (Accord sidecars or null sidecars)."""
    from bench.workload import preload as accord_preload

    clients = [AsyncClient(address, timeout=30.0) for address in addresses]
    try:
        if preload:
            await accord_preload(clients[0], keys, keyspace=keyspace)
        call = _caller(clients, keyspace, keys, random.Random(7 + round_index))
        return await _system(name, call, pids, cassandra, cassandra_idle, plan, round_index)
    finally:
        for client in clients:
            await client.close()


async def _accord_round(
    name: str,
    folder: Path,
    cassandra: CassandraHandle,
    keyspace: str,
    keys: list[str],
    plan: dict[str, Any],
    cassandra_idle: float | None,
    round_index: int,
    pythonpath: Path | None,
    preload: bool,
) -> list[dict[str, Any]]:
    with _accord_sidecars(folder, cassandra, keyspace, pythonpath) as sidecars:
        pids = [s.process.pid for s in sidecars.sidecars.values() if s.process is not None]
        if pythonpath is not None:
            mapped = [compiled_modules(pid, pythonpath) for pid in pids]
            if not all(mapped):
                raise RuntimeError(f"sidecars did not load the compiled build: {mapped}")
            note(f"{name}: compiled modules mapped per sidecar {mapped}")
        addresses = [s.address for s in sidecars.sidecars.values()]
        return await _through_clients(
            name,
            addresses,
            pids,
            cassandra,
            keyspace,
            keys,
            plan,
            cassandra_idle,
            round_index,
            preload=preload,
        )


async def _null_round(
    folder: Path,
    cassandra: CassandraHandle,
    keyspace: str,
    keys: list[str],
    plan: dict[str, Any],
    cassandra_idle: float | None,
    round_index: int,
) -> list[dict[str, Any]]:
    with NullSidecars(folder, cassandra, [keyspace], SERVERS) as nulls:
        return await _through_clients(
            NULL,
            nulls.addresses,
            nulls.pids,
            cassandra,
            keyspace,
            keys,
            plan,
            cassandra_idle,
            round_index,
        )


async def _measure(
    cassandra: CassandraHandle,
    session: Any,
    keyspace: str,
    keys: list[str],
    plan: dict[str, Any],
    compiled: Path | None,
    folder: Path,
) -> tuple[list[dict[str, Any]], list[float]]:
    rows: list[dict[str, Any]] = []
    idles: list[float] = []
    lwt = LwtClient(session, keyspace)
    lwt_rng = random.Random(11)

    def lwt_call(index: int) -> Awaitable[bool]:
        return lwt.conditional_set(
            lwt_rng.choice(keys), INITIAL_BALANCE + lwt_rng.randrange(1000), 0
        )

    for round_index in range(plan["rounds"]):
        cassandra_idle: float | None = None
        if cassandra.pids:
            before = cpu_seconds(cassandra.pids)
            await asyncio.sleep(plan["idle_seconds"])
            cassandra_idle = (cpu_seconds(cassandra.pids) - before) / plan["idle_seconds"]
            idles.append(round(1000 * cassandra_idle, 1))
            note(f"round {round_index + 1}: Cassandra idle {1000 * cassandra_idle:.0f} ms/s")
        rows += await _system(LWT, lwt_call, [], cassandra, cassandra_idle, plan, round_index)
        rows += await _accord_round(
            ACCORD,
            folder / f"accord-{round_index}",
            cassandra,
            keyspace,
            keys,
            plan,
            cassandra_idle,
            round_index,
            None,
            preload=round_index == 0,
        )
        if compiled is not None:
            rows += await _accord_round(
                ACCORD_COMPILED,
                folder / f"compiled-{round_index}",
                cassandra,
                keyspace,
                keys,
                plan,
                cassandra_idle,
                round_index,
                compiled,
                preload=False,
            )
        rows += await _null_round(
            folder / f"null-{round_index}",
            cassandra,
            keyspace + NULL_KEYSPACE_SUFFIX,
            keys,
            plan,
            cassandra_idle,
            round_index,
        )
    return rows, idles


def _null_preload(session: Any, keyspace: str, keys: Sequence[str]) -> None:
    from cassandra import ConsistencyLevel
    from cassandra.concurrent import execute_concurrent_with_args

    insert = session.prepare(f"INSERT INTO {keyspace}.{TABLE} (id, balance) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.QUORUM
    execute_concurrent_with_args(
        session, insert, [(key, INITIAL_BALANCE) for key in keys], concurrency=32
    )


# ------------------------------------------------------------------------------------------
# Figures


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _spread(values: Sequence[float | None]) -> str | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return f"{min(present):.3g}-{max(present):.3g}"


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    """Per (system, phase, level): medians over rounds, and the min-max spread."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["system"], row["phase"], row["level"]), []).append(row)
    out = {}
    for key, items in groups.items():
        cpu_keys = ("servers", "servers_above_idle", "cassandra_above_idle", "client")
        summary: dict[str, Any] = {
            "rounds": len(items),
            "ops_per_second": _median([i["ops_per_second"] for i in items]),
            "ops_spread": _spread([i["ops_per_second"] for i in items]),
            "p50": _median([i["latency_ms"].get("p50") for i in items]),
            "p99": _median([i["latency_ms"].get("p99") for i in items]),
            "errors": sum(sum(i["errors"].values()) for i in items),
            "cores_used": _median([i["cores_used"] for i in items]),
            "load": _spread([i["load_average"] for i in items]),
            "queue_servers": _median(
                [i.get("run_queue_ms_per_op", {}).get("servers") for i in items]
            ),
            "queue_cassandra": _median(
                [i.get("run_queue_ms_per_op", {}).get("cassandra") for i in items]
            ),
        }
        for name in cpu_keys:
            values = [i["cpu_ms_per_op"][name] for i in items]
            summary[name] = _median(values)
            summary[f"{name}_spread"] = _spread(values)
        total = [
            sum(i["cpu_ms_per_op"][n] or 0.0 for n in ("servers", "cassandra_above_idle", "client"))
            for i in items
        ]
        summary["total"] = _median(total)
        summary["total_spread"] = _spread(total)
        out[key] = summary
    return out


def bound(
    summary: dict[tuple[str, str, float], dict[str, Any]], plan: dict[str, Any]
) -> dict[str, Any]:
    """The arithmetic of the floor, from the medians."""
    inflight = float(plan["inflight"])
    lwt = summary.get((LWT, "inflight", inflight), {})
    null = summary.get((NULL, "inflight", inflight), {})
    accord = summary.get((ACCORD, "inflight", inflight), {})
    lwt_ops = lwt.get("ops_per_second")
    out: dict[str, Any] = {"lwt_saturated_ops_per_second": lwt_ops}
    if not lwt_ops:
        return out
    null_server = null.get("servers")
    out["null_saturated_ops_per_second"] = null.get("ops_per_second")
    out["null_vs_lwt_measured"] = (
        round(null["ops_per_second"] / lwt_ops, 3) if null.get("ops_per_second") else None
    )
    out["accord_saturated_ops_per_second"] = accord.get("ops_per_second")
    out["accord_vs_lwt_measured"] = (
        round(accord["ops_per_second"] / lwt_ops, 3) if accord.get("ops_per_second") else None
    )
    # CPU budget per op if the whole machine (CORES) went to the operations.
    for times in (1, 2):
        out[f"budget_ms_per_op_for_{times}x"] = round(CORES * 1000 / (times * lwt_ops), 3)
    per_rate = []
    for rate in plan["rates"]:
        accord_rate = summary.get((ACCORD, "rate", rate), {})
        null_rate = summary.get((NULL, "rate", rate), {})
        cassandra = accord_rate.get("cassandra_above_idle")
        client = accord_rate.get("client")
        if cassandra is None or null_server is None:
            continue
        client_part = client or 0.0
        floor_cpu = cassandra + null_server + client_part
        entry = {
            "rate": rate,
            "accord_cassandra_ms_per_op": cassandra,
            "null_cassandra_ms_per_op_at_rate": null_rate.get("cassandra_above_idle"),
            "lwt_cassandra_ms_per_op_at_rate": summary.get((LWT, "rate", rate), {}).get(
                "cassandra_above_idle"
            ),
            "client_ms_per_op": client,
            "floor_sidecar_ms_per_op": null_server,
            "best_ops_per_second": round(CORES * 1000 / floor_cpu, 1),
            "best_vs_lwt": round(CORES * 1000 / floor_cpu / lwt_ops, 3),
        }
        for times in (1, 2):
            entry[f"accord_sidecar_ms_per_op_for_{times}x"] = round(
                CORES * 1000 / (times * lwt_ops) - cassandra - client_part, 3
            )
        per_rate.append(entry)
    out["per_rate"] = per_rate
    return out


def figures(
    rows: list[dict[str, Any]], plan: dict[str, Any], cassandra: str, idles: list[float]
) -> dict[str, Any]:
    summary = summarise(rows)
    compiled = any(r["system"] == ACCORD_COMPILED for r in rows)
    arithmetic = bound(summary, plan)
    method = (
        f"{cassandra}; one keyspace RF 3 (QUORUM reads and writes for Accord and the null "
        f"sidecar; LWT at SERIAL, commit ONE); {plan['keys']} accounts chosen uniformly; "
        f"single-partition conditional set. Per round, back to back: Cassandra idle for "
        f"{plan['idle_seconds']:g} s (idle ms/s per round: {idles}), then LWT, the Accord "
        f"sidecars{' (pure, then compiled)' if compiled else ''}"
        f", the null sidecars, each with a {plan['warmup_seconds']:g} s closed-loop warm-up "
        f"then {plan['seconds']:g} s per phase; {plan['rounds']} round(s), median and "
        f"min-max over them. CPU from /proc: servers = 3 sidecars (or 3 null sidecars) summed, "
        f"raw and less their idle rate; Cassandra = 3 JVMs less their idle rate; client = "
        f"this process (gRPC client, or the driver for LWT). Everything shares a 2-core "
        f"machine with other tenants."
    )
    rate_rows = []
    for (system, phase, level), item in sorted(summary.items()):
        if phase != "rate":
            continue
        rate_rows.append(
            [
                system,
                level,
                item["ops_per_second"],
                item["ops_spread"],
                item["p50"],
                item["p99"],
                item["errors"],
                item["servers"],
                item["servers_above_idle"],
                item["cassandra_above_idle"],
                item["cassandra_above_idle_spread"],
                item["client"],
                item["total"],
                item["load"],
                item["queue_servers"],
                item["queue_cassandra"],
            ]
        )
    sat_rows = []
    for (system, phase, level), item in sorted(summary.items()):
        if phase != "inflight":
            continue
        sat_rows.append(
            [
                system,
                int(level),
                item["ops_per_second"],
                item["ops_spread"],
                item["p50"],
                item["p99"],
                item["errors"],
                item["servers"],
                item["servers_spread"],
                item["cassandra_above_idle"],
                item["client"],
                item["total"],
                item["total_spread"],
                item["cores_used"],
                item["load"],
                item["queue_servers"],
                item["queue_cassandra"],
            ]
        )
    cpu_columns = ["CPU ms/op Cassandra above idle", "CPU ms/op client"]
    equal = figure(
        "equal_rate",
        "CPU per operation at the same offered op/s (open loop)",
        layer=LAYER_NONE,
        method=method
        + " Open loop: operation i starts at i/rate s whatever earlier ones are doing."
        + " Run-queue ms/op: time the processes' threads were runnable but had no CPU"
        + " (/proc schedstat), summed over them: the machine's share of the latency.",
        columns=[
            "system",
            "offered op/s",
            "op/s",
            "op/s min-max",
            "p50 ms",
            "p99 ms",
            "errors",
            "CPU ms/op servers",
            "CPU ms/op servers above idle",
            cpu_columns[0],
            "Cassandra min-max",
            cpu_columns[1],
            "CPU ms/op total",
            "load avg min-max",
            "run-queue ms/op servers",
            "run-queue ms/op Cassandra",
        ],
        rows=rate_rows,
        plot={
            "kind": "bar",
            "x": [f"{r[0].split(' (')[0]} @{r[1]:g}" for r in rate_rows],
            "series": {
                "servers": [r[7] for r in rate_rows],
                "Cassandra above idle": [r[9] for r in rate_rows],
                "client": [r[11] for r in rate_rows],
            },
            "ylabel": "CPU ms per operation",
        },
    )
    saturated = figure(
        "saturation",
        f"Saturation ({plan['inflight']} in flight, closed loop)",
        layer=LAYER_NONE,
        method=method + " cores used = CPU-seconds of all measured processes per second.",
        columns=[
            "system",
            "in flight",
            "op/s",
            "op/s min-max",
            "p50 ms",
            "p99 ms",
            "errors",
            "CPU ms/op servers",
            "servers min-max",
            cpu_columns[0],
            cpu_columns[1],
            "CPU ms/op total",
            "total min-max",
            "cores used",
            "load avg min-max",
            "run-queue ms/op servers",
            "run-queue ms/op Cassandra",
        ],
        rows=sat_rows,
    )
    bound_rows = [
        [
            entry["rate"],
            entry["accord_cassandra_ms_per_op"],
            entry["lwt_cassandra_ms_per_op_at_rate"],
            entry["null_cassandra_ms_per_op_at_rate"],
            entry["client_ms_per_op"],
            entry["floor_sidecar_ms_per_op"],
            entry["best_ops_per_second"],
            entry["best_vs_lwt"],
            entry["accord_sidecar_ms_per_op_for_1x"],
            entry["accord_sidecar_ms_per_op_for_2x"],
        ]
        for entry in arithmetic.get("per_rate", [])
    ]
    floor_figure = figure(
        "floor",
        "The floor: best op/s any Python sidecar could reach here, and Accord's budget",
        layer=LAYER_NONE,
        method=(
            f"best op/s = {CORES} cores x 1000 / (Accord's Cassandra CPU ms/op above idle at "
            f"that rate + the null sidecar's CPU ms/op at saturation + the client's ms/op); "
            f"ratio to LWT's saturated op/s ({arithmetic.get('lwt_saturated_ops_per_second')}). "
            f"Accord's sidecar budget for kx LWT = {CORES} x 1000 / (k x LWT op/s) - "
            f"Cassandra - client. Measured directly: null sidecar / LWT at saturation = "
            f"{arithmetic.get('null_vs_lwt_measured')}, Accord / LWT = "
            f"{arithmetic.get('accord_vs_lwt_measured')}. The null sidecar is not a "
            f"transaction system: its figure bounds any design with a Python gRPC edge and "
            f"the Python driver as data path."
        ),
        columns=[
            "at op/s",
            "Accord Cassandra ms/op",
            "LWT Cassandra ms/op",
            "null Cassandra ms/op",
            "client ms/op",
            "floor sidecar ms/op",
            "best op/s",
            "best / LWT",
            "Accord sidecar ms/op for 1x",
            "Accord sidecar ms/op for 2x",
        ],
        rows=bound_rows,
    )
    accord_sat = summary.get((ACCORD, "inflight", float(plan["inflight"])), {})
    ratio = arithmetic.get("accord_vs_lwt_measured")
    targets = [
        {
            "target": "Accord conditional set >= 1.0x LWT op/s (issue 14)",
            "measured": ratio,
            "met": None if ratio is None else ratio >= 1.0,
        },
        {
            "target": "Accord conditional set >= 2x LWT op/s (issue 15)",
            "measured": ratio,
            "met": None if ratio is None else ratio >= 2.0,
        },
        {
            "target": "sidecar CPU <= 3 ms per op (3 sidecars summed, saturated)",
            "measured": accord_sat.get("servers"),
            "met": None if accord_sat.get("servers") is None else accord_sat["servers"] <= 3.0,
        },
    ]
    return {"figures": [equal, saturated, floor_figure], "bound": arithmetic, "targets": targets}


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    from accord_cassandra.launcher import driver_cluster

    del profile  # the CPU figures are the point; a profiler would distort them
    plan = plan_of(quick)
    compiled = _compiled_path(plan)
    plan["compiled_build"] = str(compiled) if compiled is not None else None
    report: dict[str, Any] = {
        "suite": "floor",
        "title": "Accord vs LWT at equal op/s, and the null-sidecar floor (same cluster, same run)",
        "layer": LAYER_NONE,
        "plan": plan,
        "load_average_at_start": machine()["load_average_1_5_15"],
    }
    with bench_cassandra(3) as cassandra:
        report["cassandra"] = cassandra.description
        keyspace = f"accord_floor_{uuid.uuid4().hex[:8]}"
        replication = "{'class': 'SimpleStrategy', 'replication_factor': 3}"
        driver = driver_cluster(cassandra.contact_points, cassandra.native_port, timeout=30.0)
        session = driver.connect()
        try:
            statements = schema(keyspace, replication=replication)
            statements += schema(keyspace + NULL_KEYSPACE_SUFFIX, replication=replication)[:2]
            for statement in statements:
                session.execute(statement, timeout=DDL_TIMEOUT)
            driver.control_connection.wait_for_schema_agreement(wait_time=DDL_TIMEOUT)
            keys = [f"acct{i:06d}" for i in range(plan["keys"])]
            note(f"preloading {len(keys)} LWT and null-sidecar accounts")
            lwt_preload(session, keyspace, keys)
            _null_preload(session, keyspace + NULL_KEYSPACE_SUFFIX, keys)
            with tempfile.TemporaryDirectory(prefix="bench-floor-") as folder:
                rows, idles = asyncio.run(
                    _measure(cassandra, session, keyspace, keys, plan, compiled, Path(folder))
                )
            if not cassandra.disposable:
                for name in (keyspace, keyspace + NULL_KEYSPACE_SUFFIX):
                    session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=DDL_TIMEOUT)
        finally:
            with cleanup():
                driver.shutdown()
    report["runs"] = rows
    report["cassandra_idle_ms_per_second"] = idles
    report.update(figures(rows, plan, report["cassandra"], idles))
    return report
