"""The canary recipe of docs/operations.md, with fencing on: a new version on a pinned slice, widened, promoted.

Three managers run version 1 of an unmodified Deployment-like controller
(tests/e2e/rules_child.py ``deploy`` mode, an ``external:`` entry; it stamps
``rules.test/version`` on the ReplicaSets it writes). A second config of the
same controller type runs version 2 (``--instance-prefix canary``); it joins,
``rebalance set-key`` sizes it to 5 % of the space, ``rebalance pin`` keeps it
there, its progress is read from the proxy's metrics, ``set-key`` widens it to
25 %, and a rolling restart of the others with the new config promotes it
(``rejoinGraceSeconds``: each comes back to its own key). Every Deployment ends
with one ReplicaSet written by version 2, the API server's audit log shows no
stale-owner write, and nothing was written twice by two owners.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from hashing import MAX_HASH, hash_key
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace
from tests.e2e.test_shard_rules import _fenced
from tests.helpers import wait_until
from tests.registry.test_cli import run

CHILD = Path(__file__).with_name("rules_child.py")
CT = "dep"
NS = "canary"
COUNT = 16
CANARY = f"canary-{CT}"


def _controllers(version: str) -> dict[str, Any]:
    command = ["env", f"RULES_VERSION={version}", sys.executable, str(CHILD), "deploy", NS]
    shard = [{"resource": "deployments.apps", "by": "uid"}, {"resource": "replicasets.apps", "by": "owner"}]
    return {CT: {"external": {"command": command, "shard": shard, "drainSeconds": 1.0}}}


def _deployment(i: int, replicas: int) -> dict[str, Any]:
    app = {"app": f"d{i}"}
    template = {"metadata": {"labels": app}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    return {
        "metadata": {"name": f"d{i}"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": app}, "template": template},
    }


def _versions(api: Any, round_: int, count: int = COUNT) -> dict[str, tuple[str, str]] | None:
    """Deployment uid -> (writer, version) of its ReplicaSet once every Deployment is answered for ``round_``."""
    apps = k8s.AppsV1Api(api)
    deployments = apps.list_namespaced_deployment(NS).items
    replicasets = apps.list_namespaced_replica_set(NS).items
    out = {}
    for d in deployments:
        owned = [rs for rs in replicasets if any(r.uid == d.metadata.uid for r in rs.metadata.owner_references or [])]
        status = d.status
        if len(owned) != 1 or owned[0].spec.replicas != round_ or status is None:
            return None
        if status.observed_generation != d.metadata.generation:
            return None
        notes = owned[0].metadata.annotations or {}
        out[d.metadata.uid] = (notes.get("rules.test/by", "?"), notes.get("rules.test/version", "?"))
    return out if len(out) == count else None


def _round(api: Any, round_: int) -> dict[str, tuple[str, str]]:
    apps = k8s.AppsV1Api(api)
    names = [d.metadata.name for d in apps.list_namespaced_deployment(NS).items]
    for name in names:
        apps.patch_namespaced_deployment(name, NS, {"spec": {"replicas": round_}})
    return wait_until(lambda: _versions(api, round_, len(names)), 90, f"round {round_} answered", interval=0.3)


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot(CT)
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _etcd(cluster: Cluster) -> tuple[str, ...]:
    return ("--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix)


def test_canary_recipe(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    create_namespace(api, NS)
    for i in range(COUNT):
        k8s.AppsV1Api(api).create_namespaced_deployment(NS, _deployment(i, 1))
    extra = {"rejoinGraceSeconds": 20}
    fleet = [cluster.start_manager(_controllers("v1"), config_extra=extra) for _ in range(3)]
    wait_until(lambda: _active(cluster, 3), 90, "three active instances")
    wait_until(lambda: _versions(api, 1), 90, "round 1 answered", interval=0.3)

    # 1. The canary: a second config of the same type with the new command, its own instance prefix.
    cluster.start_manager(_controllers("v2"), config_extra=extra, name="canary")
    wait_until(lambda: _active(cluster, 4), 90, "the canary joined")
    # 2. Size it to 5 % of the space (set-key moves its upper bound; it hands the rest to its successor).
    canary = cluster.snapshot(CT).get(CANARY)
    assert canary is not None and canary.range is not None
    key = canary.range.lo + MAX_HASH // 20
    sized = run(
        "rebalance", "set-key", "--type", CT, "--instance", CANARY, "--key", str(key), *_etcd(cluster), timeout=90
    )
    assert sized.returncode == 0, sized.stdout + sized.stderr
    # 3. Pin it: a join or a rebalance never moves it.
    pinned = run("rebalance", "pin", "--type", CT, "--instance", CANARY, *_etcd(cluster))
    assert pinned.returncode == 0, pinned.stderr
    applied = run("rebalance", "apply", "--type", CT, "--by", "range", "--yes", *_etcd(cluster), timeout=90)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    slice_ = cluster.snapshot(CT).get(CANARY).range  # type: ignore[union-attr]
    assert slice_ is not None and (slice_.lo, slice_.hi) == (canary.range.lo, key)

    # A 5 % slice holds none of 16 random uids often: add Deployments until it holds one.
    for i in range(200):
        made = k8s.AppsV1Api(api).create_namespaced_deployment(NS, _deployment(COUNT + i, 1))
        if slice_.contains(hash_key(made.metadata.uid)):
            break
    # 4. Watch it: its Deployments are answered by version 2, and the proxy measures its progress.
    versions = _round(api, 2)
    in_slice = {uid for uid in versions if slice_.contains(hash_key(uid))}
    assert in_slice and all(versions[uid] == (CANARY, "v2") for uid in in_slice), versions
    assert all(v[1] == "v1" for uid, v in versions.items() if uid not in in_slice), versions
    progress = wait_until(lambda: cluster.progress(CT).get(CANARY), 30, "the canary's progress measured")
    assert progress.measurable and progress.unreconciled == 0 and not progress.stuck, progress

    # 5. Widen it to 25 % (still pinned: set-key by hand moves it, a rebalance does not).
    snap = cluster.snapshot(CT)
    order = [m.instance_id for m in snap]
    successor = snap.members[order.index(CANARY) + 1]
    wide = min(slice_.lo + MAX_HASH // 4, successor.record.hash_key - 1)
    widened = run(
        "rebalance", "set-key", "--type", CT, "--instance", CANARY, "--key", str(wide), *_etcd(cluster), timeout=90
    )
    assert widened.returncode == 0, widened.stdout + widened.stderr
    versions = _round(api, 3)
    grown = cluster.snapshot(CT).get(CANARY)
    assert grown is not None and grown.pinned and grown.range is not None and grown.range.hi == wide
    assert all(versions[uid] == (CANARY, "v2") for uid in versions if grown.range.contains(hash_key(uid))), versions

    # 6. Promote: a rolling restart of the others with the new config; each comes back to its own key.
    for m in fleet:
        before = {x.instance_id: x.record.hash_key for x in cluster.snapshot(CT)}
        assert m.terminate(30) == 0
        cluster.start_manager(_controllers("v2"), config_extra=extra, name=m.name, files=f"{m.name}-v2")
        wait_until(lambda: _active(cluster, 4), 90, f"{m.name} back with version 2")
        assert {x.instance_id: x.record.hash_key for x in cluster.snapshot(CT)} == before  # no key moved
    assert run("rebalance", "unpin", "--type", CT, "--instance", CANARY, *_etcd(cluster)).returncode == 0
    versions = _round(api, 4)
    assert {v[1] for v in versions.values()} == {"v2"}, versions

    replicasets = k8s.AppsV1Api(api).list_namespaced_replica_set(NS).items
    assert len(replicasets) == len(versions)  # nothing made twice
    fenced = _fenced(cluster)
    assert fenced.get("ShardHashMismatch", 0) == 0 and fenced.get("UnreadableBody", 0) == 0, fenced
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
