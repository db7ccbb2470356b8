"""The rendered manifests are accepted by an API server: ``kubectl apply`` against the local API server.

Each overlay (and the two-use kustomization of ``test_overlays``, in another
namespace) is rendered with ``kubectl kustomize`` and applied with the real
``kubectl`` to a local API server of its own (fresh storage prefix on the
session etcd), which decodes every object, validates it against the kind's
schema with ``fieldValidation=Strict`` (an unknown or misplaced field is an
error, not dropped: a misspelt field in the proxy's Deployment is refused
below) and applies kube's defaults; then every object is read back.

Server-side dry-run: ``kubectl apply --dry-run=server`` (the local API
server validates, defaults and checks, and writes nothing). As on a real
cluster, the objects of a namespace the manifests create are refused in a dry
run while that namespace does not exist: the Namespaces are applied for real
first, then everything is dry-run; then everything is applied for real and
read back, so both paths are checked.

Kinds the server does not serve would be named in :data:`SKIP_KINDS` with the
reason; every kind the manifests use is served, so it is empty, and a kind
that is neither served nor listed fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from local_apiserver.process import LocalApiServerProcess
from tests.deploy.conftest import Kubectl
from tests.deploy.test_manifests import DEPLOY, kustomize

#: kind -> why the local API server cannot take it (and so it is not applied). None today.
SKIP_KINDS: dict[str, str] = {}


def served_kinds(url: str) -> set[tuple[str, str]]:
    """``(apiVersion, kind)`` of every resource the server's discovery lists."""
    out: set[tuple[str, str]] = set()
    with httpx.Client(base_url=url, timeout=10) as http:
        versions = [f"/api/{v}" for v in http.get("/api").json()["versions"]]
        for group in http.get("/apis").json()["groups"]:
            versions += [f"/apis/{v['groupVersion']}" for v in group["versions"]]
        for path in versions:
            doc = http.get(path).json()
            out |= {(doc["groupVersion"], r["kind"]) for r in doc["resources"] if "/" not in r["name"]}
    return out


def dry_run_supported(kubectl: Kubectl) -> bool:
    probe = kubectl("create", "namespace", "dry-run-probe", "--dry-run=server")
    assert probe.returncode == 0, probe.stderr  # the local API server takes dry runs
    return True


def apply(kubectl: Kubectl, url: str, docs: list[dict[str, Any]]) -> str:
    """Apply ``docs`` (dry-run on the server when it can), check every object; kubectl's output."""
    served = served_kinds(url)
    applied = []
    for d in docs:
        if (d["apiVersion"], d["kind"]) in served:
            applied.append(d)
        else:
            assert d["kind"] in SKIP_KINDS, f"{d['apiVersion']} {d['kind']} is not served: name it in SKIP_KINDS"
    assert applied
    text = "---\n".join(yaml.safe_dump(d) for d in applied)
    if dry_run_supported(kubectl):
        namespaces = "---\n".join(yaml.safe_dump(d) for d in applied if d["kind"] == "Namespace")
        if namespaces:
            made = kubectl("apply", "-f", "-", input=namespaces)
            assert made.returncode == 0, made.stderr
        dry = kubectl("apply", "--dry-run=server", "-f", "-", input=text)
        assert dry.returncode == 0, f"kubectl apply --dry-run=server failed:\n{dry.stderr}"
        assert all("(server dry run)" in line for line in dry.stdout.splitlines()), dry.stdout
    r = kubectl("apply", "-f", "-", input=text)
    assert r.returncode == 0, f"kubectl apply failed:\n{r.stderr}"
    assert len(r.stdout.splitlines()) == len(applied), r.stdout
    got = kubectl("get", "-f", "-", "-o", "json", input=text)
    assert got.returncode == 0, got.stderr
    items = yaml.safe_load(got.stdout)
    items = items.get("items", [items])
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [(d["kind"], d["metadata"]["name"]) for d in applied]
    return r.stdout


def rendered(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kustomize(path)) if d]


@pytest.mark.parametrize(
    "overlay", ["overlays/builtin-controllers", "overlays/external-sidecar", "overlays/dev", "overlays/autoscaling"]
)
def test_overlay_is_accepted(overlay: str, kubectl: Kubectl, server: LocalApiServerProcess) -> None:
    out = apply(kubectl, server.url, rendered(DEPLOY / overlay))
    assert "namespace/rangeshard" in out and "deployment.apps/rangeshard-proxy" in out


def test_two_uses_in_another_namespace_are_accepted(
    elsewhere: list[dict[str, Any]], kubectl: Kubectl, server: LocalApiServerProcess
) -> None:
    out = apply(kubectl, server.url, elsewhere)
    assert "namespace/team-ops" in out and "statefulset.apps/gadget-operator" in out


def test_an_unknown_field_is_refused(kubectl: Kubectl, server: LocalApiServerProcess) -> None:
    """The check has teeth: a misspelt field in one object fails the apply."""
    docs = rendered(DEPLOY / "base")
    for d in docs:
        if d["kind"] == "Deployment":
            d["spec"]["replicaz"] = 2
    text = "---\n".join(yaml.safe_dump(d) for d in docs)
    flag = "--dry-run=server" if dry_run_supported(kubectl) else "--dry-run=none"
    r = kubectl("apply", flag, "-f", "-", input=text)
    assert r.returncode != 0 and "replicaz" in r.stderr, (r.stdout, r.stderr)
