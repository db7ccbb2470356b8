"""One local cluster: etcd, the local API server, the range filter proxy and N controller managers.

Purpose
    :class:`LocalCluster` is how ``rangeshard up``, the test kit
    (:class:`rangeshard.testing.TestCluster`) and the benchmarks
    (``bench.common.BenchCluster``) start the system on loopback: an etcd of
    its own (or a given one, with a fresh storage prefix), the local API
    server on it, the proxy in front of it, and :class:`ManagerProcess`
    children added with :meth:`LocalCluster.add_manager`. Each caller only
    says what differs (ports, file names, bookmark interval, write fencing,
    a relay between the proxy and the API server).

Invariants
    * :meth:`LocalCluster.start` returns with etcd, the API server and the
      proxy ready (each waited for by :func:`rangeshard.core.process.wait_ready`),
      or raises after stopping whatever it had started.
    * :meth:`LocalCluster.stop` stops everything it started, whatever
      happens, in reverse order: the managers (a graceful leave, all at once),
      the proxy, the API server, then its own etcd; with a given etcd it
      deletes its storage prefix instead. It is idempotent; a failing step
      is reported to ``on_error`` (default: a WARNING) and the others still run.
    * Everything binds 127.0.0.1; logs go to ``workdir`` (``etcd.log``,
      ``apiserver.log``, ``proxy.log``, one per manager).

Concurrency model
    Owned by the thread that started it; the parts are child processes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from controller_manager.process import ManagerProcess, stop_all
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import EtcdServer, ManagedProcess, ReadyCheck, wait_ready

log = logging.getLogger(__name__)
P = TypeVar("P")


class LocalClusterError(RangeshardError):
    """A part of the local cluster was asked for before :meth:`LocalCluster.start`."""


def kubeconfig_document(server_url: str, name: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, user and context named ``name``, pointing at ``server_url``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server_url}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


class LocalCluster:
    """etcd + local API server + proxy + managers as child processes (see module docstring).

    ``etcd_url``: use that etcd (under a fresh ``storage_prefix``) instead of
    starting one; ``etcd_port``/``etcd_peer_port``/``apiserver_port``/
    ``proxy_port``: fixed ports (None: any free one); ``etcd_fast``: etcd's
    short election timing (tests); ``fence_registry``: the managers' registry
    prefix, turning the proxy's write fencing on (the registry in
    ``fence_etcd``, default the cluster's etcd); ``proxy_upstream``: where
    the proxy reaches the API server (default its URL; a benchmark puts a
    byte-counting relay there).
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        etcd_url: str | None = None,
        etcd_port: int | None = None,
        etcd_peer_port: int | None = None,
        etcd_fast: bool = False,
        storage_prefix: str | None = None,
        apiserver_port: int | None = None,
        bookmark_interval: float = 1.0,
        apiserver_args: Sequence[str] = (),
        proxy_port: int | None = None,
        proxy_resources: Sequence[str] = (),
        proxy_args: Sequence[str] = (),
        fence_registry: str | None = None,
        fence_etcd: str | None = None,
        proxy_upstream: Callable[[LocalApiServerProcess], str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self._given_etcd = etcd_url
        self._etcd_ports = (etcd_port, etcd_peer_port, etcd_fast)
        self.storage_prefix = storage_prefix
        self._apiserver_options = (apiserver_port, bookmark_interval, list(apiserver_args))
        self._proxy_options = (proxy_port, list(proxy_resources), list(proxy_args), fence_registry)
        self._proxy_upstream = proxy_upstream
        self._fence_etcd = fence_etcd
        self.etcd: EtcdServer | None = None
        self.apiserver: LocalApiServerProcess | None = None
        self.proxy: ProxyProcess | None = None
        self.managers: list[ManagerProcess] = []

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Start etcd (unless given), the API server and the proxy, each ready before the next."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_proxy()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        if self._given_etcd is not None:
            return
        port, peer_port, fast = self._etcd_ports
        self.etcd = EtcdServer(
            self.workdir / "etcd", client_port=port, peer_port=peer_port, fast=fast, log_file=self.workdir / "etcd.log"
        )
        self.etcd.start()

    def _start_apiserver(self) -> None:
        port, bookmark_interval, args = self._apiserver_options
        self.apiserver = LocalApiServerProcess(
            self.etcd_url,
            port=port,
            prefix=self.storage_prefix,
            log_file=self.workdir / "apiserver.log",
            bookmark_interval=bookmark_interval,
            extra_args=args,
        )
        self.apiserver.start()

    def _start_proxy(self) -> None:
        apiserver = self._require(self.apiserver)
        port, resources, args, fence_registry = self._proxy_options
        if fence_registry is not None:  # write fencing: the proxy watches the managers' registry
            args = [*args, "--etcd", self._fence_etcd or self.etcd_url, "--registry-prefix", fence_registry]
        upstream = self._proxy_upstream(apiserver) if self._proxy_upstream is not None else apiserver.url
        self.proxy = ProxyProcess(
            upstream, port=port, resources=resources, log_file=self.workdir / "proxy.log", extra_args=args
        )
        self.proxy.start()

    def add_manager(
        self,
        name: str,
        config: Mapping[str, Any] | Path,
        *,
        log: Path | None = None,
        instance_prefix: str | None = None,
        audit: Path | None = None,
        **options: Any,
    ) -> ManagerProcess:
        """Start a ``rangeshard controller-manager`` named ``name`` (not waited for; see :meth:`wait_ready`).

        ``config``: a config file, or a mapping written to ``WORKDIR/NAME.yaml``; ``log``
        defaults to ``WORKDIR/NAME.log``; ``options`` go to :meth:`ManagerProcess.of_config`.
        """
        if not isinstance(config, Path):
            path = self.workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
            config = path
        log = log or self.workdir / f"{name}.log"
        manager = ManagerProcess.of_config(name, config, log, instance_prefix=instance_prefix, audit=audit, **options)
        return self.add(manager)

    def add(self, manager: ManagerProcess) -> ManagerProcess:
        """Start ``manager`` (any manager program) as part of this cluster: it is stopped with it."""
        self.managers.append(manager)
        return manager.start()

    def parts(self) -> list[ManagedProcess]:
        """Every child process this cluster runs now."""
        started = [self.etcd, self.apiserver, self.proxy, *self.managers]
        return [p for p in started if p is not None]

    def wait_ready(
        self,
        check: ReadyCheck,
        timeout: float,
        *,
        what: str,
        error: type[RangeshardError],
        tolerated_exits: Sequence[int] = (),
        hint: Callable[[], str] | None = None,
        stop: threading.Event | None = None,
        interval: float = 0.2,
    ) -> None:
        """:func:`~rangeshard.core.process.wait_ready` watching every part: one that exits fails the wait at once."""
        wait_ready(
            check,
            timeout,
            what=what,
            error=error,
            children=self.parts(),
            tolerated_exits=tolerated_exits,
            hint=hint,
            stop=stop,
            interval=interval,
        )

    def stop_managers(self, managers: Sequence[ManagerProcess] | None = None, timeout: float = 20.0) -> None:
        """Graceful leave of ``managers`` (default: all) at once (SIGKILL after ``timeout``); they leave the cluster."""
        leaving = list(self.managers if managers is None else managers)
        stop_all(leaving, timeout)
        self.managers = [m for m in self.managers if m not in leaving]

    def stop(self, on_error: Callable[[str, Exception], None] | None = None) -> None:
        """Stop everything this cluster started, in reverse order (see module docstring)."""
        steps: list[tuple[str, Callable[[], None]]] = [("managers", self.stop_managers)]
        parts = (("proxy", self.proxy), ("local API server", self.apiserver), ("etcd", self.etcd))
        steps += [(what, part.stop) for what, part in parts if part is not None]
        if self.etcd is None and self._given_etcd is not None and self.storage_prefix:
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

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------
    @property
    def etcd_url(self) -> str:
        if self._given_etcd is not None:
            return self._given_etcd
        return self._require(self.etcd).url

    @property
    def api_url(self) -> str:
        return self._require(self.apiserver).url

    @property
    def proxy_url(self) -> str:
        return self._require(self.proxy).url

    def write_kubeconfig(self, path: Path, name: str) -> Path:
        """A kubeconfig for ``kubectl --kubeconfig PATH`` against the local API server."""
        path.write_text(yaml.safe_dump(kubeconfig_document(self.api_url, name), sort_keys=False))
        return path

    @staticmethod
    def _require(part: P | None) -> P:
        if part is None:
            raise LocalClusterError("the local cluster is not started")
        return part


__all__ = ["LocalCluster", "LocalClusterError", "kubeconfig_document"]
