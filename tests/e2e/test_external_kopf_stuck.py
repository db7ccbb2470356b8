"""A wedged kopf operator without a liveness probe is named by the proxy's metrics (issue 38, items 2 and 4).

The unmodified kopf example (examples/kopf-gadgets, which writes
``status.observedGeneration`` once it handled a Gadget) is sharded three
ways, with ``stuckAfterSeconds: 5`` and no probe. One manager's kopf child is
stopped with SIGSTOP (its manager keeps running: the lease renews, ``/readyz``
says ok) and every Gadget is changed. Within ``stuckAfterSeconds`` (plus a
scrape) the proxy names that instance as stuck and counts exactly the Gadgets
of its range; the others answer theirs. After SIGCONT the instance catches up
and is no longer stuck. The API server's audit log shows no stale-owner write.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import yaml
from kubernetes import client as k8s

from hashing import hash_key
from tests.e2e.conftest import Cluster, Manager, dump_logs
from tests.e2e.test_external_kopf import EXAMPLE, GROUP, PLURAL, VERSION, _controllers, install_gadgets
from tests.helpers import wait_until

NS = "ks"
N = 18
STUCK_AFTER = 5


def _gadgets(api: Any) -> list[dict[str, Any]]:
    listed = k8s.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    items: list[dict[str, Any]] = listed["items"]
    return items


def _answered(api: Any, size: int) -> bool:
    """Every Gadget handled at its current generation (``status.observedGeneration``) and its ConfigMap written."""
    gadgets = _gadgets(api)
    cms = {cm.metadata.name: cm.data or {} for cm in k8s.CoreV1Api(api).list_namespaced_config_map(NS).items}
    return len(gadgets) == N and all(
        (g.get("status") or {}).get("observedGeneration") == g["metadata"]["generation"]
        and cms.get(f"{g['metadata']['name']}-gadget", {}).get("size") == str(size)
        for g in gadgets
    )


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("gadget")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _child_pid(m: Manager) -> int:
    found = re.findall(r"gadget: started .* \(pid (\d+)\)", m.log.read_text(errors="replace"))
    assert found, f"{m.name} started no kopf child"
    return int(found[-1])


def test_a_sigstopped_kopf_is_named_stuck_with_its_count(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    crd = yaml.safe_load((EXAMPLE / "crd.yaml").read_text())
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    custom = install_gadgets(api, NS)
    for i in range(N):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": f"g{i}"}}
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {**body, "spec": {"size": 1}})

    extra = {"stuckAfterSeconds": STUCK_AFTER}
    managers = [cluster.start_manager(_controllers(), config_extra=extra) for _ in range(3)]
    wait_until(lambda: _active(cluster, 3), 90, "three active instances")
    wait_until(lambda: _answered(api, 1), 120, "every Gadget handled and answered")

    def progress() -> dict[str, Any]:
        return cluster.progress("gadget")

    wait_until(
        lambda: len(progress()) == 3 and all(p.measurable and p.unreconciled == 0 for p in progress().values()),
        30,
        "three instances measured, nothing unanswered",
    )

    snap = cluster.snapshot("gadget")
    owner = {g["metadata"]["name"]: snap.owner_of(hash_key(g["metadata"]["uid"])) for g in _gadgets(api)}
    by_instance = {m.instance_id: sum(1 for o in owner.values() if o and o.instance_id == m.instance_id) for m in snap}
    # The victim: an instance whose range holds some Gadgets.
    victim = next(m for m in managers if by_instance[f"{m.name}-gadget"] > 0)
    victim_id = f"{victim.name}-gadget"
    child = _child_pid(victim)
    os.kill(child, signal.SIGSTOP)  # a wedged operator: no exit, no log line; its manager keeps its lease
    try:
        changed = time.monotonic()
        for i in range(N):
            custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, f"g{i}", {"spec": {"size": 2}})
        wait_until(lambda: progress()[victim_id].stuck, STUCK_AFTER + 30, "the stopped kopf's instance named stuck")
        took = time.monotonic() - changed
        assert STUCK_AFTER <= took < STUCK_AFTER + 15, took
        mine = progress()[victim_id]
        assert mine.unreconciled == by_instance[victim_id], (mine, by_instance)
        assert mine.oldest_seconds is not None and mine.oldest_seconds > STUCK_AFTER
        others = [i for i in by_instance if i != victim_id]
        wait_until(
            lambda: all(progress()[i].unreconciled == 0 and not progress()[i].stuck for i in others),
            60,
            "the other instances answered theirs",
        )
        assert victim.alive and len(cluster.snapshot("gadget")) == 3, "the manager itself keeps running"

        def child_state() -> str | None:
            rec = next(m.record for m in cluster.snapshot("gadget") if m.instance_id == victim_id)
            return rec.child.state if rec.child is not None else None

        # The record says what /proc says: stopped, not running (status and registry list -o wide print it).
        wait_until(lambda: child_state() == "stopped", 30, "the record to say the child is stopped")
    finally:
        os.kill(child, signal.SIGCONT)
    wait_until(
        lambda: progress()[victim_id].unreconciled == 0 and not progress()[victim_id].stuck,
        90,
        "the instance caught up after SIGCONT",
    )
    assert wait_until(lambda: _answered(api, 2), 90, "every Gadget answered at size 2"), dump_logs(cluster)

    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
