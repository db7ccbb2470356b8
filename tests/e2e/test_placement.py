"""Placement you choose, with fencing on: ``by: label``, ``rebalance isolate --label``, pins through joins,
``rebalance apply`` and a rolling restart.

An unmodified controller (tests/e2e/rules_child.py ``namespace`` mode: it sets
``data.done`` of every ConfigMap labelled ``app=lbl`` it sees and names itself
in ``data.by``) is an ``external:`` entry of every manager with
``{resource: configmaps, by: label, label: example.com/tenant}``. ConfigMaps of
one tenant land on one instance; one without the label by its own uid. One
tenant is isolated on an instance of its own (its hash point as its range,
pinned); the pin holds through a join, ``rebalance apply`` and the pinned
instance's restart under the same id (``rejoinGraceSeconds``); a ConfigMap
relabelled to that tenant moves there. The API server's audit log shows no
stale-owner write; the proxy fenced no current owner by disagreement.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from hashing import hash_key
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace
from tests.e2e.test_shard_rules import _fenced
from tests.helpers import wait_until
from tests.registry.test_cli import run

CHILD = Path(__file__).with_name("rules_child.py")
CT = "lbl"
NS = "placement"
KEY = "example.com/tenant"
#: Tenant names (FNV-1a of names differing only in a last character lie close together; these spread).
TENANTS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
PLAIN = [f"plain-{i}" for i in range(4)]


def _controllers() -> dict[str, Any]:
    command = [sys.executable, str(CHILD), "namespace", CT]
    shard = [{"resource": "configmaps", "by": "label", "label": KEY}]
    return {CT: {"external": {"command": command, "shard": shard, "drainSeconds": 1.0}}}


def _cms(api: Any) -> dict[str, Any]:
    return {
        cm.metadata.name: cm for cm in k8s.CoreV1Api(api).list_namespaced_config_map(NS, label_selector="app=lbl").items
    }


def _converged(api: Any, round_: int) -> bool:
    cms = _cms(api)
    return len(cms) == len(TENANTS) * 3 + len(PLAIN) and all(
        (cm.data or {}).get("done") == str(round_) for cm in cms.values()
    )


def _round(api: Any, round_: int) -> None:
    core = k8s.CoreV1Api(api)
    for name in _cms(api):
        core.patch_namespaced_config_map(name, NS, {"data": {"want": str(round_)}})
    wait_until(lambda: _converged(api, round_), 90, f"round {round_} converged", interval=0.3)


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot(CT)
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _placed_by_owner(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """ConfigMap -> (its writer in the last round, the owner of its key by label now): they must agree."""
    snap = cluster.snapshot(CT)
    out = {}
    for name, cm in _cms(cluster.api).items():
        value = (cm.metadata.labels or {}).get(KEY) or cm.metadata.uid
        owner = snap.owner_of(hash_key(value))
        out[name] = ((cm.data or {}).get("by", "?"), owner.instance_id if owner else "-")
    return out


def _etcd(cluster: Cluster) -> tuple[str, ...]:
    return ("--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix)


def test_label_placement_isolate_and_pins_through_join_apply_and_restart(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    core = k8s.CoreV1Api(api)
    create_namespace(api, NS)
    for t in TENANTS:
        for j in range(3):
            labels = {"app": CT, KEY: t}
            core.create_namespaced_config_map(
                NS, {"metadata": {"name": f"{t}-{j}", "labels": labels}, "data": {"want": "1"}}
            )
    for name in PLAIN:
        core.create_namespaced_config_map(
            NS, {"metadata": {"name": name, "labels": {"app": CT}}, "data": {"want": "1"}}
        )
    extra = {"rejoinGraceSeconds": 20}
    managers = [cluster.start_manager(_controllers(), config_extra=extra) for _ in range(3)]
    wait_until(lambda: _active(cluster, 3), 90, "three active instances")
    wait_until(lambda: _converged(api, 1), 90, "round 1 converged", interval=0.3)
    _round(api, 2)
    placed = _placed_by_owner(cluster)
    assert all(by == owner for by, owner in placed.values()), placed  # a tenant's ConfigMaps on its owner

    # Isolate the first tenant on the middle instance: its point becomes a range of its own, pinned.
    members = list(cluster.snapshot(CT))
    middle = members[1].instance_id
    tenant, point = TENANTS[0], hash_key(TENANTS[0])
    wrong_rule = run("rebalance", "isolate", "--type", CT, "--namespace", NS, "--instance", middle, *_etcd(cluster))
    assert wrong_rule.returncode == 2 and "by: namespace" in wrong_rule.stderr, wrong_rule.stderr
    assert len(wrong_rule.stderr.strip().splitlines()) == 1
    done = run(
        "rebalance",
        "isolate",
        "--type",
        CT,
        "--label",
        tenant,
        "--instance",
        middle,
        "--yes",
        *_etcd(cluster),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    iso = cluster.snapshot(CT).get(middle)
    assert iso is not None and iso.pinned and (iso.range.lo, iso.range.hi) == (point, point)  # type: ignore[union-attr]
    _round(api, 3)
    placed = _placed_by_owner(cluster)
    assert {n for n, (by, _) in placed.items() if by == middle} == {f"{tenant}-{j}" for j in range(3)}, placed
    assert all(by == owner for by, owner in placed.values()), placed

    # A join splits the largest unpinned range; a rebalance plans around the pin.
    managers.append(cluster.start_manager(_controllers(), config_extra=extra))
    wait_until(lambda: _active(cluster, 4), 90, "four active instances")
    assert cluster.snapshot(CT).get(middle).range == iso.range  # type: ignore[union-attr]
    applied = run("rebalance", "apply", "--type", CT, "--by", "range", "--yes", *_etcd(cluster), timeout=120)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cluster.snapshot(CT).get(middle).range == iso.range  # type: ignore[union-attr]

    # The pinned instance restarts under the same id: it parks, comes back to the same key, still pinned.
    pinned_manager = cluster.manager_of(middle)
    assert pinned_manager.terminate(30) == 0
    cluster.start_manager(
        _controllers(), config_extra=extra, name=pinned_manager.name, files=f"{pinned_manager.name}-2"
    )
    wait_until(lambda: _active(cluster, 4), 90, "the pinned instance back")
    back = cluster.snapshot(CT).get(middle)
    assert back is not None and back.pinned and back.range == iso.range
    shown = run("registry", "list", "-o", "json", "--type", CT, *_etcd(cluster))
    assert [d["instanceId"] for d in json.loads(shown.stdout) if d["pinned"]] == [middle]

    # A label change moves the object: a plain ConfigMap relabelled to the isolated tenant lands there.
    core.patch_namespaced_config_map(PLAIN[0], NS, {"metadata": {"labels": {KEY: tenant}}})
    _round(api, 4)
    placed = _placed_by_owner(cluster)
    assert placed[PLAIN[0]] == (middle, middle), placed
    assert all(by == owner for by, owner in placed.values()), placed

    fenced = _fenced(cluster)
    assert fenced.get("ShardHashMismatch", 0) == 0 and fenced.get("UnreadableBody", 0) == 0, fenced
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
