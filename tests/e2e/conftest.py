"""End-to-end fixtures: etcd + local API server + range filter proxy + controller-manager processes.

Every manager is a real ``rangeshard controller-manager`` process with its own
config file and audit log; tests SIGKILL, SIGTERM and partition them. The API
server stores objects in the session etcd under a random prefix; the registry
uses its own random prefix (or a private etcd when a test stops it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from controller_manager.audit import find_overlaps, read_records
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import EtcdServer
from registry import Registry, Snapshot
from tests.helpers import run_cli

LEASE_TTL = 4
RECONCILE_TIMEOUT = 1.0


@dataclass
class Manager:
    name: str
    proc: subprocess.Popen[bytes]
    config: Path
    audit: Path
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@dataclass
class Cluster:
    etcd_url: str
    registry_etcd_url: str
    registry_prefix: str
    apiserver: LocalApiServerProcess
    proxy: ProxyProcess
    workdir: Path
    managers: list[Manager] = field(default_factory=list)
    counter: int = 0
    registry_server: EtcdServer | None = None

    @property
    def api(self) -> Any:
        cfg = k8s.Configuration()
        cfg.host = self.apiserver.url
        return k8s.ApiClient(cfg)

    def start_manager(
        self, controllers: dict[str, Any] | None = None, etcd_url: str | None = None, name: str | None = None
    ) -> Manager:
        self.counter += 1
        name = name or f"m{self.counter}"
        cfg = {
            "etcd": {"endpoints": [etcd_url or self.registry_etcd_url]},
            "proxy": {"url": self.proxy.url},
            "leaseTTLSeconds": LEASE_TTL,
            "reconcileTimeoutSeconds": RECONCILE_TIMEOUT,
            "registryPrefix": self.registry_prefix,
            "controllers": controllers or {"replicaset": {"workers": 2}, "deployment": {"workers": 1}},
        }
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        audit = self.workdir / f"{name}.audit.jsonl"
        log = self.workdir / f"{name}.log"
        proc = run_cli(
            [
                *("--log-level", "info", "controller-manager"),
                *("--config", str(path), "--audit-log", str(audit), "--instance-prefix", name),
            ],
            log,
            new_session=True,
        )
        m = Manager(name, proc, path, audit, log)
        self.managers.append(m)
        return m

    def snapshot(self, controller_type: str) -> Snapshot:
        with EtcdClient(EtcdConfig.from_urls(self.registry_etcd_url)) as client:
            return Registry(client, self.registry_prefix).snapshot(controller_type)

    def overlaps(self) -> list[Any]:
        files = [m.audit for m in self.managers if m.audit.exists()]
        return find_overlaps(read_records(files))

    def audit_count(self) -> int:
        files = [m.audit for m in self.managers if m.audit.exists()]
        return len(read_records(files))

    def stop(self) -> None:
        for m in self.managers:
            if m.alive:
                try:
                    m.terminate(15)
                except subprocess.TimeoutExpired:
                    m.kill()


def _start_cluster(
    etcd_url: str,
    registry_etcd_url: str,
    workdir: Path,
    registry_server: EtcdServer | None = None,
    apiserver_args: list[str] | None = None,
) -> Iterator[Cluster]:
    storage = f"/e2e-{uuid.uuid4().hex[:8]}"
    apiserver = LocalApiServerProcess(
        etcd_url,
        prefix=storage,
        log_file=workdir / "apiserver.log",
        bookmark_interval=0.2,
        extra_args=apiserver_args,
    )
    apiserver.start()
    proxy = ProxyProcess(apiserver.url, log_file=workdir / "proxy.log")
    try:
        proxy.start()
        cluster = Cluster(etcd_url, registry_etcd_url, f"/rs-{uuid.uuid4().hex[:8]}", apiserver, proxy, workdir)
        cluster.registry_server = registry_server
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        proxy.stop()
        apiserver.stop()
        with EtcdClient(EtcdConfig.from_urls(etcd_url)) as c:
            c.delete_prefix(storage + "/")


@pytest.fixture
def cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from _start_cluster(etcd_server.url, etcd_server.url, tmp_path)


@pytest.fixture
def node_cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose local API server simulates a node (pods become Running/Ready)."""
    yield from _start_cluster(etcd_server.url, etcd_server.url, tmp_path, apiserver_args=["--simulate-node", "n1"])


@pytest.fixture
def private_registry_cluster(etcd_server: EtcdServer, etcd_server_factory: Any, tmp_path: Path) -> Iterator[Cluster]:
    """API objects in the session etcd, the registry in a private etcd the test may stop."""
    reg = etcd_server_factory()
    reg.start()
    yield from _start_cluster(etcd_server.url, reg.url, tmp_path, reg)


def dump_logs(cluster: Cluster) -> str:
    out = []
    for m in cluster.managers:
        if m.log.exists():
            out.append(f"--- {m.name} ---\n" + "\n".join(m.log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(out)


os.environ.setdefault("PYTHONUNBUFFERED", "1")
