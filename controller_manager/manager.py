"""The controller-manager process: every configured controller, one registered instance each.

Purpose
    Arktos proposal C: a manager started with a local config file runs every
    listed controller with its fixed number of workers. Each controller type
    is one :class:`ControllerRuntime` (one registry instance). The manager
    serves ``/metrics``, ``/healthz`` and ``/readyz`` and leaves gracefully on
    SIGTERM/SIGINT (stop taking keys, drain, revoke the leases). Its
    :class:`~controller_manager.watchdog.Watchdog` makes it not ready while a
    built-in controller is stuck (``/readyz`` names it) and, once one was
    stuck for ``watchdog.exitAfterSeconds``, makes it leave the registry and
    exit 1 for its supervisor to restart it.

Invariants
    * All controllers talk to the API through the proxy URL of the config.
    * Instance ids are ``<prefix>-<controller>`` with a per-process prefix
      (hostname-pid-random by default), unique across restarts.

Concurrency model
    The main thread waits for a signal; everything else runs on the named
    threads of the runtimes, informers, lease keepers and watches.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from controller_manager.audit import AuditLog
from controller_manager.config import ControllerSection, ManagerConfig
from controller_manager.external import ExternalRuntime
from controller_manager.metrics import Metrics, StatusServer
from controller_manager.plugins import controller_type, resolve_controllers
from controller_manager.shardhost import ShardSettings
from controller_manager.watchdog import Watchdog
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.loops import start_thread

if TYPE_CHECKING:
    from controller_manager.controller import Controller, ControllerRuntime

log = logging.getLogger(__name__)


def default_instance_prefix() -> str:
    host = socket.gethostname().lower().split(".")[0]
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in host).strip("-") or "host"
    return f"{host[:40]}-{os.getpid()}-{secrets.token_hex(2)}"


class ControllerManager:
    """Runs the controllers of one config file (see module docstring)."""

    def __init__(
        self, config: ManagerConfig, *, audit_path: str | None = None, instance_prefix: str | None = None
    ) -> None:
        self.config = config
        etcd = config.etcd
        self.etcd_config = EtcdConfig.from_urls(
            list(etcd.endpoints),
            ca_cert=etcd.ca_cert,
            cert_file=etcd.cert,
            key_file=etcd.key,
            username=etcd.username,
            password=etcd.password.get_secret_value() if etcd.password is not None else None,
        )
        self.metrics = Metrics()
        self.audit = AuditLog(audit_path) if audit_path else None
        self.prefix = instance_prefix or config.instance_id_prefix or default_instance_prefix()
        self.api_clients: list[Any] = []
        self.runtimes: list[ControllerRuntime | ExternalRuntime] = []
        classes = resolve_controllers(config.controllers)
        for name, section in config.controllers.items():
            # What every runtime's shard instance takes, built-in or external.
            shard = ShardSettings(
                etcd_config=self.etcd_config,
                registry_prefix=config.registry_prefix,
                controller_type=name,
                instance_id=f"{self.prefix}-{name}",
                lease_ttl=config.lease_ttl_seconds,
                reconcile_timeout=config.reconcile_timeout_seconds,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                rejoin_grace=config.rejoin_grace_seconds,
                stuck_after_seconds=config.stuck_after_seconds,
                proxy_url=config.proxy.url,
            )
            if section.external is not None:
                self.runtimes.append(
                    ExternalRuntime(
                        name,
                        section.external,
                        proxy_url=config.proxy.url,
                        proxy_token_file=config.proxy.token_file,
                        proxy_ca_cert=config.proxy.ca_cert,
                        shard=shard,
                        metrics=self.metrics,
                    )
                )
                continue
            self.runtimes.append(self._in_process(name, classes[name], section, shard))
        self.watchdog = Watchdog(
            config.watchdog,
            [rt for rt in self.runtimes if not isinstance(rt, ExternalRuntime)],
            on_stuck=lambda name, stuck: self.metrics.stuck.labels(name).set(1 if stuck else 0),
        )
        for rt in self.runtimes:
            if not isinstance(rt, ExternalRuntime):
                self.metrics.stuck.labels(rt.name).set(0)
        self.status: StatusServer | None = None
        if config.metrics is not None:
            self.status = StatusServer(
                self.metrics, self.ready, config.metrics.host, config.metrics.port, detail=self.not_ready
            )

    def _in_process(
        self, name: str, cls: type[Controller], section: ControllerSection, shard: ShardSettings
    ) -> ControllerRuntime:
        """The runtime of a ``Controller`` class: the framework and the official client are loaded here only."""
        from controller_manager.controller import ControllerRuntime  # noqa: PLC0415 (not for external-only managers)
        from controller_manager.fencing import api_client_for  # noqa: PLC0415

        proxy = self.config.proxy
        # One client per instance: its User-Agent is that instance's owner token.
        api_client = api_client_for(proxy.url, proxy.token_file, proxy.ca_cert)
        self.api_clients.append(api_client)
        return ControllerRuntime(
            cls,
            api_client=api_client,
            shard=replace(shard, controller_type=controller_type(name, cls)),
            workers=section.workers,
            metrics=self.metrics,
            audit=self.audit,
            reconcile_delay=section.reconcile_delay_seconds,
            reconcile_hold_file=section.reconcile_hold_file,
            cost_window=self.config.cost_window_seconds,
            shard_labels={item.resource: item.label for item in section.shard if item.label},
        )

    def ready(self) -> bool:
        return all(rt.ready for rt in self.runtimes) and not self.watchdog.reasons()

    def not_ready(self) -> list[str]:
        """Why each controller that processes nothing now does not, or is stuck (``/readyz``'s 503 body).

        A failing informer is named as ``informer <controller>-<resource>: <error>`` (its name says
        the controller); a stuck controller as ``<controller>: stuck: <why>``; any other reason is
        ``<controller>: <why>``.
        """
        reasons = [(rt.name, rt.not_ready_reason()) for rt in self.runtimes]
        out = [why if why.startswith("informer ") else f"{name}: {why}" for name, why in reasons if why is not None]
        stuck = self.watchdog.reasons()
        return out + [f"{name}: stuck: {'; '.join(why)}" for name, why in sorted(stuck.items())]

    def start(self) -> None:
        if self.status is not None:
            self.status.start()
            log.info("metrics on %s/metrics", self.status.url)
        for rt in self.runtimes:
            rt.start()
        self.watchdog.start()
        log.info(
            "controller manager %s started: %s",
            self.prefix,
            ", ".join(f"{rt.name}x{rt.workers}" for rt in self.runtimes),
        )

    def stop(self) -> None:
        """Graceful leave of every controller (in parallel), then the status server.

        After the watchdog expired, a wedged worker is not waited for long: the process's end ends it (and
        a reconcile still running keeps the lease unrevoked: it expires after the process is gone).
        """
        self.watchdog.stop()
        wedged = self.watchdog.expired() is not None
        if wedged:
            for rt in self.runtimes:
                rt.shard.rejoin_grace = 0.0  # a real leave: a stuck manager's range goes to its neighbours now

        def leave(rt: ControllerRuntime | ExternalRuntime) -> Any:
            if wedged and not isinstance(rt, ExternalRuntime):
                return lambda: rt.stop(join_timeout=1.0)
            return rt.stop

        threads = [start_thread(f"leave-{rt.name}", leave(rt), daemon=False) for rt in self.runtimes]
        for t in threads:
            t.join()
        if self.status is not None:
            self.status.stop()
        if self.audit is not None:
            self.audit.close()
        for api_client in self.api_clients:
            api_client.close()
        log.info("controller manager %s stopped", self.prefix)

    def fatal(self) -> str | None:
        """Why this manager must not run (another live process has one of its instance ids, or a controller
        was stuck past ``watchdog.exitAfterSeconds``), if so."""
        found = next((rt.shard.fatal for rt in self.runtimes if rt.shard.fatal is not None), None)
        return found or self.watchdog.expired()

    def run_until_signal(self) -> int:
        """Run until SIGTERM/SIGINT (exit code 0) or a fatal condition (1: a duplicate instance id, or a
        controller stuck past ``watchdog.exitAfterSeconds``); always stops gracefully (leaves the registry)."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.start()
        code = 0
        try:
            while not stop.wait(0.5):
                if self.fatal() is not None:
                    code = 1
                    break
        finally:
            self.stop()
        return code
