"""One external controller type in a manager: its shard instance, endpoint and child, wired together.

Purpose
    :class:`ExternalRuntime` registers one instance for the controller as
    usual (:class:`~controller_manager.sharding.ShardInstance`: lease,
    lock -> wait -> active), serves its :class:`Endpoint` and runs its
    :class:`Child`. A controller down longer than ``leaseTTLSeconds`` gives
    its range up and joins again when it runs (:meth:`ExternalRuntime._supervise`).

Handover
    * What the endpoint serves is the instance's *allowed* range
      (``ShardInstance.allowed``): nothing while locked (a new instance owned
      nothing before) or between a range change and the reset that follows.
    * A range change resets every watch at once (the giver stops seeing the
      moved keys); the instance counts as synced as soon as that is done.
    * The giver is drained when no write of the controller to a ``shard``
      resource is in flight and ``drainSeconds`` have passed since the cut;
      then it unlocks the receiver as usual. Safety does not rest on the
      drain: a late write carries a stale owner token and the proxy refuses it.

Concurrency model
    The shard instance's callbacks run on its state-machine thread and only
    touch the endpoint's :class:`~controller_manager.external.serving.ServingState`;
    the membership supervisor is the thread ``external-<name>-membership``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from controller_manager.config import ExternalSection
from controller_manager.external.child import Child
from controller_manager.external.endpoint import Endpoint
from controller_manager.metrics import Metrics
from controller_manager.shardhost import ShardHost, ShardSettings
from controller_manager.sharding import ShardInstance
from hashing import HashRange
from rangeshard.core.loops import start_thread
from rangeshard.core.ownertoken import OwnerToken
from registry import ChildInfo

log = logging.getLogger(__name__)


class ExternalRuntime(ShardHost):
    """One external controller type in this process: its shard instance, endpoint and child."""

    workers = 0

    def __init__(
        self,
        name: str,
        section: ExternalSection,
        *,
        proxy_url: str,
        proxy_token_file: str | None,
        proxy_ca_cert: str | None,
        shard: ShardSettings,
        metrics: Metrics,
    ) -> None:
        """``shard``: the instance's settings; its ``main_resource`` is set here, from the section."""
        self.name = controller_type = shard.controller_type
        self.instance_id = instance_id = shard.instance_id
        self.lease_ttl = shard.lease_ttl
        self.metrics = metrics
        self._settings = replace(shard, main_resource=section.published_main())
        self.shard = ShardInstance(self._settings, self)
        self.endpoint = Endpoint(
            controller_type,
            section,
            self.shard,
            proxy_url=proxy_url,
            token_file=proxy_token_file,
            ca_cert=proxy_ca_cert,
        )
        child = (
            Child(
                name,
                list(section.command),
                self.endpoint.url,
                controller_type=controller_type,
                instance_id=instance_id,
                liveness_probe=section.liveness_probe,
                on_restart=lambda: metrics.external_restarts.labels(controller_type).inc(),
                on_probe=lambda result: metrics.external_probes.labels(
                    controller_type, "successful" if result.ok else "failed"
                ).inc(),
            )
            if section.command
            else None
        )
        self.child = child
        if child is not None:
            metrics.external_up.labels(controller_type).set_function(lambda: 1.0 if child.running else 0.0)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        metrics.set_state(controller_type, instance_id, "init")

    # -- the shard instance's host (ShardHost); called only after start(): the endpoint exists --
    def synced(self, epoch: int) -> bool:
        return self.endpoint.state.synced(epoch)

    def on_epoch(self) -> None:
        self.endpoint.state.on_epoch()

    def on_allowed(self) -> None:
        self.endpoint.state.on_allowed()

    def on_fenced(self) -> None:
        self.endpoint.state.on_fenced()

    def on_leaving(self) -> None:
        self.endpoint.state.on_leaving()

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        return self.endpoint.main.workload(rng)

    def on_state(self, state: str) -> None:
        self.metrics.set_state(self.name, self.instance_id, state)

    def on_token(self, token: OwnerToken) -> None:
        self.endpoint.state.on_token(token)

    def on_count(self, event: str) -> None:
        self.metrics.handover.labels(self.name, event).inc()

    def drained(self) -> bool:
        return self.endpoint.state.drained()

    def written_versions(self) -> dict[str, int]:
        return self.endpoint.state.written.snapshot()

    def child_info(self) -> ChildInfo | None:
        return ChildInfo.model_validate(self.child.info()) if self.child is not None else None

    @property
    def ready(self) -> bool:
        return self.shard.allowed is not None and (self.child is None or self.child.running)

    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        if self.shard.fatal is not None:
            return self.shard.fatal
        if self.child is not None and not self.child.running:
            return self.child.error or "the external controller is not running"
        return f"{self.shard.state} (waiting for a handover)"

    def start(self) -> None:
        self.endpoint.start()
        self.shard.start()
        if self.child is not None:
            self.child.start()
            self._supervisor = start_thread(
                f"external-{self.name}-membership", self._supervise, what=f"external {self.name}: membership"
            )

    def _supervise(self) -> None:
        """A controller down longer than ``leaseTTLSeconds`` must not keep its range: leave, rejoin when it runs.

        Transitions (``member`` is whether a :class:`ShardInstance` is registered)::

            member ──(child down > leaseTTLSeconds)──► left (record deleted; neighbours take the range)
            left ──(child running again)──► member (a fresh join: locked if it splits a busy range)
        """
        child = self.child
        if child is None:
            return
        member = True
        while not self._stop.wait(0.2):
            down = child.down_for()
            if member and down is not None and down > self.lease_ttl:
                log.warning(
                    "%s: the external controller has been down for %.1fs (> leaseTTLSeconds %s): "
                    "leaving the registry until it runs again",
                    self.name,
                    down,
                    self.lease_ttl,
                )
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.shard.rejoin_grace = 0.0  # a real leave: the range goes to the neighbours now
                    self.shard.stop(drain_timeout=0.0)
                    member = False
            elif not member and down is None:
                with self._lock:
                    if self._stop.is_set():
                        return
                    shard = ShardInstance(self._settings, self)
                    self.shard = shard
                    self.endpoint.state.shard = shard
                    shard.start()
                    member = True
                log.info("%s: the external controller runs again: joining the registry", self.name)

    def stop(self) -> None:
        """Graceful leave: the instance drains and leaves first, then the child stops, then the endpoint."""
        with self._lock:
            self._stop.set()
            shard = self.shard
        if not shard.leaving:
            shard.stop()
        if self._supervisor is not None:
            self._supervisor.join(5)
        if self.child is not None:
            self.child.stop()
        self.endpoint.stop()
