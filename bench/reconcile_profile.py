"""Where the CPU of a ReplicaSet reconcile goes, before and after the indexed stores (issue 49).

Purpose
    In one process, with no API server: the built-in ``replicaset``
    controller's ``reconcile`` over an informer store of ``replicasets`` x
    ``pods_per_rs`` pods (each ReplicaSet's status already right, so a
    reconcile reads and writes nothing, as in the ``scale`` section), timed
    with ``time.thread_time`` per reconcile and profiled with ``cProfile``
    (the functions with the most own time). Two read paths:

    * ``before``: the reconcile as it was before issue 49 (replayed
      verbatim below: every reconcile copies the whole pod store and scans it);
    * ``after``: the controller as it is (the owner and orphan indexes).

    Each with no pods and with ``pods_per_rs``: the CPU-per-reconcile ratio
    with pods over without is the figure the issue's target (<= 1.5) is
    about, here free of HTTP, the workqueue and other processes.

Invariants
    No network: the runtime is a stand-in holding real :class:`Informer`
    stores (filled by their relist path); a reconcile that would call the API
    fails loudly (the client points at a closed port).

Concurrency model
    Single thread.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
import uuid
from typing import Any

from kubernetes import client as k8s

from controller_manager.controller import ReconcileContext, Requeue
from controller_manager.controllers.common import is_terminating, selector_matches
from controller_manager.controllers.replicaset import ReplicaSetController
from controller_manager.informer import Informer
from controller_manager.resources import PODS, REPLICASETS, Resource, controller_ref
from hashing import HashRange

NAMESPACE = "bench"


class _Runtime:
    """What a controller needs of its runtime here: an API client (to nowhere) and the stores."""

    def __init__(self) -> None:
        self.api_client = k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))
        self.informers = {
            r.name: Informer(
                None,
                r,
                path="object.metadata.uid",
                range_source=lambda: (0, HashRange.full()),
                on_event=lambda _e, _o: None,
                name=f"profile-{r.name}",
            )
            for r in (REPLICASETS, PODS)
        }

    def store(self, resource: Resource) -> Informer:
        return self.informers[resource.name]


class LegacyScanController(ReplicaSetController):
    """The ReplicaSet reconcile as it was before issue 49 (the read path replayed verbatim)."""

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        rs = self.rt.store(REPLICASETS).get(key)
        if rs is None:
            self.expectations.forget(key)
            return
        if is_terminating(rs):
            return
        if not self.expectations.satisfied(key):
            raise Requeue(after=0.5)
        meta = rs["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        spec = rs.get("spec") or {}
        want = int(spec.get("replicas", 1))
        selector = spec.get("selector")
        owned: list[dict[str, Any]] = []
        orphans: list[dict[str, Any]] = []
        for pod in self.rt.store(PODS).items():
            pmeta = pod.get("metadata") or {}
            if pmeta.get("namespace") != ns or is_terminating(pod):
                continue
            ref = controller_ref(pod)
            if ref is not None:
                if ref.get("uid") == uid:
                    owned.append(pod)
            elif selector_matches(selector, pmeta.get("labels")):
                orphans.append(pod)
        for pod in orphans:
            if len(owned) >= want:
                break
            if self._adopt(rs, pod, ctx):
                owned.append(pod)
        diff = want - len(owned)
        if diff > 0:
            self._create(rs, diff, ctx)
        elif diff < 0:
            gone = {p["metadata"]["uid"] for p in self._delete(rs, key, owned, -diff, ctx)}
            owned = [p for p in owned if p["metadata"]["uid"] not in gone]
        self._update_status(rs, owned, ctx)


def _objects(replicasets: int, per_rs: int) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """ReplicaSets (status right) and their pods, keyed as the informer keys them."""
    rss: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for i in range(replicasets):
        labels = {"app": "bench-scale", "rs": f"rs-{i}"}
        uid = str(uuid.uuid4())
        rss[f"{NAMESPACE}/rs-{i}"] = {
            "metadata": {"namespace": NAMESPACE, "name": f"rs-{i}", "uid": uid, "generation": 1},
            "spec": {
                "replicas": per_rs,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "app"}]}},
            },
            "status": {
                "replicas": per_rs,
                "fullyLabeledReplicas": per_rs,
                "readyReplicas": 0,
                "availableReplicas": 0,
                "observedGeneration": 1,
            },
        }
        for j in range(per_rs):
            ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"rs-{i}", "uid": uid, "controller": True}
            pods[f"{NAMESPACE}/rs-{i}-{j}"] = {
                "metadata": {
                    "namespace": NAMESPACE,
                    "name": f"rs-{i}-{j}",
                    "uid": str(uuid.uuid4()),
                    "labels": dict(labels),
                    "ownerReferences": [ref],
                },
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Pending"},
            }
    return rss, pods


def _top(profile: cProfile.Profile, calls: int, n: int = 6) -> list[dict[str, Any]]:
    """The ``n`` functions with the most own time: calls per reconcile, share of the profiled time.

    Shares, not microseconds: cProfile's own cost per call inflates many small calls.
    """
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file.rsplit('/', 1)[-1]}:{line}({func})" if line else func
        rows.append({"function": where, "callsPerReconcile": round(nc / calls, 1), "ownShare": tt})
    total = sum(r["ownShare"] for r in rows) or 1.0
    rows.sort(key=lambda r: -r["ownShare"])
    for r in rows:
        r["ownShare"] = round(r["ownShare"] / total, 3)
    return rows[:n]


def _measure(cls: type[ReplicaSetController], replicasets: int, per_rs: int, sample: int) -> dict[str, Any]:
    rt = _Runtime()
    rss, pods = _objects(replicasets, per_rs)
    rt.store(REPLICASETS)._replace(rss, 0)
    rt.store(PODS)._replace(pods, 0)
    ctl = cls(rt)  # type: ignore[arg-type]
    keys = list(rss)[:sample]
    ctx = ReconcileContext("", float("inf"))
    for key in keys[:10]:  # warm up (imports, caches)
        ctl.reconcile(key, ctx)
    t0 = time.thread_time()
    for key in keys:
        ctl.reconcile(key, ctx)
    cpu = time.thread_time() - t0
    profile = cProfile.Profile()
    profile.enable()
    for key in keys:
        ctl.reconcile(key, ctx)
    profile.disable()
    return {
        "pods": len(pods),
        "reconciles": len(keys),
        "cpuUsPerReconcile": round(cpu / len(keys) * 1e6, 1),
        "top": _top(profile, len(keys)),
    }


def run(*, replicasets: int = 5000, pods_per_rs: int = 4, sample: int = 500) -> dict[str, Any]:
    """Before and after, each with no pods and with ``pods_per_rs`` per ReplicaSet (see module docstring)."""
    out: dict[str, Any] = {"replicaSets": replicasets, "podsPerReplicaSet": pods_per_rs, "rows": []}
    for code, cls in (("before", LegacyScanController), ("after", ReplicaSetController)):
        none = _measure(cls, replicasets, 0, sample)
        with_pods = _measure(cls, replicasets, pods_per_rs, sample)
        out["rows"].append(
            {
                "code": code,
                "noPods": none,
                "withPods": with_pods,
                "withPodsOverNoPods": round(with_pods["cpuUsPerReconcile"] / none["cpuUsPerReconcile"], 2),
            }
        )
    return out
