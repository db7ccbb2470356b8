"""A simulated node plus the sharded controllers feel like a cluster to kubectl.

Real controller managers (a second one joins during a rolling update), the local API server with ``--simulate-node``
and the real kubectl: pods become Running/Ready, ``rollout status`` finishes,
``set image`` rolls gradually within maxSurge/maxUnavailable (checked on every
pod watch event), ``rollout history``/``undo``/``restart`` work, events are
recorded, a deleted pod terminates gracefully, and ``Recreate`` replaces all
pods at once when asked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from tests.e2e.conftest import Cluster, dump_logs
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

KUBECTL = shutil.which("kubectl")
REPLICAS = 4
SURGE = 1
UNAVAILABLE = 1

MANIFEST = f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {REPLICAS}
  strategy:
    type: RollingUpdate
    rollingUpdate: {{maxSurge: {SURGE}, maxUnavailable: {UNAVAILABLE}}}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: main
        image: registry.local/web:1
        readinessProbe:
          initialDelaySeconds: 1
          exec: {{command: [/bin/true]}}
"""


class Kubectl:
    def __init__(self, server: str, home: Path, namespace: str) -> None:
        if KUBECTL is None:
            pytest.fail("kubectl is not installed")
        self.binary = KUBECTL
        self.server = server
        self.home = home
        self.namespace = namespace
        home.mkdir(exist_ok=True)

    def __call__(self, *args: str, timeout: float = 60) -> str:
        cmd = [self.binary, "--server", self.server, "--cache-dir", str(self.home / "cache"), "-n", self.namespace]
        result = subprocess.run(
            [*cmd, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"},
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout


class PodWatch:
    """Follows the namespace's pods; after every event checks how many are asked for and available."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.max_live = 0
        self.min_available = REPLICAS
        self.hashes_together = 0
        self.hashes_present = 0
        self.error: Exception | None = None
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as e:  # the stream ends with the cluster once the watch is no longer needed
            if not self.stop.is_set():
                self.error = e

    def _follow(self) -> None:
        core = k8s.CoreV1Api(self.api)
        listed = core.list_namespaced_pod(self.namespace, _preload_content=False)
        body = json.loads(listed.data)
        for pod in body["items"]:
            self.pods[pod["metadata"]["name"]] = pod
        self.ready.set()
        w = k8s_watch.Watch()
        for event in w.stream(
            core.list_namespaced_pod,
            self.namespace,
            resource_version=body["metadata"]["resourceVersion"],
            timeout_seconds=60,
            _preload_content=False,
        ):
            obj = event["raw_object"]
            name = obj["metadata"]["name"]
            if event["type"] == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = obj
            self._check()
            if self.stop.is_set():
                w.stop()

    def _check(self) -> None:
        live = [p for p in self.pods.values() if not p["metadata"].get("deletionTimestamp")]
        ready = [
            p
            for p in live
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", [])
            )
        ]
        self.max_live = max(self.max_live, len(live))
        self.min_available = min(self.min_available, len(ready))
        hashes = {p["metadata"]["labels"].get("pod-template-hash") for p in live}
        if len(hashes) > 1:
            self.hashes_together += 1
        if len({p["metadata"]["labels"].get("pod-template-hash") for p in self.pods.values()}) > 1:
            self.hashes_present += 1  # terminating pods included

    def __enter__(self) -> PodWatch:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.error is None, f"the pod watch failed: {self.error!r}"


def _pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", "pods", "-o", "json"))["items"]
    return items


def _images(kubectl: Kubectl) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in _pods(kubectl) if not p["metadata"].get("deletionTimestamp")}


def test_pods_ready_rolling_update_history_undo_restart_events(node_cluster: Cluster, tmp_path: Path) -> None:
    cluster = node_cluster
    ns = f"roll-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster.api, ns)
    cluster.start_manager()
    kubectl = Kubectl(cluster.apiserver.url, tmp_path / "home", ns)
    manifest = tmp_path / "web.yaml"
    manifest.write_text(MANIFEST)
    kubectl("create", "--validate=false", "-f", str(manifest))
    try:
        out = kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=70)
    except AssertionError:
        raise AssertionError(dump_logs(cluster)) from None
    assert "successfully rolled out" in out

    # Pods are bound, Running and Ready, with the status a kubelet reports.
    pods = _pods(kubectl)
    assert len(pods) == REPLICAS
    for pod in pods:
        assert pod["spec"]["nodeName"] == "n1"
        status = pod["status"]
        assert status["phase"] == "Running"
        assert status["podIP"].startswith("10.244.") and status["hostIP"] and status["startTime"]
        conds = {c["type"]: c["status"] for c in status["conditions"]}
        assert conds["Ready"] == conds["ContainersReady"] == conds["PodScheduled"] == "True"
        (cs,) = status["containerStatuses"]
        assert cs["ready"] and cs["started"] and cs["restartCount"] == 0 and "running" in cs["state"]
    node = json.loads(kubectl("get", "node", "n1", "-o", "json"))
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"

    dep = json.loads(kubectl("get", "deployment", "web", "-o", "json"))
    assert dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    st = dep["status"]
    assert (st["replicas"], st["updatedReplicas"], st["readyReplicas"], st["availableReplicas"]) == (4, 4, 4, 4)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"
    (rs,) = json.loads(kubectl("get", "rs", "-o", "json"))["items"]
    assert rs["status"]["readyReplicas"] == rs["status"]["availableReplicas"] == 4

    # A rolling `set image`: gradual, within the surge and unavailability bounds, while a second
    # manager joins (a handover of half the hash space in the middle of the rollout).
    with PodWatch(cluster.api, ns) as watch:
        kubectl("set", "image", "deployment/web", "main=registry.local/web:2")
        cluster.start_manager()
        kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=70)
        wait_until(lambda: len(watch.pods) == REPLICAS, 30, "old pods to terminate")
    assert watch.max_live <= REPLICAS + SURGE, watch.max_live
    assert watch.min_available >= REPLICAS - UNAVAILABLE, watch.min_available
    assert watch.hashes_together > 0, "old and new pods never ran together: not a rolling update"
    assert _images(kubectl) == {"registry.local/web:2"}

    history = kubectl("rollout", "history", "deployment/web")
    revisions = [line.split()[0] for line in history.splitlines()[2:] if line.strip()]
    assert revisions == ["1", "2"], history

    kubectl("rollout", "undo", "deployment/web")
    kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=70)
    wait_until(lambda: _images(kubectl) == {"registry.local/web:1"}, 30, "the undo to bring back image 1")
    dep = json.loads(kubectl("get", "deployment", "web", "-o", "json"))
    assert dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"

    kubectl("rollout", "restart", "deployment/web")
    kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=70)
    history = kubectl("rollout", "history", "deployment/web")
    revisions = [line.split()[0] for line in history.splitlines()[2:] if line.strip()]
    assert revisions == ["2", "3", "4"], history

    # Graceful deletion: the pod is Terminating first (grace period 30 s), the node removes it
    # once its containers stopped.
    victim = next(p for p in _pods(kubectl) if not p["metadata"].get("deletionTimestamp"))["metadata"]["name"]
    answer = k8s.CoreV1Api(cluster.api).delete_namespaced_pod(victim, ns, _preload_content=False)
    terminating = json.loads(answer.data)["metadata"]  # the pod as the delete left it
    assert terminating["deletionTimestamp"] and terminating["deletionGracePeriodSeconds"] == 30
    wait_until(lambda: victim not in {p["metadata"]["name"] for p in _pods(kubectl)}, 20, "the node to remove the pod")

    # Recreate when asked: the old pods are gone (not even terminating) before new ones start.
    wait_until(
        lambda: not any(p["metadata"].get("deletionTimestamp") for p in _pods(kubectl)), 20, "no pod terminating"
    )
    kubectl(
        "patch",
        "deployment/web",
        "--type=merge",
        "-p",
        '{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}',
    )
    with PodWatch(cluster.api, ns) as watch:
        kubectl("set", "image", "deployment/web", "main=registry.local/web:3")
        kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=70)
    assert watch.hashes_present == 0 and watch.max_live <= REPLICAS
    assert _images(kubectl) == {"registry.local/web:3"}
    assert "ScalingReplicaSet" in kubectl("describe", "deployment", "web")

    events = json.loads(kubectl("get", "events", "-o", "json"))["items"]
    reasons = {e["reason"] for e in events}
    expected = {"ScalingReplicaSet", "SuccessfulCreate", "SuccessfulDelete", "Scheduled", "Started", "Killing"}
    assert expected <= reasons, reasons
    # A manager whose ranges hold neither the deployment nor any of its replicasets rightly reconciled nothing.
    assert cluster.overlaps(may_be_idle=cluster.idle_in(ns)) == []
    for manager in cluster.managers:  # nothing left to prove: skip the graceful leaves of the teardown
        manager.kill()
