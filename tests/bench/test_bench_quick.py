"""``python -m bench --quick`` runs end to end and its JSON has every section with sane values.

Behaviour, not timing: the machine running CI is noisy, so nothing here
asserts a speed. What must hold whatever the load: the proxy holds one
upstream watch however many range watchers it serves and the direct mode one
per watcher; every event reaches exactly one proxy watcher; the ranges of a
LIST partition the cache; managers reconcile, join and take over; balance
plans keep every object; in ``scale``, the managers' caches partition the
ReplicaSets and the proxy's range watchers and 1/64 LISTs partition the pods;
in ``sidecar``, every watch event arrives through the endpoint; in
``handover``, a join lists nothing upstream and its two ranges hold every pod.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import SECTIONS

#: chains runs in tests/bench/test_bench_chains.py (its own quick run): not twice.
OTHER_SECTIONS = ",".join(s for s in SECTIONS if s != "chains")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--sections", OTHER_SECTIONS, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.slow
def test_every_section_present_without_errors(result: dict[str, Any]) -> None:
    assert "errors" not in result, result.get("errors")
    sections = (
        "meta",
        "fanout",
        "fanoutRatios",
        "throughput",
        "cache",
        "scaleout",
        "balance",
        "rolling",
        "external",
        "sidecar",
        "passthrough",
        "scale",
        "handover",
    )
    for section in sections:
        assert section in result, section
    meta = result["meta"]
    assert meta["quick"] is True
    assert meta["machine"]["nproc"] >= 1
    assert meta["machine"]["python"]


@pytest.mark.slow
def test_fanout_proxy_holds_one_upstream_watch_direct_holds_n(result: dict[str, Any]) -> None:
    rows = result["fanout"]
    proxy = {r["watchers"]: r for r in rows if r["mode"] == "proxy"}
    direct = {r["watchers"]: r for r in rows if r["mode"] == "direct"}
    assert proxy and set(proxy) == set(direct)
    for n, p in proxy.items():
        d = direct[n]
        events = p["events"]
        assert p["upstreamWatches"] == 1, p
        assert d["upstreamWatches"] == n, d
        # The proxy's slices partition the space: every event reaches exactly one watcher.
        assert p["eventsReceivedTotal"] == events
        assert p["eventsKeptTotal"] == events
        assert len(p["eventsReceived"]) == n
        # Direct watchers each receive everything and keep their slice.
        assert d["eventsReceived"] == [events] * n
        assert d["eventsKeptTotal"] == events
        assert p["upstreamBytes"] >= events * 500
        assert d["upstreamBytes"] > 0.5 * n * p["upstreamBytes"]
        assert p["proxyCpuSeconds"] is not None and p["proxyCpuSeconds"] >= 0
    for r in result["fanoutRatios"]:
        assert r["upstreamWatchesDirectOverProxy"] == r["watchers"]


@pytest.mark.slow
def test_throughput_paths_deliver_every_event(result: dict[str, Any]) -> None:
    tp = result["throughput"]
    assert tp["bareLoop"]["eventsPerSecond"] > 0
    assert tp["inProcess"]["delivered"] == tp["inProcess"]["events"] > 0
    steps = tp["http"]["steps"]
    assert steps, "no HTTP rate step ran"
    first = steps[0]
    assert first["events"] > 0
    assert first["delivered"] == first["events"]
    assert first["p50LatencyMs"] >= 0 and first["p99LatencyMs"] >= first["p50LatencyMs"]
    assert tp["http"]["watchers"] == 16
    assert "Upstream" in tp["http"]["path"]
    # The CLI proxy reading a real chunked HTTP watch delivers every event too.
    real = tp["realUpstream"]["steps"]
    assert real and real[0]["events"] > 0 and real[0]["delivered"] == real[0]["events"]
    # The write-only floor reaches every client with every line.
    floor = tp["socketFloorAt2000"]
    assert floor["delivered"] == floor["events"] > 0
    assert floor["p99LatencyMs"] >= floor["p50LatencyMs"] >= 0


@pytest.mark.slow
def test_cache_lists_partition_and_memory_is_measured(result: dict[str, Any]) -> None:
    cache = result["cache"]
    for row in cache["list"]:
        # 16 slices of the space partition the pods: the mean slice holds exactly 1/16.
        assert row["itemsPerList"] == row["objects"] / row["slices"]
        assert row["p50Ms"] > 0 and row["maxMs"] >= row["p50Ms"]
    mem = cache["memory"]
    assert mem["bytesPerObject"] > mem["rawJsonBytes"] > 500
    assert mem["ratioToRawJson"] > 1
    without, with_keeper = cache["gcPauses"]
    assert (without["keeper"], with_keeper["keeper"]) == (False, True)
    assert without["historyEvents"] == with_keeper["historyEvents"] == without["events"]
    assert with_keeper["keeperPasses"] == with_keeper["events"] // 2500 and without["keeperPasses"] == 0


@pytest.mark.slow
def test_scaleout_managers_reconcile_join_and_take_over(result: dict[str, Any]) -> None:
    s = result["scaleout"]
    counts = [w["managers"] for w in s["throughput"]]
    assert counts == sorted(counts) and counts[0] == 1 and len(counts) >= 2
    for w in s["throughput"]:
        assert w["reconciles"] > 0
        assert all(v > 0 for v in w["perManager"].values()), w
        assert len(w["perManager"]) == w["managers"]
    for j in s["joins"]:
        assert j["spawnToRegisteredSeconds"] is not None and j["spawnToRegisteredSeconds"] > 0
        assert j["registeredToActiveSeconds"] is not None and j["registeredToActiveSeconds"] >= 0
    t = s["takeover"]
    assert t is not None
    assert t["recordGoneSeconds"] is not None
    assert t["firstReconcileOfVictimKeySeconds"] is not None
    assert t["victimKeys"] > 0


@pytest.mark.slow
def test_balance_plans_keep_every_object(result: dict[str, Any]) -> None:
    rows = result["balance"]
    assert {(r["workload"], r["instances"]) for r in rows} == {(w, n) for w in ("uniform", "skewed") for n in (3, 5, 7)}
    for r in rows:
        assert sum(r["countsAfterJoins"]) == r["objects"] == sum(r["countsAfterRebalance"])
        assert sum(r["countsAfterRebalanceByRange"]) == r["objects"]
        assert len(r["countsAfterRebalance"]) == r["instances"] == len(r["countsAfterRebalanceByRange"])
        assert r["maxOverMeanAfterRebalance"] <= r["maxOverMeanAfterJoins"]
        # The planner works on the published histograms (at most 256 buckets); the exact counts stay close to its prediction.
        assert abs(r["maxOverMeanAfterRebalance"] - r["predictedMaxOverMean"]) <= 0.05
        if r["workload"] == "uniform":
            assert r["maxOverMeanAfterRebalance"] <= 1.01
        else:
            assert r["largestLump"] > 1


@pytest.mark.slow
def test_rolling_restart_with_a_grace_moves_no_key(result: dict[str, Any]) -> None:
    rows = result["rolling"]["rows"]
    without = [r for r in rows if r["rejoinGraceSeconds"] == 0]
    with_grace = [r for r in rows if r["rejoinGraceSeconds"] > 0]
    assert without and with_grace
    for r in with_grace:
        assert r["keyMoves"] == 0 and r["keysMoved"] == 0, r
        assert r["layoutChanges"] == 0 and r["hashKeysChanged"] == 0, r
    for r in rows:
        # Reconciled in the last second by the final owner: all but a key whose requeue straddles the window.
        assert r["objects"] > 0 and r["convergedKeys"] >= 0.9 * r["objects"], r


@pytest.mark.slow
def test_external_kopf_operator_handles_everything_with_one_and_three_instances(result: dict[str, Any]) -> None:
    ex = result["external"]
    assert ex["cores"] >= 1
    for n, run in (("one", 1), ("three", 3)):
        row = ex["cpuBound"][n]
        assert row["instances"] == run and row["objects"] > 0 and row["perSecond"] > 0, row
    assert ex["cpuBound"]["ratio"] > 0
    assert ex["cpuBound"]["one"]["proxyCpuSeconds"] > 0 and ex["cpuBound"]["one"]["apiserverCpuSeconds"] > 0
    lat = ex["latency"]
    for what in ("get", "list"):
        for via in ("Proxy", "Endpoint"):
            assert 0 < lat[f"{what}{via}P50Ms"] <= lat[f"{what}{via}P99Ms"], lat


def test_sidecar_measures_every_process_and_relays_every_event(result: dict[str, Any]) -> None:
    sc = result["sidecar"]
    for run in sc["runs"]:
        for what in ("externalOnly", "builtIn", "proxy"):
            assert run[what]["rssMiB"] > 0 and run[what]["startSeconds"] > 0, (what, run[what])
        assert run["watch"]["events"] == 30, "every patch arrived through the proxy, the endpoint and the hop"
        assert run["watches"]["watches"] == 100 and run["watches"]["rssAfterMiB"] > 0
        assert 0 < run["profile"]["interpreterRssMiB"] < run["profile"]["etcdClientRssMiB"]
        for what in ("get", "list"):
            assert 0 < run["latency"][f"{what}EndpointP50Ms"] <= run["latency"][f"{what}EndpointP99Ms"]
    assert set(sc["summary"]["externalOnlyRssMiB"]) and sc["targets"]["externalOnlyRssMiB"] == 55


@pytest.mark.slow
def test_passthrough_measures_every_way_and_kind_against_the_upstream(result: dict[str, Any]) -> None:
    pt = result["passthrough"]
    ways = {(r["way"], r["kind"]) for r in pt["rows"]}
    assert ways == {
        (w, k)
        for w in ("upstream", "hop", "proxy", "fenced", "fenced-root")
        for k in ("GET", "PATCH", "POST", "DELETE")
    }
    for r in pt["rows"]:
        assert r["requests"] == 60 and r["apiserverCpuMsPerRequest"] > 0, r
        if r["way"] in ("proxy", "fenced", "fenced-root"):
            assert r["relayCpuMsPerRequest"] > 0 and r["requestsPerRelayCpuSecond"] > 0, r
        elif r["way"] == "hop":  # a bare byte relay: 60 requests may cost less than one CPU clock tick (10 ms)
            assert r["relayCpuMsPerRequest"] >= 0, r
    assert set(pt["proxyOverUpstream"]) == {"GET", "PATCH", "POST", "DELETE"}


@pytest.mark.slow
def test_scale_managers_partition_their_caches_and_the_proxy_its_watchers(result: dict[str, Any]) -> None:
    sc = result["scale"]
    assert sc["bareLoop"]["loopsPerSecond"] > 0 and sc["bareLoopAtEnd"]["loopsPerSecond"] > 0
    m = sc["managers"]
    assert m["idleRssMiB"] > 0
    assert [r["managers"] for r in m["rows"]] == [1, 2]
    for r in m["rows"]:
        # Each ReplicaSet is in exactly one manager's cache (the ranges partition the space); no pods exist.
        assert r["cachedReplicaSets"] == m["objects"], r
        assert r["cachedPods"] == 0, r
        assert len(r["perManager"]) == r["managers"]
        assert all(x["rssKiB"] > 0 and x["peakRssKiB"] >= x["rssKiB"] for x in r["perManager"]), r
        assert r["reconcilesTotal"] > 0, r
        assert r["startToSyncedSeconds"] > 0
    # After a rolling restart (every id parked and took its range back) the caches were full again.
    assert m["rows"][0]["afterRollingRestartRssMiB"] is None
    two = m["rows"][1]
    assert len(two["afterRollingRestartRssMiB"]) == 2 and min(two["afterRollingRestartRssMiB"]) > 0, two
    assert two["afterRollingRestartMemoryShare"] is not None
    p = sc["proxy"]
    assert p["firstSyncSeconds"] > 0 and p["bytesPerObject"] > 0 and p["rawJsonBytes"] > 1000
    lst = p["list"]
    assert lst["partitionChecked"] and lst["itemsTotal"] == p["objects"], lst
    for w in p["watchers"]:
        assert w["delivered"] == w["events"], w  # each event reached exactly one range watcher
        assert w["cutOff"] == 0, w
    assert [w["watchers"] for w in p["watchers"]] == [4, 32]


@pytest.mark.slow
def test_a_handover_lists_nothing_upstream_and_moves_half_the_pods(result: dict[str, Any]) -> None:
    """The join is served from the proxy's cache on an upstream without bookmarks; the two ranges hold every pod."""
    (row,) = result["handover"]["rows"]
    join = row["join"]
    assert join["upstreamLists"] == 0 and join["upstreamBytes"] < row["oneUpstreamListBytes"] / 10, row
    assert sum(join["itemsPerController"]) == row["objects"] and min(join["itemsPerController"]) > 0, join
    assert join["objectsToControllers"] >= row["objects"], join  # the giver's relist and the receiver's list
    assert row["restart"]["upstreamLists"] == 0, row


@pytest.mark.slow
def test_scale_managers_with_pods_cache_every_pod_once_beside_the_no_pod_rows(result: dict[str, Any]) -> None:
    mp = result["scale"]["managersWithPods"]
    assert mp["pods"] == mp["objects"] * mp["podsPerReplicaSet"] > 0
    assert [r["managers"] for r in mp["rows"]] == [r["managers"] for r in mp["rowsWithPods"]] == [1, 2]
    for r in mp["rows"]:
        assert r["cachedReplicaSets"] == mp["objects"] and r["cachedPods"] == 0, r
    for r in mp["rowsWithPods"]:
        # Each pod is in exactly one manager's cache: with its owner (placed by the owner's uid).
        assert r["cachedReplicaSets"] == mp["objects"] and r["cachedPods"] == mp["pods"], r
        assert r["reconcilesTotal"] > 0, r
        # Quick sizes may drain before any sample or the window sees a backlog: then there is no figure,
        # never a made-up one (the published run's sizes keep every manager busy).
        cpu = r["processCpuMsPerReconcile"]
        assert (cpu is None) == (r["cpuMeasuredOver"] == "window" and r["reconcilesPerSecond"] == 0), r
        assert cpu is None or cpu > 0, r
        assert r["managersWithBacklog"] <= r["managers"] and len(r["backlogSeconds"]) == r["managers"], r
    # Same N, same ReplicaSets, one run: a comparison for every N (its values are the published run's).
    assert [c["managers"] for c in mp["podsOverNoPods"]] == [1, 2]
    assert all("processCpuPerReconcile" in c for c in mp["podsOverNoPods"])
    assert mp["cpuPerReconcileTarget"] == 1.5
    two = mp["rowsWithPods"][1]
    assert len(two["afterRollingRestartRssMiB"]) == 2 and min(two["afterRollingRestartRssMiB"]) > 0, two


@pytest.mark.slow
def test_scale_reconcile_profile_before_and_after(result: dict[str, Any]) -> None:
    rp = result["scale"]["reconcileProfile"]
    assert [r["code"] for r in rp["rows"]] == ["before", "after"]
    for r in rp["rows"]:
        assert r["noPods"]["pods"] == 0 and r["withPods"]["pods"] == rp["replicaSets"] * rp["podsPerReplicaSet"]
        assert r["noPods"]["cpuUsPerReconcile"] > 0 and r["withPods"]["cpuUsPerReconcile"] > 0
        assert r["withPods"]["top"], r
    # Structure, not speed: the scan read every pod per reconcile; the indexes read none of the others.
    before, after = rp["rows"]
    calls = {t["function"]: t["callsPerReconcile"] for t in before["withPods"]["top"]}
    assert any(c >= rp["replicaSets"] * rp["podsPerReplicaSet"] for c in calls.values()), calls
    assert all(t["callsPerReconcile"] < 100 for t in after["withPods"]["top"]), after["withPods"]["top"]
