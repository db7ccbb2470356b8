"""The Deployment controller: one ReplicaSet per pod template, old ones scaled down, status reported.

Purpose
    For a Deployment key: compute the pod-template hash, make sure the
    ReplicaSet ``<name>-<hash>`` exists (owned by the Deployment, selector and
    template labelled with ``pod-template-hash``), scale every older
    ReplicaSet to 0 and, once their pods are gone, the current one to
    ``spec.replicas``; then write ``status``.

Invariants
    * Updates use the **Recreate** strategy whatever ``spec.strategy`` says
      (documented): old pods are gone before new ones are asked for, so the
      Deployment never runs more than ``spec.replicas`` pods and always
      converges.
    * The ReplicaSet name is deterministic, so a repeated create after a lost
      answer or a handover is a harmless 409.

Concurrency model
    Called by worker threads; one key is never reconciled by two workers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext, Requeue
from controller_manager.controllers.common import is_terminating
from controller_manager.resources import DEPLOYMENTS, REPLICASETS, Resource, controller_ref
from hashing import fnv1a_64

MERGE = "application/merge-patch+json"
HASH_LABEL = "pod-template-hash"


def template_hash(template: dict[str, Any]) -> str:
    """A short, stable hash of a pod template (10 hex digits)."""
    return f"{fnv1a_64(orjson.dumps(template, option=orjson.OPT_SORT_KEYS)):016x}"[:10]


class DeploymentController(Controller):
    name: ClassVar[str] = "deployment"
    main: ClassVar[Resource] = DEPLOYMENTS
    dependents: ClassVar[tuple[Resource, ...]] = (REPLICASETS,)

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        # Typed loosely: bodies are plain dicts (the client serialises them as they are).
        self.apps: Any = k8s.AppsV1Api(self.api)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        d = self.rt.store(DEPLOYMENTS).get(key)
        if d is None or is_terminating(d):
            return
        meta = d["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        spec = d.get("spec") or {}
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        thash = template_hash(template)
        owned = [
            rs
            for rs in self.rt.store(REPLICASETS).items()
            if (rs.get("metadata") or {}).get("namespace") == ns
            and (controller_ref(rs) or {}).get("uid") == uid
            and not is_terminating(rs)
        ]
        current = next((rs for rs in owned if (rs["metadata"].get("labels") or {}).get(HASH_LABEL) == thash), None)
        old = [rs for rs in owned if rs is not current]
        if current is None:
            current = self._create_rs(d, thash, ctx)
            if current is None:
                raise Requeue(after=0.5, reason="ReplicaSet exists but is not in the cache yet")
        # Recreate: scale old ReplicaSets down first and wait for their pods to go.
        old_pods = 0
        for rs in old:
            if int((rs.get("spec") or {}).get("replicas", 0)) != 0:
                self._scale(rs, 0, ctx)
            old_pods += int((rs.get("status") or {}).get("replicas", 0))
        target = want if old_pods == 0 else 0
        if int((current.get("spec") or {}).get("replicas", 0)) != target:
            self._scale(current, target, ctx)
        self._update_status(d, current, owned, ctx)
        if old_pods:
            raise Requeue(after=0.5, reason="waiting for old ReplicaSets to scale down")

    def _create_rs(self, d: dict[str, Any], thash: str, ctx: ReconcileContext) -> dict[str, Any] | None:
        meta = d["metadata"]
        spec = d.get("spec") or {}
        template = orjson.loads(orjson.dumps(spec.get("template") or {}))
        tmeta = template.setdefault("metadata", {})
        tmeta.setdefault("labels", {})[HASH_LABEL] = thash
        selector = orjson.loads(orjson.dumps(spec.get("selector") or {}))
        selector.setdefault("matchLabels", {})[HASH_LABEL] = thash
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{thash}"[:253],
                "namespace": meta["namespace"],
                "labels": {**(tmeta.get("labels") or {})},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"replicas": 0, "selector": selector, "template": template},
        }
        try:
            created = self.apps.create_namespaced_replica_set(
                meta["namespace"], body, _request_timeout=ctx.timeout(), _preload_content=False
            )
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        raw = getattr(created, "response", created)
        result: dict[str, Any] = orjson.loads(raw.data)
        return result

    def _scale(self, rs: dict[str, Any], replicas: int, ctx: ReconcileContext) -> None:
        meta = rs["metadata"]
        self.apps.patch_namespaced_replica_set(
            meta["name"],
            meta["namespace"],
            {"spec": {"replicas": replicas}},
            _content_type=MERGE,
            _request_timeout=ctx.timeout(),
        )

    def _update_status(
        self, d: dict[str, Any], current: dict[str, Any], owned: list[dict[str, Any]], ctx: ReconcileContext
    ) -> None:
        meta = d["metadata"]

        def total(field: str) -> int:
            return sum(int((rs.get("status") or {}).get(field, 0)) for rs in owned)

        want = int((d.get("spec") or {}).get("replicas", 1))
        available = total("availableReplicas")
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": total("replicas"),
            "updatedReplicas": int((current.get("status") or {}).get("replicas", 0)),
            "readyReplicas": total("readyReplicas"),
            "availableReplicas": available,
            "unavailableReplicas": max(want - available, 0),
        }
        old = d.get("status") or {}
        if all(old.get(k, 0) == v for k, v in status.items()):
            return
        body = {**d, "status": {**old, **status}}
        self.apps.replace_namespaced_deployment_status(
            meta["name"], meta["namespace"], body, _request_timeout=ctx.timeout()
        )
