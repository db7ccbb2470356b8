"""kubectl's default validation (OpenAPI + server-side field validation) and server-side Tables, with the real kubectl."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson

from rangeshard.core.process import popen
from tests.local_apiserver.conftest import KUBECTL
from tests.local_apiserver.test_kubectl import MANIFEST

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)

# The deployment of test_kubectl plus fields kubectl must not flag: int-or-string, a numeric quantity, ports.
DEPLOYMENT = (
    MANIFEST.split("---", maxsplit=1)[0]
    .replace("  selector:\n", "  strategy:\n    rollingUpdate: {maxSurge: 1, maxUnavailable: 25%}\n  selector:\n", 1)
    .replace(
        "image: nginx:1.27\n",
        "image: nginx:1.27\n        ports: [{containerPort: 80}]\n"
        "        resources: {limits: {cpu: 1, memory: 64Mi}}\n",
    )
)


def _header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_openapi_documents(http: httpx.Client) -> None:
    root = http.get("/openapi/v3").json()["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/coordination.k8s.io/v1"} <= set(root)
    apps = http.get(root["apis/apps/v1"]["serverRelativeURL"]).json()
    patch = apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
    containers = apps["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    v2 = http.get("/openapi/v2", headers={"accept": "application/json"}).json()
    assert v2["swagger"] == "2.0"
    assert (
        v2["definitions"]["io.k8s.api.coordination.v1.Lease"]["x-kubernetes-group-version-kind"][0]["kind"] == "Lease"
    )


def test_kubectl_validates_by_default(kubectl: Any, namespace: str, tmp_path: Path, http: httpx.Client) -> None:
    good = tmp_path / "dep.yaml"
    good.write_text(DEPLOYMENT)
    assert "deployment.apps/web created" in kubectl("apply", "-n", namespace, "-f", str(good)).stdout
    cm = tmp_path / "cm.yaml"
    cm.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n")
    assert "configmap/settings created" in kubectl("create", "-n", namespace, "-f", str(cm)).stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text(DEPLOYMENT.replace("  replicas: 2\n", "  replicas: 3\n  foo: bar\n"))
    for verb in ("apply", "create"):
        result = kubectl(verb, "-n", namespace, "-f", str(bad), check=False)
        assert result.returncode != 0
        assert 'strict decoding error: unknown field "spec.foo"' in result.stderr
    dep = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()
    assert dep["spec"]["replicas"] == 2

    warned = kubectl("apply", "-n", namespace, "--validate=warn", "-f", str(bad))
    assert 'Warning: unknown field "spec.foo"' in warned.stderr
    dep = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()
    assert dep["spec"]["replicas"] == 3 and "foo" not in dep["spec"]

    # kubectl edit: the server's answer names the field (not a bare "is invalid").
    result = _edit(http, namespace, tmp_path, "s/^  replicas: 3$/  replicas: 4\\n  bogus: 1/")
    assert result.returncode != 0
    assert 'unknown field "spec.bogus"' in result.stderr
    result = _edit(http, namespace, tmp_path, "s/^  replicas: 3$/  replicas: 4/")
    assert result.returncode == 0, result.stderr
    assert http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()["spec"]["replicas"] == 4
    explained = kubectl("explain", "deployment.spec.strategy.rollingUpdate").stdout
    assert "maxSurge" in explained


def _edit(http: httpx.Client, namespace: str, tmp_path: Path, sed: str) -> subprocess.CompletedProcess[str]:
    """``kubectl edit deploy web`` with an editor that applies one sed expression."""
    assert KUBECTL is not None
    editor = tmp_path / "editor.sh"
    editor.write_text(f"#!/bin/sh\nsed -i '{sed}' \"$1\"\n")
    editor.chmod(0o755)
    return subprocess.run(
        [KUBECTL, "--server", str(http.base_url).rstrip("/"), "-n", namespace, "edit", "deploy", "web"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "EDITOR": str(editor)},
        check=False,
    )


def test_field_validation_directives(http: httpx.Client, namespace: str) -> None:
    url = f"/api/v1/namespaces/{namespace}/configmaps"
    body = b'{"metadata":{"name":"a","labels":{"x":"1"},"labels":{"y":"2"}},"data":{"k":"v"},"extra":{"deep":1}}'
    json_ct = {"content-type": "application/json"}
    strict = http.post(url, params={"fieldValidation": "Strict"}, content=body, headers=json_ct)
    assert strict.status_code == 400 and strict.json()["reason"] == "BadRequest"
    message = strict.json()["message"]
    assert message.startswith('ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error:')
    assert 'duplicate field "labels"' in message and 'unknown field "extra"' in message
    assert http.get(f"{url}/a").status_code == 404

    warn = http.post(url, content=body, headers=json_ct)  # Warn is the default
    assert warn.status_code == 201
    assert warn.headers.get_list("warning") == [
        '299 - "duplicate field \\"labels\\""',
        '299 - "unknown field \\"extra\\""',
    ]
    assert "extra" not in warn.json() and warn.json()["metadata"]["labels"] == {"y": "2"}

    ignore = http.post(url, params={"fieldValidation": "Ignore"}, content=body.replace(b'"a"', b'"b"'), headers=json_ct)
    assert ignore.status_code == 201 and "warning" not in ignore.headers and "extra" not in ignore.json()

    nested = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "nope": 1}]}}}}
    http.post(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        json={
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            },
        },
    ).raise_for_status()
    patched = http.patch(
        f"/apis/apps/v1/namespaces/{namespace}/deployments/d",
        params={"fieldValidation": "Strict"},
        content=orjson.dumps(nested),
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    assert patched.status_code == 400
    assert 'unknown field "spec.template.spec.containers[0].nope"' in patched.json()["message"]
    bad = http.post(url, params={"fieldValidation": "Loose"}, json={"metadata": {"name": "z"}})
    assert bad.status_code == 422 and 'Unsupported value: "Loose"' in bad.json()["message"]


def test_kubectl_get_prints_real_columns(kubectl: Any, namespace: str, http: httpx.Client) -> None:
    ns = namespace
    pod = {
        "metadata": {"name": "p1"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]},
    }
    http.post(f"/api/v1/namespaces/{ns}/pods", json=pod).raise_for_status()
    status = {
        "phase": "Running",
        "podIP": "10.1.2.3",
        "containerStatuses": [
            {"name": "a", "ready": True, "restartCount": 2, "state": {"running": {}}, "image": "i", "imageID": ""},
            {"name": "b", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ],
    }
    http.patch(
        f"/api/v1/namespaces/{ns}/pods/p1/status",
        content=orjson.dumps({"status": status}),
        headers={"content-type": "application/merge-patch+json"},
    ).raise_for_status()
    rs = {
        "metadata": {"name": "rs1"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "img"}]}},
        },
    }
    http.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", json=rs).raise_for_status()
    http.post(f"/api/v1/namespaces/{ns}/configmaps", json={"metadata": {"name": "c1"}, "data": {"a": "1", "b": "2"}})
    lease = {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "me"}}
    http.post(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", json=lease).raise_for_status()

    out = kubectl("get", "-n", ns, "pods").stdout
    assert _header(out) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out.splitlines()[1].split()[:4] == ["p1", "1/2", "CrashLoopBackOff", "2"]
    wide = kubectl("get", "-n", ns, "pods", "-o", "wide").stdout
    assert _header(wide)[5:8] == ["IP", "NODE", "NOMINATED"]
    assert "10.1.2.3" in wide and "node-1" in wide
    out = kubectl("get", "-n", ns, "rs", "-o", "wide").stdout
    assert _header(out) == ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert out.splitlines()[1].split()[:4] == ["rs1", "3", "0", "0"] and "app=x" in out
    out = kubectl("get", "-n", ns, "cm", "c1").stdout
    assert _header(out) == ["NAME", "DATA", "AGE"] and out.splitlines()[1].split()[:2] == ["c1", "2"]
    out = kubectl("get", "-n", ns, "leases").stdout
    assert _header(out) == ["NAME", "HOLDER", "AGE"] and out.splitlines()[1].split()[:2] == ["l1", "me"]
    out = kubectl("get", "ns", ns).stdout
    assert _header(out) == ["NAME", "STATUS", "AGE"] and out.splitlines()[1].split()[:2] == [ns, "Active"]
    http.post(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        json={"metadata": {"name": "d1"}, "spec": {**rs["spec"], "replicas": 2}},
    ).raise_for_status()
    out = kubectl("get", "-n", ns, "deploy").stdout
    assert _header(out) == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert out.splitlines()[1].split()[:4] == ["d1", "0/2", "0", "0"]

    # includeObject: Metadata (default) / Object / None; a bad value is a 400.
    url = f"/api/v1/namespaces/{ns}/configmaps"
    table = http.get(url, headers={"accept": TABLE}).json()
    assert table["kind"] == "Table" and table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert "data" not in table["rows"][0]["object"]
    full = http.get(url, params={"includeObject": "Object"}, headers={"accept": TABLE}).json()
    assert full["rows"][0]["object"]["data"] == {"a": "1", "b": "2"}
    bare = http.get(f"{url}/c1", params={"includeObject": "None"}, headers={"accept": TABLE}).json()
    assert bare["rows"] == [{"cells": ["c1", 2, bare["rows"][0]["cells"][2]]}]
    assert http.get(url, params={"includeObject": "All"}, headers={"accept": TABLE}).status_code == 400


def test_kubectl_get_watch_prints_table_rows(http: httpx.Client, namespace: str, apiserver: Any) -> None:
    assert KUBECTL is not None
    url = f"/api/v1/namespaces/{namespace}/configmaps"
    http.post(url, json={"metadata": {"name": "w1"}, "data": {"a": "1"}}).raise_for_status()
    cmd = [KUBECTL, "--server", apiserver.url, "get", "-n", namespace, "cm", "-w", "--request-timeout=20s"]
    with popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split() == ["NAME", "DATA", "AGE"]
            assert proc.stdout.readline().split()[:2] == ["w1", "1"]
            http.post(url, json={"metadata": {"name": "w2"}, "data": {"a": "1", "b": "2"}}).raise_for_status()
            assert proc.stdout.readline().split()[:2] == ["w2", "2"]
        finally:
            proc.terminate()
            proc.wait(10)
    with http.stream("GET", url, params={"watch": "1", "timeoutSeconds": "1"}, headers={"accept": TABLE}) as resp:
        events = [json.loads(line) for line in resp.iter_lines() if line]
    assert [e["object"]["kind"] for e in events] == ["Table", "Table"]
    assert events[0]["object"]["columnDefinitions"] and not events[1]["object"]["columnDefinitions"]
