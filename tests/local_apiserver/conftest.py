"""Fixtures for the local API server tests: one server process per module on the session etcd.

Each module gets its own random storage prefix, so modules never see each
other's objects; the prefix is deleted afterwards. Clients: ``http`` (httpx),
``kube`` (the official ``kubernetes`` client) and ``kubectl`` (the real binary).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from tests.helpers import missing_prerequisite

BOOKMARK_INTERVAL = 0.3


@dataclass
class Server:
    proc: LocalApiServerProcess
    prefix: str

    @property
    def url(self) -> str:
        return self.proc.url


@pytest.fixture(scope="module")
def apiserver(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    prefix = f"/test-las-{uuid.uuid4().hex[:10]}"
    log_file = tmp_path_factory.mktemp("las") / "apiserver.log"
    proc = LocalApiServerProcess(etcd_server.url, prefix=prefix, log_file=log_file, bookmark_interval=BOOKMARK_INTERVAL)
    proc.start()
    yield Server(proc, prefix)
    proc.stop()
    with EtcdClient(EtcdConfig.from_urls(etcd_server.url)) as client:
        client.delete_prefix(prefix + "/")


@pytest.fixture
def http(apiserver: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=apiserver.url, timeout=10.0) as client:
        yield client


@pytest.fixture
def namespace(http: httpx.Client) -> str:
    """A fresh namespace for one test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    resp = http.post("/api/v1/namespaces", json={"metadata": {"name": name}})
    assert resp.status_code == 201, resp.text
    return name


@pytest.fixture
def kube(apiserver: Server) -> Iterator[Any]:
    cfg = kubernetes.client.Configuration()
    cfg.host = apiserver.url
    with kubernetes.client.ApiClient(cfg) as api_client:
        yield api_client


KUBECTL = shutil.which("kubectl")


@pytest.fixture
def kubectl(apiserver: Server, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    if KUBECTL is None:
        missing_prerequisite("kubectl is not installed")
    kubectl_path = KUBECTL
    home = tmp_path / "home"  # no user kubeconfig, no discovery cache shared between tests
    home.mkdir()

    def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_path, "--server", apiserver.url, "--cache-dir", str(tmp_path / "cache"), *args]
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            input=input,
            timeout=30,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value (or fail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """The sum of the Prometheus samples ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def deployment(name: str, replicas: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj)
