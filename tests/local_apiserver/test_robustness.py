"""Mutated objects of every kind, created and patched: always a Status 2xx/4xx, never a 500."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import httpx

from local_apiserver.resources import RESOURCES, ResourceSpec
from tests.local_apiserver.conftest import deployment, metric

WEIRD: list[Any] = [None, -1, "x", True, [], {"a": [None]}]


def _valid(spec: ResourceSpec, name: str) -> dict[str, Any]:
    if spec.resource in ("deployments", "replicasets"):
        workload = deployment(name)
        workload["kind"] = spec.kind
        return workload
    body: dict[str, Any] = {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": {"name": name}}
    if spec.resource == "pods":
        body["spec"] = {"containers": [{"name": "c", "image": "i"}]}
    if spec.resource == "configmaps":
        body["data"] = {"k": "v"}
    if spec.resource == "jobs":  # kube requires a template whose restartPolicy is Never or OnFailure
        body["spec"] = {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}
    if spec.resource == "events":
        body["involvedObject"] = {"kind": "Pod", "name": "p"}
    if spec.resource == "customresourcedefinitions":
        group = f"{name}.example.com"
        body["metadata"]["name"] = f"things.{group}"
        body["spec"] = {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {"specReplicasPath": ".spec.n", "statusReplicasPath": ".status.n"},
                    },
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}}
                            },
                        }
                    },
                }
            ],
        }
    return body


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    obj = copy.deepcopy(obj)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def _collection(spec: ResourceSpec) -> str:
    base = f"/apis/{spec.group}/{spec.version}" if spec.group else f"/api/{spec.version}"
    return f"{base}/namespaces/default/{spec.resource}" if spec.namespaced else f"{base}/{spec.resource}"


def test_mutated_bodies_never_break_the_server(http: httpx.Client) -> None:
    allowed = {200, 201, 400, 404, 409, 415, 422}
    for spec in RESOURCES:
        base = _collection(spec)
        valid = _valid(spec, f"ok-{uuid.uuid4().hex[:6]}")
        created = http.post(base, json=valid)
        assert created.status_code == 201, created.text
        name = valid["metadata"]["name"]
        extra = [("status",), ("spec",), ("metadata", "ownerReferences"), ("metadata", "finalizers")]
        for path in _paths(valid) + extra:
            for value in WEIRD:
                body = _set(valid, path, value)
                if isinstance(body.get("metadata"), dict) and path[:2] != ("metadata", "name"):
                    body["metadata"]["name"] = f"m-{uuid.uuid4().hex[:8]}"
                resp = http.post(base, json=body)
                assert resp.status_code in allowed, (spec.resource, path, value, resp.text)
                if resp.status_code >= 400:
                    assert resp.json()["kind"] == "Status"
                patch = _set({}, path[:1], value) if len(path) == 1 else None
                if patch is not None and path[0] not in ("kind", "apiVersion"):
                    resp = http.patch(
                        f"{base}/{name}", json=patch, headers={"content-type": "application/merge-patch+json"}
                    )
                    assert resp.status_code in allowed, (spec.resource, path, value, resp.text)
                    if spec.status:
                        resp = http.put(f"{base}/{name}/status", json=body)
                        assert resp.status_code in allowed, (spec.resource, "status", path, value, resp.text)
                    if spec.scale:
                        resp = http.put(f"{base}/{name}/scale", json={"spec": {"replicas": value}})
                        assert resp.status_code in allowed, (spec.resource, "scale", value, resp.text)
    assert metric(http, "local_apiserver_requests_total", code="500") == 0


def test_mutated_custom_objects_never_break_the_server(http: httpx.Client) -> None:
    crd_spec = next(s for s in RESOURCES if s.resource == "customresourcedefinitions")
    crd = _valid(crd_spec, f"cr-{uuid.uuid4().hex[:6]}")
    group = crd["spec"]["group"]
    assert http.post(_collection(crd_spec), json=crd).status_code == 201
    base = f"/apis/{group}/v1/namespaces/default/things"
    valid = {"apiVersion": f"{group}/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {"n": 2}}
    assert http.post(base, json=valid).status_code == 201
    for path in [*_paths(valid), ("status",), ("spec", "other")]:
        for value in WEIRD:
            body = _set(valid, path, value)
            if isinstance(body.get("metadata"), dict) and path[:2] != ("metadata", "name"):
                body["metadata"]["name"] = f"m-{uuid.uuid4().hex[:8]}"
            for resp in (
                http.post(base, json=body),
                http.put(f"{base}/t/status", json=body),
                http.put(f"{base}/t/scale", json={"spec": {"replicas": value}}),
            ):
                assert resp.status_code in {200, 201, 400, 404, 409, 422}, (path, value, resp.text)
    assert metric(http, "local_apiserver_requests_total", code="500") == 0
