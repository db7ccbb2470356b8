"""Fixtures of the deploy tests: a kustomization of a user's own (another namespace and registry), and a
local API server of a test's own with the real kubectl in front of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from tests.deploy.test_manifests import DEPLOY, kustomize
from tests.helpers import missing_prerequisite

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

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


@pytest.fixture
def server(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[LocalApiServerProcess]:
    """A local API server of this test's own (a fresh storage prefix, deleted afterwards)."""
    prefix = f"/test-deploy-{uuid.uuid4().hex[:10]}"
    proc = LocalApiServerProcess(etcd_server.url, prefix=prefix, log_file=tmp_path / "apiserver.log")
    proc.start()
    yield proc
    proc.stop()
    with EtcdClient(EtcdConfig.from_urls(etcd_server.url)) as client:
        client.delete_prefix(prefix + "/")


@pytest.fixture
def kubectl(server: LocalApiServerProcess, tmp_path: Path) -> Kubectl:
    exe = shutil.which("kubectl")
    if exe is None:
        missing_prerequisite("kubectl is not installed")
    home = tmp_path / "home"  # no user kubeconfig, no shared discovery cache
    home.mkdir()

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [exe, "--server", server.url, "--cache-dir", str(tmp_path / "cache"), *args]
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
        return subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=120, env=env)

    return run
