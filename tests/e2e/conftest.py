"""End-to-end fixtures: etcd + local API server + range filter proxy + controller-manager processes.

Every manager is a real ``rangeshard controller-manager`` process with its own
config file and audit log; tests SIGKILL, SIGTERM, SIGSTOP and partition them,
and can make every reconcile slow (``reconcileDelaySeconds``) so handovers
happen while moved keys are in flight. The API server stores objects in the
session etcd under a random prefix; the registry uses its own random prefix
(or a private etcd when a test stops it).

Audit checks are never vacuous: :meth:`Cluster.overlaps` fails when a started
manager wrote no audit file or no record (unless the test names it as allowed
to be idle), and :meth:`Cluster.handed_over` lists the keys that more than one
instance reconciled, so a scenario can prove that keys changed hands.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from controller_manager.audit import AuditRecord, find_overlaps, read_records
from controller_manager.process import ManagerProcess
from hashing import hash_key
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.cli.progress import Progress
from rangeshard.cli.progress import fetch as fetch_progress
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdCluster, EtcdServer
from rangeshard.localcluster import LocalCluster
from registry import Registry, Snapshot
from tests.e2e.kube import replicasets, scale_replicaset

LEASE_TTL = 4
#: The checkout's root: managers import test controllers (``tests.e2e.…``) from it.
REPO_ROOT = Path(__file__).resolve().parents[2]
RECONCILE_TIMEOUT = 1.0


def _manager_env() -> dict[str, str]:
    """This environment with the checkout on ``PYTHONPATH`` (managers run with ``-P``: no cwd on sys.path)."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class Manager(ManagerProcess):
    """The test kit's manager process, plus what the handover scenarios need."""

    proc: subprocess.Popen[bytes]
    audit: Path
    hold_file: Path | None = None

    def terminate(self, timeout: float = 20) -> int:
        """Graceful leave; unlike the kit's, a manager that does not leave in time fails the test (no SIGKILL)."""
        self.send(signal.SIGTERM)
        return self.proc.wait(timeout)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its registration until its lease expires, but does nothing."""
        self.send(signal.SIGSTOP)

    def metrics_url(self) -> str:
        found = re.search(r"metrics on (http://\S+)/metrics", self.log.read_text(errors="replace"))
        assert found, f"{self.name} logged no metrics address"
        return found.group(1)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of this manager's ``/metrics`` (0 when absent)."""
        with httpx.Client(timeout=5) as c:
            text = c.get(self.metrics_url() + "/metrics").text
        for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE):
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                return float(m.group(2))
        return 0.0

    def handover(self, controller: str = "replicaset") -> dict[str, float]:
        """This manager's ``rangeshard_handover_events_total`` counters of one controller, by event."""
        with httpx.Client(timeout=5) as c:
            text = c.get(self.metrics_url() + "/metrics").text
        pattern = rf'^rangeshard_handover_events_total{{controller="{controller}",event="(\w+)"}} (\S+)$'
        return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


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
        self,
        controllers: dict[str, Any] | None = None,
        etcd_url: str | None = None,
        name: str | None = None,
        reconcile_delay: float = 0.0,
        lease_ttl: int = 0,
        hold: bool = False,
        reconcile_timeout: float = 0.0,
        log_level: str | None = "info",
        config_extra: dict[str, Any] | None = None,
        files: str | None = None,
    ) -> Manager:
        """Start a manager; ``reconcile_delay`` makes every reconcile of every controller that slow.

        ``hold``: every controller gets ``reconcileHoldFile`` = ``manager.hold_file``
        (absent at start): while the test makes that file exist, reconciles hold
        their keys, up to ``reconcile_timeout`` (default ``RECONCILE_TIMEOUT``).
        ``log_level=None`` runs it as a user would by hand, without ``--log-level``.
        ``config_extra``: top-level config fields added; ``files``: the stem of its
        config, log and audit files (default ``name``; a restart of the same
        instance ids under another stem keeps each incarnation's audit apart).
        """
        self.counter += 1
        name = name or f"m{self.counter}"
        controllers = controllers or {"replicaset": {"workers": 2}, "deployment": {"workers": 1}}
        if reconcile_delay:
            controllers = {k: {**v, "reconcileDelaySeconds": reconcile_delay} for k, v in controllers.items()}
        hold_file = self.workdir / f"{name}.hold"
        if hold:
            controllers = {k: {**v, "reconcileHoldFile": str(hold_file)} for k, v in controllers.items()}
        cfg = {
            "etcd": {"endpoints": (etcd_url or self.registry_etcd_url).split(",")},
            "proxy": {"url": self.proxy.url},
            "leaseTTLSeconds": lease_ttl or LEASE_TTL,
            "reconcileTimeoutSeconds": reconcile_timeout or RECONCILE_TIMEOUT,
            "registryPrefix": self.registry_prefix,
            "controllers": controllers,
            **(config_extra or {}),
        }
        stem = files or name
        path = self.workdir / f"{stem}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        audit = self.workdir / f"{stem}.audit.jsonl"
        log = self.workdir / f"{stem}.log"
        m = Manager.of_config(
            name, path, log, instance_prefix=name, audit=audit, log_level=log_level, env=_manager_env()
        )
        m.start()
        m.hold_file = hold_file
        self.managers.append(m)
        return m

    def progress(self, controller_type: str) -> dict[str, Progress]:
        """``instance -> Progress`` of one type, as the proxy's ``/metrics`` say (a proxy with write fencing)."""
        return {i: p for (t, i), p in fetch_progress(self.proxy.url, timeout=10).items() if t == controller_type}

    def snapshot(self, controller_type: str) -> Snapshot:
        with EtcdClient(EtcdConfig.from_urls(self.registry_etcd_url)) as client:
            return Registry(client, self.registry_prefix).snapshot(controller_type)

    def owners(self, controller_type: str, uids: Iterable[str]) -> dict[str, str]:
        """The instance whose range holds each uid's hash now (uid -> instance id; none when nobody owns it)."""
        snap = self.snapshot(controller_type)
        members = {uid: snap.owner_of(hash_key(uid)) for uid in uids}
        return {uid: m.instance_id for uid, m in members.items() if m is not None}

    def manager_of(self, instance_id: str) -> Manager:
        """The manager (its latest incarnation, when one was restarted under the same name) of an instance."""
        return next(m for m in reversed(self.managers) if instance_id.startswith(m.name + "-"))

    def without_objects(self, ns: str, controller: str = "replicaset") -> list[Manager]:
        """Registered managers whose range holds none of ``ns``'s replicasets (they may rightly be idle)."""
        hashes = [hash_key(rs["metadata"]["uid"]) for rs in replicasets(self.api, ns)]
        return [
            self.manager_of(m.instance_id)
            for m in self.snapshot(controller)
            if m.range is not None and not any(m.range.contains(h) for h in hashes)
        ]

    def idle_in(self, ns: str) -> list[Manager]:
        """Managers that hold neither a replicaset nor a deployment of ``ns`` in their ranges (may rightly be idle)."""
        deployments = k8s.AppsV1Api(self.api).list_namespaced_deployment(ns).items
        hashes = [hash_key(d.metadata.uid) for d in deployments]
        busy = {
            self.manager_of(m.instance_id).name
            for m in self.snapshot("deployment")
            if m.range is not None and any(m.range.contains(h) for h in hashes)
        }
        return [m for m in self.without_objects(ns) if m.name not in busy]

    def records(self, may_be_idle: Iterable[Manager] = ()) -> list[AuditRecord]:
        """Every manager's audit records; fails if a started manager (not in ``may_be_idle``) recorded nothing."""
        idle_ok = {m.name for m in may_be_idle}
        records: list[AuditRecord] = []
        for m in self.managers:
            if not m.audit.exists():
                assert m.name in idle_ok, f"manager {m.name} wrote no audit file:\n{dump_logs(self)}"
                continue
            mine = read_records([m.audit])
            assert mine or m.name in idle_ok, f"manager {m.name} audited no reconcile:\n{dump_logs(self)}"
            records += mine
        assert records, "no manager audited any reconcile"
        return records

    def overlaps(self, may_be_idle: Iterable[Manager] = ()) -> list[Any]:
        """Overlapping reconciles in the audit logs (checked to be non-empty, see :meth:`records`)."""
        return find_overlaps(self.records(may_be_idle))

    def audit_count(self) -> int:
        files = [m.audit for m in self.managers if m.audit.exists()]
        return len(read_records(files))

    def handed_over(self, may_be_idle: Iterable[Manager] = ()) -> dict[tuple[str, str], set[str]]:
        """``(controller type, key) -> instances`` for every key more than one instance reconciled."""
        by_key: dict[tuple[str, str], set[str]] = {}
        for r in self.records(may_be_idle):
            by_key.setdefault((r.controller_type, r.key), set()).add(r.instance_id)
        return {k: v for k, v in by_key.items() if len(v) > 1}

    def assert_safe_handover(self, may_be_idle: Iterable[Manager] = ()) -> None:
        """Zero overlaps, and the scenario really moved keys: some key was reconciled by two instances."""
        idle = list(may_be_idle)
        overlaps = self.overlaps(idle)
        assert overlaps == [], f"{len(overlaps)} overlapping reconcile(s), first: {overlaps[:2]}"
        assert self.handed_over(idle), "no key was reconciled by two different instances: nothing was handed over"

    def logs(self) -> list[Path]:
        """Every log this cluster's processes wrote: managers, proxy, local API server."""
        paths = [m.log for m in self.managers] + [Path(self.proxy.log_path), Path(self.apiserver.log_path)]
        return [p for p in paths if p.exists()]

    def assert_no_stale_owner_writes(self) -> None:
        """``python -m controller_manager.audit --apiserver-audit`` over the API server's log: 0 stale-owner writes.

        Run as a user runs it (the module entry point), on the log of a ``fenced_cluster``.
        """
        audit = self.workdir / "apiserver-audit.jsonl"
        check = subprocess.run(
            [sys.executable, "-m", "controller_manager.audit", "--apiserver-audit", str(audit)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert " 0 stale-owner write(s)" in check.stdout, check.stdout

    def assert_no_tracebacks(self) -> None:
        """Expected events (kills, timeouts, disconnects, fencing) are log lines, never a ``Traceback``.

        An external controller's own output (lines its manager copies from the
        ``external-<name>-child`` thread) is not ours: kopf, for one, logs a
        refused late write of a giver with its traceback.
        """
        for path in self.logs():
            lines = path.read_text(errors="replace").splitlines(keepends=True)
            text = "".join(line for line in lines if not re.search(r"\[external-\S+-child\] ", line))
            at = text.find("Traceback")
            assert at < 0, f"{path.name} has a traceback:\n{text[max(0, at - 1500) : at + 3000]}"

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
    fenced: bool = False,
    bookmark_interval: float = 0.2,
) -> Iterator[Cluster]:
    """API server and proxy on ``etcd_url``; ``fenced``: the proxy fences writes against the registry.

    ``bookmark_interval``: how often the API server sends a watch bookmark (kube-apiserver: about once a minute).
    """
    registry_prefix = f"/rs-{uuid.uuid4().hex[:8]}"
    local = LocalCluster(
        workdir,
        external_etcd=etcd_url,
        storage_prefix=f"/e2e-{uuid.uuid4().hex[:8]}",
        bookmark_interval=bookmark_interval,
        apiserver_args=apiserver_args or (),
        fence_registry=registry_prefix if fenced else None,
        fence_etcd=registry_etcd_url,
    )
    with local:
        apiserver, proxy = local.apiserver, local.proxy
        assert apiserver is not None and proxy is not None
        cluster = Cluster(etcd_url, registry_etcd_url, registry_prefix, apiserver, proxy, workdir)
        cluster.registry_server = registry_server
        try:
            yield cluster
        finally:
            for m in cluster.managers:
                if m.alive:
                    os.killpg(m.proc.pid, signal.SIGCONT)  # a frozen manager must be able to leave
            cluster.stop()


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


class Load:
    """Keep reconciles coming while a scenario moves boundaries: scale ``names`` round-robin in a thread."""

    def __init__(self, cluster: Cluster, ns: str, names: list[str], pause: float = 0.05, rounds: int = 2000) -> None:
        self.cluster = cluster
        self.ns = ns
        self.names = names
        self.pause = pause
        self.rounds = rounds
        self.patches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-load", daemon=True)

    def _run(self) -> None:
        api = self.cluster.api
        for i in range(self.rounds):
            if self._stop.is_set():
                return
            scale_replicaset(api, self.ns, self.names[i % len(self.names)], (i // len(self.names)) % 2)
            self.patches += 1
            self._stop.wait(self.pause)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


#: Lease TTL of the fenced cluster's managers (short: pauses past it are the point).
FENCED_LEASE_TTL = 3


@pytest.fixture
def fenced_cluster(etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A cluster whose proxy fences writes and whose API server writes a RequestResponse audit log."""
    monkeypatch.setitem(globals(), "LEASE_TTL", FENCED_LEASE_TTL)
    yield from _fenced_cluster(etcd_server.url, etcd_server.url, tmp_path)


@pytest.fixture
def members_cluster(etcd_server: EtcdServer, etcd_members: EtcdCluster, tmp_path: Path) -> Iterator[Cluster]:
    """A fenced cluster whose registry (managers and the proxy's fencing) is the session's 3-member etcd."""
    yield from _fenced_cluster(etcd_server.url, etcd_members.urls, tmp_path)


@pytest.fixture
def kube_like_cluster(etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A fenced cluster whose API server bookmarks as kube-apiserver does: about once a minute.

    Its watch caches get no progress on request: a consistent read of a quiet
    resource cannot be proven fresh from the cache (the proxy lists upstream).
    """
    monkeypatch.setitem(globals(), "LEASE_TTL", FENCED_LEASE_TTL)
    yield from _fenced_cluster(etcd_server.url, etcd_server.url, tmp_path, bookmark_interval=60.0)


def _fenced_cluster(
    etcd_url: str, registry_urls: str, tmp_path: Path, bookmark_interval: float = 0.2
) -> Iterator[Cluster]:
    audit = tmp_path / "apiserver-audit.jsonl"
    args = ["--audit-log-path", str(audit), "--audit-level", "RequestResponse"]
    yield from _start_cluster(
        etcd_url, registry_urls, tmp_path, apiserver_args=args, fenced=True, bookmark_interval=bookmark_interval
    )
