"""CustomResourceDefinitions in the local API server: served at once, CRUD, watch, schema, subresources, GC, kubectl."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from controller_manager.resources import Resource, discover_scope
from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.errors import ControllerError
from rangeshard.core.etcdserver import EtcdServer
from tests.local_apiserver.conftest import Server, wait_for


def widget_crd(group: str, *, scope: str = "Namespaced") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                    "additionalPrinterColumns": [{"name": "Color", "type": "string", "jsonPath": ".spec.color"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["color"],
                                    "properties": {
                                        "color": {"type": "string", "enum": ["red", "green", "blue"]},
                                        "replicas": {"type": "integer", "minimum": 0, "default": 1},
                                        "size": {"type": "string", "default": "M"},
                                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    },
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {"replicas": {"type": "integer"}, "ready": {"type": "boolean"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def widget(name: str, group: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def new_group() -> str:
    return f"t{uuid.uuid4().hex[:8]}.example.com"


def install(http: httpx.Client, group: str, **kw: Any) -> float:
    """Create the CRD; seconds until its resource was in discovery."""
    t0 = time.monotonic()
    resp = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd(group, **kw))
    assert resp.status_code == 201, resp.text
    crd = resp.json()
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}

    def served() -> bool:
        r = http.get(f"/apis/{group}/v1")
        return r.status_code == 200 and any(x["name"] == "widgets" for x in r.json()["resources"])

    wait_for(served, timeout=5, what="discovery")
    return time.monotonic() - t0


def test_crd_is_served_at_once_with_crud_selectors_watch_and_conflicts(
    http: httpx.Client, kube: Any, namespace: str
) -> None:
    group = new_group()
    assert install(http, group) < 1.0
    groups = http.get("/apis").json()["groups"]
    assert any(g["name"] == group for g in groups)
    resources = {r["name"]: r for r in http.get(f"/apis/{group}/v1").json()["resources"]}
    assert resources["widgets"]["namespaced"] is True
    assert resources["widgets"]["kind"] == "Widget"
    assert resources["widgets"]["shortNames"] == ["wd"]
    assert {"widgets/status", "widgets/scale"} <= set(resources)

    api = k8s.CustomObjectsApi(kube)
    created = api.create_namespaced_custom_object(
        group,
        "v1",
        namespace,
        "widgets",
        widget("a", group, color="red") | {"metadata": {"name": "a", "labels": {"tier": "x"}}},
    )
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    assert created["spec"] == {"color": "red", "replicas": 1, "size": "M"}  # schema defaults
    api.create_namespaced_custom_object(group, "v1", namespace, "widgets", widget("b", group, color="blue"))
    listed = api.list_namespaced_custom_object(group, "v1", namespace, "widgets", label_selector="tier=x")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    listed = api.list_cluster_custom_object(group, "v1", "widgets", field_selector="metadata.name=b")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["b"]
    rv = listed["metadata"]["resourceVersion"]

    events: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        w = k8s_watch.Watch()
        for ev in w.stream(
            api.list_namespaced_custom_object,
            group,
            "v1",
            namespace,
            "widgets",
            resource_version=rv,
            timeout_seconds=10,
        ):
            events.append((ev["type"], ev["object"]["metadata"]["name"]))
            if ev["type"] == "DELETED":
                w.stop()
        done.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    got = api.get_namespaced_custom_object(group, "v1", namespace, "widgets", "a")
    got["spec"]["color"] = "green"
    updated = api.replace_namespaced_custom_object(group, "v1", namespace, "widgets", "a", got)
    assert updated["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as ei:
        api.replace_namespaced_custom_object(group, "v1", namespace, "widgets", "a", got)  # stale resourceVersion
    assert ei.value.status == 409
    api.delete_namespaced_custom_object(group, "v1", namespace, "widgets", "b")
    assert done.wait(10)
    assert events == [("MODIFIED", "a"), ("DELETED", "b")]


def test_status_and_scale_subresources(http: httpx.Client, kube: Any, namespace: str) -> None:
    group = new_group()
    install(http, group)
    api = k8s.CustomObjectsApi(kube)
    obj = api.create_namespaced_custom_object(
        group, "v1", namespace, "widgets", widget("s", group, color="red", replicas=2) | {"status": {"ready": True}}
    )
    assert "status" not in obj  # status is set through /status only
    obj = api.patch_namespaced_custom_object_status(
        group, "v1", namespace, "widgets", "s", {"status": {"replicas": 2, "ready": True}, "spec": {"color": "blue"}}
    )
    assert obj["status"] == {"replicas": 2, "ready": True} and obj["spec"]["color"] == "red"
    assert obj["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as ei:
        api.patch_namespaced_custom_object_status(group, "v1", namespace, "widgets", "s", {"status": {"ready": "yes"}})
    assert ei.value.status == 422 and "status.ready" in ei.value.body
    scale = api.get_namespaced_custom_object_scale(group, "v1", namespace, "widgets", "s")
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    api.patch_namespaced_custom_object_scale(group, "v1", namespace, "widgets", "s", {"spec": {"replicas": 5}})
    assert api.get_namespaced_custom_object(group, "v1", namespace, "widgets", "s")["spec"]["replicas"] == 5


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        ({"color": 3}, "spec.color", "spec.color in body must be of type string"),
        ({}, "spec.color", "Required value"),
        ({"color": "pink"}, "spec.color", 'Unsupported value: "pink"'),
        ({"color": "red", "shape": "round"}, "spec.shape", 'unknown field "spec.shape"'),
        ({"color": "red", "replicas": -1}, "spec.replicas", "should be greater than or equal to 0"),
    ],
)
def test_schema_violations_are_422_naming_the_field(
    http: httpx.Client, namespace: str, spec: dict[str, Any], field: str, text: str
) -> None:
    group = new_group()
    install(http, group)
    resp = http.post(f"/apis/{group}/v1/namespaces/{namespace}/widgets", json=widget("bad", group, **spec))
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["reason"] == "Invalid"
    causes = body["details"]["causes"]
    assert [c["field"] for c in causes] == [field]
    assert text in causes[0]["message"] and text in body["message"]
    ok = http.post(
        f"/apis/{group}/v1/namespaces/{namespace}/widgets",
        json=widget("good", group, color="red", extra={"anything": {"goes": [1]}}),
    )
    assert ok.status_code == 201, ok.text


def test_bad_crds_are_refused(http: httpx.Client) -> None:
    crd = widget_crd("example.com")
    crd["metadata"]["name"] = "wrong.example.com"
    crd["spec"]["versions"][0]["storage"] = False
    crd["spec"]["conversion"] = {"strategy": "Webhook"}
    resp = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert resp.status_code == 422, resp.text
    fields = [c["field"] for c in resp.json()["details"]["causes"]]
    assert fields == ["metadata.name", "spec.versions", "spec.conversion.strategy"]


def test_owner_references_cascade_and_deleting_the_crd_removes_everything(
    http: httpx.Client, kube: Any, namespace: str, apiserver: Server, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    group = new_group()
    install(http, group)
    api = k8s.CustomObjectsApi(kube)
    core = k8s.CoreV1Api(kube)
    owner = api.create_namespaced_custom_object(group, "v1", namespace, "widgets", widget("o", group, color="red"))
    ref = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "name": "o",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    for name in ("cm1", "cm2"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "ownerReferences": [ref]}})
    api.delete_namespaced_custom_object(group, "v1", namespace, "widgets", "o")
    wait_for(lambda: not core.list_namespaced_config_map(namespace).items, timeout=10, what="cascading deletion")

    # A second API server process on the same etcd prefix serves the CRD too.
    other = LocalApiServerProcess(etcd_server.url, prefix=apiserver.prefix, log_file=tmp_path / "other.log")
    other.start()
    try:
        with httpx.Client(base_url=other.url, timeout=10) as http2:
            assert http2.get(f"/apis/{group}/v1/widgets").status_code == 200
            owner = api.create_namespaced_custom_object(
                group, "v1", namespace, "widgets", widget("p", group, color="red")
            )
            ref["uid"], ref["name"] = owner["metadata"]["uid"], "p"
            core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm3", "ownerReferences": [ref]}})
            resp = http.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{group}")
            assert resp.status_code == 200, resp.text
            assert http.get(f"/apis/{group}/v1/widgets").status_code == 404
            wait_for(lambda: http2.get(f"/apis/{group}/v1/widgets").status_code == 404, timeout=2, what="other server")
            wait_for(lambda: not core.list_namespaced_config_map(namespace).items, timeout=10, what="dependents")
    finally:
        other.stop()
    install(http, group)  # objects of the deleted CRD do not come back
    assert http.get(f"/apis/{group}/v1/widgets").json()["items"] == []


def test_kubectl_get_widgets(kubectl: Any, http: httpx.Client, namespace: str, tmp_path: Path) -> None:
    group = new_group()
    manifest = tmp_path / "crd.yaml"
    manifest.write_text(yaml.safe_dump(widget_crd(group)))
    kubectl("create", "--validate=false", "-f", str(manifest))
    wait_for(lambda: http.get(f"/apis/{group}/v1").status_code == 200, timeout=5, what="discovery")
    obj = tmp_path / "w.yaml"
    obj.write_text(yaml.safe_dump(widget("k", group, color="blue")))
    kubectl("create", "--validate=false", "-n", namespace, "-f", str(obj))
    names = kubectl("get", f"widgets.{group}", "-n", namespace, "-o", "name").stdout.split()
    assert names == [f"widget.{group}/k"]
    got = json.loads(kubectl("get", f"widgets.{group}", "k", "-n", namespace, "-o", "json").stdout)
    assert got["spec"] == {"color": "blue", "replicas": 1, "size": "M"}


def test_cluster_scoped_crd_and_scope_from_discovery(http: httpx.Client, kube: Any) -> None:
    group = new_group()
    install(http, group, scope="Cluster")
    api = k8s.CustomObjectsApi(kube)
    created = api.create_cluster_custom_object(group, "v1", "widgets", widget("c", group, color="green"))
    assert "namespace" not in created["metadata"]
    assert http.get(f"/apis/{group}/v1/namespaces/default/widgets").status_code == 404
    assert discover_scope(kube, Resource("widgets", group, "v1", "Widget")).namespaced is False
    assert discover_scope(kube, Resource("configmaps", "", "v1", "ConfigMap")).namespaced is True
    with pytest.raises(ControllerError, match="serves no resource 'gadgets'"):
        discover_scope(kube, Resource("gadgets", group, "v1", "Gadget"))
