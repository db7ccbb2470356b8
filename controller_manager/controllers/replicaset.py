"""The ReplicaSet controller: keep ``spec.replicas`` pods per ReplicaSet, adopt orphans, report status.

Purpose
    For a ReplicaSet key: count the live pods it controls (from the owner-path
    pod informer's owner index), adopt matching orphans of its namespace (the
    orphan index), so a reconcile costs O(its own pods), not O(the range), create or delete pods to match
    ``spec.replicas``, and write ``status`` (``replicas``,
    ``fullyLabeledReplicas``, ``readyReplicas``, ``availableReplicas`` - ready
    for at least ``spec.minReadySeconds`` - and ``observedGeneration``).
    Records the events ``SuccessfulCreate`` / ``SuccessfulDelete``.

Invariants
    * Never more pods than asked for: creations and deletions are recorded as
      *expectations* (client-go style) and the ReplicaSet is not reconciled
      again until the informer has seen them (or they expire); together with
      the framework's fresh-cache rule after a handover, no reconcile acts on a
      pod count that misses its own or a previous owner's writes.
    * Adoption updates the pod with its resourceVersion as precondition, so a
      pod is adopted at most once even if two ReplicaSets' selectors overlap.
    * The status written after deleting pods no longer counts them (they are
      terminating), so a Deployment reading it never sees pods that are going.

Concurrency model
    Called by worker threads; one key is never reconciled by two workers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.controller import Controller, ControllerRuntime, Expectations, ReconcileContext, Requeue
from controller_manager.controllers.common import available_in, is_ready, is_terminating, owner_ref, selector_matches
from controller_manager.controllers.events import EventRecorder
from controller_manager.resources import PODS, REPLICASETS, Resource, controller_ref, object_key

MERGE = "application/merge-patch+json"


class ReplicaSetController(Controller):
    name: ClassVar[str] = "replicaset"
    main: ClassVar[Resource] = REPLICASETS
    dependents: ClassVar[tuple[Resource, ...]] = (PODS,)

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        # Typed loosely: bodies are plain dicts (the client serialises them as they are).
        self.core: Any = k8s.CoreV1Api(self.api)
        self.apps: Any = k8s.AppsV1Api(self.api)
        self.expectations = Expectations()
        self.recorder = EventRecorder(self.api, "replicaset-controller")

    def orphan_keys(self, resource: Resource, obj: dict[str, Any]) -> list[str]:
        """The ReplicaSets of the orphan's namespace whose selector matches it (the namespace index)."""
        meta = obj.get("metadata") or {}
        return [
            object_key(rs)
            for rs in self.rt.store(REPLICASETS).by_namespace(str(meta.get("namespace") or ""))
            if selector_matches((rs.get("spec") or {}).get("selector"), meta.get("labels"))
        ]

    def on_dependent_event(self, event: str, resource: Resource, obj: dict[str, Any]) -> None:
        ref = controller_ref(obj)
        if ref is None or ref.get("kind") != "ReplicaSet":
            return
        key = f"{(obj.get('metadata') or {}).get('namespace')}/{ref.get('name')}"
        if event == "ADDED":
            self.expectations.observe(key, adds=1)
        elif event == "DELETED":
            self.expectations.observe(key, dels=1)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        rs = self.rt.store(REPLICASETS).get(key)
        if rs is None:
            self.expectations.forget(key)
            return
        if is_terminating(rs):
            return
        if not self.expectations.satisfied(key):
            raise Requeue(after=0.5, reason="waiting for the informer to see earlier creations/deletions")
        meta = rs["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        spec = rs.get("spec") or {}
        want = int(spec.get("replicas", 1))
        selector = spec.get("selector")
        # Through the pod store's indexes: its own pods (owner uid), then the orphans of its namespace:
        # O(its pods + the namespace's orphans), never the whole range's pods.
        pods = self.rt.store(PODS)
        owned = [
            pod
            for pod in pods.by_owner(uid)
            if (pod.get("metadata") or {}).get("namespace") == ns and not is_terminating(pod)
        ]
        orphans = [
            pod
            for pod in pods.orphans(ns)
            if not is_terminating(pod) and selector_matches(selector, (pod.get("metadata") or {}).get("labels"))
        ]
        for pod in orphans:
            if len(owned) >= want:
                break
            if self._adopt(rs, pod, ctx):
                owned.append(pod)
        diff = want - len(owned)
        if diff > 0:
            self._create(rs, diff, ctx)
        elif diff < 0:
            gone = {p["metadata"]["uid"] for p in self._delete(rs, key, owned, -diff, ctx)}
            owned = [p for p in owned if p["metadata"]["uid"] not in gone]
        wait = self._update_status(rs, owned, ctx)
        if wait is not None:
            raise Requeue(after=wait, reason="pods become available after minReadySeconds")

    def _adopt(self, rs: dict[str, Any], pod: dict[str, Any], ctx: ReconcileContext) -> bool:
        pmeta = pod["metadata"]
        refs = [*list(pmeta.get("ownerReferences") or []), owner_ref(rs, "ReplicaSet")]
        body = {"metadata": {"ownerReferences": refs, "resourceVersion": pmeta["resourceVersion"]}}
        try:
            self.core.patch_namespaced_pod(
                pmeta["name"], pmeta["namespace"], body, _content_type=MERGE, _request_timeout=ctx.timeout()
            )
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    def _create(self, rs: dict[str, Any], count: int, ctx: ReconcileContext) -> None:
        meta = rs["metadata"]
        key = object_key(rs)
        template = (rs.get("spec") or {}).get("template") or {}
        tmeta = template.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-",
                "namespace": meta["namespace"],
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": dict(tmeta.get("annotations") or {}),
                "ownerReferences": [owner_ref(rs, "ReplicaSet")],
            },
            "spec": template.get("spec") or {"containers": [{"name": "main", "image": "pause"}]},
        }
        self.expectations.expect(key, adds=count)
        for i in range(count):
            try:
                pod = self.core.create_namespaced_pod(meta["namespace"], body, _request_timeout=ctx.timeout())
                self.recorder.event(_typed(rs), "SuccessfulCreate", f"Created pod: {pod.metadata.name}")
            except BaseException:
                # The remaining creations will not happen: do not wait for them.
                self.expectations.observe(key, adds=count - i)
                raise

    def _delete(
        self, rs: dict[str, Any], key: str, owned: list[dict[str, Any]], count: int, ctx: ReconcileContext
    ) -> list[dict[str, Any]]:
        """Delete ``count`` of ``owned``; return the pods deleted (or already gone)."""
        # Prefer pods that are not ready, then the newest.
        victims = sorted(owned, key=lambda p: (is_ready(p), _neg_ts(p)))[:count]
        self.expectations.expect(key, dels=len(victims))
        for i, pod in enumerate(victims):
            pmeta = pod["metadata"]
            try:
                self.core.delete_namespaced_pod(pmeta["name"], pmeta["namespace"], _request_timeout=ctx.timeout())
                self.recorder.event(_typed(rs), "SuccessfulDelete", f"Deleted pod: {pmeta['name']}")
            except BaseException as e:
                if isinstance(e, ApiException) and e.status == 404:
                    self.expectations.observe(key, dels=1)
                    continue
                self.expectations.observe(key, dels=len(victims) - i)
                raise
        return victims

    def _update_status(self, rs: dict[str, Any], owned: list[dict[str, Any]], ctx: ReconcileContext) -> float | None:
        """Write the status if it changed; return seconds until a ready pod becomes available (if any)."""
        meta = rs["metadata"]
        spec = rs.get("spec") or {}
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        ready = [p for p in owned if is_ready(p)]
        available, wait = available_in(ready, int(spec.get("minReadySeconds") or 0))
        labelled = sum(
            1
            for p in owned
            if all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in template_labels.items())
        )
        status = {
            "replicas": len(owned),
            "fullyLabeledReplicas": labelled,
            "readyReplicas": len(ready),
            "availableReplicas": available,
            "observedGeneration": meta.get("generation", 1),
        }
        old = rs.get("status") or {}
        if all(old.get(k, 0) == v for k, v in status.items()):
            return wait
        body = {**rs, "status": {**old, **status}}
        self.apps.replace_namespaced_replica_set_status(
            meta["name"], meta["namespace"], body, _request_timeout=ctx.timeout()
        )
        return wait


def _typed(rs: dict[str, Any]) -> dict[str, Any]:
    """``rs`` with its kind and apiVersion (list items may lack them), for event references."""
    return {**rs, "kind": "ReplicaSet", "apiVersion": "apps/v1"}


def _neg_ts(pod: dict[str, Any]) -> tuple[int, ...]:
    """Sort key putting the newest creationTimestamp first."""
    ts = (pod.get("metadata") or {}).get("creationTimestamp") or ""
    return tuple(-ord(c) for c in ts)
