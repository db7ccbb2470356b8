"""A real, unmodified kopf operator (examples/kopf-gadgets) sharded by its managers: 2 -> 3 managers, a SIGKILL.

kopf from PyPI runs ``examples/kopf-gadgets/operator.py`` as each manager's
external child (``kopf run --standalone --all-namespaces``). Gadgets are cut
by uid, their ConfigMaps by owner. Every object converges after every step,
every instance wrote, and the write-level check over the API server's audit
log finds no stale-owner write (the child's reconciles are not in our
reconcile audit: the API server's log is the proof).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.e2e.conftest import Cluster, Manager
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kopf-gadgets"
NS = "kg"
N = 24
GROUP, VERSION, PLURAL = "bars.example.org", "v1", "gadgets"


def _controllers() -> dict[str, Any]:
    command = [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces"]
    return {
        "gadget": {
            "external": {
                "command": [*command, str(EXAMPLE / "operator.py")],
                "shard": [
                    {"resource": f"{PLURAL}.{GROUP}", "by": "uid"},
                    {"resource": "configmaps", "by": "owner"},
                ],
                "drainSeconds": 1,
            }
        }
    }


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("gadget")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _configmaps(api: Any) -> dict[str, dict[str, str]]:
    items = k8s.CoreV1Api(api).list_namespaced_config_map(NS).items
    return {cm.metadata.name: (cm.data or {}) for cm in items if cm.metadata.name.endswith("-gadget")}


def _converged(api: Any, size: int) -> bool:
    cms = _configmaps(api)
    return len(cms) == N and all(d.get("size") == str(size) for d in cms.values())


def _writers(api: Any) -> set[str]:
    return {d.get("by", "") for d in _configmaps(api).values()}


def _written_by_owners(cluster: Cluster, api: Any) -> bool:
    """Each Gadget's ConfigMap was last written by the instance whose range holds the Gadget's uid now."""
    uids = {
        g["metadata"]["name"]: g["metadata"]["uid"]
        for g in k8s.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    }
    owners = cluster.owners("gadget", uids.values())
    written = {uids.get(name.removesuffix("-gadget")): d.get("by") for name, d in _configmaps(api).items()}
    return len(owners) == len(uids) and written == owners


def _set_size(api: Any, size: int) -> None:
    custom = k8s.CustomObjectsApi(api)
    for i in range(N):
        custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, f"g{i}", {"spec": {"size": size}})


def install_gadgets(api: Any, namespace: str) -> Any:
    """The example's Gadget CRD installed and served, and ``namespace`` created; a ``CustomObjectsApi``."""
    crd = yaml.safe_load((EXAMPLE / "crd.yaml").read_text())
    k8s.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    custom = k8s.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
        except k8s.ApiException:
            return False
        return True

    wait_until(served, 30, "the Gadget CRD served")
    create_namespace(api, namespace)
    return custom


def test_a_kopf_operator_sharded_unmodified(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    custom = install_gadgets(api, NS)
    for i in range(N):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": f"g{i}"}}
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {**body, "spec": {"size": 1}})

    managers: list[Manager] = [cluster.start_manager(_controllers()) for _ in range(2)]
    wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    wait_until(lambda: _converged(api, 1), 90, "converged with two instances")
    assert len(_writers(api)) == 2, _writers(api)

    managers.append(cluster.start_manager(_controllers()))
    wait_until(lambda: _active(cluster, 3), 60, "three active instances")
    _set_size(api, 2)
    wait_until(lambda: _converged(api, 2), 90, "converged with three instances")
    assert _written_by_owners(cluster, api), _writers(api)  # every instance that owns a Gadget wrote

    victim = managers.pop(0)
    os.killpg(victim.proc.pid, signal.SIGKILL)  # its kopf child dies with it (PDEATHSIG)
    victim.proc.wait(10)
    _set_size(api, 3)
    wait_until(lambda: _active(cluster, 2), 60, "two instances after the kill")
    wait_until(lambda: _converged(api, 3), 90, "converged after the kill")
    assert _written_by_owners(cluster, api), _writers(api)
    # Owned ConfigMaps carry the Gadget as owner (kopf.adopt), so the cut by owner follows the Gadget.
    cm = k8s.CoreV1Api(api).read_namespaced_config_map("g0-gadget", NS)
    assert cm.metadata.owner_references[0].kind == "Gadget"

    cluster.assert_no_stale_owner_writes()
    for m in managers:
        assert "[gadget]" in m.log.read_text(), "the child's output goes to the manager's log, prefixed"
    cluster.assert_no_tracebacks()
