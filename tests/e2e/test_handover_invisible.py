"""Handovers an unmodified controller cannot notice (issue 46): no extra pod, no upstream list.

The controller is tests/e2e/rs_like_child.py, an official-client ReplicaSet
controller written as kube's is (two informers, creates while it sees fewer
pods than ``spec.replicas``, expectations), whose pod list is slower than its
ReplicaSet list. Sharded 3 ways over 180 pods through joins, a SIGKILL,
another join, ``rangeshard rebalance set-key`` and ``rebalance apply``, with the spec never changed:

* the API server's audit log holds no pod created or deleted after the first
  convergence (with every shard watch reset at once, the ReplicaSets that
  moved in were synced against a pod cache without their pods: extra pods);
* the upstream bookmarks once a minute and makes no progress on request, as
  kube-apiserver: the proxy's ``range_filter_proxy_consistent_read_fallbacks_total``
  stays 0 (the handover is served from its cache);
* no stale owner wrote; the fence's refusals are printed.

Run for a list-then-watch client and for a streaming-list client
(``sendInitialEvents``), the two ways client-go lists, and for a kopf
operator of the same shape (tests/e2e/kopf_rs_operator.py: a kopf index of
pods by owner, a sync on every ReplicaSet event).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s

from hashing import MAX_HASH
from tests.e2e.conftest import Cluster, Manager
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

CHILD = Path(__file__).with_name("rs_like_child.py")
KOPF_OPERATOR = Path(__file__).with_name("kopf_rs_operator.py")
NS = "inv"
RS = 30
REPLICAS = 6


def _controllers(client: str) -> dict[str, object]:
    if client == "kopf":
        command = [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", NS, str(KOPF_OPERATOR)]
    else:
        command = [sys.executable, str(CHILD), NS, "--pod-list-delay", "1.0"]
        command += ["--streaming"] if client == "streaming-list" else []
    return {
        "rs": {
            "external": {
                "command": command,
                "shard": [{"resource": "replicasets.apps", "by": "uid"}, {"resource": "pods", "by": "owner"}],
                "drainSeconds": 1.0,
                # A client-go-like list-then-watch opens its watch only after it replaced its store: no settle
                # needed. A streaming list's bookmark is ours, not the client's: the default (1 s). kopf fills its
                # pod index in per-object workers after the list arrived: slower on a loaded host.
                "handoverSettleSeconds": {"list-watch": 0.0, "streaming-list": 1.0, "kopf": 3.0}[client],
            }
        }
    }


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("rs")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _pods_per_rs(api: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in k8s.CoreV1Api(api).list_namespaced_pod(NS).items:
        if pod.metadata.deletion_timestamp:
            continue
        for ref in pod.metadata.owner_references or ():
            if ref.controller:
                counts[ref.name] = counts.get(ref.name, 0) + 1
    return counts


def _converged(api: object) -> bool:
    counts = _pods_per_rs(api)
    return len(counts) == RS and set(counts.values()) == {REPLICAS}


def _pod_writes(audit: Path) -> list[dict[str, object]]:
    """Pods created or deleted (successfully) in the API server's audit log."""
    out = []
    for line in audit.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:  # a line being written
            continue
        ref = e.get("objectRef") or {}
        code = (e.get("responseStatus") or {}).get("code", 0)
        if (
            e.get("stage") == "ResponseComplete"
            and ref.get("resource") == "pods"
            and not ref.get("subresource")
            and e.get("verb") in ("create", "delete")
            and 200 <= code < 300
        ):
            out.append(e)
    return out


def _proxy_metric(cluster: Cluster, name: str) -> dict[str, float]:
    text = httpx.get(f"{cluster.proxy.url}/metrics", timeout=10).text
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^{name}(?:{{(.*)}})? (\S+)$", text, re.M)}


def _actions(managers: list[Manager]) -> list[str]:
    return [line for m in managers for line in m.log.read_text(errors="replace").splitlines() if "ACTION " in line]


def _rebalance(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--type", "rs", "--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix]
    command = [sys.executable, "-m", "rangeshard.cli.main", "rebalance", *args, *where]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("client", ["list-watch", "streaming-list", "kopf"])
def test_handovers_create_and_delete_no_pod_and_list_nothing_upstream(kube_like_cluster: Cluster, client: str) -> None:
    cluster = kube_like_cluster
    api = cluster.api
    create_namespace(api, NS)
    managers = [cluster.start_manager(_controllers(client))]
    wait_until(lambda: _active(cluster, 1), 60, "one active instance")
    apps = k8s.AppsV1Api(api)
    for i in range(RS):
        labels = {"app": f"rs{i}"}
        apps.create_namespaced_replica_set(
            NS,
            {
                "metadata": {"name": f"rs{i}"},
                "spec": {
                    "replicas": REPLICAS,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
                },
            },
        )
    wait_until(lambda: _converged(api), 90, f"{RS} ReplicaSets with {REPLICAS} pods each")
    audit = cluster.workdir / "apiserver-audit.jsonl"
    baseline = len(_pod_writes(audit))
    assert baseline == RS * REPLICAS, "the first instance created exactly the pods asked for"
    fallbacks_before = sum(_proxy_metric(cluster, "range_filter_proxy_consistent_read_fallbacks_total").values())

    steps: list[str] = []
    for n in (2, 3):  # two joins
        managers.append(cluster.start_manager(_controllers(client)))
        wait_until(lambda n=n: _active(cluster, n), 60, f"{n} active instances")
        steps.append(f"join -> {n}")
    victim = managers.pop(0)  # a SIGKILL: its range is taken over when its lease expires
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    wait_until(lambda: _active(cluster, 2), 60, "two instances after the kill")
    steps.append("SIGKILL -> 2")
    managers.append(cluster.start_manager(_controllers(client)))
    wait_until(lambda: _active(cluster, 3), 60, "three active instances again")
    steps.append("join -> 3")
    # The ranges made uneven by one boundary (a handover itself), so that the rebalance surely moves keys.
    first = min(cluster.snapshot("rs"), key=lambda m: m.record.hash_key)
    _rebalance(cluster, "set-key", "--instance", first.instance_id, "--key", str(MAX_HASH // 8))
    steps.append("set-key")
    moved = _rebalance(cluster, "apply", "--by", "range", "--min-gain", "0")
    assert re.search(r"^\s+\S+: \d+ -> \d+$", moved.stdout, re.M), moved.stdout  # keys moved
    wait_until(lambda: _active(cluster, 3), 60, "three active instances after the rebalance")
    steps.append("rebalance apply")
    wait_until(lambda: _converged(api), 60, "every ReplicaSet still has its pods")

    writes = _pod_writes(audit)[baseline:]
    fenced = _proxy_metric(cluster, "range_filter_proxy_fenced_writes_total")
    fallbacks = sum(_proxy_metric(cluster, "range_filter_proxy_consistent_read_fallbacks_total").values())
    print(f"steps: {steps}; rebalance: {moved.stdout.strip()[-300:]}")
    print(f"pod writes after the first convergence: {len(writes)}; fence refusals: {fenced}; fallbacks: {fallbacks}")
    extra = [f"{e.get('verb')} {(e.get('objectRef') or {}).get('name')} by {e.get('userAgent')}" for e in writes]
    assert not writes, (
        f"{len(writes)} pods created or deleted by handovers: {extra[:10]}; {_actions(cluster.managers)[:10]}"
    )
    assert fallbacks == fallbacks_before == 0, f"{fallbacks} consistent reads fell back to an upstream list"
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
