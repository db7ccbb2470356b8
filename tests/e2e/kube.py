"""Small helpers over the official kubernetes client for the end-to-end tests."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubernetes import client as k8s

from hashing import MAX_HASH, hash_key

TEMPLATE = {"metadata": {"labels": {}}, "spec": {"containers": [{"name": "main", "image": "registry.local/pause:1"}]}}


def create_namespace(api: Any, name: str) -> None:
    k8s.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _template(app: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "registry.local/pause:1"}]},
    }


def create_replicaset(api: Any, ns: str, name: str, replicas: int) -> None:
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": _template(name)},
    }
    k8s.AppsV1Api(api).create_namespaced_replica_set(ns, body)


def create_replicasets_in_both_halves(api: Any, ns: str, count: int, max_extra: int = 20) -> list[str]:
    """Create ``count`` ReplicaSets (``rs0``...), and more (``rs-extra0``...) until both halves of the space hold one.

    The second instance of a type owns one half of the hash space: a test that
    needs it to reconcile (or something to move) cannot rely on luck, since
    with 8 objects one half holds none in 1 run of 128. Returns every name.
    """
    names = [f"rs{i}" for i in range(count)]
    for name in names:
        create_replicaset(api, ns, name, 1)
    for extra in range(max_extra):
        keys = [hash_key(rs.metadata.uid) for rs in k8s.AppsV1Api(api).list_namespaced_replica_set(ns).items]
        if any(k <= MAX_HASH // 2 for k in keys) and any(k > MAX_HASH // 2 for k in keys):
            return names
        names.append(f"rs-extra{extra}")
        create_replicaset(api, ns, names[-1], 1)
    raise AssertionError(f"{len(names)} ReplicaSets and still one half of the hash space holds none")


def create_deployment(api: Any, ns: str, name: str, replicas: int) -> None:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": _template(name)},
    }
    k8s.AppsV1Api(api).create_namespaced_deployment(ns, body)


def scale_replicaset(api: Any, ns: str, name: str, replicas: int) -> None:
    k8s.AppsV1Api(api).patch_namespaced_replica_set_scale(
        name, ns, {"spec": {"replicas": replicas}}, _content_type="application/merge-patch+json"
    )


def raw_list(api: Any, path: str) -> list[dict[str, Any]]:
    import orjson  # noqa: PLC0415

    resp = api.call_api("GET", api.configuration.host + path, header_params={"Accept": "application/json"})
    resp.read()
    items: list[dict[str, Any]] = orjson.loads(resp.data)["items"]
    return items


def pods_by_owner(api: Any, ns: str) -> Counter[str]:
    """Live (not terminating) pods per controlling owner name."""
    counts: Counter[str] = Counter()
    for pod in raw_list(api, f"/api/v1/namespaces/{ns}/pods"):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                counts[ref["name"]] += 1
    return counts


def replicasets(api: Any, ns: str) -> list[dict[str, Any]]:
    return raw_list(api, f"/apis/apps/v1/namespaces/{ns}/replicasets")


def deployments(api: Any, ns: str) -> list[dict[str, Any]]:
    return raw_list(api, f"/apis/apps/v1/namespaces/{ns}/deployments")


def replicasets_converged(api: Any, ns: str) -> bool:
    pods = pods_by_owner(api, ns)
    for rs in replicasets(api, ns):
        want = rs["spec"].get("replicas", 1)
        if pods.get(rs["metadata"]["name"], 0) != want:
            return False
        if (rs.get("status") or {}).get("replicas", 0) != want:
            return False
    return True


def deployments_converged(api: Any, ns: str) -> bool:
    """Every deployment has exactly one RS with spec.replicas pods, and the right status."""
    rss = replicasets(api, ns)
    pods = pods_by_owner(api, ns)
    for d in deployments(api, ns):
        uid = d["metadata"]["uid"]
        want = d["spec"].get("replicas", 1)
        owned = [
            rs
            for rs in rss
            if any(r.get("uid") == uid and r.get("controller") for r in rs["metadata"].get("ownerReferences") or [])
        ]
        total = sum(pods.get(rs["metadata"]["name"], 0) for rs in owned)
        if len(owned) != 1 or total != want:
            return False
        if (d.get("status") or {}).get("replicas", 0) != want:
            return False
    return True
