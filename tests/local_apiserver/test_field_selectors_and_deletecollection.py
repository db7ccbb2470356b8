"""Field selectors per kind and deletecollection, as kube-apiserver 1.32 serves them (issue 23).

Each kind's field labels come from one table (``rangeshard.core.fieldlabels``):
kube's labels and how kube renders each value (a Job's ``status.successful``
reads ``status.succeeded``, absent booleans are ``false``, integers decimal).
DELETE on a collection deletes each match through the single delete and
answers the list kind. Checked with the official client, real kubectl and raw
HTTP against a real server on the session etcd.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException
from starlette.requests import Request

from range_filter_proxy.listing import ListOptions
from range_filter_proxy.resources import ResourceInfo
from rangeshard.core.kubeapi import ApiError
from rangeshard.core.rest import GVR
from tests.local_apiserver.conftest import metric, wait_for

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _secret(name: str, type_: str = "Opaque", labels: dict[str, str] | None = None) -> dict[str, Any]:
    data = {"tls.crt": "Y3J0", "tls.key": "a2V5"} if type_ == "kubernetes.io/tls" else {"k": "dg=="}
    return {"metadata": {"name": name, "labels": labels or {}}, "type": type_, "data": data}


def _names(listed: Any) -> list[str]:
    items = listed["items"] if isinstance(listed, dict) else listed.items
    return sorted(i["metadata"]["name"] if isinstance(i, dict) else i.metadata.name for i in items)


def _list(http: httpx.Client, path: str, selector: str) -> list[str]:
    resp = http.get(path, params={"fieldSelector": selector})
    assert resp.status_code == 200, resp.text
    return _names(resp.json())


def test_kube_field_labels_per_kind_with_kube_rendering(kube: Any, http: httpx.Client, namespace: str) -> None:
    core, batch, apps = k8s.CoreV1Api(kube), k8s.BatchV1Api(kube), k8s.AppsV1Api(kube)
    core.create_namespaced_secret(namespace, _secret("tls", "kubernetes.io/tls"))
    core.create_namespaced_secret(namespace, _secret("plain"))
    tls = core.list_namespaced_secret(namespace, field_selector="type=kubernetes.io/tls")
    assert _names(tls) == ["tls"]
    assert _names(core.list_namespaced_secret(namespace, field_selector="type=Opaque")) == ["plain"]
    assert _names(core.list_namespaced_secret(namespace, field_selector="type!=kubernetes.io/tls")) == ["plain"]

    # Services: spec.type (defaulted ClusterIP) and the allocated spec.clusterIP.
    port = [{"port": 80}]
    web = core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {"ports": port}})
    core.create_namespaced_service(namespace, {"metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": port}})
    assert _names(core.list_namespaced_service(namespace, field_selector="spec.type=NodePort")) == ["np"]
    by_ip = core.list_namespaced_service(namespace, field_selector=f"spec.clusterIP={web.spec.cluster_ip}")
    assert _names(by_ip) == ["web"]

    # Jobs: status.successful is kube's name for status.succeeded; absent is 0.
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}
    for name in ("done", "fresh"):
        batch.create_namespaced_job(namespace, {"metadata": {"name": name}, "spec": {"template": template}})
    batch.patch_namespaced_job_status("done", namespace, {"status": {"succeeded": 2}})
    assert _names(batch.list_namespaced_job(namespace, field_selector="status.successful=2")) == ["done"]
    assert _names(batch.list_namespaced_job(namespace, field_selector="status.successful=0")) == ["fresh"]

    # ReplicaSets: status.replicas in decimal, 0 when absent.
    rs = {
        "metadata": {"name": "rs"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }
    apps.create_namespaced_replica_set(namespace, rs)
    assert _names(apps.list_namespaced_replica_set(namespace, field_selector="status.replicas=0")) == ["rs"]

    # Pods: spec.hostNetwork is "false" when absent, spec.serviceAccountName, status.nominatedNodeName;
    # status.podIPs is accepted but never set (as kube 1.32: it compares as "").
    pod = {
        "metadata": {"name": "p"},
        "spec": {"serviceAccountName": "robot", "containers": [{"name": "c", "image": "i"}]},
    }
    core.create_namespaced_pod(namespace, pod)
    for selector, want in (
        ("spec.hostNetwork=false", ["p"]),
        ("spec.hostNetwork=true", []),
        ("spec.serviceAccountName=robot", ["p"]),
        ("status.nominatedNodeName=", ["p"]),
        ("status.podIPs=10.0.0.1", []),
        ("spec.host=", ["p"]),  # kube's old name of spec.nodeName
    ):
        assert _names(core.list_namespaced_pod(namespace, field_selector=selector)) == want, selector

    # Cluster-scoped kinds: nodes (spec.unschedulable, a boolean), CSRs (spec.signerName).
    node = f"n-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node}, "spec": {"unschedulable": True}})
    assert node in _names(core.list_node(field_selector="spec.unschedulable=true"))
    assert node not in _names(core.list_node(field_selector="spec.unschedulable=false"))
    csr = f"csr-{uuid.uuid4().hex[:6]}"
    signer = f"example.com/{csr}"
    http.post(
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        json={
            "metadata": {"name": csr},
            "spec": {"request": "Y3Ny", "signerName": signer, "usages": ["digital signature"]},
        },
    ).raise_for_status()
    csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
    assert _list(http, csrs, f"spec.signerName={signer}") == [csr]

    # Events in both APIs: kube's labels of each, `source` falling back to the reporting controller.
    event = {
        "metadata": {"name": "ev"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": namespace, "fieldPath": "spec.containers{c}"},
        "reason": "Started",
        "type": "Normal",
        "reportingComponent": "kubelet",
        "reportingInstance": "n1",
    }
    core.create_namespaced_event(namespace, event)
    events = f"/api/v1/namespaces/{namespace}/events"
    assert _list(http, events, "involvedObject.fieldPath=spec.containers{c},source=kubelet") == ["ev"]
    assert _list(http, events, "reportingComponent=kubelet,reason=Started") == ["ev"]
    new_events = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    assert _list(http, new_events, "regarding.fieldPath=spec.containers{c},reportingController=kubelet") == ["ev"]
    assert _list(http, new_events, "source=kubelet") == ["ev"]


def test_unsupported_field_label_is_kubes_400(kube: Any, http: httpx.Client, namespace: str) -> None:
    core = k8s.CoreV1Api(kube)
    for call in (
        lambda: core.list_namespaced_secret(namespace, field_selector="spec.type=x"),
        lambda: core.list_node(field_selector="metadata.namespace=x"),  # kube's nodes have no namespace label
        lambda: k8s.BatchV1Api(kube).list_namespaced_job(namespace, field_selector="status.succeeded=1"),
    ):
        with pytest.raises(ApiException) as caught:
            call()
        assert caught.value.status == 400
        assert "field label not supported:" in caught.value.body
    # The watch path refuses it as the list does, before streaming.
    resp = http.get("/api/v1/namespaces", params={"watch": "true", "fieldSelector": "metadata.namespace=x"})
    assert resp.status_code == 400 and resp.json()["reason"] == "BadRequest"


def test_kubectl_field_selectors(kubectl: Kubectl, kube: Any, namespace: str) -> None:
    core = k8s.CoreV1Api(kube)
    core.create_namespaced_secret(namespace, _secret("cert", "kubernetes.io/tls"))
    core.create_namespaced_secret(namespace, _secret("other"))
    out = kubectl("get", "secrets", "-n", namespace, "--field-selector", "type=kubernetes.io/tls", "-o", "name")
    assert out.stdout.split() == ["secret/cert"]
    out = kubectl("get", "ns", "--field-selector", f"status.phase=Active,metadata.name={namespace}", "-o", "name")
    assert out.stdout.split() == [f"namespace/{namespace}"]
    bad = kubectl("get", "secrets", "-n", namespace, "--field-selector", "spec.nope=1", check=False)
    assert bad.returncode != 0 and "field label not supported: spec.nope" in bad.stderr


def test_deletecollection_with_the_official_client_and_a_watch(kube: Any, http: httpx.Client, namespace: str) -> None:
    core = k8s.CoreV1Api(kube)
    for name, type_, app in (("a", "kubernetes.io/tls", "x"), ("b", "Opaque", "x"), ("c", "kubernetes.io/tls", "y")):
        core.create_namespaced_secret(namespace, _secret(name, type_, {"app": app}))
    start = core.list_namespaced_secret(namespace).metadata.resource_version
    before = metric(http, "local_apiserver_requests_total", verb="deletecollection", resource="secrets", code="200")

    core.delete_collection_namespaced_secret(namespace, label_selector="app=x")

    assert _names(core.list_namespaced_secret(namespace, label_selector="app")) == ["c"]
    after = metric(http, "local_apiserver_requests_total", verb="deletecollection", resource="secrets", code="200")
    assert after == before + 1
    # A watch with a field selector sees the DELETED event of the matching deleted object only.
    seen: list[tuple[str, str]] = []
    w = k8s_watch.Watch()
    for ev in w.stream(
        core.list_namespaced_secret,
        namespace,
        field_selector="type=kubernetes.io/tls",
        resource_version=start,
        timeout_seconds=5,
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
        w.stop()
    assert seen == [("DELETED", "a")]


def test_deletecollection_answers_the_list_kind_with_finalizers_and_gc(http: httpx.Client, namespace: str) -> None:
    base = f"/api/v1/namespaces/{namespace}"
    owner = http.post(f"{base}/configmaps", json={"metadata": {"name": "owner", "labels": {"batch": "1"}}}).json()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    http.post(f"{base}/secrets", json={"metadata": {"name": "owned", "ownerReferences": [ref]}}).raise_for_status()
    held = {"metadata": {"name": "held", "labels": {"batch": "1"}, "finalizers": ["example.com/hold"]}}
    http.post(f"{base}/configmaps", json=held).raise_for_status()
    http.post(f"{base}/configmaps", json={"metadata": {"name": "kept"}}).raise_for_status()

    resp = http.request(
        "DELETE",
        f"{base}/configmaps",
        params={"labelSelector": "batch=1"},
        json={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
    )

    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["kind"] == "ConfigMapList" and body["apiVersion"] == "v1"
    assert _names(body) == ["held", "owner"]
    left = http.get(f"{base}/configmaps").json()["items"]
    # The finalizer holds its object, marked for deletion; the unlabelled one is untouched.
    assert {o["metadata"]["name"]: bool(o["metadata"].get("deletionTimestamp")) for o in left} == {
        "held": True,
        "kept": False,
    }
    # The owner's Secret is collected as after a single delete.
    wait_for(lambda: http.get(f"{base}/secrets/owned").status_code == 404, what="owned secret collected")
    http.patch(
        f"{base}/configmaps/held",
        json={"metadata": {"finalizers": None}},
        headers={"content-type": "application/merge-patch+json"},
    ).raise_for_status()
    assert http.get(f"{base}/configmaps/held").status_code == 404


def test_deletecollection_cluster_scoped_and_refusals(http: httpx.Client, namespace: str) -> None:
    roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    tag = uuid.uuid4().hex[:6]
    for i in range(2):
        role = {"metadata": {"name": f"r{i}-{tag}", "labels": {"t": tag}}, "rules": []}
        http.post(roles, json=role).raise_for_status()
    resp = http.delete(roles, params={"labelSelector": f"t={tag}"})
    assert resp.status_code == 200 and resp.json()["kind"] == "ClusterRoleList"
    assert _names(resp.json()) == [f"r0-{tag}", f"r1-{tag}"]
    assert http.get(roles, params={"labelSelector": f"t={tag}"}).json()["items"] == []
    # An unsupported field label is the list's 400; nothing is deleted.
    http.post(f"/api/v1/namespaces/{namespace}/secrets", json=_secret("s")).raise_for_status()
    bad = http.delete(f"/api/v1/namespaces/{namespace}/secrets", params={"fieldSelector": "spec.x=1"})
    assert bad.status_code == 400 and "field label not supported: spec.x" in bad.json()["message"]
    assert http.get(f"/api/v1/namespaces/{namespace}/secrets/s").status_code == 200
    # As kube: no deletecollection of namespaces, none across all namespaces, dryRun refused like every verb.
    assert http.delete("/api/v1/namespaces").status_code == 405
    assert http.delete("/api/v1/secrets").status_code == 405
    dry = http.delete(f"/api/v1/namespaces/{namespace}/secrets", params={"dryRun": "All"})
    assert dry.status_code == 400
    assert http.get(f"/api/v1/namespaces/{namespace}/secrets/s").status_code == 200


def test_kubectl_delete_by_label_deletes_object_by_object(
    kubectl: Kubectl, kube: Any, http: httpx.Client, namespace: str
) -> None:
    core = k8s.CoreV1Api(kube)
    for name, app in (("one", "x"), ("two", "x"), ("three", "y")):
        core.create_namespaced_secret(namespace, _secret(name, labels={"app": app}))
    deletes = metric(http, "local_apiserver_requests_total", verb="delete", resource="secrets")
    collections = metric(http, "local_apiserver_requests_total", verb="deletecollection", resource="secrets")
    out = kubectl("delete", "secrets", "-n", namespace, "-l", "app=x")
    assert sorted(out.stdout.split("\n")[:2]) == ['secret "one" deleted', 'secret "two" deleted']
    assert _names(core.list_namespaced_secret(namespace, label_selector="app")) == ["three"]
    # kubectl lists, then deletes each object: two deletes, no deletecollection.
    assert metric(http, "local_apiserver_requests_total", verb="delete", resource="secrets") == deletes + 2
    assert metric(http, "local_apiserver_requests_total", verb="deletecollection", resource="secrets") == collections


def test_discovery_lists_deletecollection_where_kube_does(http: httpx.Client) -> None:
    core = {r["name"]: r["verbs"] for r in http.get("/api/v1").json()["resources"]}
    assert core["secrets"] == ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    assert "deletecollection" in core["nodes"] and "deletecollection" not in core["namespaces"]
    assert core["pods/status"] == ["get", "patch", "update"]
    rbac = {r["name"]: r["verbs"] for r in http.get("/apis/rbac.authorization.k8s.io/v1").json()["resources"]}
    assert "deletecollection" in rbac["clusterroles"]
    reviews = http.get("/apis/authentication.k8s.io/v1").json()["resources"]
    assert [r["verbs"] for r in reviews] == [["create"]]


def _proxy_options(query: str, info: ResourceInfo) -> ListOptions:
    scope = {"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers": []}
    return ListOptions.parse(Request(scope), None, info)


def test_the_proxy_reads_built_in_field_labels_from_the_same_table() -> None:
    jobs = ResourceInfo(GVR("batch", "v1", "jobs"), "Job", True, frozenset({"list", "watch"}))
    opts = _proxy_options("fieldSelector=status.successful%3D2", jobs)
    assert opts.filter.fields.matches({"status": {"succeeded": 2}})
    assert not opts.filter.fields.matches({"status": {"successful": 2}})
    with pytest.raises(ApiError) as caught:
        _proxy_options("fieldSelector=spec.nope%3D1", jobs)
    assert "field label not supported: spec.nope" in str(caught.value)
    # Resources the table does not name (custom resources): any dotted path, as before.
    widgets = ResourceInfo(GVR("example.com", "v1", "widgets"), "Widget", True, frozenset({"list"}))
    assert _proxy_options("fieldSelector=spec.size%3D3", widgets).filter.fields.matches({"spec": {"size": 3}})
