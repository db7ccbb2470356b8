"""``python -m bench``: run the benchmark sections, print a table, write JSON.

Purpose
    Command line of the benchmarks (see bench/README.md). ``--quick`` is the
    CI-sized run (well under 60 s on 2 cores); the default is the full run
    published in docs/benchmarks.md. ``--json FILE`` writes every number;
    ``--sections`` picks a subset. A section that fails is recorded under
    ``errors`` and the exit code is 1; the other sections still run.

Invariants
    * Logging is set up by :func:`rangeshard.core.logs.configure_logging`,
      here for the sections and in the ``main`` of each child program of
      ours (``bench.feed``, ``bench.scaleout_manager``); nothing else in
      ``bench`` configures handlers.
    * Every process started by a section is stopped before the next section
      starts (each section cleans up in ``finally``); the shared cluster
      (etcd, API server, proxy) is stopped in ``finally`` here.

Concurrency model
    Sections run sequentially in the main thread.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from rangeshard.core.logs import configure_logging

log = logging.getLogger(__name__)

SECTIONS = (
    "balance",
    "cache",
    "throughput",
    "fanout",
    "scaleout",
    "rolling",
    "external",
    "sidecar",
    "passthrough",
    "scale",
    "chains",
    "handover",
)


def machine() -> dict[str, Any]:
    """nproc, CPU model, Python version and load average of this host."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpuModel": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadAverageAtStart": [round(x, 2) for x in os.getloadavg()],
    }


def fanout_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """direct / proxy per N for upstream watches, upstream bytes and API server CPU."""
    by = {(r["mode"], r["watchers"]): r for r in rows}
    out = []
    for n in sorted({r["watchers"] for r in rows}):
        p, d = by.get(("proxy", n)), by.get(("direct", n))
        if p is None or d is None:
            continue
        out.append(
            {
                "watchers": n,
                "upstreamWatchesDirectOverProxy": round(d["upstreamWatches"] / max(p["upstreamWatches"], 1), 2),
                "upstreamBytesDirectOverProxy": round(d["upstreamBytes"] / max(p["upstreamBytes"], 1), 2),
                "apiserverCpuDirectOverProxy": round(d["apiserverCpuSeconds"] / max(p["apiserverCpuSeconds"], 1e-3), 2),
                "eventsDecodedDirectOverProxy": round(d["eventsReceivedTotal"] / max(p["eventsReceivedTotal"], 1), 2),
            }
        )
    return out


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*["-" if v is None else str(v) for v in r])
    return t


def render(result: dict[str, Any], console: Console) -> None:
    """Print one table per section (the JSON has more detail)."""
    if "fanout" in result:
        console.print(
            _table(
                "Fan-out: N range watchers via proxy vs N direct full watches (client-side filter)",
                [
                    "mode",
                    "N",
                    "upstream watches",
                    "upstream bytes",
                    "events recv",
                    "kept",
                    "proxy cpu s",
                    "apisrv cpu s",
                ],
                [
                    [
                        r["mode"],
                        r["watchers"],
                        r["upstreamWatches"],
                        r["upstreamBytes"],
                        r["eventsReceivedTotal"],
                        r["eventsKeptTotal"],
                        r["proxyCpuSeconds"],
                        r["apiserverCpuSeconds"],
                    ]
                    for r in result["fanout"]
                ],
            )
        )
        console.print(
            _table(
                "Fan-out ratios (direct / proxy)",
                ["N", "upstream watches", "upstream bytes", "apiserver cpu", "events decoded"],
                [
                    [
                        r["watchers"],
                        r["upstreamWatchesDirectOverProxy"],
                        r["upstreamBytesDirectOverProxy"],
                        r["apiserverCpuDirectOverProxy"],
                        r["eventsDecodedDirectOverProxy"],
                    ]
                    for r in result.get("fanoutRatios", [])
                ],
            )
        )
    if "throughput" in result:
        tp = result["throughput"]
        console.print(
            _table(
                "Proxy throughput, 16 watchers, ~1.2 KiB events (ratios to the bare decode+encode loop)",
                ["path", "events/s (wall)", "events per CPU s", "vs bare (per CPU s)", "note"],
                [
                    [
                        "bare orjson loads+dumps",
                        tp["bareLoop"]["eventsPerSecond"],
                        tp["bareLoop"]["eventsPerCpuSecond"],
                        1.0,
                        "CPython limit, one core",
                    ],
                    [
                        "in-process cache apply+dispatch",
                        tp["inProcess"]["eventsPerSecond"],
                        tp["inProcess"]["eventsPerCpuSecond"],
                        tp["inProcessVsBare"],
                        "WatchCache.apply, no sockets",
                    ],
                    [
                        "HTTP proxy (feed via Upstream)",
                        tp["http"]["sustainedPerSecond"],
                        tp["http"]["eventsPerProxyCpuSecond"],
                        tp["httpPerCpuVsBare"],
                        "wall = highest step kept up",
                    ],
                    [
                        "rangeshard proxy, HTTP upstream",
                        tp["realUpstream"]["sustainedPerSecond"],
                        tp["realUpstream"]["eventsPerProxyCpuSecond"],
                        tp["realUpstreamPerCpuVsBare"],
                        "bench.upstream_server -> CLI proxy",
                    ],
                ],
            )
        )
        targets = tp["targets"]
        console.print(
            _table(
                "Real HTTP upstream against the bare loop (issue 17 targets, same run)",
                ["ratio", "this run", "target"],
                [
                    [
                        "events per proxy CPU s / bare",
                        tp["realUpstreamPerCpuVsBare"],
                        targets["realUpstreamPerCpuVsBare"],
                    ],
                    [
                        "sustained events/s / bare",
                        tp["realUpstreamSustainedVsBare"],
                        targets["realUpstreamSustainedVsBare"],
                    ],
                    [
                        "p99 at 2,000/s minus floor p99 (ms)",
                        tp["realUpstreamP99OverFloorMs"],
                        targets["realUpstreamP99OverFloorMs"],
                    ],
                ],
            )
        )
        floor = tp["socketFloorAt2000"]
        for key, title in (
            ("http", "Proxy over HTTP fed via its Upstream interface, rate steps (latency = send -> client receipt)"),
            (
                "realUpstream",
                "rangeshard proxy reading an HTTP upstream, rate steps (latency = send -> client receipt)",
            ),
        ):
            console.print(
                _table(
                    title,
                    ["offered/s", "achieved/s", "p50 ms", "p99 ms", "proxy cpu util", "events/cpu-s", "kept up"],
                    [
                        [
                            s["offeredPerSecond"],
                            s["achievedPerSecond"],
                            s["p50LatencyMs"],
                            s["p99LatencyMs"],
                            s["proxyCpuUtilisation"],
                            s["eventsPerProxyCpuSecond"],
                            s["keptUp"],
                        ]
                        for s in tp[key]["steps"]
                    ]
                    + [["2000 (floor: bench.floor)", "-", floor["p50LatencyMs"], floor["p99LatencyMs"], "-", "-", "-"]],
                )
            )
    if "cache" in result:
        c = result["cache"]
        console.print(
            _table(
                "Cache: consistent LIST of a 1/16 range (in-process app, no sockets)",
                ["pods", "items/list", "p50 ms", "p50 CPU ms", "max ms", "target ms"],
                [[r["objects"], r["itemsPerList"], r["p50Ms"], r["p50CpuMs"], r["maxMs"], 100] for r in c["list"]],
            )
        )
        b = c.get("listBreakdown")
        if b:
            console.print(
                _table(
                    f"Cache: where one LIST's CPU goes at {b['objects']} pods (ms, best of 3)",
                    ["sort whole store", "filter whole store", "sort slice only", "join body", "full GC pass"],
                    [
                        [
                            b["sortWholeStoreCpuMs"],
                            b["filterWholeStoreCpuMs"],
                            b["sortSliceOnlyCpuMs"],
                            b["joinBodyCpuMs"],
                            b["fullGcCpuMs"],
                        ]
                    ],
                )
            )
        m = c["memory"]
        console.print(
            _table(
                "Cache: memory per cached object (tracemalloc)",
                ["objects", "raw JSON B", "bytes/object", "ratio", "target"],
                [[m["objects"], m["rawJsonBytes"], m["bytesPerObject"], m["ratioToRawJson"], m["target"]]],
            )
        )
        console.print(
            _table(
                "Cache: garbage-collector pauses while the history fills, without / with the heap keeper",
                ["heap keeper", "events", "history", "max pause ms", "full GCs", "max full GC ms", "total GC ms"],
                [
                    [
                        g["keeper"],
                        g["events"],
                        g["historyEvents"],
                        g["maxPauseMs"],
                        g["fullCollections"],
                        g["maxFullCollectionMs"],
                        g["totalGcMs"],
                    ]
                    for g in c["gcPauses"]
                ],
            )
        )
    if "balanceByCost" in result:
        bc = result["balanceByCost"]
        console.print(
            _table(
                f"Balance by measured cost: {bc['managers']} managers, {bc['objects']} objects, "
                f"{int(bc['expensiveShare'] * 100)}% cost {bc['expensiveFactor']}x (reconcile seconds per instance "
                f"in a {bc['windowSeconds']:g} s window)",
                ["layout", "measured cost max/mean", "objects max/mean", "moves", "reconcile s per instance"],
                [
                    [
                        p["phase"],
                        p["measuredCostMaxOverMean"],
                        p["objectsMaxOverMean"],
                        p.get("moves", "-"),
                        " ".join(f"{x:.1f}" for x in p["reconcileSecondsPerInstance"]),
                    ]
                    for p in bc["phases"]
                ],
            )
        )
    if "external" in result:
        ex = result["external"]
        console.print(
            _table(
                f"External controller: a kopf operator, 1 vs 3 sharded instances ({ex['cores']} cores)",
                [
                    "handler",
                    "objects",
                    "1 instance /s",
                    "3 instances /s",
                    "ratio",
                    "ratio / min(3, cores)",
                    "proxy CPU 1 / 3",
                    "API server CPU 1 / 3",
                ],
                [
                    [
                        f"{label} {ex['workMs'] if label == 'cpuBound' else ex.get('sleepMs', ex['workMs'])} ms",
                        ex[label]["one"]["objects"],
                        ex[label]["one"]["perSecond"],
                        ex[label]["three"]["perSecond"],
                        ex[label]["ratio"],
                        ex[label].get("ratioPerCoreBound"),
                        f"{ex[label]['one'].get('proxyCpuUtilisation')} / "
                        f"{ex[label]['three'].get('proxyCpuUtilisation')}",
                        f"{ex[label]['one'].get('apiserverCpuUtilisation')} / "
                        f"{ex[label]['three'].get('apiserverCpuUtilisation')}",
                    ]
                    for label in ("cpuBound", "ioBound")
                    if label in ex
                ],
            )
        )
        lat = ex["latency"]
        console.print(
            _table(
                f"External controller: the endpoint's added latency ({lat['requests']} sequential GETs)",
                [
                    "request",
                    "proxy p50 ms",
                    "endpoint p50 ms",
                    "added p50",
                    "proxy p99 ms",
                    "endpoint p99 ms",
                    "added p99",
                ],
                [
                    [
                        what,
                        lat[f"{what}ProxyP50Ms"],
                        lat[f"{what}EndpointP50Ms"],
                        lat[f"{what}AddedP50Ms"],
                        lat[f"{what}ProxyP99Ms"],
                        lat[f"{what}EndpointP99Ms"],
                        lat[f"{what}AddedP99Ms"],
                    ]
                    for what in ("get", "list")
                ],
            )
        )
    if "sidecar" in result:
        render_sidecar(result["sidecar"], console)
    if "passthrough" in result:
        render_passthrough(result["passthrough"], console)
    if "rolling" in result:
        console.print(
            _table(
                "Rolling restart, one manager at a time, same instance ids, under steady load",
                [
                    "managers",
                    "rejoinGraceSeconds",
                    "key moves",
                    "keys moved",
                    "layout changes",
                    "hashKeys changed",
                    "longest unserved s",
                    "converged keys",
                    "restart s",
                ],
                [
                    [
                        r["managers"],
                        r["rejoinGraceSeconds"],
                        r["keyMoves"],
                        r["keysMoved"],
                        r["layoutChanges"],
                        r["hashKeysChanged"],
                        r["longestUnservedSeconds"],
                        f"{r['convergedKeys']}/{r['objects']}",
                        r["restartSeconds"],
                    ]
                    for r in result["rolling"]["rows"]
                ],
            )
        )
    if "scaleout" in result:
        s = result["scaleout"]
        console.print(
            _table(
                f"Scale-out: reconcile = sleep({s['latencySeconds']}s), {s['workersPerManager']} workers/manager",
                ["managers", "reconciles/s", "ideal/s", "of ideal", "speedup vs 1", "efficiency (target 0.8)"],
                [
                    [
                        w["managers"],
                        w["reconcilesPerSecond"],
                        w["idealPerSecond"],
                        w["ofIdeal"],
                        w["speedup"],
                        w["efficiency"],
                    ]
                    for w in s["throughput"]
                ],
            )
        )
        console.print(
            _table(
                "Scale-out: join to active",
                ["manager", "spawn -> registered s", "registered -> active s"],
                [[j["manager"], j["spawnToRegisteredSeconds"], j["registeredToActiveSeconds"]] for j in s["joins"]],
            )
        )
        if s.get("takeover"):
            t = s["takeover"]
            console.print(
                _table(
                    "Scale-out: SIGKILL to takeover",
                    ["lease TTL s", "record gone s", "survivors active s", "first reconcile of a victim key s"],
                    [
                        [
                            t["leaseTTLSeconds"],
                            t["recordGoneSeconds"],
                            t["survivorsActiveSeconds"],
                            t["firstReconcileOfVictimKeySeconds"],
                        ]
                    ],
                )
            )
    if "balance" in result:
        console.print(
            _table(
                "Balance: max/mean owned objects after joins and after `rangeshard rebalance apply --by ...`",
                [
                    "workload",
                    "N",
                    "after joins",
                    "--by workload",
                    "moves",
                    "objects moved",
                    "--by range",
                    "largest lump",
                ],
                [
                    [
                        r["workload"],
                        r["instances"],
                        r["maxOverMeanAfterJoins"],
                        r["maxOverMeanAfterRebalance"],
                        r["boundaryMoves"],
                        r["objectsMoved"],
                        r["maxOverMeanAfterRebalanceByRange"],
                        r["largestLump"],
                    ]
                    for r in result["balance"]
                ],
            )
        )
    if "scale" in result:
        render_scale(result["scale"], console)
    if "chains" in result:
        render_chains(result["chains"], console)
    if "handover" in result:
        render_handover(result["handover"], console)
    for name, err in result.get("errors", {}).items():
        console.print(f"[red]section {name} failed:[/red] {err.splitlines()[-1] if err else ''}")


def _spread(values: list[float]) -> str:
    return " / ".join(f"{v:g}" for v in values)


def render_sidecar(sc: dict[str, Any], console: Console) -> None:
    """The tables of the ``sidecar`` section (min / median / max of its runs)."""
    s, t = sc["summary"], sc["targets"]
    runs = len(sc["runs"])
    console.print(
        _table(
            f"Sidecar: RSS 2 s after ready and spawn -> /readyz (min / median / max of {runs} runs)",
            ["process", "RSS MiB", "start s", "target"],
            [
                ["external-only manager", _spread(s["externalOnlyRssMiB"]), _spread(s["externalOnlyStartSeconds"]),
                 f"<= {t['externalOnlyRssMiB']} MiB, <= {t['externalOnlyStartSeconds']} s"],
                ["manager, built-in controllers", _spread(s["builtInRssMiB"]), _spread(s["builtInStartSeconds"]), "-"],
                ["proxy (pods cached)", _spread(s["proxyRssMiB"]), _spread(s["proxyStartSeconds"]), "-"],
                *[[f"peer: {name}", mib, "-", "-"] for name, mib in sc["peersMiB"].items()],
                ["profile: bare interpreter", _spread(s["interpreterRssMiB"]), "-", "-"],
                ["profile: + etcd client (gRPC), one call", _spread(s["withEtcdClientRssMiB"]), "-", "-"],
                ["profile: + httpx, YAML, config models", _spread(s["withConfigStackRssMiB"]), "-", "-"],
            ],
        )
    )  # fmt: skip
    console.print(
        _table(
            f"Sidecar: the endpoint's added latency, {sc['runs'][0]['latency']['requests']} requests each way "
            f"(target p50 <= {t['addedP50Ms']} ms, p99 <= {t['addedP99Ms']} ms)",
            ["request", "proxy p50", "endpoint p50", "added p50", "hop added p50", "proxy p99", "added p99",
             "hop added p99"],
            [
                [what, *(_spread(s[f"{what}{k}Ms"]) for k in
                         ("ProxyP50", "EndpointP50", "AddedP50", "HopAddedP50", "ProxyP99", "AddedP99", "HopAddedP99"))]
                for what in ("get", "list")
            ],
        )
    )  # fmt: skip
    console.print(
        _table(
            "Sidecar: relaying (hop: a byte-for-byte relay process, the floor of any extra hop)",
            ["CPU ms per request", "watch event added p50 ms", "p99 ms", "hop: event added p50", "100 watches MiB",
             "targets"],
            [[
                _spread(s["endpointCpuMsPerRequest"]), _spread(s["watchEventAddedP50Ms"]),
                _spread(s["watchEventAddedP99Ms"]), _spread(s["hopWatchEventAddedP50Ms"]),
                _spread(s["hundredWatchesMiB"]),
                f"event p50 <= {t['watchEventAddedP50Ms']} ms, 100 watches <= {t['hundredWatchesMiB']} MiB",
            ]],
        )
    )  # fmt: skip


def render_passthrough(pt: dict[str, Any], console: Console) -> None:
    """The table of the ``passthrough`` section."""
    console.print(
        _table(
            f"Pass-through: CPU per request of the relay against the API server's, {pt['clients']} clients "
            f"(target proxy / upstream <= {pt['targetRatio']} for GET and PATCH; met: {pt['meetsTarget']})",
            ["way", "request", "requests/s", "relay CPU ms", "API server CPU ms", "relay / upstream",
             "requests per relay CPU s"],
            [
                [r["way"], r["kind"], r["perSecond"], r["relayCpuMsPerRequest"], r["apiserverCpuMsPerRequest"],
                 r["relayOverUpstream"], r["requestsPerRelayCpuSecond"]]
                for r in pt["rows"]
            ],
        )
    )  # fmt: skip


def render_scale(sc: dict[str, Any], console: Console) -> None:
    """The tables of the ``scale`` section (the parts that ran)."""
    rp = sc.get("reconcileProfile")
    if rp:
        console.print(
            _table(
                f"Scale, one ReplicaSet reconcile in process: {rp['replicaSets']} ReplicaSets, "
                f"{rp['podsPerReplicaSet']} pods each or none (CPU us per reconcile)",
                ["code", "no pods", "with pods", "ratio", "most own time with pods"],
                [
                    [
                        r["code"],
                        r["noPods"]["cpuUsPerReconcile"],
                        r["withPods"]["cpuUsPerReconcile"],
                        r["withPodsOverNoPods"],
                        ", ".join(f"{t['function']} {t['ownShare']:.0%}" for t in r["withPods"]["top"][:3]),
                    ]
                    for r in rp["rows"]
                ],
            )
        )
    if "managers" in sc:
        render_scale_managers(sc, sc["managers"], "no pods", console)
    mp = sc.get("managersWithPods")
    if mp:
        render_scale_managers(sc, mp, "no pods", console)
        render_scale_managers(sc, {**mp, "rows": mp["rowsWithPods"]}, f"{mp['podsPerReplicaSet']} pods each", console)
        console.print(
            _table(
                f"Scale, managers: {mp['objects']} ReplicaSets with {mp['podsPerReplicaSet']} pods each over the same "
                f"with none (one run; target CPU per reconcile <= {mp['cpuPerReconcileTarget']}x)",
                [
                    "managers",
                    "reconcile CPU/reconcile",
                    "process CPU/reconcile",
                    "reconciles/s with backlog",
                    "max RSS",
                ],
                [
                    [
                        c["managers"],
                        c["reconcileCpuPerReconcile"],
                        c["processCpuPerReconcile"],
                        c.get("backlogReconcilesPerSecond"),
                        c["maxRss"],
                    ]
                    for c in mp["podsOverNoPods"]
                ],
            )
        )
    if "proxy" in sc:
        render_scale_proxy(sc["proxy"], console)
    pr = sc.get("proxyReal")
    if pr:
        console.print(
            _table(
                f"Scale, proxy on real-shaped pods: {pr['objects']} pods of {pr['rawJsonBytes']} B "
                f"({pr['rawJsonMiB']} MiB JSON), {pr['churnPerSecond']} status updates/s for {pr['churnSeconds']} s; "
                f"idle proxy {pr['idleRssMiB']} MiB",
                ["history bound", "objects RSS MiB", "x raw", "history events", "history MiB", "window s",
                 "history RSS MiB", "RSS/byte", "RSS-idle MiB", "target MiB", "met"],
                [
                    [r["historyMaxBytes"] or "none", r["objectsRssMiB"], r["objectsRssOverRawJson"],
                     r["historyEvents"], r["historyMiB"], r["historyWindowSeconds"], r["historyRssMiB"],
                     r["historyRssOverBytes"], r["rssOverIdleMiB"], r["targetMiB"], r["targetMet"]]
                    for r in pr["rows"]
                ],
            )
        )  # fmt: skip


def render_scale_managers(sc: dict[str, Any], m: dict[str, Any], what: str, console: Console) -> None:
    """One table of manager rows (``m["rows"]``)."""
    delay = m["reconcileDelaySeconds"]
    console.print(
        _table(
            f"Scale, managers: {m['objects']} ReplicaSets ({what}), built-in controller, {m['workersPerManager']} "
            f"workers, reconcile waits {delay}s; idle manager {m['idleRssMiB']} MiB "
            f"(bare loop {sc['bareLoop']['loopsPerSecond']}/s)",
            [
                "managers",
                "start->synced s",
                "reconciles/s (window)",
                "with backlog",
                "speedup",
                "target",
                "CPU ms/reconcile",
                "max RSS MiB",
                "peak MiB",
                "RSS-idle share",
                "target",
                "share after rolling restart",
                "cached RS",
            ],
            [
                [
                    r["managers"],
                    r["startToSyncedSeconds"],
                    r["reconcilesPerSecond"],
                    r.get("backlogReconcilesPerSecond"),
                    r.get("backlogSpeedup", r["speedup"]),
                    r["throughputTarget"],
                    r.get("processCpuMsPerReconcile"),
                    r["maxRssMiB"],
                    r["maxPeakRssMiB"],
                    r["memoryShare"],
                    r["memoryTarget"],
                    r.get("afterRollingRestartMemoryShare"),
                    r["cachedReplicaSets"],
                ]
                for r in m["rows"]
            ],
        )
    )


def render_scale_proxy(p: dict[str, Any], console: Console) -> None:
    """The tables of the scale section's proxy part."""
    console.print(
        _table(
            f"Scale, proxy: {p['objects']} pods ({p['rawJsonBytes']} B JSON each) from the synthetic upstream",
            [
                "first sync s",
                "RSS MiB",
                "bytes/object",
                "ratio (<= 2)",
                "ratio with index",
                "LIST 1/64 p50 ms (<= 200)",
                "max ms",
            ],
            [
                [
                    p["firstSyncSeconds"],
                    p["rssAfterSyncMiB"],
                    p["bytesPerObject"],
                    p["memoryRatioToRawJson"],
                    p.get("memoryRatioToRawJsonAfterLists"),
                    p["list"]["p50Ms"],
                    p["list"]["maxMs"],
                ]
            ],
        )
    )
    console.print(
        _table(
            f"Scale, proxy: range watchers, each on its own slice (per-CPU ratio {p['perCpuLargeOverSmall']}, "
            "target >= 0.5)",
            ["watchers", "events", "delivered", "proxy cpu s", "events/cpu-s", "p50 ms", "p99 ms"],
            [
                [
                    w["watchers"],
                    w["events"],
                    w["delivered"],
                    w["proxyCpuSeconds"],
                    w["eventsPerProxyCpuSecond"],
                    w["p50LatencyMs"],
                    w["p99LatencyMs"],
                ]
                for w in p["watchers"]
            ],
        )
    )


def render_chains(ch: dict[str, Any], console: Console) -> None:
    """The tables of the ``chains`` section."""
    console.print(
        _table(
            f"Chains: the built-in deployment controller's pod cache, {ch['deployments']} Deployments x "
            f"{ch['podsPerReplicaSet']} pods (by root through replicasets.apps; target pods/N +- 10 %)",
            ["managers", "pods per manager", "ideal pods/N", "deviation %", "within 10 %", "today (unsharded)",
             "start -> synced s"],
            [
                [r["managers"], " / ".join(map(str, r["podsPerManager"])), r["idealPodsPerManager"],
                 " / ".join(f"{d:+g}" for d in r["deviationPercent"]), r["withinTolerance"],
                 r["todayPodsPerManager"], r["startToSyncedSeconds"]]
                for r in ch["managers"]
            ],
        )
    )  # fmt: skip
    ev = ch["events"]
    rows = [ev["unsharded"], *ev["root"], ev["unshardedAfter"]]
    console.print(
        _table(
            f"Chains: every pod touched once, pod watches on the proxy (root / unsharded proxy CPU per event at "
            f"{ev['comparedAtWatches']} watches: {ev['cpuPerEventRootOverUnsharded']})",
            ["watches", "selector", "MODIFIED per watch", "ideal per watch", "proxy delivered", "churn s",
             "proxy cpu s", "idle cpu/s", "cpu ms per pod event (over idle)"],
            [
                [r["watches"], r["mode"], " / ".join(map(str, r["modifiedPerWatch"])), r["idealPerWatch"],
                 r["proxyEventsDelivered"], r["churnSeconds"], r["proxyCpuSeconds"], r["proxyIdleCpuPerSecond"],
                 r["proxyCpuMsPerPodEvent"]]
                for r in rows
            ],
        )
    )  # fmt: skip
    rp = ev["root"][-1].get("reparent")
    if rp:
        console.print(
            _table(
                f"Chains: {rp['replicaSetsReparented']} ReplicaSets re-parented to other Deployments "
                f"({rp['podsUnderThem']} pods under them), {ev['root'][-1]['watches']} root watches",
                ["expected moves", "DELETED", "ADDED", "exact"],
                [[rp["expectedMoves"], rp["deleted"], rp["added"], rp["exact"]]],
            )
        )


def render_handover(h: dict[str, Any], console: Console) -> None:
    """The table of the ``handover`` section."""
    rows = []
    for r in h["rows"]:
        for what in ("join", "restart"):
            m = r[what]
            rows.append(
                [
                    r["objects"],
                    what,
                    m["seconds"],
                    m["upstreamBytes"],
                    m["upstreamLists"],
                    m["objectsToControllers"],
                    r["oneUpstreamListBytes"],
                ]
            )
    console.print(
        _table(
            "Handover: one join (half the hash space moves) against a restart of the controller, kube-like upstream",
            ["pods", "event", "seconds", "upstream bytes", "upstream lists", "objects to controllers",
             "one upstream LIST bytes"],
            rows,
        )
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description="rangeshard benchmarks (see bench/README.md)")
    p.add_argument("--quick", action="store_true", help="CI-sized run (< 60 s on 2 cores)")
    p.add_argument("--json", type=Path, help="write every number to this file")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--workdir", type=Path, help="keep logs and data here (default: a temporary directory)")
    p.add_argument("--scale-replicasets", type=int, help="scale section: ReplicaSets (default 20000; quick 40)")
    p.add_argument("--scale-pods", type=int, help="scale section: pods the proxy caches (default 1000000; quick 2000)")
    p.add_argument(
        "--scale-pod-replicasets",
        type=int,
        help="scale section, managers with pods: ReplicaSets (default 5000; quick 20)",
    )
    p.add_argument(
        "--scale-pods-per-replicaset",
        type=int,
        help="scale section, managers with pods: pods per ReplicaSet (default 4; quick 2)",
    )
    p.add_argument(
        "--scale-parts",
        default="",
        help="scale section: comma-separated subset of profile,managers,pods,proxy,proxyReal "
        "(default: all; with --quick all but proxyReal)",
    )
    p.add_argument(
        "--chains-deployments", type=int, help="chains section: Deployments (x 3 pods; default 2000; quick 30)"
    )
    p.add_argument(
        "--handover-objects",
        type=lambda v: [int(x) for x in v.split(",")],
        help="handover section: pod counts, comma-separated (default 10000,100000; quick 2000)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    args = p.parse_args(argv)
    configure_logging("info" if args.verbose else "warning")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"unknown sections: {', '.join(unknown)}")
    scale_parts = tuple(s.strip() for s in args.scale_parts.split(",") if s.strip())
    scale_choices = ("profile", "managers", "pods", "proxy", "proxyReal")
    if not scale_parts:
        scale_parts = tuple(c for c in scale_choices if not (args.quick and c == "proxyReal"))
    unknown = [s for s in scale_parts if s not in scale_choices]
    if unknown:
        p.error(f"--scale-parts: unknown parts {', '.join(unknown)}; choose from {','.join(scale_choices)}")

    from bench import (  # noqa: PLC0415 (after logging setup)
        balance,
        cache,
        chains,
        costbalance,
        external,
        fanout,
        handover,
        passthrough,
        rolling,
        scale,
        scaleout,
        sidecar,
        throughput,
    )
    from bench.common import BenchCluster  # noqa: PLC0415

    own_workdir = args.workdir is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rangeshard-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    started = time.time()
    t0 = time.monotonic()
    result: dict[str, Any] = {
        "meta": {
            "quick": quick,
            "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine(),
        }
    }
    errors: dict[str, str] = {}
    section_seconds: dict[str, float] = {}

    def guarded(name: str, fn: Callable[[], Any]) -> None:
        if name not in sections and not (name == "balanceByCost" and "balance" in sections):
            return
        s0 = time.monotonic()
        try:
            result[name] = fn()
        except Exception:
            log.exception("section %s failed", name)
            errors[name] = traceback.format_exc()
        section_seconds[name] = round(time.monotonic() - s0, 2)

    guarded("balance", lambda: balance.run(quick))
    guarded("cache", lambda: cache.run(quick))
    guarded("throughput", lambda: throughput.run(quick, workdir))
    guarded(
        "scale",
        lambda: scale.run(
            workdir / "scale",
            quick=quick,
            rs_objects=args.scale_replicasets,
            pod_objects=args.scale_pods,
            pod_replicasets=args.scale_pod_replicasets,
            pods_per_rs=args.scale_pods_per_replicaset,
            parts=scale_parts,
        ),
    )
    guarded(
        "chains",
        lambda: chains.run(
            workdir / "chains",
            deployments=args.chains_deployments or (30 if quick else 2000),
            counts=[1, 2] if quick else [1, 2, 4],
            reparent=10 if quick else 100,
            idle_seconds=1.0 if quick else 5.0,
            rate=0.0 if quick else 75.0,
        ),
    )
    guarded("handover", lambda: handover.run(quick, workdir / "handover", sizes=args.handover_objects))
    measured_balance = "balance" in sections and not quick  # the measured part (by cost) needs ~2 min
    clustered = ("fanout", "scaleout", "rolling", "external", "sidecar", "passthrough")
    if any(s in sections for s in clustered) or measured_balance:
        cluster = BenchCluster(workdir / "cluster")
        try:
            c0 = time.monotonic()
            cluster.start()
            section_seconds["clusterStart"] = round(time.monotonic() - c0, 2)
            counts = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32]
            guarded("fanout", lambda: fanout.run(cluster, counts, 40 if quick else 300))
            if "fanout" in result:
                result["fanoutRatios"] = fanout_ratios(result["fanout"])
            guarded(
                "scaleout",
                lambda: scaleout.run(
                    cluster,
                    workdir,
                    counts=[1, 2] if quick else [1, 2, 4],
                    window=1.5 if quick else 5.0,
                    latency=0.05,
                    workers=4,
                    objects=32 if quick else 128,
                ),
            )
            if measured_balance:
                guarded("balanceByCost", lambda: costbalance.run(cluster, workdir / "costbalance"))
            guarded(
                "rolling",
                lambda: rolling.run(
                    cluster,
                    workdir / "rolling",
                    counts=[2] if quick else [4, 8],
                    grace=10.0 if quick else 15.0,
                    objects=32 if quick else 128,
                ),
            )
            guarded(
                "external",
                lambda: external.run(
                    cluster,
                    workdir / "external",
                    objects=40 if quick else 2000,
                    work_ms=20,
                    requests=50 if quick else 500,
                    io_bound=not quick,
                ),
            )
            guarded(
                "sidecar",
                lambda: sidecar.run(
                    cluster,
                    workdir / "sidecar",
                    runs=1 if quick else 3,
                    requests=50 if quick else 500,
                    events=30 if quick else 200,
                    watches=100,
                ),
            )
            guarded(
                "passthrough",
                lambda: passthrough.run(cluster, workdir / "passthrough", requests=60 if quick else 400, clients=8),
            )
        except Exception:
            log.exception("starting the benchmark cluster failed")
            errors["cluster"] = traceback.format_exc()
        finally:
            cluster.stop()
    result["meta"]["sectionSeconds"] = section_seconds
    result["meta"]["durationSeconds"] = round(time.monotonic() - t0, 2)
    if errors:
        result["errors"] = errors
    render(result, Console(width=140))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
