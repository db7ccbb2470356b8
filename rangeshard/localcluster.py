"""One local cluster: etcd, the local API server, the range filter proxy and N controller managers.

Purpose
    :class:`LocalCluster` is how ``rangeshard up``, the test kit
    (:class:`rangeshard.testing.TestCluster`) and the benchmarks
    (``bench.common.BenchCluster``) start the system on loopback: an etcd of
    its own (or a given one, with a fresh storage prefix), the local API
    server on it, the proxy in front of it, and :class:`ManagerProcess`
    children added with :meth:`LocalCluster.add_manager`. Each caller only
    says what differs (ports, file names, bookmark interval, write fencing,
    a relay between the proxy and the API server). :meth:`LocalCluster.apply`
    creates objects from manifests (``up``'s demo, the test kit's fixtures).

Invariants
    * :meth:`LocalCluster.start` returns with etcd, the API server and the
      proxy ready (each waited for by :func:`rangeshard.core.process.wait_ready`),
      or raises after stopping whatever it had started.
    * :meth:`LocalCluster.stop` stops everything it started, whatever
      happens, in reverse order: the managers (a graceful leave, all at once),
      the proxy, the API server, then its own etcd; with a given etcd it
      deletes its storage prefix instead. It is idempotent; a failing step
      is reported to ``on_error`` (default: a WARNING) and the others still run.
    * Every part is waited for by that one routine, with its own check: etcd
      a KV read, the API server and the proxy ``/readyz``
      (:meth:`rangeshard.core.process.ManagedProcess.wait_http_ready`; no
      part keeps a readiness loop of its own), the managers the caller's
      check (registry state, audit).
    * Everything binds 127.0.0.1; logs go to ``workdir`` (``etcd.log``,
      ``apiserver.log``, ``proxy.log``, one per manager).
    * Every part dies with the process that started the cluster (a
      parent-death signal, :func:`rangeshard.core.process.popen`) unless
      ``detached`` (``rangeshard up --detach``).

Concurrency model
    Owned by the thread that started it; the parts are child processes.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import orjson
import yaml
from kubernetes import client as k8s

from controller_manager.process import ManagerProcess
from controller_manager.resources import raw_request
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.kubeapi import kubeconfig
from rangeshard.core.process import ManagedProcess, wait_ready
from rangeshard.core.rest import GVR, group_version_path

log = logging.getLogger(__name__)
P = TypeVar("P")


class LocalClusterError(RangeshardError):
    """A part of the local cluster was asked for before :meth:`LocalCluster.start`."""


@dataclass(eq=False)
class LocalCluster:
    """etcd + local API server + proxy + managers as child processes (see module docstring).

    ``external_etcd``: use that etcd (under ``storage_prefix``) instead of
    starting one; ports None: any free one; ``etcd_fast``: etcd's short
    election timing (tests); ``fence_registry``: the managers' registry
    prefix, turning the proxy's write fencing on (the registry in
    ``fence_etcd``, default the cluster's etcd); ``proxy_upstream``: where
    the proxy reaches the API server (default its URL; a benchmark puts a
    byte-counting relay there); ``detached``: the parts outlive this process
    (no parent-death signal; ``up --detach``).
    """

    workdir: Path
    external_etcd: str | None = None
    etcd_port: int | None = None
    etcd_peer_port: int | None = None
    etcd_fast: bool = False
    storage_prefix: str | None = None
    apiserver_port: int | None = None
    bookmark_interval: float = 1.0
    apiserver_args: Sequence[str] = ()
    proxy_port: int | None = None
    proxy_resources: Sequence[str] = ()
    proxy_args: Sequence[str] = ()
    fence_registry: str | None = None
    fence_etcd: str | None = None
    proxy_upstream: Callable[[LocalApiServerProcess], str] | None = None
    detached: bool = False
    etcd: EtcdServer | None = field(default=None, init=False)
    apiserver: LocalApiServerProcess | None = field(default=None, init=False)
    proxy: ProxyProcess | None = field(default=None, init=False)
    managers: list[ManagerProcess] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)  # a str works too

    def start(self) -> Self:
        """Start etcd (unless external), the API server and the proxy, each ready before the next."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.external_etcd is None:
                self.etcd = EtcdServer(
                    self.workdir / "etcd",
                    client_port=self.etcd_port,
                    peer_port=self.etcd_peer_port,
                    fast=self.etcd_fast,
                    log_file=self.workdir / "etcd.log",
                )
                self.etcd.detached = self.detached
                self.etcd.start()
            self.apiserver = LocalApiServerProcess(
                self.etcd_url,
                port=self.apiserver_port,
                prefix=self.storage_prefix,
                log_file=self.workdir / "apiserver.log",
                bookmark_interval=self.bookmark_interval,
                extra_args=list(self.apiserver_args),
            )
            self.apiserver.detached = self.detached
            self.apiserver.start()
            self._start_proxy(self.apiserver)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_proxy(self, apiserver: LocalApiServerProcess) -> None:
        args = list(self.proxy_args)
        if self.fence_registry is not None:  # write fencing: the proxy watches the managers' registry
            args += ["--etcd", self.fence_etcd or self.etcd_url, "--registry-prefix", self.fence_registry]
        upstream = self.proxy_upstream(apiserver) if self.proxy_upstream is not None else apiserver.url
        self.proxy = ProxyProcess(
            upstream,
            port=self.proxy_port,
            resources=self.proxy_resources,
            log_file=self.workdir / "proxy.log",
            extra_args=args,
        )
        self.proxy.detached = self.detached
        self.proxy.start()

    def add_manager(
        self, name: str, config: Mapping[str, Any] | Path, *, log: Path | None = None, **options: Any
    ) -> ManagerProcess:
        """Start a ``rangeshard controller-manager`` named ``name`` (not waited for).

        ``config``: a config file, or a mapping written to ``WORKDIR/NAME.yaml``; ``log``
        defaults to ``WORKDIR/NAME.log``; ``options`` go to :meth:`ManagerProcess.of_config`.
        """
        if not isinstance(config, Path):
            path = self.workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
            config = path
        return self.add(ManagerProcess.of_config(name, config, log or self.workdir / f"{name}.log", **options))

    def add(self, manager: ManagerProcess) -> ManagerProcess:
        """Start ``manager`` (any manager program) as part of this cluster: it is stopped with it."""
        manager.detached = self.detached
        self.managers.append(manager)
        return manager.start()

    def parts(self) -> list[ManagedProcess]:
        """Every child process of this cluster (for :func:`rangeshard.core.process.wait_ready`)."""
        return [p for p in (self.etcd, self.apiserver, self.proxy, *self.managers) if p is not None]

    def stop_managers(self, managers: Sequence[ManagerProcess] | None = None, timeout: float = 20.0) -> None:
        """Graceful leave of ``managers`` (default: all) at once (SIGKILL after ``timeout``); they leave the cluster."""
        leaving = list(self.managers if managers is None else managers)
        for m in leaving:
            m.send(signal.SIGTERM)
        for m in leaving:
            m.stop(timeout)
        self.managers = [m for m in self.managers if m not in leaving]

    def stop(self, on_error: Callable[[str, Exception], None] | None = None) -> None:
        """Stop everything this cluster started, in reverse order (see module docstring)."""
        steps: list[tuple[str, Callable[[], None]]] = [("managers", self.stop_managers)]
        parts = (("proxy", self.proxy), ("local API server", self.apiserver), ("etcd", self.etcd))
        steps += [(what, part.stop) for what, part in parts if part is not None]
        if self.external_etcd is not None and self.storage_prefix:
            steps.append(("storage", self._delete_storage))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # keep stopping the others
                if on_error is None:
                    log.warning("local cluster: stopping %s failed: %s", what, e)
                else:
                    on_error(what, e)

    def _delete_storage(self) -> None:
        with EtcdClient(EtcdConfig.from_urls(self.etcd_url)) as client:
            client.delete_prefix(f"{self.storage_prefix}/")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api_client(self) -> Any:
        """An official-client ``ApiClient`` talking to the local API server directly (close it when done)."""
        cfg = k8s.Configuration()
        cfg.host = self.api_url
        return k8s.ApiClient(cfg)

    def apply(self, manifest: str | Path | Mapping[str, Any], namespace: str | None = None) -> list[dict[str, Any]]:
        """Create the objects of a YAML file, a YAML string or a dict (existing ones are left alone).

        CRDs are waited for until their resources are served.
        """
        if isinstance(manifest, Mapping):
            docs: list[Any] = [dict(manifest)]
        else:
            text = Path(manifest).read_text() if isinstance(manifest, Path) or "\n" not in manifest else manifest
            docs = [d for d in yaml.safe_load_all(text) if d]
        created: list[dict[str, Any]] = []
        with self.api_client() as api:
            for doc in docs:
                created.append(self._create(api, doc, namespace))
        return created

    def _create(self, api: Any, doc: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        api_version = str(doc.get("apiVersion") or "")
        kind = str(doc.get("kind") or "")
        group, _, version = api_version.rpartition("/")
        found = orjson.loads(raw_request(api, "GET", group_version_path(group, version), timeout=10).data)
        entry = next((r for r in found.get("resources") or [] if r.get("kind") == kind and "/" not in r["name"]), None)
        if entry is None:
            raise LocalClusterError(f"{api_version} serves no kind {kind!r}")
        ns = (doc.get("metadata") or {}).get("namespace") or namespace
        path = GVR(group, version, entry["name"]).path(ns if entry.get("namespaced") else None)
        try:
            obj: dict[str, Any] = orjson.loads(
                raw_request(api, "POST", path, body=doc, content_type="application/json", timeout=10).data
            )
        except k8s.ApiException as e:
            if e.status != 409:
                raise
            obj = doc
        if kind == "CustomResourceDefinition":
            spec = doc.get("spec") or {}
            plural = (spec.get("names") or {}).get("plural")
            versions = [v["name"] for v in spec.get("versions") or [] if v.get("served", True)]

            def served() -> tuple[bool, str]:
                for v in versions:
                    try:
                        listing = orjson.loads(
                            raw_request(api, "GET", group_version_path(spec["group"], v), timeout=5).data
                        )
                    except k8s.ApiException as e:
                        return False, f"{spec['group']}/{v}: {e.status}"
                    if not any(r.get("name") == plural for r in listing.get("resources") or []):
                        return False, f"{spec['group']}/{v} does not serve {plural}"
                return True, "served"

            name = (doc.get("metadata") or {}).get("name")
            wait_ready(served, 10, what=f"CRD {name}", error=LocalClusterError, interval=0.05)
        return obj

    @property
    def etcd_url(self) -> str:
        return self.external_etcd or _started(self.etcd).url

    @property
    def api_url(self) -> str:
        return _started(self.apiserver).url

    @property
    def proxy_url(self) -> str:
        return _started(self.proxy).url

    def write_kubeconfig(self, path: Path, name: str) -> Path:
        """A kubeconfig (cluster, user, context: ``name``) for ``kubectl --kubeconfig PATH`` against the API server."""
        path.write_text(yaml.safe_dump(kubeconfig(self.api_url, name), sort_keys=False))
        return path


def _started(part: P | None) -> P:
    if part is None:
        raise LocalClusterError("the local cluster is not started")
    return part
