"""``python -m bench --quick --sections chains``: owner chains partition the pods, in the managers and the watches.

Behaviour, not timing or balance (a quick run has too few Deployments for
1/N +- 10 % to be expected): the deployment controller's pod caches over N
managers add up to every pod exactly once; the root watches of one N get
every touched pod exactly once, each unsharded watch gets all of them; the
re-parenting moves arrive as exactly the expected DELETED/ADDED pairs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench-chains") / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--sections", "chains", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    data: dict[str, Any] = json.loads(out.read_text())
    assert "errors" not in data, data.get("errors")
    section: dict[str, Any] = data["chains"]
    return section


@pytest.mark.slow
def test_managers_pod_caches_partition_every_pod(chains: dict[str, Any]) -> None:
    pods = chains["pods"]
    assert pods == chains["deployments"] * chains["podsPerReplicaSet"] > 0
    assert [r["managers"] for r in chains["managers"]] == [1, 2]
    for r in chains["managers"]:
        assert len(r["podsPerManager"]) == r["managers"]
        assert sum(r["podsPerManager"]) == pods, r
        assert sum(r["deploymentsPerManager"]) == chains["deployments"], r
        assert r["todayPodsPerManager"] == pods
    assert chains["managers"][0]["podsPerManager"] == [pods]


@pytest.mark.slow
def test_root_watches_partition_the_events_and_reparenting_moves_exactly(chains: dict[str, Any]) -> None:
    pods = chains["pods"]
    ev = chains["events"]
    for un in (ev["unsharded"], ev["unshardedAfter"]):
        assert un["modifiedPerWatch"] == [pods] * un["watches"], un  # every watch got every pod
        # The proxy-wide count may include a watch still closing from an earlier step: at least these.
        assert un["proxyEventsReceived"] == pods and un["proxyEventsDelivered"] >= pods * un["watches"], un
    for r in ev["root"]:
        assert r["modifiedTotal"] == pods, r  # every touched pod reached exactly one root watch
        assert r["proxyEventsDelivered"] >= pods, r
        assert r["errors"] == [] and r["proxyCpuSeconds"] >= 0
    assert [r["watches"] for r in ev["root"]] == [1, 2]
    rp = ev["root"][-1]["reparent"]
    assert rp["exact"], rp
    assert rp["deleted"] == rp["added"] == rp["expectedMoves"]
