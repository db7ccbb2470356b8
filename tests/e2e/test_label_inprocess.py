"""``by: label`` for an in-process controller: the built-in ReplicaSet controller places ReplicaSets and pods by
a tenant label, with fencing on.

Config: ``controllers.replicaset.shard: [{resource: replicasets.apps, by: label, label: example.com/tenant},
{resource: pods, by: label, label: example.com/tenant}]`` (its pods carry the template's labels). Through
2 -> 3 managers and a scale round every ReplicaSet converges; after the third joined, each tenant's
ReplicaSets are reconciled by the one instance that owns the tenant's hash; the reconcile audit shows no
overlap, the API server's audit log no stale-owner write, and the proxy fenced no current owner by
disagreement.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client as k8s

from controller_manager.audit import read_records
from hashing import hash_key
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace, replicasets_converged, scale_replicaset
from tests.e2e.test_manager import all_active
from tests.e2e.test_shard_rules import _fenced
from tests.helpers import wait_until

KEY = "example.com/tenant"
TENANTS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
NS = "tenants"
CONTROLLERS = {
    "replicaset": {
        "workers": 2,
        "shard": [
            {"resource": "replicasets.apps", "by": "label", "label": KEY},
            {"resource": "pods", "by": "label", "label": KEY},
        ],
    }
}


def _replicaset(name: str, tenant: str) -> dict[str, Any]:
    labels = {"app": name, KEY: tenant}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": {KEY: tenant}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def test_in_process_replicasets_placed_by_a_tenant_label(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    create_namespace(api, NS)
    tenant_of = {f"{t}-{j}": t for t in TENANTS for j in range(2)}
    for name, tenant in tenant_of.items():
        k8s.AppsV1Api(api).create_namespaced_replica_set(NS, _replicaset(name, tenant))
    for _ in range(2):
        cluster.start_manager(CONTROLLERS)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 60, "2 active")
    wait_until(lambda: replicasets_converged(api, NS), 60, "converged with 2")
    cluster.start_manager(CONTROLLERS)
    wait_until(lambda: all_active(cluster, "replicaset", 3), 60, "3 active")
    snap = cluster.snapshot("replicaset")
    assert all(m.record.main_resource is not None and m.record.main_resource.label_key == KEY for m in snap)
    since = time.time()
    for name in tenant_of:
        scale_replicaset(api, NS, name, 2)
    wait_until(lambda: replicasets_converged(api, NS), 60, "converged with 3 after a scale round")
    owner = {t: snap.owner_of(hash_key(t)).instance_id for t in TENANTS}  # type: ignore[union-attr]
    records = [r for m in cluster.managers if m.audit.exists() for r in read_records([m.audit]) if r.start >= since]
    by_key: dict[str, set[str]] = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.instance_id)
    for name, tenant in tenant_of.items():
        assert by_key.get(f"{NS}/{name}") == {owner[tenant]}, (name, tenant, by_key.get(f"{NS}/{name}"), owner)
    pods = k8s.CoreV1Api(api).list_namespaced_pod(NS).items
    assert len(pods) == 2 * len(tenant_of) and all(p.metadata.labels[KEY] for p in pods)
    assert cluster.overlaps(may_be_idle=cluster.managers) == []
    fenced = _fenced(cluster)
    assert fenced.get("ShardHashMismatch", 0) == 0 and fenced.get("UnreadableBody", 0) == 0, fenced
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
