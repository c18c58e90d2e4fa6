"""latency: commit latency of conflict-free multi-partition transactions across 3 regions.

Setup: three sidecars (embedded store, so the figure is the protocol's own latency, not
Cassandra's), sidecar *i* in region A, B, C; every peer link goes through a delay proxy with
half the region pair's RTT each way (:mod:`bench.wan`; the RTT matrix defaults to
A-B 10, A-C 40, B-C 80 ms and ``BENCH_RTT_MS=ab,ac,bc`` changes it, ``BENCH_JITTER_MS`` adds
uniform jitter). A client in each region talks to its local sidecar over loopback.

Transactions: transfers between two accounts no other transaction touches (two partitions,
2 reads, a condition, 2 writes), so nothing conflicts and every transaction can take the
fast path. Two phases:

* *isolated*: one region at a time, one transaction in flight, an idle pause after each so
  the peer transport is idle when the next one starts: the protocol's latency;
* *loaded*: all regions at once, several transactions in flight per region, back to back.

Theory: Accord commits on the fast path in one round trip to a fast quorum, here (3 replicas,
all in the electorate) ``floor((f + e) / 2) + 1 = 3`` replicas: the coordinator and both
others, so the floor is the RTT to its farthest replica. The ratio is measured p50 over
that RTT; the "calibrated" ratio divides by the RTT the proxy layer actually produced for that
link (configured + measured proxy overhead), which separates the layer's cost from Accord's.

With ``BENCH_LATENCY_CASSANDRA=1`` (default outside ``--quick``) the suite also runs
:mod:`bench.latency_cassandra`: Accord on real Cassandra vs LWT, internode links delayed too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from accord.topology import fast_quorum_size
from accord_cassandra.client import AsyncClient
from bench.clusters import BenchSidecars, bench_nice, raise_own_priority, region_of
from bench.profiling import sidecar_profile
from bench.report import Progress, cdf_points, figure, note
from bench.wan import (
    LAYER_NONE,
    LAYER_PROXY,
    RttMatrix,
    calibrate,
    nearest_quorum_rtt_ms,
    netem_available,
    percentiles,
)
from bench.workload import (
    LoadResult,
    closed_loop,
    cpu_ms_per_txn,
    fast_path_share,
    fsync_ms_mean,
    measured,
    preload,
    transfer,
)

NODES = 3
TARGET_RATIO = 1.10
# The idle pause after each isolated transaction, in largest RTTs: long enough for its
# Apply / InformDurable exchanges to finish on the slowest link, so the next transaction
# finds every peer transport idle.
ISOLATION_RTTS = 3


def matrix_from_environment() -> RttMatrix:
    return RttMatrix.parse(
        os.environ.get("BENCH_RTT_MS", "10,40,80"),
        jitter_ms=float(os.environ.get("BENCH_JITTER_MS", "0")),
    )


def run(*, quick: bool, profile: bool) -> dict[str, Any]:
    nice = bench_nice()
    niceness = raise_own_priority(nice)
    matrix = matrix_from_environment()
    netem, netem_words = netem_available()
    note(f"netem on loopback: {netem} ({netem_words}); using the userspace proxy")
    plan = {
        "isolated_per_region": 8 if quick else 150,
        "loaded_per_region": 30 if quick else 300,
        "loaded_inflight_per_region": 4,
    }
    rtts = sorted(set(matrix.pairs.values()))
    calibration = calibrate([r / 2 for r in rtts], samples=20 if quick else 200)
    report: dict[str, Any] = {
        "suite": "latency",
        "title": "Accord commit latency under an emulated 3-region WAN (embedded store)",
        "layer": LAYER_PROXY,
        "netem": {"available": netem, "probe": netem_words},
        "rtt_matrix_ms": matrix.describe(),
        "jitter_ms": matrix.jitter_ms,
        "plan": plan,
        "proxy_calibration": calibration,
        "niceness": {"sidecars_and_proxies": nice, "load_generator": niceness},
    }
    phases: dict[str, Any] = {}
    # (variant, WAN matrix or None for plain loopback, extra sidecar config, loaded phase?)
    variants: tuple[tuple[str, Any, dict[str, Any], bool], ...] = (
        ("wan", matrix, {}, True),
        ("wan_no_fsync", matrix, {"journal_fsync": False}, False),
        ("loopback", None, {}, False),
    )
    for variant, links, extra, loaded in variants:
        profiled = profile and variant == "wan"
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as folder:
            cluster = BenchSidecars(
                Path(folder), nodes=NODES, matrix=links, extra=extra, profile=profiled, nice=nice
            )
            note(f"starting 3 sidecars ({variant})")
            with cluster:
                pause = (max(matrix.pairs.values()) if links else 10.0) * ISOLATION_RTTS / 1000
                phases[variant] = asyncio.run(_measure(cluster, plan, pause, loaded=loaded))
            report.setdefault("link_stats", {})[variant] = cluster.link_stats
            if profiled:
                report["profile_top"] = sidecar_profile(
                    [cluster.profile_path(n) for n in cluster.sidecars]
                )
    report.update(_figures(phases, matrix, calibration, profiled=profile))
    if os.environ.get("BENCH_LATENCY_CASSANDRA", "0" if quick else "1") == "1":
        from bench import latency_cassandra

        part = latency_cassandra.run(matrix=matrix, quick=quick)
        report["cassandra"] = part
        report["figures"] += part.pop("figures")
        report["targets"] += part.pop("targets", [])
    else:
        report["cassandra"] = {"skipped": "quick mode (BENCH_LATENCY_CASSANDRA=1 runs it)"}
    return report


async def _measure(
    cluster: BenchSidecars, plan: dict[str, int], pause: float, *, loaded: bool
) -> dict[str, Any]:
    addresses = {n: s.address for n, s in cluster.sidecars.items()}
    metrics = [s.metrics_address for s in cluster.sidecars.values()]
    pids = [s.process.pid for s in cluster.sidecars.values() if s.process is not None]
    clients = {n: AsyncClient(a, timeout=30.0) for n, a in addresses.items()}
    isolated_count = plan["isolated_per_region"]
    loaded_count = plan["loaded_per_region"] if loaded else 0
    per_node = isolated_count + loaded_count
    keys = {n: [f"n{n}-{i}-{side}" for i in range(per_node) for side in "ab"] for n in clients}
    try:
        await preload(clients[1], [k for n in sorted(keys) for k in keys[n]])
        # Let the preload apply everywhere, so no measured transaction waits for it.
        await asyncio.sleep(1.0)

        def maker(node: int, offset: int) -> Any:
            names = keys[node]
            return lambda i: transfer(names[2 * (offset + i)], names[2 * (offset + i) + 1], 1)

        isolated: dict[int, tuple[LoadResult, dict[str, float]]] = {}
        for node, client in sorted(clients.items()):
            progress = Progress(f"isolated, region {region_of(node)}", isolated_count)
            isolated[node] = await measured(
                metrics,
                functools.partial(
                    closed_loop,
                    client,
                    maker(node, 0),
                    inflight=1,
                    count=isolated_count,
                    pause_seconds=pause,
                    progress=progress,
                ),
                pids,
            )
        if not loaded_count:
            return {"isolated": isolated}
        progress = Progress("loaded, all regions", loaded_count * len(clients))
        inflight = plan["loaded_inflight_per_region"]

        async def loaded_all() -> dict[int, LoadResult]:
            parts = await asyncio.gather(
                *(
                    closed_loop(
                        client,
                        maker(node, isolated_count),
                        inflight=inflight,
                        count=loaded_count,
                        progress=progress,
                    )
                    for node, client in sorted(clients.items())
                )
            )
            return dict(zip(sorted(clients), parts, strict=True))

        loaded_results, loaded_counters = await measured(metrics, loaded_all, pids)
    finally:
        for client in clients.values():
            await client.close()
    return {
        "isolated": isolated,
        "loaded": loaded_results,
        "loaded_counters": loaded_counters,
        "loaded_seconds": round(max(r.seconds for r in loaded_results.values()), 2),
    }


def _calibrated(calibration: list[dict[str, float]], rtt_ms: float) -> float:
    for row in calibration:
        if abs(row["configured_rtt_ms"] - rtt_ms) < 1e-9:
            return rtt_ms + row["excess_p50_ms"]
    return rtt_ms


def _rows(
    results: dict[int, LoadResult],
    counters: dict[int, dict[str, float]],
    matrix: RttMatrix,
    calibration: list[dict[str, float]],
) -> tuple[list[list[Any]], list[float]]:
    """One row per coordinator region; ``counters`` per node, or one set under key 0 for a
    phase where all regions ran at once (then the share and fsync are over all nodes)."""
    quorum = fast_quorum_size(NODES, NODES)
    regions = [region_of(n) for n in range(1, NODES + 1)]
    rows, ratios = [], []
    for node, result in sorted(results.items()):
        region = region_of(node)
        theory = nearest_quorum_rtt_ms(matrix, region, regions, quorum)
        calibrated = _calibrated(calibration, theory)
        figures = percentiles(result.latencies_ms)
        p50 = figures.get("p50")
        ratio = round(p50 / theory, 3) if p50 and theory else None
        ratio_calibrated = round(p50 / calibrated, 3) if p50 and calibrated else None
        if ratio is not None:
            ratios.append(ratio)
        moved = counters.get(node, counters.get(0, {}))
        # Counters under key 0 cover every region's transactions together.
        txns = (
            sum(len(r.latencies_ms) for r in results.values())
            if 0 in counters
            else len(result.latencies_ms)
        )
        rows.append(
            [
                region,
                theory,
                round(calibrated, 2),
                p50,
                figures.get("p90"),
                figures.get("p99"),
                ratio,
                ratio_calibrated,
                fast_path_share(moved),
                fsync_ms_mean(moved),
                cpu_ms_per_txn(moved, txns),
                figures.get("count", 0),
                sum(result.errors.values()),
            ]
        )
    return rows, ratios


COLUMNS = [
    "coordinator region",
    "fast-quorum RTT ms (configured)",
    "RTT ms the proxy produced",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "p50 / RTT",
    "p50 / produced RTT",
    "fast-path share",
    "mean fsync ms",
    "sidecar CPU ms / txn",
    "txns",
    "errors",
]


def _isolated_rows(
    phase: dict[str, Any], matrix: RttMatrix, calibration: list[dict[str, float]]
) -> tuple[dict[int, LoadResult], list[list[Any]], list[float]]:
    results = {n: pair[0] for n, pair in phase["isolated"].items()}
    counters = {n: pair[1] for n, pair in phase["isolated"].items()}
    rows, ratios = _rows(results, counters, matrix, calibration)
    return results, rows, ratios


def _figures(
    phases: dict[str, Any],
    matrix: RttMatrix,
    calibration: list[dict[str, float]],
    *,
    profiled: bool,
) -> dict[str, Any]:
    isolated, iso_rows, iso_ratios = _isolated_rows(phases["wan"], matrix, calibration)
    _, nosync_rows, nosync_ratios = _isolated_rows(phases["wan_no_fsync"], matrix, calibration)
    loopback, loopback_rows, _ = _isolated_rows(phases["loopback"], matrix, calibration)
    loaded_rows, loaded_ratios = _rows(
        phases["wan"]["loaded"], {0: phases["wan"]["loaded_counters"]}, matrix, calibration
    )
    matrix_text = ", ".join(f"{k} {v:g} ms" for k, v in matrix.describe().items())
    common = (
        f"3 sidecars (embedded store) in regions A, B, C; RTT matrix {matrix_text}, jitter "
        f"±{matrix.jitter_ms:g} ms; every peer link through its own delay proxy; client to "
        f"its local sidecar over loopback; conflict-free 2-partition transfers; fast quorum "
        f"= 3 of 3 replicas (electorate = all), so the floor is the RTT to the farthest "
        f"replica. Fast-path share, mean fsync time and sidecar CPU (all 3 processes, "
        f"/proc) from the sidecars during the phase."
        + (" Sidecars ran under cProfile (slower than unprofiled)." if profiled else "")
    )
    isolated_method = (
        f" One region at a time, 1 in flight, an idle pause of {ISOLATION_RTTS} x the largest "
        f"RTT after each transaction so every peer transport is idle when the next starts."
    )
    regions = [row[0] for row in iso_rows]
    figures = [
        figure(
            "isolated",
            "Commit latency, one transaction at a time (idle transport), journal fsync on",
            layer=LAYER_PROXY,
            method=common + isolated_method + " Journal fsync on (the default).",
            columns=COLUMNS,
            rows=iso_rows,
            plot=_bar_plot(regions, iso_rows),
        ),
        figure(
            "isolated_no_fsync",
            "Commit latency, one transaction at a time, journal fsync off",
            layer=LAYER_PROXY,
            method=common + isolated_method + " journal_fsync: false, fresh sidecars: the "
            "difference to the figure above is what the journal's fsyncs cost.",
            columns=COLUMNS,
            rows=nosync_rows,
            plot=_bar_plot(regions, nosync_rows),
        ),
        figure(
            "loaded",
            "Commit latency, all regions at once, 4 in flight per region",
            layer=LAYER_PROXY,
            method=common + " All three regions concurrently, 4 transactions in flight per "
            "region, back to back, journal fsync on; fast-path share, fsync and CPU over all "
            "nodes and transactions.",
            columns=COLUMNS,
            rows=loaded_rows,
            plot=_bar_plot(regions, loaded_rows),
        ),
        _decomposition_figure(iso_rows, loopback_rows, loopback),
        figure(
            "isolated_cdf",
            "Commit latency CDF, one transaction at a time, journal fsync on",
            layer=LAYER_PROXY,
            method=common + isolated_method + " Dotted lines: each region's fast-quorum RTT.",
            columns=["region", "samples"],
            rows=[[region_of(n), len(r.latencies_ms)] for n, r in sorted(isolated.items())],
            plot={
                "kind": "cdf",
                "series": {
                    f"region {region_of(n)}": cdf_points(r.latencies_ms)
                    for n, r in sorted(isolated.items())
                },
                "vlines": {f"RTT {row[0]}": row[1] for row in iso_rows},
                "xlabel": "commit latency (ms)",
                "ylabel": "fraction of transactions",
            },
        ),
        _calibration_figure(calibration),
    ]
    targets = [
        _target("isolated, fsync on", iso_ratios),
        _target("isolated, fsync off", nosync_ratios),
        _target("4 in flight per region, fsync on", loaded_ratios),
    ]
    return {"figures": figures, "targets": targets}


def _decomposition_figure(
    iso_rows: list[list[Any]], loopback_rows: list[list[Any]], loopback: dict[int, LoadResult]
) -> dict[str, Any]:
    """Where the isolated latency goes: the produced RTT vs everything else, next to the
    same transactions on plain loopback (no WAN at all)."""
    rows = []
    for wan_row, local_row in zip(iso_rows, loopback_rows, strict=True):
        produced, p50 = wan_row[2], wan_row[3]
        rows.append(
            [
                wan_row[0],
                produced,
                p50,
                round(p50 - produced, 2) if p50 is not None else None,
                local_row[3],
                local_row[4],
                local_row[10],
            ]
        )
    return figure(
        "decomposition",
        "Isolated p50 = network RTT + everything else; the same on plain loopback",
        layer=f"{LAYER_PROXY} (WAN columns); {LAYER_NONE} (loopback columns)",
        method="WAN columns from the isolated fsync-on figure; 'everything else' = p50 minus "
        "the RTT the proxies produced. Loopback: the same 3 sidecars and transactions with no "
        "proxies (peers dial each other directly), one at a time with a 30 ms pause: the "
        "non-network cost of a transaction on this machine (client and peer gRPC, journal, "
        "Python protocol code, scheduling among the machine's other work).",
        columns=[
            "region",
            "produced RTT ms",
            "WAN p50 ms",
            "WAN p50 - RTT ms",
            "loopback p50 ms",
            "loopback p90 ms",
            "sidecar CPU ms / txn (loopback)",
        ],
        rows=rows,
        plot={
            "kind": "bar",
            "x": [f"region {row[0]}" for row in rows],
            "series": {
                "produced RTT": [row[1] for row in rows],
                "WAN p50 - RTT": [row[3] for row in rows],
                "loopback p50": [row[4] for row in rows],
            },
            "ylabel": "ms",
        },
    )


def _target(where: str, ratios: list[float]) -> dict[str, Any]:
    worst = max(ratios) if ratios else None
    return {
        "target": f"fast-path median <= {TARGET_RATIO} x RTT to the nearest fast quorum "
        f"({where}; worst region)",
        "measured": worst,
        "met": worst is not None and worst <= TARGET_RATIO,
    }


def _calibration_figure(calibration: list[dict[str, float]]) -> dict[str, Any]:
    return figure(
        "proxy_calibration",
        "The delay layer itself: a 64-byte ping through one proxy",
        layer=LAYER_PROXY,
        method="TCP echo server on loopback behind one proxy per RTT value, run in a proxy "
        "process like the suites'; excess = measured p50 - configured RTT (two proxy hops, "
        "timer lateness: epoll rounds timeouts up to whole ms, machine load).",
        columns=["configured RTT ms", "measured p50 ms", "measured p99 ms", "excess p50 ms"],
        rows=[
            [r["configured_rtt_ms"], r["measured_p50_ms"], r["measured_p99_ms"], r["excess_p50_ms"]]
            for r in calibration
        ],
        plot={
            "kind": "bar",
            "x": [f"{r['configured_rtt_ms']:g} ms" for r in calibration],
            "series": {
                "configured": [r["configured_rtt_ms"] for r in calibration],
                "measured p50": [r["measured_p50_ms"] for r in calibration],
                "measured p99": [r["measured_p99_ms"] for r in calibration],
            },
            "ylabel": "RTT (ms)",
        },
    )


def _bar_plot(regions: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {
        "kind": "bar",
        "x": [f"region {r}" for r in regions],
        "series": {
            "fast-quorum RTT": [row[1] for row in rows],
            "p50": [row[3] for row in rows],
            "p90": [row[4] for row in rows],
            "p99": [row[5] for row in rows],
        },
        "ylabel": "ms",
    }
