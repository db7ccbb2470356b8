"""Fixtures of the deploy tests: a kustomization of a user's own, in another namespace and registry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_manifests import DEPLOY, kustomize

REGISTRY = "registry.example.com/platform"
#: Every image the manifests use -> the reference the user's kustomization sets.
IMAGES = {
    "rangeshard": f"{REGISTRY}/rangeshard:1.2.3",
    "gadget-operator": f"{REGISTRY}/gadget-operator:1.2.3",
    "gcr.io/etcd-development/etcd": f"{REGISTRY}/etcd:v3.5.17",
}


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base and both components, in namespace ``team-ops``, every image from :data:`REGISTRY`."""
    here = tmp_path_factory.mktemp("ops")
    up = Path(os.path.relpath(DEPLOY, here))  # kustomize wants relative paths to other kustomizations
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "team-ops",
        "resources": [str(up / "base")],
        "components": [str(up / "builtin-controllers"), str(up / "external-sidecar")],
        "images": [
            {"name": name, "newName": ref.rsplit(":", 1)[0], "newTag": ref.rsplit(":", 1)[1]}
            for name, ref in IMAGES.items()
        ],
    }
    (here / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    text = kustomize(here)
    assert "rangeshard.svc" not in text and "namespace: rangeshard\n" not in text, "a hard-coded namespace"
    return [d for d in yaml.safe_load_all(text) if d]
