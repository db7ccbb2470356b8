"""More built-in kinds served generically (issue 23, first part): kubectl and the official client on them.

Stored and served like ConfigMaps (CRUD, list/watch with resourceVersions,
label selectors, status/scale where kube has them, the ``all`` category), with
the kind-specific semantics of issue 23 tested here (Secret ``stringData``,
``type`` and ``immutable``, Service IP and node-port allocation, default
ServiceAccounts).
"""

from __future__ import annotations

import base64
import ipaddress
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from tests.helpers import wait_until

MANIFESTS = """
apiVersion: v1
kind: Secret
metadata: {name: tls, labels: {app: web}}
type: Opaque
data: {key: SECRET_B64}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web}
---
apiVersion: v1
kind: Service
metadata: {name: web, labels: {app: web}}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: registry.local/db:1}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: migrate}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: m, image: registry.local/m:1}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader}
rules: [{apiGroups: [""], resources: [secrets], verbs: [get]}]
""".replace("SECRET_B64", base64.b64encode(b"secret-bytes").decode())


def test_kubectl_applies_and_lists_the_new_kinds(
    kubectl: Callable[..., Any], namespace: str, kube: Any, http: httpx.Client
) -> None:
    applied = kubectl("apply", "-n", namespace, "-f", "-", input=MANIFESTS)
    for what in ("secret/tls", "serviceaccount/web", "service/web", "statefulset.apps/db", "job.batch/migrate",
                 "role.rbac.authorization.k8s.io/reader"):  # fmt: skip
        assert f"{what} created" in applied.stdout, applied.stdout
    names = kubectl("get", "secrets,sa,svc,sts,jobs,roles", "-n", namespace, "-o", "name").stdout.split()
    assert {"secret/tls", "serviceaccount/web", "service/web", "statefulset.apps/db", "job.batch/migrate",
            "role.rbac.authorization.k8s.io/reader"} <= set(names)  # fmt: skip

    # kubectl's own columns (kube's printers) for the common kinds.
    def header_and_row(what: str, name: str) -> tuple[list[str], str]:
        lines = kubectl("get", what, "-n", namespace).stdout.splitlines()
        row = next(line for line in lines[1:] if line.split()[0] == name)
        return lines[0].split(), row

    head, row = header_and_row("secrets", "tls")
    assert head == ["NAME", "TYPE", "DATA", "AGE"] and row.split()[1:3] == ["Opaque", "1"], (head, row)
    head, row = header_and_row("svc", "web")
    assert head == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"], head
    cells = row.split()
    assert cells[1] == "ClusterIP" and cells[2].startswith("10.") and cells[3] == "<none>" and cells[4] == "80/TCP"
    head, row = header_and_row("sts", "db")
    assert head == ["NAME", "READY", "AGE"] and row.split()[1] == "0/2", (head, row)
    head, row = header_and_row("jobs", "migrate")
    assert head == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"] and row.split()[1] == "Running", (head, row)
    head, row = header_and_row("sa", "web")
    assert head == ["NAME", "SECRETS", "AGE"], head
    head, _ = header_and_row("roles", "reader")
    assert head == ["NAME", "CREATED", "AT"], head  # "CREATED AT"
    # `kubectl get all` lists what kube lists in the category (services, statefulsets, jobs here).
    everything = kubectl("get", "all", "-n", namespace, "-o", "name").stdout.split()
    assert {"service/web", "statefulset.apps/db", "job.batch/migrate"} <= set(everything), everything
    assert not any(n.startswith("secret/") for n in everything)
    # The official client reads them back; the Secret's data is what was sent.
    core = k8s.CoreV1Api(kube)
    secret = core.read_namespaced_secret("tls", namespace)
    assert base64.b64decode(secret.data["key"]) == b"secret-bytes"
    assert [s.metadata.name for s in core.list_namespaced_secret(namespace, label_selector="app=web").items] == ["tls"]
    sts = k8s.AppsV1Api(kube).read_namespaced_stateful_set("db", namespace)
    assert sts.spec.replicas == 2 and sts.metadata.generation == 1
    scaled = kubectl("scale", "statefulset/db", "-n", namespace, "--replicas", "3")
    assert "scaled" in scaled.stdout
    assert k8s.AppsV1Api(kube).read_namespaced_stateful_set_scale("db", namespace).spec.replicas == 3
    # A watch from a list's resourceVersion sees a change, as for any served kind.
    listed = core.list_namespaced_service(namespace)
    w = k8s_watch.Watch()
    kubectl("label", "service/web", "-n", namespace, "tier=front")
    seen = []
    for ev in w.stream(
        core.list_namespaced_service, namespace, resource_version=listed.metadata.resource_version, timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.labels.get("tier")))
        if ev["type"] == "MODIFIED":
            w.stop()
    assert ("MODIFIED", "front") in seen
    # Cluster-scoped kinds are cluster-scoped.
    created = http.post(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"cr-{namespace}"},
        },
    )
    assert created.status_code == 201, created.text
    assert http.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/cr-{namespace}").status_code == 200
    kubectl("delete", "-n", namespace, "secret/tls", "svc/web", "sts/db", "job/migrate")
    assert core.list_namespaced_secret(namespace).items == []


def test_secret_string_data_base64_and_type(kube: Any, namespace: str, http: httpx.Client) -> None:
    core = k8s.CoreV1Api(kube)
    body = {
        "metadata": {"name": "s1"},
        "data": {"a": base64.b64encode(b"A").decode()},
        "stringData": {"b": "B", "a": "X"},
    }
    created = core.create_namespaced_secret(namespace, body)
    assert created.type == "Opaque"
    assert {k: base64.b64decode(v) for k, v in created.data.items()} == {"a": b"X", "b": b"B"}  # stringData wins
    raw = http.get(f"/api/v1/namespaces/{namespace}/secrets/s1").json()
    assert "stringData" not in raw  # merged, never stored
    # stringData on an update is merged too.
    raw["stringData"] = {"c": "C"}
    updated = http.put(f"/api/v1/namespaces/{namespace}/secrets/s1", json=raw)
    assert updated.status_code == 200, updated.text
    assert base64.b64decode(updated.json()["data"]["c"]) == b"C" and "stringData" not in updated.json()
    bad = http.post(
        f"/api/v1/namespaces/{namespace}/secrets",
        json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s2"}, "data": {"k": "not base64!"}},
    )
    assert bad.status_code == 422, bad.text
    status = bad.json()
    assert status["reason"] == "Invalid" and status["details"]["causes"][0]["field"] == "data[k]"
    typed = core.create_namespaced_secret(namespace, {"metadata": {"name": "s3"}, "type": "kubernetes.io/tls"})
    assert typed.type == "kubernetes.io/tls"


def test_every_namespace_gets_a_default_service_account(kube: Any, namespace: str, http: httpx.Client) -> None:
    core = k8s.CoreV1Api(kube)
    names = [sa.metadata.name for sa in core.list_namespaced_service_account(namespace).items]
    assert names == ["default"]
    assert core.read_namespaced_service_account("default", "default").metadata.name == "default"
    # Deleting the namespace deletes it with everything else.
    ns = f"{namespace}-gone"
    assert (
        http.post(
            "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        ).status_code
        == 201
    )
    assert http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200
    assert http.delete(f"/api/v1/namespaces/{ns}").status_code == 200
    wait_until(lambda: http.get(f"/api/v1/namespaces/{ns}").status_code == 404, 15, "the namespace deleted")
    assert http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 404


def test_service_cluster_ips_and_node_ports(kube: Any, namespace: str, http: httpx.Client) -> None:
    core = k8s.CoreV1Api(kube)

    def svc(name: str, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [{"port": 80}], **spec}}

    a = core.create_namespaced_service(namespace, svc("a"))
    b = core.create_namespaced_service(namespace, svc("b"))
    for s in (a, b):
        assert ipaddress.IPv4Address(s.spec.cluster_ip) in ipaddress.IPv4Network("10.96.0.0/12")
        assert s.spec.cluster_ips == [s.spec.cluster_ip] and s.spec.type == "ClusterIP"
        assert s.spec.ports[0].target_port == 80 and s.spec.ports[0].protocol == "TCP"
    assert a.spec.cluster_ip != b.spec.cluster_ip
    headless = core.create_namespaced_service(namespace, svc("h", clusterIP="None"))
    assert headless.spec.cluster_ip == "None"
    # Asking for an IP: it must be free and in range.
    taken = http.post(
        f"/api/v1/namespaces/{namespace}/services",
        json={"apiVersion": "v1", "kind": "Service", **svc("c", clusterIP=a.spec.cluster_ip)},
    )
    assert taken.status_code == 422 and "provided IP is already allocated" in taken.text, taken.text
    outside = http.post(
        f"/api/v1/namespaces/{namespace}/services",
        json={"apiVersion": "v1", "kind": "Service", **svc("d", clusterIP="192.168.0.1")},
    )
    assert outside.status_code == 422 and "not in the valid range" in outside.text
    # NodePorts from 30000-32767, kept across an update that omits them.
    np = core.create_namespaced_service(namespace, svc("np", type="NodePort"))
    port = np.spec.ports[0].node_port
    assert 30000 <= port <= 32767
    raw = http.get(f"/api/v1/namespaces/{namespace}/services/np").json()
    raw["spec"].pop("clusterIP")
    raw["spec"].pop("clusterIPs")
    raw["spec"]["ports"][0].pop("nodePort")
    kept = http.put(f"/api/v1/namespaces/{namespace}/services/np", json=raw)
    assert kept.status_code == 200, kept.text
    assert (
        kept.json()["spec"]["clusterIP"] == np.spec.cluster_ip and kept.json()["spec"]["ports"][0]["nodePort"] == port
    )
    # spec.clusterIP is immutable.
    raw = kept.json()
    raw["spec"]["clusterIP"] = "10.96.0.77"
    changed = http.put(f"/api/v1/namespaces/{namespace}/services/np", json=raw)
    assert changed.status_code == 422 and "spec.clusterIP" in changed.text and "field is immutable" in changed.text
    # Deleting a Service frees its IP: it can be asked for again.
    core.delete_namespaced_service("a", namespace)
    again = core.create_namespaced_service(namespace, svc("a2", clusterIP=a.spec.cluster_ip))
    assert again.spec.cluster_ip == a.spec.cluster_ip


def test_secret_type_and_immutable_data_cannot_change(namespace: str, http: httpx.Client) -> None:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    one = base64.b64encode(b"1").decode()
    made = http.post(
        base,
        json={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "fixed"},
            "data": {"k": one},
            "immutable": True,
        },
    )
    assert made.status_code == 201, made.text
    obj = made.json()
    retyped = {**obj, "type": "kubernetes.io/tls"}
    bad = http.put(f"{base}/fixed", json=retyped)
    assert bad.status_code == 422 and "type" in bad.text and "field is immutable" in bad.text, bad.text
    changed = {**obj, "data": {"k": base64.b64encode(b"2").decode()}}
    bad = http.put(f"{base}/fixed", json=changed)
    assert bad.status_code == 422 and "field is immutable when `immutable` is set" in bad.text, bad.text
    relabeled = {**obj, "metadata": {**obj["metadata"], "labels": {"a": "b"}}}
    ok = http.put(f"{base}/fixed", json=relabeled)
    assert ok.status_code == 200, ok.text  # metadata may still change
    assert http.delete(f"{base}/fixed").status_code == 200  # and it may be deleted


def test_service_cluster_ip_range_flag(etcd_server: Any, tmp_path: Path) -> None:
    from local_apiserver.process import LocalApiServerProcess  # noqa: PLC0415

    server = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/svc-range-{tmp_path.name}",
        log_file=tmp_path / "apiserver.log",
        extra_args=["--service-cluster-ip-range", "10.200.0.0/29"],
    )
    server.start(timeout=30)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            got = set()
            for i in range(5):  # a /29 has 8 addresses: .0 and .1 and .7 are not handed out
                body = {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": f"s{i}"},
                    "spec": {"ports": [{"port": 80}]},
                }
                r = c.post("/api/v1/namespaces/default/services", json=body)
                assert r.status_code == 201, r.text
                got.add(r.json()["spec"]["clusterIP"])
            assert got == {f"10.200.0.{n}" for n in range(2, 7)}
            full = c.post(
                "/api/v1/namespaces/default/services",
                json={
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "s9"},
                    "spec": {"ports": [{"port": 80}]},
                },
            )
            assert full.status_code == 422 and "range is full" in full.text, full.text
            outside = c.post(
                "/api/v1/namespaces/default/services",
                json={
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "s8"},
                    "spec": {"clusterIP": "10.96.0.10"},
                },
            )
            assert outside.status_code == 422 and "10.200.0.0/29" in outside.text
    finally:
        server.stop()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "local_apiserver",
            "--etcd",
            etcd_server.url,
            "--service-cluster-ip-range",
            "10.0.0.0/33",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "--service-cluster-ip-range" in bad.stderr and "Traceback" not in bad.stderr
