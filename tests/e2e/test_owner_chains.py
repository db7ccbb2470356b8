"""Owner chains through the endpoint: controllers that read two levels down see exactly their Deployments' pods.

Unmodified official-client controllers (tests/e2e/rules_child.py) as
``external:`` entries of every manager, fencing proxy, local API server:

* ``deploy`` and ``rs`` build Deployment -> ReplicaSet -> Pod trees in one
  namespace (as in tests/e2e/test_shard_rules.py);
* ``tree-a`` and ``tree-b``, two controller types of the same code, read
  ``deployments.apps`` by ``uid``, ``replicasets.apps`` by ``owner`` and
  ``pods`` by ``root`` through ``replicasets.apps``: each instance counts the
  pods under each of its Deployments (an annotation on the Deployment) and
  annotates those pods (writes the fence judges by the Deployment's key).

Checked with 2 and then 3 managers and after re-parenting ReplicaSets by hand:
every pod is seen by exactly one instance of each tree type, no instance sees
a pod whose chain leads elsewhere, every Deployment's count is right, and the
audit log shows no stale-owner write.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

CHILD = Path(__file__).with_name("rules_child.py")
NS = "chains"
HAND = "chains-hand"  # trees the test builds and re-parents itself (no controller creates pods there)
TREE = "chains-tree"  # the tree controllers' ConfigMaps
DEPLOYMENTS = 8
TREES = ("tree-a", "tree-b")


def _controllers() -> dict[str, Any]:
    def entry(mode: str, arg: str, shard: list[dict[str, Any]]) -> dict[str, Any]:
        return {"external": {"command": [sys.executable, str(CHILD), mode, arg], "shard": shard, "drainSeconds": 1.0}}

    tree_shard = [
        {"resource": "deployments.apps", "by": "uid", "main": True},
        {"resource": "replicasets.apps", "by": "owner"},
        {"resource": "pods", "by": "root", "via": ["replicasets.apps"]},
    ]
    return {
        "deploy": entry(
            "deploy", NS, [{"resource": "deployments.apps"}, {"resource": "replicasets.apps", "by": "owner"}]
        ),
        "rs": entry("replicaset", NS, [{"resource": "replicasets.apps"}, {"resource": "pods", "by": "owner"}]),
        **{t: entry("tree", TREE, tree_shard) for t in TREES},
    }


def _template(app: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"tree": TREE}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": _template(name)},
    }


def _ref(kind: str, obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": True,
    }


def _active(cluster: Cluster, n: int) -> bool:
    for ctype in ("deploy", "rs", *TREES):
        snap = cluster.snapshot(ctype)
        if len(snap) != n or not all(m.record.state.value == "active" and not m.record.is_locked for m in snap):
            return False
    return True


def _expected_counts(api: Any) -> dict[tuple[str, str], int]:
    """(namespace, Deployment) -> live pods whose ReplicaSet it controls, from the API server."""
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    deployments = apps.list_deployment_for_all_namespaces(label_selector=f"tree={TREE}").items
    rs_owner = {rs.metadata.uid: _controller(rs) for rs in apps.list_replica_set_for_all_namespaces().items}
    counts = {(d.metadata.namespace, d.metadata.name): 0 for d in deployments}
    by_uid = {d.metadata.uid: (d.metadata.namespace, d.metadata.name) for d in deployments}
    for p in core.list_pod_for_all_namespaces().items:
        top = rs_owner.get(_controller(p) or "")
        if top in by_uid:
            counts[by_uid[top]] += 1
    return counts


def _controller(obj: Any) -> str | None:
    for ref in obj.metadata.owner_references or []:
        if ref.controller:
            return str(ref.uid)
    return None


def _trees_agree(cluster: Cluster) -> bool:
    """Every tree type: counts right, each pod seen once, nothing foreign, by the current instances."""
    api = cluster.api
    want = _expected_counts(api)
    if not want or any(v == 0 for (ns, _), v in want.items() if ns == NS):
        return False
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    deployments = apps.list_deployment_for_all_namespaces(label_selector=f"tree={TREE}").items
    have = {(d.metadata.namespace, d.metadata.name): (d.metadata.annotations or {}) for d in deployments}
    # Both tree types write the same annotation; each pass compares with its own count, so it settles only when equal.
    if any(have[k].get("rules.test/pods") != str(v) for k, v in want.items()):
        return False
    seen = {cm.metadata.name: cm.data or {} for cm in core.list_namespaced_config_map(TREE).items}
    total = sum(want.values())
    for ctype in TREES:
        ids = {m.instance_id for m in cluster.snapshot(ctype)}
        views = [seen.get(f"tree-{i}") for i in ids]
        if any(v is None or v.get("foreign") != "0" for v in views):
            return False
        if sum(int(v["pods"]) for v in views if v is not None) != total:
            return False
    return True


def test_controllers_reading_two_levels_down_see_exactly_their_deployments_pods(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    for ns in (NS, HAND, TREE):
        create_namespace(api, ns)
    for i in range(DEPLOYMENTS):
        apps.create_namespaced_deployment(NS, _deployment(f"d{i}", i % 3 + 1))
    # By hand: two Deployments, a ReplicaSet of the first with three pods (no controller manages HAND).
    e1 = apps.create_namespaced_deployment(HAND, _deployment("e1", 0))
    e2 = apps.create_namespaced_deployment(HAND, _deployment("e2", 0))
    rs_body = {
        "metadata": {"name": "r1", "ownerReferences": [_ref("Deployment", e1)]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "r1"}}, "template": _template("r1")},
    }
    r1 = apps.create_namespaced_replica_set(HAND, rs_body)
    for j in range(3):
        meta = {"name": f"r1-{j}", "labels": {"app": "r1"}, "ownerReferences": [_ref("ReplicaSet", r1)]}
        core.create_namespaced_pod(HAND, {"metadata": meta, "spec": _template("r1")["spec"]})

    managers = [cluster.start_manager(_controllers()) for _ in range(2)]
    wait_until(lambda: _active(cluster, 2), 90, "two active instances of each type")
    wait_until(lambda: _trees_agree(cluster), 120, "tree controllers agree with two managers", interval=0.5)
    assert _expected_counts(api)[(HAND, "e1")] == 3

    # Re-parent the hand-made ReplicaSet: its pods move to e2's instance, and the counts follow.
    replace = [{"op": "replace", "path": "/metadata/ownerReferences", "value": [_ref("Deployment", e2)]}]
    apps.patch_namespaced_replica_set("r1", HAND, replace)  # a JSON patch: a strategic one would merge the refs
    wait_until(lambda: _expected_counts(api)[(HAND, "e2")] == 3, 10, "r1 re-parented")
    wait_until(lambda: _trees_agree(cluster), 60, "counts follow the re-parenting", interval=0.5)

    managers.append(cluster.start_manager(_controllers()))
    wait_until(lambda: _active(cluster, 3), 90, "three active instances of each type")
    # Orphan it: its pods' root is now the ReplicaSet itself, under no Deployment.
    apps.patch_namespaced_replica_set("r1", HAND, [{"op": "remove", "path": "/metadata/ownerReferences"}])
    wait_until(lambda: _expected_counts(api)[(HAND, "e2")] == 0, 10, "r1 orphaned")
    for i in range(DEPLOYMENTS):
        apps.patch_namespaced_deployment(f"d{i}", NS, {"spec": {"replicas": (i + 1) % 3 + 1}})
    wait_until(lambda: _trees_agree(cluster), 120, "tree controllers agree with three managers", interval=0.5)

    # Every pod of NS was annotated by a tree controller (a pod write judged by its Deployment's key).
    pods = core.list_namespaced_pod(NS).items
    assert pods and all((p.metadata.annotations or {}).get("rules.test/tree") for p in pods)
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
    fenced = [ln for ln in (cluster.workdir / "proxy.log").read_text().splitlines() if "ShardHashMismatch" in ln]
    assert not fenced, fenced[:5]
