"""The real kubectl against the local API server: create -f, get, watch, label, patch, scale, delete."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx

from rangeshard.core.process import popen
from tests.local_apiserver.conftest import KUBECTL

MANIFEST = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: fast
"""


def test_create_get_label_patch_scale_delete(kubectl: Any, namespace: str, tmp_path: Path, http: httpx.Client) -> None:
    manifest = tmp_path / "objs.yaml"
    manifest.write_text(MANIFEST)
    out = kubectl("create", "-n", namespace, "-f", str(manifest)).stdout
    assert "deployment.apps/web created" in out
    assert "configmap/settings created" in out

    dep = json.loads(kubectl("get", "-n", namespace, "deploy", "web", "-o", "json").stdout)
    assert dep["kind"] == "Deployment"
    assert dep["metadata"]["generation"] == 1
    assert dep["spec"]["replicas"] == 2
    assert int(dep["metadata"]["resourceVersion"]) > 0
    uid = dep["metadata"]["uid"]

    listed = json.loads(kubectl("get", "-n", namespace, "cm,deploy", "-o", "json").stdout)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["settings", "web"]

    kubectl("label", "-n", namespace, "deploy", "web", "tier=front")
    kubectl("patch", "-n", namespace, "deploy", "web", "--type=merge", "-p", '{"spec":{"replicas":3}}')
    kubectl("scale", "-n", namespace, "deploy", "web", "--replicas=5")
    dep = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()
    assert dep["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert dep["spec"]["replicas"] == 5
    assert dep["metadata"]["generation"] == 3  # label: no bump; patch and scale: one each
    assert dep["metadata"]["uid"] == uid

    # Short names resolve through discovery.
    names = kubectl("get", "-n", namespace, "rs,po,cm", "-o", "name").stdout.split()
    assert names == ["configmap/settings"]

    out = kubectl("delete", "-n", namespace, "deploy", "web").stdout
    assert 'deployment.apps "web" deleted' in out
    assert http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").status_code == 404


def test_get_watch_output_watch_events(kubectl: Any, namespace: str, http: httpx.Client, apiserver: Any) -> None:
    assert KUBECTL is not None
    http.post(f"/api/v1/namespaces/{namespace}/configmaps", json={"metadata": {"name": "first"}})
    cmd = [KUBECTL, "--server", apiserver.url, "get", "-n", namespace, "cm", "-w", "--output-watch-events"]
    cmd += ["--request-timeout=20s"]
    with popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            lines: list[str] = []

            def seen(word: str, name: str) -> bool:
                while not any(line.split()[:2] == [word, name] for line in lines):
                    line = proc.stdout.readline() if proc.stdout else ""
                    if not line:
                        return False
                    lines.append(line)
                return True

            assert seen("ADDED", "first")
            http.post(f"/api/v1/namespaces/{namespace}/configmaps", json={"metadata": {"name": "second"}})
            assert seen("ADDED", "second")
            http.patch(
                f"/api/v1/namespaces/{namespace}/configmaps/first",
                content='{"data":{"k":"v"}}',
                headers={"content-type": "application/merge-patch+json"},
            )
            assert seen("MODIFIED", "first")
            http.delete(f"/api/v1/namespaces/{namespace}/configmaps/first")
            assert seen("DELETED", "first")
        finally:
            proc.terminate()
            proc.wait(10)


def test_generator_commands_work(kubectl: Any, http: httpx.Client) -> None:
    # kubectl 1.32's typed generators POST protobuf (every generator: tests/local_apiserver/test_protobuf_bodies.py).
    assert "namespace/from-generator created" in kubectl("create", "namespace", "from-generator").stdout
    assert http.get("/api/v1/namespaces/from-generator").status_code == 200
    out = kubectl("create", "configmap", "generated", "-n", "from-generator", "--from-literal=a=b").stdout
    assert "configmap/generated created" in out
    assert http.get("/api/v1/namespaces/from-generator/configmaps/generated").json()["data"] == {"a": "b"}


def test_apply_and_set_image_use_strategic_merge(
    kubectl: Any, namespace: str, tmp_path: Path, http: httpx.Client
) -> None:
    manifest = tmp_path / "dep.yaml"
    manifest.write_text(MANIFEST.split("---", maxsplit=1)[0])
    kubectl("apply", "-n", namespace, "-f", str(manifest))
    http.patch(  # somebody else adds an env var: a keyed merge must keep it
        f"/apis/apps/v1/namespaces/{namespace}/deployments/web",
        content=b'{"spec":{"template":{"spec":{"containers":[{"name":"nginx","env":[{"name":"X","value":"1"}]}]}}}}',
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    manifest.write_text(
        MANIFEST.split("---", maxsplit=1)[0].replace("nginx:1.27", "nginx:1.28").replace("replicas: 2", "replicas: 4")
    )
    out = kubectl("apply", "-n", namespace, "-f", str(manifest)).stdout
    assert "configured" in out
    dep = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nginx:1.28" and container["env"] == [{"name": "X", "value": "1"}]
    assert dep["spec"]["replicas"] == 4
    kubectl("set", "image", "-n", namespace, "deploy/web", "nginx=nginx:1.29")
    dep = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web").json()
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.29"
    assert dep["metadata"]["generation"] == 4
