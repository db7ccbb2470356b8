"""deploy/external-sidecar: an unmodified controller image with the manager as a sidecar container.

The component on the base alone (``deploy/overlays/external-sidecar``),
rendered with ``kubectl kustomize``; checked: every object round-trips through
the official client's model; the pod runs the operator and the manager; the
operator's kubeconfig names the manager's endpoint (``external.listen``) and
holds no credentials; the manager config validates, runs no command (the
operator is the other container) and points at the base's etcd and proxy
Services and the proxy's registry prefix; both containers have probes and
resources; the pods are admitted by the base's NetworkPolicies; RBAC gives the
operator what a kopf operator owning ConfigMaps needs and the proxy list and
watch of what it caches for it (generated: tests/deploy/test_deploy_rbac.py).
It needs the base alone: nothing of deploy/builtin-controllers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from controller_manager.config import load_config
from tests.deploy.test_manifests import (
    DEPLOY,
    MODELS,
    _prune,
    by_kind,
    containers,
    one,
    projected_token_path,
    render,
)

SIDECAR = DEPLOY / "external-sidecar"
OVERLAY = DEPLOY / "overlays" / "external-sidecar"


def docs() -> list[dict[str, Any]]:
    return render(OVERLAY)


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
    base = render(DEPLOY / "base")
    services = {s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]} for s in by_kind(base, "Service")}
    for url in (*cfg.etcd.endpoints, cfg.proxy.url):
        host, port = url.split("://", 1)[1].rsplit(":", 1)
        assert int(port) in services.get(host, set()), f"{url}: no such Service in deploy/base"
    (proxy_c,) = containers(one(base, "Deployment", "rangeshard-proxy"))
    args = proxy_c["args"]
    assert args[args.index("--etcd") + 1].split(",") == list(cfg.etcd.endpoints)
    assert cfg.registry_prefix == args[args.index("--registry-prefix") + 1], "the proxy fences the same registry"
    token = str(Path(projected_token_path(sts, manager)).resolve())
    assert cfg.proxy.token_file == token, "the proxy authenticates the sidecar"

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
    # The base's NetworkPolicies admit the pods to the proxy and to etcd (same namespace: it carries the label).
    labels = sts["spec"]["template"]["metadata"]["labels"]
    (ns,) = by_kind(base, "Namespace")
    for np in by_kind(base, "NetworkPolicy"):
        (peer,) = [p for rule in np["spec"]["ingress"] for p in rule["from"] if "namespaceSelector" in p]
        assert peer["namespaceSelector"]["matchLabels"].items() <= ns["metadata"]["labels"].items()
        assert peer["podSelector"]["matchLabels"].items() <= labels.items(), np["metadata"]["name"]


def test_needs_the_base_alone() -> None:
    """The overlay is the base plus the component: no object of deploy/builtin-controllers."""

    def ids(rendered: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in rendered}

    component, base = ids(render(SIDECAR)), ids(render(DEPLOY / "base"))
    assert not component & base, "the component repeats nothing of the base"
    assert ids(docs()) == component | base
    assert not ids(docs()) & ids(render(DEPLOY / "builtin-controllers"))
    assert not by_kind(render(SIDECAR), "Namespace") and not by_kind(render(SIDECAR), "NetworkPolicy")


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def test_rbac_for_the_operator_and_the_proxys_caches() -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(docs(), "ClusterRole")}
    operator = _granted(roles["gadget-operator"])
    assert ("bars.example.org", "gadgets", "patch") in operator  # kopf keeps its progress in annotations
    assert ("bars.example.org", "gadgets/status", "patch") in operator  # status.observedGeneration
    assert {("", "configmaps", v) for v in ("create", "patch", "list", "watch")} <= operator
    assert not any("*" in x for t in operator for x in t), "no wildcards"
    # The proxy lists and watches the shard resources and the CRDs kopf watches (unsharded) through it.
    proxy = _granted(roles["rangeshard-proxy-gadget"])
    cached = (
        ("bars.example.org", "gadgets"),
        ("", "configmaps"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    )
    assert proxy == {(g, r, v) for g, r in cached for v in ("list", "watch")}
    # Every cached read is authorized for the operator too (the proxy's SubjectAccessReview).
    assert {(g, r, v) for g, r in cached for v in ("list", "watch")} <= operator
    bindings = {b["metadata"]["name"]: b for b in by_kind(docs(), "ClusterRoleBinding")}
    assert bindings["gadget-operator"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "gadget-operator", "namespace": "rangeshard"}
    ]
    assert bindings["rangeshard-proxy-gadget"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "rangeshard-proxy", "namespace": "rangeshard"}
    ]
    sts = one(docs(), "StatefulSet", "gadget-operator")
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "gadget-operator"
