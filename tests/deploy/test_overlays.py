"""Every kustomization under deploy/ renders, and one kustomization sets the namespace and images of all.

``kubectl kustomize`` renders the base, both components and every overlay.
A kustomization of a user's own (written to ``tmp_path``) lists the base and
both components and sets another namespace and an image registry and tag for
every image, once: every namespaced object, every ServiceAccount subject and
the Namespace itself move to it, every image reference names the new
registry, nothing still spells the default namespace, and the
NetworkPolicies still admit the stack's clients, because they select
namespaces by label, not by name. One stack serves both uses: the proxy's
ServiceAccount is bound to each use's read role, and reads the union.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.conftest import IMAGES
from tests.deploy.test_manifests import DEPLOY, by_kind, one, render, selects, workloads

KUSTOMIZATIONS = [
    "base",
    "builtin-controllers",
    "external-sidecar",
    "prometheus-rules",
    "overlays/builtin-controllers",
    "overlays/external-sidecar",
    "overlays/dev",
    "autoscaling",
    "overlays/autoscaling",
]
NAMESPACE_LABEL = "rangeshard.io/client-namespace"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def test_every_kustomization_renders() -> None:
    found = sorted(str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml"))
    # The dev overlay's manager-config is a component of that overlay only.
    assert sorted([*KUSTOMIZATIONS, "overlays/dev/manager-config"]) == found, "a new kustomization: add it here"
    for path in KUSTOMIZATIONS:
        assert render(DEPLOY / path)


def image_refs(docs: list[dict[str, Any]]) -> list[str]:
    return [c["image"] for w in workloads(docs) for c in w["spec"]["template"]["spec"]["containers"]]


def test_namespace_set_in_one_place(elsewhere: list[dict[str, Any]]) -> None:
    (ns,) = by_kind(elsewhere, "Namespace")
    assert ns["metadata"]["name"] == "team-ops" and ns["metadata"]["labels"][NAMESPACE_LABEL] == "true"
    for d in elsewhere:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"]["namespace"] == "team-ops", (d["kind"], d["metadata"]["name"])
    subjects = [s for b in by_kind(elsewhere, "ClusterRoleBinding") for s in b["subjects"]]
    assert len(subjects) == 5
    assert all(s["kind"] == "ServiceAccount" and s["namespace"] == "team-ops" for s in subjects), subjects


def test_images_set_in_one_place(elsewhere: list[dict[str, Any]]) -> None:
    refs = image_refs(elsewhere)
    assert len(refs) == 5  # proxy, etcd, manager, the operator and its sidecar
    assert set(refs) == set(IMAGES.values()), refs
    # The same overlay without the images: every reference was changed, none was already right.
    defaults = set(image_refs(render(DEPLOY / "overlays" / "builtin-controllers")))
    defaults |= set(image_refs(render(DEPLOY / "overlays" / "external-sidecar")))
    assert defaults == {"rangeshard:0.1.0", "gadget-operator:0.1.0", "gcr.io/etcd-development/etcd:v3.5.17"}
    assert not defaults & set(refs)


def test_network_policies_admit_clients_by_namespace_label(elsewhere: list[dict[str, Any]]) -> None:
    (ns,) = by_kind(elsewhere, "Namespace")
    admitted = {
        "rangeshard-proxy": {"rangeshard-controller-manager", "gadget-operator"},
        "rangeshard-etcd": {"rangeshard-controller-manager", "gadget-operator", "rangeshard-proxy"},
    }
    for name, expected in admitted.items():
        np = one(elsewhere, "NetworkPolicy", name)
        text = yaml.safe_dump(np)
        assert "kubernetes.io/metadata.name" not in text and "team-ops" not in text.replace("namespace: team-ops", "")
        (peer,) = [p for rule in np["spec"]["ingress"] for p in rule["from"] if "namespaceSelector" in p]
        assert peer["namespaceSelector"]["matchLabels"] == {NAMESPACE_LABEL: "true"}
        assert selects(peer["namespaceSelector"]["matchLabels"], ns["metadata"]["labels"])
        got = {
            w["metadata"]["name"]
            for w in workloads(elsewhere)
            if selects(peer["podSelector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
        }
        assert got == expected, (name, got)


def test_one_stack_serves_both_uses(elsewhere: list[dict[str, Any]]) -> None:
    """One etcd, one proxy: the proxy reads the union of the uses' resources; their types are distinct."""
    assert sorted(w["metadata"]["name"] for w in workloads(elsewhere)) == [
        "gadget-operator",
        "rangeshard-controller-manager",
        "rangeshard-etcd",
        "rangeshard-proxy",
    ]
    roles = {r["metadata"]["name"]: r for r in by_kind(elsewhere, "ClusterRole")}
    bound = {
        b["roleRef"]["name"]
        for b in by_kind(elsewhere, "ClusterRoleBinding")
        if b["subjects"][0]["name"] == "rangeshard-proxy"
    }
    assert bound == {"system:auth-delegator", "rangeshard-proxy-deployment-replicaset", "rangeshard-proxy-gadget"}
    reads = {
        (g, r) for name in bound - {"system:auth-delegator"} for rule in roles[name]["rules"]
        for g in rule["apiGroups"] for r in rule["resources"]
    }  # fmt: skip
    assert reads == {
        ("", "pods"),
        ("apps", "replicasets"),
        ("apps", "deployments"),
        ("", "configmaps"),
        ("bars.example.org", "gadgets"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    }
    configs = [
        yaml.safe_load(cm["data"]["manager.yaml"])
        for cm in by_kind(elsewhere, "ConfigMap")
        if "manager.yaml" in cm.get("data", {})
    ]
    assert len(configs) == 2
    assert len({c["registryPrefix"] for c in configs}) == 1, "one registry prefix, the proxy's"
    types = [t for c in configs for t in c["controllers"]]
    assert len(types) == len(set(types)), "controller types are distinct keys under the one prefix"
