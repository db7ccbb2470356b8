"""``rangeshard rebalance isolate --namespace`` for a type sharded ``by: namespace``, with fencing on.

An unmodified controller (tests/e2e/rules_child.py ``namespace`` mode) has
``{resource: configmaps, by: namespace}`` in three managers. Isolating one
namespace on the middle instance makes that namespace's hash point its range
(pinned); from then on exactly that namespace's ConfigMaps are written by it,
every other namespace by the owner of its point (a join and a restart with a
pin: test_placement). The API server's audit log shows no stale-owner write.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from hashing import hash_key
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace
from tests.e2e.test_shard_rules import NAMESPACES
from tests.helpers import wait_until
from tests.registry.test_cli import run

CHILD = Path(__file__).with_name("rules_child.py")
CT = "nsiso"


def _controllers() -> dict[str, Any]:
    command = [sys.executable, str(CHILD), "namespace", CT]
    return {CT: {"external": {"command": command, "shard": [{"resource": "configmaps", "by": "namespace"}]}}}


def _writers(api: Any, round_: int) -> dict[str, set[str]] | None:
    """Namespace -> the instances that wrote its ConfigMaps in ``round_`` (``None`` until all are answered)."""
    out: dict[str, set[str]] = {}
    for cm in k8s.CoreV1Api(api).list_config_map_for_all_namespaces(label_selector=f"app={CT}").items:
        data = cm.data or {}
        if data.get("done") != str(round_):
            return None
        out.setdefault(cm.metadata.namespace, set()).add(data.get("by", "?"))
    return out if len(out) == len(NAMESPACES) else None


def _round(api: Any, round_: int) -> dict[str, set[str]]:
    for ns in NAMESPACES:
        for j in range(2):
            k8s.CoreV1Api(api).patch_namespaced_config_map(f"c{j}", ns, {"data": {"want": str(round_)}})
    return wait_until(lambda: _writers(api, round_), 90, f"round {round_} answered", interval=0.3)


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot(CT)
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def test_isolate_a_namespace_on_an_instance_of_its_own(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    for ns in NAMESPACES:
        create_namespace(api, ns)
        for j in range(2):
            body = {"metadata": {"name": f"c{j}", "labels": {"app": CT}}, "data": {"want": "1"}}
            k8s.CoreV1Api(api).create_namespaced_config_map(ns, body)
    for _ in range(3):
        cluster.start_manager(_controllers())
    wait_until(lambda: _active(cluster, 3), 90, "three active instances")
    wait_until(lambda: _writers(api, 1), 90, "round 1 answered", interval=0.3)

    middle = list(cluster.snapshot(CT))[1].instance_id
    tenant = NAMESPACES[3]
    etcd = ("--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix)
    done = run("rebalance", "isolate", "--type", CT, "--namespace", tenant, "--instance", middle, *etcd, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"isolated namespace {tenant} on {CT}/{middle}" in done.stdout
    iso = cluster.snapshot(CT).get(middle)
    point = hash_key(tenant)
    assert iso is not None and iso.pinned and iso.range is not None and (iso.range.lo, iso.range.hi) == (point, point)

    writers = _round(api, 2)
    snap = cluster.snapshot(CT)
    assert writers[tenant] == {middle}, writers
    for ns in NAMESPACES:
        owner = snap.owner_of(hash_key(ns))
        assert owner is not None and writers[ns] == {owner.instance_id}, (ns, writers)
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
