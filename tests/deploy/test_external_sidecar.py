"""deploy/external-sidecar: an unmodified controller image with the manager as a sidecar container.

Rendered with ``kubectl kustomize``; checked: every object round-trips through
the official client's model; the pod runs the operator and the manager; the
operator's kubeconfig names the manager's endpoint (``external.listen``) and
holds no credentials; the manager config validates, runs no command (the
operator is the other container) and points at the base's etcd and proxy;
both containers have probes and resources; RBAC gives the operator what a
kopf operator owning ConfigMaps needs and the proxy's caches their reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from controller_manager.config import load_config
from tests.deploy.test_manifests import DEPLOY, MODELS, _prune, by_kind, containers, one, render

SIDECAR = DEPLOY / "external-sidecar"


def docs() -> list[dict[str, Any]]:
    return render(SIDECAR)


def test_every_object_matches_its_api_schema() -> None:
    api = k8s.ApiClient()
    for d in docs():
        assert d["kind"] in MODELS, f"unexpected kind {d['kind']}"
        obj = api.deserialize(json.dumps(d), MODELS[d["kind"]], "application/json")
        assert _prune(api.sanitize_for_serialization(obj)) == _prune(d), d["metadata"]["name"]


def _mounted_configmap(sts: dict[str, Any], container: dict[str, Any], mount_path: str) -> dict[str, Any]:
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == mount_path)
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    return one(docs(), "ConfigMap", vol["configMap"]["name"])


def test_operator_talks_only_to_its_sidecars_endpoint(tmp_path: Path) -> None:
    sts = one(docs(), "StatefulSet", "gadget-operator")
    by_name = {c["name"]: c for c in containers(sts)}
    assert set(by_name) == {"operator", "controller-manager"}
    operator, manager = by_name["operator"], by_name["controller-manager"]

    # The manager: one external controller without command, stable instance ids.
    args = manager["args"]
    i = args.index("controller-manager")
    assert args[i : i + 3] == ["controller-manager", "--config", "/etc/rangeshard/manager.yaml"]
    assert args[args.index("--instance-prefix") + 1] == "$(POD_NAME)"
    cm = _mounted_configmap(sts, manager, "/etc/rangeshard")
    path = tmp_path / "manager.yaml"
    path.write_text(cm["data"]["manager.yaml"])
    cfg = load_config(path)
    assert set(cfg.controllers) == {"gadget"}
    external = cfg.controllers["gadget"].external
    assert external is not None and not external.command, "the operator is the other container"
    assert {(s.resource, s.by) for s in external.shard} == {
        ("gadgets.bars.example.org", "uid"),
        ("configmaps", "owner"),
    }
    base = load_config_text(render(DEPLOY / "base"), tmp_path)
    assert list(cfg.etcd.endpoints) == list(base.etcd.endpoints) and cfg.proxy.url == base.proxy.url
    assert cfg.registry_prefix == base.registry_prefix, "the proxy fences against the same registry"

    # The operator: KUBECONFIG names the endpoint on the pod's loopback, no credentials.
    env = {e["name"]: e.get("value") for e in operator.get("env", [])}
    kubeconfig_path = Path(env["KUBECONFIG"])
    kcm = _mounted_configmap(sts, operator, str(kubeconfig_path.parent))
    kubeconfig = yaml.safe_load(kcm["data"][kubeconfig_path.name])
    (cluster,) = kubeconfig["clusters"]
    assert cluster["cluster"]["server"] == f"http://{external.listen}"
    assert external.listen.startswith("127.0.0.1:"), "the endpoint is reachable from the pod only"
    assert all(not u["user"] for u in kubeconfig["users"]), "no credentials in the operator's kubeconfig"
    assert "--standalone" in operator["args"], "kopf must not elect a leader: every pod runs"
    spec = sts["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False

    for c in (operator, manager):
        assert c.get("livenessProbe") and c.get("readinessProbe"), c["name"]
        assert c["resources"]["requests"].keys() >= {"cpu", "memory"} and "memory" in c["resources"]["limits"]
    assert sts["spec"]["template"]["metadata"]["labels"].get("rangeshard.io/etcd-client") == "true"


def load_config_text(rendered: list[dict[str, Any]], tmp_path: Path) -> Any:
    cm = one(rendered, "ConfigMap", "rangeshard-manager-config")
    path = tmp_path / "base-manager.yaml"
    path.write_text(cm["data"]["manager.yaml"])
    return load_config(path)


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def test_rbac_for_the_operator_and_the_proxys_caches() -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(docs(), "ClusterRole")}
    operator = _granted(roles["gadget-operator"])
    assert ("bars.example.org", "gadgets", "patch") in operator  # kopf keeps its progress in annotations
    assert {("", "configmaps", v) for v in ("create", "patch", "list", "watch")} <= operator
    assert not any("*" in x for t in operator for x in t), "no wildcards"
    proxy = _granted(roles["rangeshard-proxy-gadgets"])
    assert proxy == {
        (g, r, v) for g, r in (("bars.example.org", "gadgets"), ("", "configmaps")) for v in ("get", "list", "watch")
    }
    bindings = {b["metadata"]["name"]: b for b in by_kind(docs(), "ClusterRoleBinding")}
    assert bindings["gadget-operator"]["subjects"][0]["name"] == "gadget-operator"
    assert bindings["rangeshard-proxy-gadgets"]["subjects"][0]["name"] == "rangeshard-proxy"
    sts = one(docs(), "StatefulSet", "gadget-operator")
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "gadget-operator"
