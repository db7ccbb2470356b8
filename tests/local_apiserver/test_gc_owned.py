"""An owner's delete collects its owned Secrets and Services (issue 23), with the official client and real kubectl.

Owners: a ConfigMap, a Deployment and a custom resource. Propagation:
``Background`` (the default, and ``kubectl delete --cascade=background``),
``Foreground`` (the owner stays with ``deletionTimestamp`` and the
``foregroundDeletion`` finalizer until its dependents are gone; a dependent
held by its own finalizer holds the owner) and ``Orphan`` (dependents kept,
the reference to the owner removed). A Service collected by the garbage
collector releases its cluster IP: a new Service may ask for it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.local_apiserver.conftest import wait_for

HOLD = "example.org/hold"


@pytest.fixture(scope="module")
def gadgets(apiserver: Any) -> str:
    """A namespaced CRD ``gadgets.<group>``; its group."""
    group = f"g{uuid.uuid4().hex[:8]}.example.org"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    with httpx.Client(base_url=apiserver.url, timeout=10.0) as http:
        resp = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        assert resp.status_code == 201, resp.text

        def served() -> bool:
            r = http.get(f"/apis/{group}/v1")
            return r.status_code == 200 and any(x["name"] == "gadgets" for x in r.json()["resources"])

        wait_for(served, timeout=10, what="the Gadget CRD served")
    return group


def _owner(kube: Any, namespace: str, kind: str, name: str, group: str) -> dict[str, Any]:
    """Create an owner of ``kind``; its ownerReference (controller, blockOwnerDeletion)."""
    if kind == "ConfigMap":
        obj = k8s.CoreV1Api(kube).create_namespaced_config_map(namespace, {"metadata": {"name": name}})
        api_version = "v1"
    elif kind == "Deployment":
        labels = {"app": name}
        body = {
            "metadata": {"name": name},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}},
            },
        }
        obj = k8s.AppsV1Api(kube).create_namespaced_deployment(namespace, body)
        api_version = "apps/v1"
    else:
        body = {"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": name}}
        created = k8s.CustomObjectsApi(kube).create_namespaced_custom_object(group, "v1", namespace, "gadgets", body)
        return {
            "apiVersion": f"{group}/v1",
            "kind": "Gadget",
            "name": name,
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": obj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _dependents(kube: Any, namespace: str, name: str, ref: dict[str, Any], finalizers: list[str] | None = None) -> str:
    """A Secret and a Service ``<name>-dep`` owned by ``ref``; the Service's cluster IP."""
    core = k8s.CoreV1Api(kube)
    meta: dict[str, Any] = {"name": f"{name}-dep", "ownerReferences": [ref]}
    if finalizers:
        meta["finalizers"] = finalizers
    core.create_namespaced_secret(namespace, {"metadata": meta, "stringData": {"k": "v"}})
    svc = core.create_namespaced_service(namespace, {"metadata": meta, "spec": {"ports": [{"port": 80}]}})
    return str(svc.spec.cluster_ip)


def _exists(read: Callable[..., Any], *args: Any) -> Any:
    try:
        return read(*args)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _owner_exists(kube: Any, namespace: str, kind: str, name: str, group: str) -> Any:
    if kind == "ConfigMap":
        return _exists(k8s.CoreV1Api(kube).read_namespaced_config_map, name, namespace)
    if kind == "Deployment":
        return _exists(k8s.AppsV1Api(kube).read_namespaced_deployment, name, namespace)
    custom = k8s.CustomObjectsApi(kube)
    return _exists(custom.get_namespaced_custom_object, group, "v1", namespace, "gadgets", name)


def _kubectl_kind(kind: str, group: str) -> str:
    return {"ConfigMap": "configmap", "Deployment": "deployment.apps"}.get(kind, f"gadgets.{group}")


def _both_gone(core: Any, namespace: str, name: str) -> bool:
    return (
        _exists(core.read_namespaced_secret, f"{name}-dep", namespace) is None
        and _exists(core.read_namespaced_service, f"{name}-dep", namespace) is None
    )


def _ip_is_free(core: Any, namespace: str, ip: str) -> None:
    """The released cluster IP can be asked for again (the allocator reads the stored Services)."""
    again = core.create_namespaced_service(
        namespace,
        {"metadata": {"name": f"again-{uuid.uuid4().hex[:6]}"}, "spec": {"clusterIP": ip, "ports": [{"port": 80}]}},
    )
    assert again.spec.cluster_ip == ip


@pytest.mark.parametrize("kind", ["ConfigMap", "Deployment", "Gadget"])
@pytest.mark.parametrize("tool", ["client", "kubectl"])
def test_background_delete_collects_secret_and_service(
    kube: Any, namespace: str, kubectl: Callable[..., Any], gadgets: str, kind: str, tool: str
) -> None:
    core = k8s.CoreV1Api(kube)
    name = f"bg-{kind.lower()}"
    ref = _owner(kube, namespace, kind, name, gadgets)
    ip = _dependents(kube, namespace, name, ref)
    # While the Service holds its IP, nobody else gets it.
    with pytest.raises(ApiException) as taken:
        _ip_is_free(core, namespace, ip)
    assert taken.value.status == 422 and "already allocated" in taken.value.body
    if tool == "kubectl":
        out = kubectl("delete", "-n", namespace, _kubectl_kind(kind, gadgets), name, "--cascade=background").stdout
        assert "deleted" in out
    elif kind == "ConfigMap":
        core.delete_namespaced_config_map(name, namespace)  # no DeleteOptions: Background is the default
    elif kind == "Deployment":
        k8s.AppsV1Api(kube).delete_namespaced_deployment(name, namespace, propagation_policy="Background")
    else:
        k8s.CustomObjectsApi(kube).delete_namespaced_custom_object(gadgets, "v1", namespace, "gadgets", name)
    assert _owner_exists(kube, namespace, kind, name, gadgets) is None  # Background: the owner goes at once
    wait_for(lambda: _both_gone(core, namespace, name), timeout=15, what="the owned Secret and Service collected")
    _ip_is_free(core, namespace, ip)


@pytest.mark.parametrize("kind", ["ConfigMap", "Deployment", "Gadget"])
def test_foreground_owner_waits_for_its_secret_and_service(
    kube: Any, namespace: str, gadgets: str, kind: str, http: httpx.Client
) -> None:
    core = k8s.CoreV1Api(kube)
    name = f"fg-{kind.lower()}"
    ref = _owner(kube, namespace, kind, name, gadgets)
    ip = _dependents(kube, namespace, name, ref, finalizers=[HOLD])
    base = {"ConfigMap": "/api/v1", "Deployment": "/apis/apps/v1"}.get(kind, f"/apis/{gadgets}/v1")
    plural = {"ConfigMap": "configmaps", "Deployment": "deployments"}.get(kind, "gadgets")
    # propagationPolicy in the DeleteOptions body, as client-go sends it.
    resp = http.request(
        "DELETE",
        f"{base}/namespaces/{namespace}/{plural}/{name}",
        json={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
    )
    assert resp.status_code in (200, 202), resp.text
    assert resp.json()["metadata"]["finalizers"] == ["foregroundDeletion"]

    def dependents_terminating() -> bool:
        secret = _exists(core.read_namespaced_secret, f"{name}-dep", namespace)
        svc = _exists(core.read_namespaced_service, f"{name}-dep", namespace)
        return bool(secret and secret.metadata.deletion_timestamp and svc and svc.metadata.deletion_timestamp)

    wait_for(dependents_terminating, timeout=15, what="the dependents marked for deletion")
    owner = _owner_exists(kube, namespace, kind, name, gadgets)  # held by its dependents' finalizers
    if isinstance(owner, dict):  # a custom object: plain JSON
        deleting, finalizers = owner["metadata"].get("deletionTimestamp"), owner["metadata"].get("finalizers")
    else:
        deleting, finalizers = owner.metadata.deletion_timestamp, owner.metadata.finalizers
    assert deleting and finalizers == ["foregroundDeletion"]

    for patch in (core.patch_namespaced_secret, core.patch_namespaced_service):
        patch(f"{name}-dep", namespace, {"metadata": {"finalizers": None}})
    wait_for(lambda: _both_gone(core, namespace, name), timeout=15, what="the dependents gone")
    wait_for(
        lambda: _owner_exists(kube, namespace, kind, name, gadgets) is None, timeout=15, what="the owner deleted last"
    )
    _ip_is_free(core, namespace, ip)


def test_kubectl_cascade_foreground_waits_until_the_dependents_are_gone(
    kube: Any, namespace: str, kubectl: Callable[..., Any], gadgets: str
) -> None:
    core = k8s.CoreV1Api(kube)
    ref = _owner(kube, namespace, "Gadget", "fgk", gadgets)
    _dependents(kube, namespace, "fgk", ref)
    out = kubectl("delete", "-n", namespace, f"gadgets.{gadgets}", "fgk", "--cascade=foreground").stdout
    assert "deleted" in out
    # kubectl waits for the owner to leave, which is only after its dependents left.
    assert _owner_exists(kube, namespace, "Gadget", "fgk", gadgets) is None
    assert _both_gone(core, namespace, "fgk")


@pytest.mark.parametrize(("kind", "tool"), [("ConfigMap", "kubectl"), ("Deployment", "client"), ("Gadget", "kubectl")])
def test_orphan_keeps_secret_and_service_without_the_reference(
    kube: Any, namespace: str, kubectl: Callable[..., Any], gadgets: str, kind: str, tool: str
) -> None:
    core = k8s.CoreV1Api(kube)
    name = f"or-{kind.lower()}"
    ref = _owner(kube, namespace, kind, name, gadgets)
    ip = _dependents(kube, namespace, name, ref)
    if tool == "kubectl":
        kubectl("delete", "-n", namespace, _kubectl_kind(kind, gadgets), name, "--cascade=orphan")
    else:
        k8s.AppsV1Api(kube).delete_namespaced_deployment(
            name, namespace, body=k8s.V1DeleteOptions(propagation_policy="Orphan")
        )
    wait_for(lambda: _owner_exists(kube, namespace, kind, name, gadgets) is None, timeout=15, what="the owner deleted")

    def orphaned() -> bool:
        secret = core.read_namespaced_secret(f"{name}-dep", namespace)
        svc = core.read_namespaced_service(f"{name}-dep", namespace)
        return not secret.metadata.owner_references and not svc.metadata.owner_references

    wait_for(orphaned, timeout=15, what="the owner references removed")
    # Kept, and nothing collects them later; the Service keeps its IP.
    svc = core.read_namespaced_service(f"{name}-dep", namespace)
    assert svc.spec.cluster_ip == ip and svc.metadata.deletion_timestamp is None
    assert core.read_namespaced_secret(f"{name}-dep", namespace).data == {"k": "dg=="}


def test_legacy_orphan_dependents_and_bad_policy(kube: Any, namespace: str, http: httpx.Client, gadgets: str) -> None:
    core = k8s.CoreV1Api(kube)
    ref = _owner(kube, namespace, "ConfigMap", "legacy", gadgets)
    _dependents(kube, namespace, "legacy", ref)
    bad = http.delete(f"/api/v1/namespaces/{namespace}/configmaps/legacy", params={"propagationPolicy": "Sideways"})
    assert bad.status_code == 422 and bad.json()["kind"] == "Status", bad.text
    # The same policy in the DeleteOptions body is the same 422 (kube validates both alike), not a 400.
    url = f"/api/v1/namespaces/{namespace}/configmaps/legacy"
    bad = http.request("DELETE", url, json={"propagationPolicy": "Sideways"})
    assert bad.status_code == 422 and bad.json()["reason"] == "Invalid", bad.text
    both = http.request("DELETE", url, json={"propagationPolicy": "Orphan", "orphanDependents": True})
    assert both.status_code == 422 and "both" in both.json()["message"], both.text
    assert _owner_exists(kube, namespace, "ConfigMap", "legacy", gadgets) is not None
    ok = http.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/legacy", json={"orphanDependents": True})
    assert ok.status_code == 200, ok.text
    wait_for(
        lambda: not core.read_namespaced_service("legacy-dep", namespace).metadata.owner_references,
        timeout=15,
        what="orphanDependents: true orphans",
    )
    assert core.read_namespaced_secret("legacy-dep", namespace).metadata.owner_references is None


def test_foreground_waits_only_for_blocking_dependents(kube: Any, namespace: str, gadgets: str) -> None:
    """As kube: the owner waits for dependents whose reference has ``blockOwnerDeletion: true``, not the others."""
    core = k8s.CoreV1Api(kube)
    ref = _owner(kube, namespace, "ConfigMap", "fgb", gadgets)
    loose = {**ref, "blockOwnerDeletion": False}
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "fgb-loose", "ownerReferences": [loose], "finalizers": [HOLD]}}
    )
    core.create_namespaced_secret(namespace, {"metadata": {"name": "fgb-plain", "ownerReferences": [loose]}})
    core.delete_namespaced_config_map("fgb", namespace, propagation_policy="Foreground")
    wait_for(
        lambda: _owner_exists(kube, namespace, "ConfigMap", "fgb", gadgets) is None,
        timeout=15,
        what="the owner gone although a non-blocking dependent is held by its finalizer",
    )
    held = core.read_namespaced_secret("fgb-loose", namespace)
    assert held.metadata.deletion_timestamp is not None  # deleted too, only held by its own finalizer
    wait_for(
        lambda: _exists(core.read_namespaced_secret, "fgb-plain", namespace) is None, timeout=15, what="plain collected"
    )
    core.patch_namespaced_secret("fgb-loose", namespace, {"metadata": {"finalizers": None}})
    wait_for(lambda: _exists(core.read_namespaced_secret, "fgb-loose", namespace) is None, timeout=15, what="released")


def test_foreground_waits_for_the_whole_blocking_tree(kube: Any, namespace: str, gadgets: str) -> None:
    """Deployment -> ConfigMap -> Secret (held by a finalizer): the middle is deleted in the foreground too."""
    core = k8s.CoreV1Api(kube)
    top = _owner(kube, namespace, "Deployment", "tree", gadgets)
    mid = core.create_namespaced_config_map(namespace, {"metadata": {"name": "tree-mid", "ownerReferences": [top]}})
    mid_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "tree-mid", "uid": mid.metadata.uid,
               "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "tree-leaf", "ownerReferences": [mid_ref], "finalizers": [HOLD]}}
    )
    k8s.AppsV1Api(kube).delete_namespaced_deployment("tree", namespace, propagation_policy="Foreground")
    wait_for(
        lambda: core.read_namespaced_secret("tree-leaf", namespace).metadata.deletion_timestamp,
        timeout=15,
        what="the leaf marked for deletion",
    )
    middle = core.read_namespaced_config_map("tree-mid", namespace)
    assert middle.metadata.deletion_timestamp and middle.metadata.finalizers == ["foregroundDeletion"]
    assert _owner_exists(kube, namespace, "Deployment", "tree", gadgets).metadata.finalizers == ["foregroundDeletion"]

    core.patch_namespaced_secret("tree-leaf", namespace, {"metadata": {"finalizers": None}})
    wait_for(
        lambda: _owner_exists(kube, namespace, "Deployment", "tree", gadgets) is None,
        timeout=15,
        what="the top owner gone once the tree is",
    )
    assert _exists(core.read_namespaced_config_map, "tree-mid", namespace) is None
    assert _exists(core.read_namespaced_secret, "tree-leaf", namespace) is None
