"""Every shard rule through the endpoint with fencing on: the fence judges each write by the writer's rule.

Three unmodified controllers (tests/e2e/rules_child.py, official Python
client), each an ``external:`` entry of every manager, in front of the local
API server behind the fencing proxy:

* ``deploy`` (Deployment-like): ``deployments.apps`` by ``uid``,
  ``replicasets.apps`` by ``owner``;
* ``rs`` (ReplicaSet-like): ``replicasets.apps`` by ``uid`` — ReplicaSets
  *with* a controller owner, the write the fence used to refuse because it
  guessed the owner's hash — and ``pods`` by ``owner``, with orphan pods to
  adopt (``owner`` of owner-less objects);
* ``ns`` (namespace-sharded, like the kopf operator of the issue):
  ``configmaps`` by ``namespace``, with creates in 8 namespaces.

Through 2 -> 3 managers, a SIGKILL and spec changes everything converges,
every instance writes, the API server's audit log shows no stale-owner write,
and the proxy fenced no write of a current owner (no ``OutOfRange``,
``ShardHashMismatch`` or unreadable body: a current owner is refused only if
the fence and the endpoint disagree on where an object lives).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from rangeshard.core.ownertoken import OwnerToken
from tests.e2e.conftest import Cluster, Manager
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

CHILD = Path(__file__).with_name("rules_child.py")
NS = "rules"
DEPLOYMENTS = 10
#: Names whose FNV-1a hashes spread over the space (names differing only in a last digit, ns0..ns7, hash within
#: 1e-6 of each other: FNV-1a mixes its last byte into the low bits only), so every instance owns one.
NAMESPACES = [f"rules-{n}" for n in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")]
LABEL = "nsrule"
#: Fence reasons that only a disagreement between the fence and the endpoint produces for a current owner.
#: ``OutOfRange`` also comes from the race of a join (the giver's new token on what it listed before its
#: range shrank): the proxy's log says those keys "left in a handover", and only those are allowed.
DISAGREEMENT = ("ShardHashMismatch", "UnreadableBody")


def _controllers() -> dict[str, Any]:
    def entry(mode: str, arg: str, shard: list[dict[str, str]]) -> dict[str, Any]:
        return {"external": {"command": [sys.executable, str(CHILD), mode, arg], "shard": shard, "drainSeconds": 1.0}}

    return {
        "deploy": entry(
            "deploy",
            NS,
            [{"resource": "deployments.apps", "by": "uid"}, {"resource": "replicasets.apps", "by": "owner"}],
        ),
        "rs": entry(
            "replicaset", NS, [{"resource": "replicasets.v1.apps", "by": "uid"}, {"resource": "pods", "by": "owner"}]
        ),
        "ns": entry("namespace", LABEL, [{"resource": "configmaps", "by": "namespace"}]),
    }


def _deployment(i: int, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"d{i}"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": f"d{i}"}},
            "template": {
                "metadata": {"labels": {"app": f"d{i}"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }


def _want(i: int, round_: int) -> int:
    return (i + round_) % 3 + 1


def _converged(api: Any, round_: int) -> bool:
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(NS).items}
    if len(deployments) != DEPLOYMENTS:
        return False
    replicasets = apps.list_namespaced_replica_set(NS).items
    pods = [p for p in core.list_namespaced_pod(NS).items if p.metadata.deletion_timestamp is None]
    for i in range(DEPLOYMENTS):
        d = deployments[f"d{i}"]
        want = _want(i, round_)
        if d.spec.replicas != want or d.status is None or d.status.observed_generation != d.metadata.generation:
            return False
        if (d.status.replicas or 0) != want:
            return False
        owned = [rs for rs in replicasets if _controller(rs) == d.metadata.uid]
        if len(owned) != 1 or owned[0].spec.replicas != want:
            return False
        if len([p for p in pods if _controller(p) == owned[0].metadata.uid]) != want:
            return False
    for ns in NAMESPACES:
        cms = {cm.metadata.name: cm for cm in core.list_namespaced_config_map(ns).items}
        for j in range(3):
            cm = cms.get(f"c{j}")
            if cm is None or (cm.data or {}).get("done") != str(round_) or f"c{j}-out" not in cms:
                return False
    return True


def _owning_instances(cluster: Cluster) -> dict[str, set[str]]:
    """Per controller type, the instances whose range holds at least one of its root objects now.

    Ten Deployments leave a quarter range empty in about one run in eighteen, so
    "every instance wrote" is asked only of the instances that own something.
    """
    apps = k8s.AppsV1Api(cluster.api)
    deployments = [d.metadata.uid for d in apps.list_namespaced_deployment(NS).items]
    replicasets = [rs.metadata.uid for rs in apps.list_namespaced_replica_set(NS).items]
    return {
        "deploy": set(cluster.owners("deploy", deployments).values()),
        "rs": set(cluster.owners("rs", replicasets).values()),
        "ns": set(cluster.owners("ns", NAMESPACES).values()),
    }


def _controller(obj: Any) -> str | None:
    for ref in obj.metadata.owner_references or []:
        if ref.controller:
            return str(ref.uid)
    return None


def _spec_round(api: Any, round_: int) -> None:
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    for i in range(DEPLOYMENTS):
        apps.patch_namespaced_deployment(f"d{i}", NS, {"spec": {"replicas": _want(i, round_)}})
    for ns in NAMESPACES:
        for j in range(3):
            core.patch_namespaced_config_map(f"c{j}", ns, {"data": {"want": str(round_)}})


def _active(cluster: Cluster, n: int) -> bool:
    for ctype in ("deploy", "rs", "ns"):
        snap = cluster.snapshot(ctype)
        if len(snap) != n or not all(m.record.state.value == "active" and not m.record.is_locked for m in snap):
            return False
    return True


def _fenced(cluster: Cluster) -> dict[str, float]:
    text = httpx.get(cluster.proxy.url + "/metrics", timeout=10).text
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "range_filter_proxy_fenced_writes_total"
    }


def _token_writes(audit: Path) -> list[tuple[OwnerToken, dict[str, Any]]]:
    out = []
    for line in audit.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        token = OwnerToken.parse(ev.get("userAgent"))
        code = (ev.get("responseStatus") or {}).get("code")
        if token is not None and ev.get("verb") in ("create", "update", "patch", "delete") and 200 <= code < 300:
            out.append((token, ev))
    return out


def test_every_shard_rule_through_the_endpoint_with_fencing(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    create_namespace(api, NS)
    for i in range(DEPLOYMENTS):
        apps.create_namespaced_deployment(NS, _deployment(i, _want(i, 1)))
    # Orphan pods the ReplicaSet-like controller adopts (every instance sees them: by owner, no owner).
    orphans = [f"orphan{i}" for i in range(4)]
    for i, name in enumerate(orphans):
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": name, "labels": {"app": f"d{i}"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        )
    for ns in NAMESPACES:
        create_namespace(api, ns)
        for j in range(3):
            core.create_namespaced_config_map(
                ns, {"metadata": {"name": f"c{j}", "labels": {"app": LABEL}}, "data": {"want": "1"}}
            )

    managers: list[Manager] = [cluster.start_manager(_controllers()) for _ in range(2)]
    wait_until(lambda: _active(cluster, 2), 90, "two active instances of each type")
    _wait_converged(cluster, 1, "converged with two managers")
    adopted = {
        p.metadata.name: _controller(p) for p in core.list_namespaced_pod(NS).items if p.metadata.name in orphans
    }
    assert all(adopted.values()), f"every orphan was adopted: {adopted}"

    managers.append(cluster.start_manager(_controllers()))
    wait_until(lambda: _active(cluster, 3), 90, "three active instances of each type")
    _spec_round(api, 2)
    _wait_converged(cluster, 2, "converged with three managers")
    instances = _owning_instances(cluster)
    assert len(instances["ns"]) == 3, instances  # the namespaces' names are chosen so that each instance owns one

    victim = managers.pop(0)
    os.killpg(victim.proc.pid, signal.SIGKILL)  # its children die with it (parent-death signal)
    victim.proc.wait(10)
    _spec_round(api, 3)
    wait_until(lambda: _active(cluster, 2), 90, "two instances of each type after the kill")
    _wait_converged(cluster, 3, "converged after the kill")

    # Every instance of the three-manager phase that owns an object wrote, under every rule.
    audit = cluster.workdir / "apiserver-audit.jsonl"
    writes = _token_writes(audit)
    for ctype, ids in instances.items():
        writers = {t.instance_id for t, _ in writes if t.controller_type == ctype}
        assert ids <= writers, (ctype, ids - writers)
    # The ReplicaSet-like controller's status PUTs of owned ReplicaSets passed, from every instance.
    status_writers = {
        t.instance_id
        for t, ev in writes
        if t.controller_type == "rs" and (ev.get("objectRef") or {}).get("subresource") == "status"
    }
    assert instances["rs"] <= status_writers, instances["rs"] - status_writers

    fenced = _fenced(cluster)
    assert all(fenced.get(reason, 0) == 0 for reason in DISAGREEMENT), fenced
    out_of_range = [
        ln for ln in (cluster.workdir / "proxy.log").read_text().splitlines() if "is outside the range" in ln
    ]
    assert len(out_of_range) == fenced.get("OutOfRange", 0), out_of_range
    assert all("left in a handover" in ln for ln in out_of_range), out_of_range
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()


def _wait_converged(cluster: Cluster, round_: int, what: str) -> None:
    try:
        wait_until(lambda: _converged(cluster.api, round_), 120, what, interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_diagnose(cluster)}") from None


def _diagnose(cluster: Cluster) -> str:
    lines = [f"fenced: {_fenced(cluster)}"]
    proxy_log = cluster.workdir / "proxy.log"
    if proxy_log.exists():
        lines += [ln for ln in proxy_log.read_text().splitlines() if "fenced" in ln][-10:]
    for m in cluster.managers:
        if m.log.exists():
            lines += [f"--- {m.name}", *[ln for ln in m.log.read_text().splitlines() if "pass failed" in ln][-8:]]
    return "\n".join(lines)
