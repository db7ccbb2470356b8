"""What makes ``rangeshard up`` safe and scriptable: port plan, readiness of every child, demo counts.

Purpose
    * :func:`plan_ports` picks every port ``up`` will bind (etcd client and
      peer, API server, proxy, one metrics port per manager) and checks them
      all before anything starts, failing with each busy port and its holder.
    * :func:`wait_healthy` returns only when every started child is still
      running and healthy (etcd ``/health``, API server and proxy ``/readyz``,
      each manager's ``/readyz``) and every manager's instances are active
      in the registry, naming what is not (:func:`unhealthy_components`:
      ``manager m0: informer certificate-secrets: 404 ...``); a child that exits fails at once with its log tail
      (:func:`rangeshard.core.process.wait_ready`, the one readiness routine).
    * :func:`demo_summary` reads the demo's real counts from the API server.

Invariants
    ``ready`` is printed by ``up`` only after :func:`wait_healthy` returned.

Concurrency model
    Main thread; blocking probes with short timeouts, polled with a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from rangeshard.cli.state import probe
from rangeshard.cli.statefile import Component
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.ports import check_ports
from rangeshard.core.process import ManagedProcess, free_port, wait_ready
from registry import Registry


class NotReadyError(RangeshardError):
    """A component ``up`` started died or did not become healthy in time."""


@dataclass(frozen=True)
class PortPlan:
    """Every port one ``up`` binds."""

    etcd: int
    etcd_peer: int
    apiserver: int
    proxy: int
    managers: tuple[int, ...]


def choose_port(port: int | None, what: str) -> int:
    """``port``, checked to be in 1-65535; None or 0: any free port."""
    if not port:
        return free_port()
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is outside 1-65535")
    return port


def plan_ports(etcd_port: int, apiserver_port: int, proxy_port: int, managers: int) -> PortPlan:
    """Choose the ports (0: any free one, never one chosen already) and fail (PortInUseError) if any is taken."""
    taken: set[int] = {p for p in (etcd_port, apiserver_port, proxy_port) if p}

    def pick(port: int | None, what: str) -> int:
        if port:
            return choose_port(port, what)
        # The kernel may hand out one free port twice while nothing is bound to it yet: pick again then.
        for _ in range(100):  # bounded; two picks in a row are rarely the same
            chosen = free_port()
            if chosen not in taken:
                taken.add(chosen)
                return chosen
        raise ConfigError(f"{what}: no free port found that is not chosen already")

    plan = PortPlan(
        pick(etcd_port, "--etcd-port"),
        pick(None, "etcd peer"),
        pick(apiserver_port, "--apiserver-port"),
        pick(proxy_port, "--proxy-port"),
        tuple(pick(None, f"manager m{i} metrics") for i in range(managers)),
    )
    named = {
        "etcd client, --etcd-port": plan.etcd,
        "etcd peer": plan.etcd_peer,
        "local API server, --apiserver-port": plan.apiserver,
        "proxy, --proxy-port": plan.proxy,
    } | {f"manager m{i} metrics": p for i, p in enumerate(plan.managers)}
    ports = list(named.values())
    if len(set(ports)) != len(ports):
        raise ConfigError(f"ports: the same port is given twice ({', '.join(f'{k}={v}' for k, v in named.items())})")
    check_ports(named)
    return plan


def wait_healthy(
    components: Sequence[Component],
    children: Sequence[ManagedProcess],
    etcd_url: str,
    controller_types: Sequence[str],
    managers: int,
    stop: threading.Event,
    timeout: float = 90.0,
) -> None:
    """Block until every component is healthy and all instances are active (:func:`wait_ready`).

    Every process of ``children`` must keep running: one that exits fails at
    once with its exit code and log tail. Raises :class:`NotReadyError`.
    """
    with EtcdClient(EtcdConfig.from_urls(etcd_url)) as client:
        reg = Registry(client)

        def check() -> tuple[bool, str]:
            failed = child_errors(reg)
            if failed:  # a controller that cannot start: said at once, not after the whole timeout
                raise NotReadyError("an external controller cannot run: " + "; ".join(failed))
            unhealthy = unhealthy_components(components) or _inactive(reg, controller_types, managers)
            return not unhealthy, "; ".join(unhealthy)

        wait_ready(
            check,
            timeout,
            what="rangeshard up",
            error=NotReadyError,
            children=children,
            hint=lambda: "see the logs in the state dir",
            interval=0.2,
            stop=stop,
        )


def unhealthy_components(components: Sequence[Component]) -> list[str]:
    """What each unhealthy component says, one line each; a manager says why (its ``/readyz`` 503 body).

    ``manager m0: informer certificate-secrets: 404 no resource 'secrets' in core/v1`` (the component's
    name, then the reasons); any other failure is ``<name> <status or no answer>``. The test kit's
    ``Managers.wait_active`` starts its failure with these lines too.
    """
    unhealthy = []
    for c in components:
        ok, detail = probe(c.health_url, c.kind, timeout=1.0)
        if not ok and c.kind == "manager" and detail.startswith("503 not ready: "):
            unhealthy.append(f"{c.name}: {detail.removeprefix('503 not ready: ')}")
        elif not ok:
            unhealthy.append(f"{c.name} {detail}")
    return unhealthy


def child_errors(reg: Registry) -> list[str]:
    """``type/instance: <error>`` of every external controller that is not running and says why (its record)."""
    _, snaps = reg.snapshots()
    return [
        f"{t}/{m.instance_id}: {m.record.child.error}"
        for t, snap in sorted(snaps.items())
        for m in snap.members
        if m.record.child is not None and m.record.child.error and m.record.child.state == "restarting"
    ]


def _inactive(reg: Registry, controller_types: Sequence[str], managers: int) -> list[str]:
    """The controller types that do not have ``managers`` active instances yet."""
    _, snaps = reg.snapshots()
    waiting = []
    for t in controller_types:
        members = snaps.get(t, ())
        active = [m for m in members if m.record.state.value == "active"]
        if len(members) != managers or len(active) != managers:
            waiting.append(f"{t}: {len(active)}/{managers} instance(s) active")
    return waiting


def _get(client: httpx.Client, url: str) -> list[dict[str, Any]]:
    resp = client.get(url)
    resp.raise_for_status()
    items = resp.json().get("items") or []
    return [i for i in items if isinstance(i, dict)]


def demo_summary(api_url: str, namespace: str, wait: float = 30.0) -> str:
    """The demo's deployments and pods as the API server reports them.

    Waits (up to ``wait`` seconds) until the pods the deployments ask for
    exist, so the counts printed are the settled ones; then reports what is
    there, whatever it is.
    """
    deadline = time.monotonic() + wait
    with httpx.Client(timeout=5.0) as client:
        while True:
            deps = _get(client, f"{api_url}/apis/apps/v1/namespaces/{namespace}/deployments")
            pods = _get(client, f"{api_url}/api/v1/namespaces/{namespace}/pods")
            desired = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in deps)
            if len(pods) >= desired or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # polling the API server for the controllers' work
    parts = []
    for d in sorted(deps, key=lambda d: str(d["metadata"]["name"])):
        spec = int((d.get("spec") or {}).get("replicas") or 0)
        have = sum(
            1 for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get("app") == d["metadata"]["name"]
        )
        parts.append(f"{d['metadata']['name']} ({have}/{spec} pods)")
    return (
        f"demo: namespace '{namespace}' with {len(deps)} deployment(s): {', '.join(parts) or 'none'}; "
        f"{len(pods)} pod(s) in total"
    )
