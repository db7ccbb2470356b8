"""The built-in controllers read their pods and ReplicaSets through the informers' indexes (issue 49).

A ReplicaSet reconcile over a range holding thousands of other pods reads
only its own pods (owner index) and the orphans of its namespace (orphan
index): it never copies the whole store (``items()`` raises here), adopts
no orphan of another namespace, and counts exactly its own pods. An orphan
pod's event enqueues the matching ReplicaSets of its namespace only. The
Deployment controller finds its ReplicaSets and the pods of its old ones the
same way. The runtimes are offline (their API client reaches nobody): the
API calls a reconcile makes are recorded by a stand-in.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller_manager.controller import ControllerRuntime, ReconcileContext
from controller_manager.controllers.deployment import DeploymentController
from controller_manager.controllers.replicaset import ReplicaSetController
from controller_manager.informer import Informer
from controller_manager.resources import DEPLOYMENTS, PODS, REPLICASETS
from rangeshard.core.etcd import EtcdConfig
from tests.helpers import offline_runtime

OTHER_PODS = 3000


class _Calls:
    """Records every API method called on it (and answers like the API server would, minimally)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return type("R", (), {"metadata": type("M", (), {"name": "p", "generation": 1})()})()

        return call


def _no_full_scan(inf: Informer) -> None:
    def items() -> list[dict[str, Any]]:
        raise AssertionError(f"{inf.name}: a reconcile copied the whole store")

    inf.items = items  # type: ignore[method-assign]


def _owner(kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}]


def _pod(ns: str, name: str, *, owner: tuple[str, str] | None = None, app: str = "web") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}", "resourceVersion": "1"}
    meta["labels"] = {"app": app}
    if owner is not None:
        meta["ownerReferences"] = _owner("ReplicaSet", *owner)
    return {"metadata": meta, "status": {"phase": "Running"}}


def _rs(ns: str, name: str, replicas: int, app: str = "web", owner: tuple[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": ns,
        "name": name,
        "uid": f"uid-{ns}-{name}",
        "resourceVersion": "1",
        "generation": 1,
    }
    if owner is not None:
        meta["ownerReferences"] = _owner("Deployment", *owner)
    return {
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}},
        },
        "status": {
            "replicas": replicas,
            "fullyLabeledReplicas": replicas,
            "readyReplicas": 0,
            "availableReplicas": 0,
            "observedGeneration": 1,
        },
    }


def _fill(inf: Informer, objs: list[dict[str, Any]]) -> None:
    inf._replace({f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objs}, 0)


@pytest.fixture
def rs_runtime(etcd_config: EtcdConfig, key_prefix: str) -> ControllerRuntime:
    return offline_runtime(ReplicaSetController, etcd_config, key_prefix)


def test_a_replicaset_reconcile_reads_only_its_own_pods_and_its_namespaces_orphans(
    rs_runtime: ControllerRuntime,
) -> None:
    rt = rs_runtime
    ctl: Any = rt.controller
    ctl.core, ctl.apps, ctl.recorder = _Calls(), _Calls(), _Calls()
    mine = _rs("ns", "mine", replicas=3)
    mine["status"] |= {"replicas": 2, "fullyLabeledReplicas": 2}  # before the adoption
    others = [_rs("ns", f"rs{i}", replicas=4, app=f"other{i}") for i in range(OTHER_PODS // 4)]
    _fill(rt.store(REPLICASETS), [mine, *others])
    pods = [
        _pod("ns", f"o{i}-{j}", owner=(f"rs{i}", f"uid-ns-rs{i}"), app=f"other{i}")
        for i in range(OTHER_PODS // 4)
        for j in range(4)
    ]
    pods += [_pod("ns", "m0", owner=("mine", "uid-ns-mine")), _pod("ns", "m1", owner=("mine", "uid-ns-mine"))]
    pods.append(_pod("ns", "orphan-here"))  # matches the selector: adopted
    pods.append(_pod("elsewhere", "orphan-there"))  # matches the selector, other namespace: never adopted
    _fill(rt.store(PODS), pods)
    _no_full_scan(rt.store(PODS))
    _no_full_scan(rt.store(REPLICASETS))

    ctl.reconcile("ns/mine", ReconcileContext("ns/mine", deadline=float("inf")))

    patched = [args[:2] for name, args in ctl.core.calls if name == "patch_namespaced_pod"]
    assert patched == [("orphan-here", "ns")]
    assert [n for n, _ in ctl.core.calls if n == "create_namespaced_pod"] == []
    # Three pods now (two own + the adopted one): the status says 3; nothing was deleted.
    (status_call,) = [args for name, args in ctl.apps.calls if name == "replace_namespaced_replica_set_status"]
    assert status_call[2]["status"]["replicas"] == 3
    assert not [n for n, _ in ctl.core.calls if n == "delete_namespaced_pod"]


def test_an_orphans_event_enqueues_only_matching_replicasets_of_its_namespace(rs_runtime: ControllerRuntime) -> None:
    rt = rs_runtime
    _fill(
        rt.store(REPLICASETS),
        [_rs("ns", "web", 1), _rs("ns", "db", 1, app="db"), _rs("other", "web", 1)]
        + [_rs(f"n{i}", "web", 1) for i in range(200)],
    )
    _no_full_scan(rt.store(REPLICASETS))
    assert rt.controller.owner_keys(PODS, _pod("ns", "lost")) == ["ns/web"]
    assert rt.controller.owner_keys(PODS, _pod("nowhere", "lost")) == []
    # A pod with a controller owner concerns that owner only (no lookup at all).
    assert rt.controller.owner_keys(PODS, _pod("ns", "p", owner=("db", "uid-ns-db"))) == ["ns/db"]


def test_the_deployment_controller_reads_its_replicasets_and_old_pods_by_owner(
    etcd_config: EtcdConfig, key_prefix: str
) -> None:
    rt = offline_runtime(DeploymentController, etcd_config, key_prefix)
    ctl: Any = rt.controller
    d = {"metadata": {"namespace": "ns", "name": "d", "uid": "uid-ns-d"}}
    _fill(rt.store(DEPLOYMENTS), [d])
    old = _rs("ns", "d-old", 0, owner=("d", "uid-ns-d"))
    rss = [old] + [_rs("ns", f"x{i}", 1, owner=(f"dx{i}", f"uid-ns-dx{i}")) for i in range(500)]
    _fill(rt.store(REPLICASETS), rss)
    _fill(rt.store(PODS), [_pod("ns", f"p{i}", owner=(f"x{i}", f"uid-ns-x{i}")) for i in range(500)])
    _no_full_scan(rt.store(PODS))
    _no_full_scan(rt.store(REPLICASETS))
    ctx = ReconcileContext("ns/d", deadline=float("inf"))
    assert ctl._old_pods_remain(d, [old], ctx) is False
    rt.store(PODS)._apply("ADDED", _pod("ns", "leftover", owner=("d-old", "uid-ns-d-old")))
    assert ctl._old_pods_remain(d, [old], ctx) is True
    # The pod informer is chained through replicasets.apps: by_root finds the Deployment's pods.
    assert [p["metadata"]["name"] for p in rt.store(PODS).by_root("uid-ns-d")] == ["leftover"]
    assert rt.store(PODS).via == (rt.store(REPLICASETS),)
