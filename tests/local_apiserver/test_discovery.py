"""Discovery, health, metrics and the command line."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from local_apiserver.app import create_app
from local_apiserver.process import LocalApiServerProcess, free_port
from tests.helpers import missing_prerequisite
from tests.local_apiserver.conftest import metric, wait_for


def test_discovery_documents(http: httpx.Client) -> None:
    assert http.get("/version").json()["major"] == "1"
    assert http.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"]: g for g in http.get("/apis").json()["groups"]}
    assert set(groups) == {
        "apps",
        "coordination.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "batch",
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "policy",
        "autoscaling",
        "discovery.k8s.io",
        "storage.k8s.io",
        "scheduling.k8s.io",
        "node.k8s.io",
        "admissionregistration.k8s.io",
        "certificates.k8s.io",
        "flowcontrol.apiserver.k8s.io",
    }
    assert groups["apps"]["preferredVersion"]["groupVersion"] == "apps/v1"
    assert http.get("/apis/apps").json()["kind"] == "APIGroup"
    core = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert core["pods"]["shortNames"] == ["po"] and core["pods"]["namespaced"] is True
    assert core["namespaces"]["namespaced"] is False and core["namespaces"]["shortNames"] == ["ns"]
    assert core["configmaps"]["shortNames"] == ["cm"] and "watch" in core["configmaps"]["verbs"]
    assert core["pods/status"]["verbs"] == ["get", "patch", "update"]
    apps = {r["name"]: r for r in http.get("/apis/apps/v1").json()["resources"]}
    assert apps["replicasets"]["shortNames"] == ["rs"] and apps["deployments"]["shortNames"] == ["deploy"]
    assert apps["deployments/scale"]["kind"] == "Scale" and apps["deployments/scale"]["group"] == "autoscaling"
    leases = http.get("/apis/coordination.k8s.io/v1").json()["resources"]
    assert [r["kind"] for r in leases] == ["Lease"]
    assert "deletecollection" in core["pods"]["verbs"] and "deletecollection" not in core["namespaces"]["verbs"]
    assert core["nodes"]["namespaced"] is False and core["nodes"]["shortNames"] == ["no"]
    # More built-in kinds (issue 23, first part): scope, short names, subresources, the `all` category.
    assert core["secrets"]["namespaced"] is True and core["secrets"]["kind"] == "Secret"
    assert core["services"]["shortNames"] == ["svc"] and core["services"]["categories"] == ["all"]
    assert core["serviceaccounts"]["shortNames"] == ["sa"] and core["persistentvolumes"]["namespaced"] is False
    assert apps["statefulsets"]["shortNames"] == ["sts"] and "statefulsets/scale" in apps
    batch = {r["name"]: r for r in http.get("/apis/batch/v1").json()["resources"]}
    assert set(batch) == {"jobs", "jobs/status", "cronjobs", "cronjobs/status"}
    rbac = {r["name"]: r for r in http.get("/apis/rbac.authorization.k8s.io/v1").json()["resources"]}
    assert rbac["clusterroles"]["namespaced"] is False and rbac["roles"]["namespaced"] is True
    events = http.get("/apis/events.k8s.io/v1").json()["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in events] == [("events", "Event", True)]


def test_kubectl_api_resources(kubectl: Any) -> None:
    out = kubectl("api-resources", "--no-headers").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows["replicasets"][1] == "rs" and rows["deployments"][1] == "deploy"
    assert rows["namespaces"][1] == "ns" and rows["leases"][1] == "coordination.k8s.io/v1"
    result = kubectl("get", "widgets", check=False)
    assert result.returncode != 0 and "widgets" in result.stderr


def test_health_and_metrics(http: httpx.Client) -> None:
    assert http.get("/healthz").text == "ok"
    assert http.get("/readyz").status_code == 200
    http.get("/api/v1/namespaces")
    assert metric(http, "local_apiserver_requests_total", verb="list", resource="namespaces", code="200") >= 1
    assert "local_apiserver_watches" in http.get("/metrics").text


def test_default_namespaces_exist(http: httpx.Client) -> None:
    names = {n["metadata"]["name"] for n in http.get("/api/v1/namespaces").json()["items"]}
    assert {"default", "kube-system", "kube-public"} <= names
    ns = http.get("/api/v1/namespaces/default").json()
    assert ns["status"]["phase"] == "Active"
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "default"


def test_objects_are_stored_under_the_prefix(http: httpx.Client, apiserver: Any, etcd_client: Any) -> None:
    created = http.post(
        "/apis/coordination.k8s.io/v1/namespaces/default/leases", json={"metadata": {"name": "lock"}, "spec": {}}
    ).json()
    _, kv = etcd_client.get(f"{apiserver.prefix}/coordination.k8s.io/leases/default/lock")
    assert kv is not None and str(kv.mod_revision) == created["metadata"]["resourceVersion"]
    stored = json.loads(kv.value)
    assert "resourceVersion" not in stored["metadata"]  # derived from etcd, never stored


def test_cli_rejects_bad_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "local_apiserver", "--etcd", "ftp://x:1", "--port", "1234"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "scheme must be http or https" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "local_apiserver", "--port", "0"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "--port" in result.stderr


def test_tls(etcd_server: Any, key_prefix: str, tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        missing_prerequisite("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    args += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [openssl, *args],
        check=True,
        capture_output=True,
        timeout=60,
    )
    proc = LocalApiServerProcess(etcd_server.url, prefix=key_prefix, tls_cert=cert, tls_key=key)
    with proc:
        assert proc.url.startswith("https://")
        with httpx.Client(base_url=proc.url, verify=ssl.create_default_context(cafile=str(cert))) as client:
            assert client.get("/api/v1/namespaces/default").json()["metadata"]["name"] == "default"


def test_create_app_in_process(etcd_server: Any, key_prefix: str) -> None:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(etcd_server.url, prefix=key_prefix), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            wait_for(lambda: server.started, what="in-process server")
            created = client.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "in-proc"}})
            assert created.status_code == 201
            got = client.get("/api/v1/namespaces/default/configmaps/in-proc").json()
            assert got["metadata"]["uid"] == created.json()["metadata"]["uid"]
    finally:
        server.should_exit = True
        thread.join(10)
    assert not thread.is_alive()
