"""The built-in controllers on the base, and the dev overlay, render, and what they render fits together.

``kubectl kustomize`` (``kubectl`` on PATH, as the e2e tests need anyway)
renders ``deploy/overlays/builtin-controllers`` and ``deploy/overlays/dev``
(each the base plus the ``deploy/builtin-controllers`` component); every
manifest is parsed with PyYAML and checked:

* each object round-trips through the official client's model of its kind
  unchanged (a misspelt or misplaced field would be dropped, so it shows);
* every Deployment/StatefulSet container has liveness and readiness probes on
  a declared port and CPU/memory requests and a memory limit;
* ServiceAccounts, ConfigMaps, Services and (Cluster)RoleBindings reference
  things that exist; Service selectors and PDBs select pods; NetworkPolicies
  select pods;
* the managers' config (the generated ConfigMap) validates with
  :func:`controller_manager.config.load_config` and points at the etcd and
  proxy Services;
* etcd has 3 members in the base and 1 in dev, each listed in
  ``ETCD_INITIAL_CLUSTER`` under its headless-Service name;
* RBAC: the proxy's read role grants list and watch of exactly the
  controllers' resources, the managers' role exactly what the built-in
  controllers read and write, no wildcards; the managers' ServiceAccount
  mounts no token;
* the base alone holds only etcd and the proxy (no manager, no read role).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from controller_manager.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "rangeshard"

MODELS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "ConfigMap": "V1ConfigMap",
    "Service": "V1Service",
    "Deployment": "V1Deployment",
    "StatefulSet": "V1StatefulSet",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "NetworkPolicy": "V1NetworkPolicy",
}

# (apiGroup, resource, verb) the proxy's ServiceAccount needs for the built-in
# controllers: list and watch of their resources, which it caches with its own
# credentials (range_filter_proxy/upstream.py lists and watches, nothing else);
# every other request passes through with the caller's token (--auth-mode delegate).
PROXY_NEEDS = {("", "pods", v) for v in ("list", "watch")} | {
    ("apps", r, v) for r in ("replicasets", "deployments") for v in ("list", "watch")
}
PROXY_READ_ROLE = "rangeshard-proxy-deployment-replicaset"
# The built-in controllers' manager (the managers' write RBAC, deploy/builtin-controllers/rbac.yaml).
MANAGER_NEEDS = {("", "pods", v) for v in ("get", "list", "watch", "create", "delete", "patch")} | {
    ("apps", "replicasets", "get"),
    ("apps", "replicasets", "list"),
    ("apps", "replicasets", "watch"),
    ("apps", "replicasets", "create"),
    ("apps", "replicasets", "patch"),
    ("apps", "replicasets", "delete"),
    ("apps", "replicasets/status", "update"),
    ("apps", "replicasets/finalizers", "update"),
    ("apps", "deployments", "get"),
    ("apps", "deployments", "list"),
    ("apps", "deployments", "watch"),
    ("apps", "deployments", "patch"),
    ("apps", "deployments/status", "patch"),
    ("", "events", "create"),
    ("apps", "deployments/finalizers", "update"),
}


#: The overlays with the built-in controllers (deploy/README.md).
VARIANTS = {"builtin": "overlays/builtin-controllers", "dev": "overlays/dev"}


def kustomize(path: Path) -> str:
    """``kubectl kustomize PATH``: the rendered YAML (asserts that it renders)."""
    kubectl = shutil.which("kubectl") or "/usr/bin/kubectl"
    r = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"kubectl kustomize {path} failed:\n{r.stderr}"
    return r.stdout


@functools.cache
def render(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(kustomize(path)) if d]
    assert docs, f"{path} rendered nothing"
    return docs


def render_variant(name: str) -> list[dict[str, Any]]:
    return render(DEPLOY / VARIANTS[name])


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    name: str = request.param
    return name, render_variant(name)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_start: str) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].startswith(name_start)]
    assert len(found) == 1, f"expected one {kind} named {name_start}*, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from workload["spec"]["template"]["spec"]["containers"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _prune(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _prune(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_prune(v) for v in x]
    return x


def test_every_object_matches_its_api_schema(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    api = k8s.ApiClient()
    for d in docs:
        assert d["kind"] in MODELS, f"unexpected kind {d['kind']}"
        obj = api.deserialize(json.dumps(d), MODELS[d["kind"]], "application/json")
        back = _prune(api.sanitize_for_serialization(obj))
        assert back == _prune(d), f"{d['kind']}/{d['metadata']['name']}: unknown or misplaced fields"
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]


def test_kinds_present(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered

    def name(d: dict[str, Any]) -> str:  # generated ConfigMaps carry a content hash suffix
        n: str = d["metadata"]["name"]
        return n.rsplit("-", 1)[0] if d["kind"] == "ConfigMap" else n

    kinds = {(d["kind"], name(d)) for d in docs}
    for expected in [
        ("Namespace", "rangeshard"),
        ("StatefulSet", "rangeshard-etcd"),
        ("Service", "rangeshard-etcd"),
        ("Service", "rangeshard-etcd-peer"),
        ("PodDisruptionBudget", "rangeshard-etcd"),
        ("Deployment", "rangeshard-proxy"),
        ("Service", "rangeshard-proxy"),
        ("StatefulSet", "rangeshard-controller-manager"),
        ("Service", "rangeshard-controller-manager"),
        ("ConfigMap", "rangeshard-manager-config"),
        ("ServiceAccount", "rangeshard-proxy"),
        ("ServiceAccount", "rangeshard-controller-manager"),
        ("ServiceAccount", "rangeshard-etcd"),
        ("ClusterRole", PROXY_READ_ROLE),
        ("ClusterRoleBinding", PROXY_READ_ROLE),
        ("ClusterRoleBinding", "rangeshard-proxy-auth-delegator"),
        ("NetworkPolicy", "rangeshard-proxy"),
        ("NetworkPolicy", "rangeshard-etcd"),
    ]:
        assert expected in kinds, f"missing {expected}"


def test_workloads_have_probes_and_resources(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert len(workloads(docs)) == 3
    for w in workloads(docs):
        name = w["metadata"]["name"]
        for c in containers(w):
            ports = {p["name"] for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{name}/{c['name']}: no {probe}"
                port = c[probe]["httpGet"]["port"]
                assert port in ports, f"{name}/{c['name']}: {probe} on undeclared port {port}"
            res = c.get("resources") or {}
            assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{name}/{c['name']}: requests {res}"
            assert "memory" in res.get("limits", {}), f"{name}/{c['name']}: no memory limit"
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True
            assert sc.get("capabilities", {}).get("drop") == ["ALL"]
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()


def test_probe_paths(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for kind, name in (("Deployment", "rangeshard-proxy"), ("StatefulSet", "rangeshard-controller-manager")):
        (c,) = containers(one(docs, kind, name))
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_references_exist(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    sas = {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
    cms = {d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")}
    roles = {d["metadata"]["name"] for d in by_kind(docs, "ClusterRole")}
    for w in workloads(docs):
        pod = w["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] in sas, f"{w['metadata']['name']}: ServiceAccount missing"
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in cms, f"{w['metadata']['name']}: ConfigMap {vol} missing"
    builtin = {"system:auth-delegator"}  # ships with every cluster
    for b in by_kind(docs, "ClusterRoleBinding"):
        assert b["roleRef"]["name"] in roles | builtin
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["name"] in sas and s["namespace"] == NAMESPACE, s
    pod_labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)]
    for svc in by_kind(docs, "Service"):
        sel = svc["spec"]["selector"]
        targets = [w for w in workloads(docs) if selects(sel, w["spec"]["template"]["metadata"]["labels"])]
        assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)} workloads"
        declared = {p["name"] for c in containers(targets[0]) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in declared, f"Service {svc['metadata']['name']}: targetPort {p['targetPort']}"
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], labels) for labels in pod_labels), pdb
    for np in by_kind(docs, "NetworkPolicy"):
        assert any(selects(np["spec"]["podSelector"]["matchLabels"], labels) for labels in pod_labels), np
    # Clients are admitted by labels: their namespace's (the stack's own carries it) and their pods'.
    (ns,) = by_kind(docs, "Namespace")
    clients = {
        "rangeshard-proxy": {"rangeshard-controller-manager"},
        "rangeshard-etcd": {"rangeshard-controller-manager", "rangeshard-proxy"},
    }
    for np_name, expected in clients.items():
        np = one(docs, "NetworkPolicy", np_name)
        peers = [p for rule in np["spec"]["ingress"] for p in rule["from"] if "namespaceSelector" in p]
        assert len(peers) == 1, np
        assert selects(peers[0]["namespaceSelector"]["matchLabels"], ns["metadata"]["labels"]), (np, ns)
        admitted = {
            w["metadata"]["name"]
            for w in workloads(docs)
            if selects(peers[0]["podSelector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
        }
        assert admitted == expected, (np_name, admitted)


def test_manager_config_validates_and_points_at_the_services(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, docs = rendered
    mgr = one(docs, "StatefulSet", "rangeshard-controller-manager")
    (c,) = containers(mgr)
    i = c["args"].index("controller-manager")
    assert c["args"][i : i + 3] == ["controller-manager", "--config", "/etc/rangeshard/manager.yaml"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/rangeshard")
    vol = next(v for v in mgr["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    cm = one(docs, "ConfigMap", vol["configMap"]["name"])
    assert set(cm["data"]) == {"manager.yaml"}
    path = tmp_path / "manager.yaml"
    path.write_text(cm["data"]["manager.yaml"])
    cfg = load_config(path)

    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}

    def service_port(url: str) -> tuple[str, int]:
        host, port = url.split("://", 1)[1].rsplit(":", 1)
        assert host in services, f"{url}: no Service {host}"
        assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, url
        return host, int(port)

    assert [service_port(u) for u in cfg.etcd.endpoints] == [("rangeshard-etcd", 2379)]
    assert service_port(cfg.proxy.url) == ("rangeshard-proxy", 8001)
    assert cfg.metrics is not None and cfg.metrics.host == "0.0.0.0"
    assert {p["containerPort"] for p in c["ports"]} == {cfg.metrics.port}
    assert set(cfg.controllers) == {"replicaset", "deployment"}
    # The proxy authenticates every cached read (--auth-mode delegate): the managers send the projected token.
    assert cfg.proxy.token_file == str(Path(projected_token_path(mgr, c)).resolve())
    # The managers may reach etcd through its NetworkPolicy.
    assert mgr["spec"]["template"]["metadata"]["labels"].get("rangeshard.io/etcd-client") == "true"


def projected_token_path(workload: dict[str, Any], container: dict[str, Any]) -> str:
    """Where ``container`` sees the pod's projected ServiceAccount token."""
    (vol,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if "projected" in v]
    (source,) = vol["projected"]["sources"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == vol["name"]]
    return f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"


def test_proxy_runs_in_cluster(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    (c,) = containers(one(docs, "Deployment", "rangeshard-proxy"))
    args = c["args"]
    assert args[0] == "proxy" and "--in-cluster" in args
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == "8001"


def test_proxy_fences_writes_against_the_managers_registry(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    proxy = one(docs, "Deployment", "rangeshard-proxy")
    (c,) = containers(proxy)
    args = c["args"]
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "manager.yaml" in (d.get("data") or {})]
    cfg = yaml.safe_load(cm["data"]["manager.yaml"])
    assert args[args.index("--etcd") + 1].split(",") == cfg["etcd"]["endpoints"]
    assert args[args.index("--registry-prefix") + 1] == cfg["registryPrefix"]
    # etcd's NetworkPolicy admits the proxy.
    assert proxy["spec"]["template"]["metadata"]["labels"].get("rangeshard.io/etcd-client") == "true"


def test_etcd_members(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    want = 3 if name == "builtin" else 1
    sts = one(docs, "StatefulSet", "rangeshard-etcd")
    assert sts["spec"]["replicas"] == want
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    peer = one(docs, "Service", "rangeshard-etcd-peer")
    assert sts["spec"]["serviceName"] == "rangeshard-etcd-peer"
    assert peer["spec"]["clusterIP"] == "None" and peer["spec"]["publishNotReadyAddresses"] is True
    (c,) = containers(sts)
    env = {e["name"]: e.get("value") for e in c["env"]}
    members = dict(m.split("=", 1) for m in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert members == {
        f"rangeshard-etcd-{i}": f"http://rangeshard-etcd-{i}.rangeshard-etcd-peer:2380" for i in range(want)
    }
    assert env["ETCD_NAME"] == "$(POD_NAME)"
    assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == "http://$(POD_NAME).rangeshard-etcd-peer:2380"
    pdb = one(docs, "PodDisruptionBudget", "rangeshard-etcd")
    # Voluntary disruptions never take more than one member (quorum of 3 is 2).
    assert pdb["spec"].get("maxUnavailable") == 1


def test_replicas_and_requests_per_variant() -> None:
    base, dev = render_variant("builtin"), render_variant("dev")
    assert one(base, "StatefulSet", "rangeshard-controller-manager")["spec"]["replicas"] == 3
    assert one(dev, "StatefulSet", "rangeshard-controller-manager")["spec"]["replicas"] == 1
    assert one(dev, "Deployment", "rangeshard-proxy")["spec"]["replicas"] == 1

    def mem_mi(docs: list[dict[str, Any]]) -> int:
        total = 0
        for w in workloads(docs):
            for c in containers(w):
                value = c["resources"]["requests"]["memory"]
                assert value.endswith("Mi"), value
                total += int(value[:-2]) * w["spec"]["replicas"]
        return total

    assert mem_mi(dev) < mem_mi(base) / 4


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    granted: set[tuple[str, str, str]] = set()
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {rule}"
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return granted


def test_rbac_least_privilege(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    proxy = _granted(one(docs, "ClusterRole", PROXY_READ_ROLE))
    assert proxy == PROXY_NEEDS, f"missing {PROXY_NEEDS - proxy}, extra {proxy - PROXY_NEEDS}"
    manager = _granted(one(docs, "ClusterRole", "rangeshard-controller-manager"))
    assert manager == MANAGER_NEEDS, f"missing {MANAGER_NEEDS - manager}, extra {manager - MANAGER_NEEDS}"
    bindings = by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")
    roles_of: dict[str, set[str]] = {}
    for b in bindings:
        for subject in b["subjects"]:
            roles_of.setdefault(subject["name"], set()).add(b["roleRef"]["name"])
    assert roles_of == {
        "rangeshard-proxy": {PROXY_READ_ROLE, "system:auth-delegator"},
        "rangeshard-controller-manager": {"rangeshard-controller-manager"},
    }
    # The proxy delegates authorization; managers authenticate with a projected token only.
    (proxy_c,) = containers(one(docs, "Deployment", "rangeshard-proxy"))
    assert proxy_c["args"][proxy_c["args"].index("--auth-mode") + 1] == "delegate"
    mgr_sa = one(docs, "ServiceAccount", "rangeshard-controller-manager")
    assert mgr_sa["automountServiceAccountToken"] is False
    mgr = one(docs, "StatefulSet", "rangeshard-controller-manager")
    pod = mgr["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    projected = [v for v in pod["volumes"] if "projected" in v]
    assert projected and projected[0]["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    assert 'ENTRYPOINT ["rangeshard"]' in text
    assert "USER 10001" in text
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pkg in (p.rstrip("*") for p in packages):
        assert f"COPY {pkg} ./{pkg}" in text, pkg
        assert f"!{pkg}/**" in ignore, pkg


def test_managers_have_a_stable_identity_for_rolling_restarts(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """StatefulSet pod names as instance prefixes + rejoinGraceSeconds: a rolling update moves no key."""
    _, docs = rendered
    sts = one(docs, "StatefulSet", "rangeshard-controller-manager")
    assert sts["spec"]["serviceName"] == "rangeshard-controller-manager"
    headless = one(docs, "Service", "rangeshard-controller-manager")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    (c,) = containers(sts)
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    args = c["args"]
    assert args[args.index("--instance-prefix") + 1] == "$(POD_NAME)"
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("rangeshard-manager")
    )
    manager_yaml = yaml.safe_load(config["data"]["manager.yaml"])
    assert manager_yaml["rejoinGraceSeconds"] > 0
    # The pod can drain within its termination grace period.
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > manager_yaml["reconcileTimeoutSeconds"]


def test_base_holds_only_etcd_and_the_proxy() -> None:
    docs = render(DEPLOY / "base")
    assert {(w["kind"], w["metadata"]["name"]) for w in workloads(docs)} == {
        ("StatefulSet", "rangeshard-etcd"),
        ("Deployment", "rangeshard-proxy"),
    }
    assert not by_kind(docs, "ConfigMap") and not by_kind(docs, "ClusterRole"), "no use's config or read role"
    # Its only RBAC: delegated authentication/authorization of the proxy.
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rangeshard-proxy", "namespace": NAMESPACE}]
    # The built-in controllers are a component of their own: no Namespace, no etcd, no proxy in it.
    builtin = render(DEPLOY / "builtin-controllers")
    assert {w["metadata"]["name"] for w in workloads(builtin)} == {"rangeshard-controller-manager"}
    assert not by_kind(builtin, "Namespace") and not by_kind(builtin, "NetworkPolicy")
