"""The Deployment controller: one ReplicaSet per pod template, rolled with RollingUpdate or Recreate.

Purpose
    For a Deployment key: find the ReplicaSet of the current pod template
    (``<name>-<hash>``, label ``pod-template-hash``) or create it, then move
    replicas from the old ReplicaSets to it as ``spec.strategy`` says, keep
    the revisions, and write ``status``:

    * ``RollingUpdate`` (the default): never more than ``replicas + maxSurge``
      pods asked for, never fewer than ``replicas - maxUnavailable`` available
      (both ints or percentages, default 25%/25%; surge rounds up, unavailable
      down; both 0 means unavailable 1), old ReplicaSets scaled down as new
      pods become available (:mod:`controller_manager.controllers.rollout`);
    * ``Recreate``: every old ReplicaSet scaled to 0 and its pods gone (also
      terminating ones) before the new one scales up; the pods come from this
      controller's pod informer, which holds exactly the pods of its own
      Deployments (``chained``: placed by the root of their owner chain through
      ``replicasets.apps``), so its pod cache falls as 1/N with N instances;
    * revisions: ``deployment.kubernetes.io/revision`` on the ReplicaSets (the
      newest template gets the highest, also after ``kubectl rollout undo``)
      and on the Deployment; old ReplicaSets with no pods are deleted beyond
      ``spec.revisionHistoryLimit`` (default 10);
    * status: ``replicas``, ``updatedReplicas``, ``readyReplicas``,
      ``availableReplicas``, ``unavailableReplicas``, ``observedGeneration``
      and the conditions ``Available`` and ``Progressing`` (reason
      ``NewReplicaSetAvailable`` once the rollout is complete), which is what
      ``kubectl rollout status`` waits for;
    * events ``ScalingReplicaSet`` for every scale.

Invariants
    * Decisions are taken only on ReplicaSets whose status describes their
      current spec (``status.observedGeneration >= metadata.generation``) and
      whose latest scale by this controller the informer has seen (per-key
      expectations): availability is never counted from a stale status, so
      the bounds above hold even when reconciles follow each other quickly.
      After a handover the new owner relists first (framework rule), so
      expectations lost with the old owner are not needed.
    * ``spec.paused`` stops the rollout (status is still written).
    * The ReplicaSet name is deterministic, so a repeated create after a lost
      answer or a handover is a harmless 409.

Concurrency model
    Called by worker threads; one key is never reconciled by two workers.
    The expectations dict is guarded by a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import orjson
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext, Requeue
from controller_manager.controllers.common import is_terminating, owner_ref
from controller_manager.controllers.events import EventRecorder
from controller_manager.controllers.rollout import (
    HASH_LABEL,
    REVISION,
    Strategy,
    deployment_status,
    new_rs_target,
    old_scale_downs,
    revision_of,
    rs_replicas,
    synced,
)
from controller_manager.resources import DEPLOYMENTS, PODS, REPLICASETS, Resource
from hashing import fnv1a_64

MERGE = "application/merge-patch+json"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
# Deployment annotations not copied to its ReplicaSets (kube's skip list).
_NOT_COPIED = (
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
)
_EXPECTATION_TTL = 10.0


def normalized(value: Any) -> Any:
    """``value`` without nulls, empty objects and empty lists (at any depth).

    Clients that round-trip a template through typed structs (``kubectl
    rollout undo``) add ``resources: {}`` or ``creationTimestamp: null``;
    such a template is the same template.
    """
    if isinstance(value, dict):
        out = {k: normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v not in ({}, [])}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def comparable(template: dict[str, Any]) -> Any:
    """A pod template as compared between a Deployment and its ReplicaSets (no ``pod-template-hash``)."""
    labels = dict(((template.get("metadata") or {}).get("labels")) or {})
    labels.pop(HASH_LABEL, None)
    return normalized({**template, "metadata": {**(template.get("metadata") or {}), "labels": labels}})


def template_hash(template: dict[str, Any]) -> str:
    """A short, stable hash of a pod template (10 hex digits)."""
    return f"{fnv1a_64(orjson.dumps(comparable(template), option=orjson.OPT_SORT_KEYS)):016x}"[:10]


def _replica_annotations(spec: dict[str, Any]) -> dict[str, str]:
    """The desired- and max-replicas annotations a Deployment's ReplicaSets carry (as kube writes them)."""
    want = int(spec.get("replicas", 1))
    return {DESIRED_REPLICAS: str(want), MAX_REPLICAS: str(want + Strategy.of(spec, want).surge)}


class DeploymentController(Controller):
    name: ClassVar[str] = "deployment"
    main: ClassVar[Resource] = DEPLOYMENTS
    dependents: ClassVar[tuple[Resource, ...]] = (REPLICASETS,)
    #: Its pods, two levels down: Deployment -> ReplicaSet -> Pod, placed with the Deployment.
    chained: ClassVar[tuple[tuple[Resource, tuple[str, ...]], ...]] = ((PODS, ("replicasets.apps",)),)

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        # Typed loosely: bodies are plain dicts (the client serialises them as they are).
        self.apps: Any = k8s.AppsV1Api(self.api)
        self.core: Any = k8s.CoreV1Api(self.api)
        self.recorder = EventRecorder(self.api, "deployment-controller")
        self._lock = threading.Lock()
        # key -> ({ReplicaSet name: generation the informer must reach}, since)
        self._expected: dict[str, tuple[dict[str, int], float]] = {}

    # -- expectations ------------------------------------------------------------
    def _expect(self, key: str, rs_name: str, generation: int) -> None:
        with self._lock:
            names, _ = self._expected.get(key, ({}, 0.0))
            names[rs_name] = generation
            self._expected[key] = (names, time.monotonic())

    def _caught_up(self, key: str, owned: list[dict[str, Any]]) -> bool:
        with self._lock:
            entry = self._expected.get(key)
            if entry is None:
                return True
            names, since = entry
            gens = {rs["metadata"]["name"]: int(rs["metadata"].get("generation") or 0) for rs in owned}
            if time.monotonic() - since > _EXPECTATION_TTL or all(gens.get(n, g) >= g for n, g in names.items()):
                del self._expected[key]
                return True
            return False

    # -- reconcile -----------------------------------------------------------------
    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        d = self.rt.store(DEPLOYMENTS).get(key)
        if d is None:
            with self._lock:
                self._expected.pop(key, None)
            return
        if is_terminating(d):
            return
        d = {**d, "kind": "Deployment", "apiVersion": "apps/v1"}
        meta = d["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        spec = d.get("spec") or {}
        want = int(spec.get("replicas", 1))
        strategy = Strategy.of(spec, want)
        thash = template_hash(spec.get("template") or {})
        owned = [  # the owner index: O(its own ReplicaSets)
            {**rs, "kind": "ReplicaSet", "apiVersion": "apps/v1"}
            for rs in self.rt.store(REPLICASETS).by_owner(uid)
            if (rs.get("metadata") or {}).get("namespace") == ns and not is_terminating(rs)
        ]
        if not self._caught_up(key, owned):
            raise Requeue(after=0.2, reason="waiting for the informer to see earlier ReplicaSet scales")
        wanted = comparable(spec.get("template") or {})
        current = next((rs for rs in owned if comparable((rs.get("spec") or {}).get("template") or {}) == wanted), None)
        old = [rs for rs in owned if rs is not current]
        max_old = max((revision_of(rs) for rs in old), default=0)
        paused = bool(spec.get("paused"))
        if current is None and not paused:
            if strategy.recreate:
                first = 0 if old else want
            else:
                first = new_rs_target(want, strategy, 0, sum(rs_replicas(rs) for rs in old))
            current = self._create_rs(d, thash, max_old + 1, first, ctx)
            if current is None:
                raise Requeue(after=0.5, reason="ReplicaSet exists but is not in the cache yet")
            owned.append(current)
        elif current is not None and revision_of(current) <= max_old and not paused:
            current = self._set_revision(current, max_old + 1, ctx)
        waiting = False
        if current is not None and not paused:
            waiting = self._roll(key, d, strategy, current, old, ctx)
            self._cleanup(d, old, ctx)
        self._sync_deployment(d, current, owned, strategy, ctx)
        if waiting:
            raise Requeue(after=0.5, reason="rollout in progress")

    def _roll(
        self,
        key: str,
        d: dict[str, Any],
        strategy: Strategy,
        current: dict[str, Any],
        old: list[dict[str, Any]],
        ctx: ReconcileContext,
    ) -> bool:
        """One step of the rollout; True while old pods remain or ReplicaSets are not synced."""
        want = int((d.get("spec") or {}).get("replicas", 1))
        all_rs = [current, *old]
        if not all(synced(rs) for rs in all_rs):
            return True
        old_spec = sum(rs_replicas(rs) for rs in old)
        old_live = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in old)
        if strategy.recreate:
            for rs in old:
                if rs_replicas(rs):
                    self._scale(key, d, rs, 0, ctx)
            if old_spec or old_live:
                return True
            if rs_replicas(current) != want:
                if self._old_pods_remain(d, old, ctx):
                    return True
                self._scale(key, d, current, want, ctx)
            return False
        target = new_rs_target(want, strategy, rs_replicas(current), old_spec)
        if target != rs_replicas(current):
            self._scale(key, d, current, target, ctx)
            return True
        for rs, replicas in old_scale_downs(want, strategy, current, old):
            self._scale(key, d, rs, replicas, ctx)
        return old_spec > 0 or old_live > 0

    def _old_pods_remain(self, d: dict[str, Any], old: list[dict[str, Any]], ctx: ReconcileContext) -> bool:
        """Whether pods of old ReplicaSets still exist (terminating ones too): Recreate waits for them.

        Read from the pod informer (``chained``): it holds the pods whose chain of
        controller owners leads to this instance's Deployments, terminating ones
        included until they are gone; their deletion enqueues the Deployment again.
        """
        ns = d["metadata"]["namespace"]
        pods = self.rt.store(PODS)
        return any(
            (pod.get("metadata") or {}).get("namespace") == ns
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            for rs in old
            for pod in pods.by_owner(rs["metadata"]["uid"])  # the owner index: only these pods
        )

    # -- writes --------------------------------------------------------------------
    def _create_rs(
        self, d: dict[str, Any], thash: str, revision: int, replicas: int, ctx: ReconcileContext
    ) -> dict[str, Any] | None:
        meta = d["metadata"]
        spec = d.get("spec") or {}
        template = orjson.loads(orjson.dumps(spec.get("template") or {}))
        tmeta = template.setdefault("metadata", {})
        tmeta.setdefault("labels", {})[HASH_LABEL] = thash
        selector = orjson.loads(orjson.dumps(spec.get("selector") or {}))
        selector.setdefault("matchLabels", {})[HASH_LABEL] = thash
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_COPIED}
        annotations |= {REVISION: str(revision), **_replica_annotations(spec)}
        rs_spec: dict[str, Any] = {"replicas": replicas, "selector": selector, "template": template}
        if spec.get("minReadySeconds"):
            rs_spec["minReadySeconds"] = spec["minReadySeconds"]
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{thash}"[:253],
                "namespace": meta["namespace"],
                "labels": {**(tmeta.get("labels") or {})},
                "annotations": annotations,
                "ownerReferences": [owner_ref(d, "Deployment")],
            },
            "spec": rs_spec,
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
        result: dict[str, Any] = {**orjson.loads(raw.data), "kind": "ReplicaSet", "apiVersion": "apps/v1"}
        if replicas:
            self.recorder.event(
                d, "ScalingReplicaSet", f"Scaled up replica set {result['metadata']['name']} from 0 to {replicas}"
            )
        return result

    def _set_revision(self, rs: dict[str, Any], revision: int, ctx: ReconcileContext) -> dict[str, Any]:
        meta = rs["metadata"]
        patch = {"metadata": {"annotations": {REVISION: str(revision)}}}
        self.apps.patch_namespaced_replica_set(
            meta["name"], meta["namespace"], patch, _content_type=MERGE, _request_timeout=ctx.timeout()
        )
        annotations = {**(meta.get("annotations") or {}), REVISION: str(revision)}
        return {**rs, "metadata": {**meta, "annotations": annotations}}

    def _scale(self, key: str, d: dict[str, Any], rs: dict[str, Any], replicas: int, ctx: ReconcileContext) -> None:
        meta = rs["metadata"]
        before = rs_replicas(rs)
        annotations = _replica_annotations(d.get("spec") or {})
        result = self.apps.patch_namespaced_replica_set(
            meta["name"],
            meta["namespace"],
            {"metadata": {"annotations": annotations}, "spec": {"replicas": replicas}},
            _content_type=MERGE,
            _request_timeout=ctx.timeout(),
        )
        self._expect(key, meta["name"], int(result.metadata.generation or 0))
        verb = "up" if replicas > before else "down"
        self.recorder.event(
            d, "ScalingReplicaSet", f"Scaled {verb} replica set {meta['name']} from {before} to {replicas}"
        )

    def _cleanup(self, d: dict[str, Any], old: list[dict[str, Any]], ctx: ReconcileContext) -> None:
        """Delete the oldest empty old ReplicaSets beyond ``revisionHistoryLimit``."""
        limit = int((d.get("spec") or {}).get("revisionHistoryLimit", 10))
        empty = [
            rs
            for rs in old
            if rs_replicas(rs) == 0 and int((rs.get("status") or {}).get("replicas", 0)) == 0 and synced(rs)
        ]
        extra = len(empty) - max(limit, 0)
        for rs in sorted(empty, key=revision_of)[: max(extra, 0)]:
            meta = rs["metadata"]
            try:
                self.apps.delete_namespaced_replica_set(meta["name"], meta["namespace"], _request_timeout=ctx.timeout())
            except ApiException as e:
                if e.status != 404:
                    raise

    def _sync_deployment(
        self,
        d: dict[str, Any],
        current: dict[str, Any] | None,
        owned: list[dict[str, Any]],
        strategy: Strategy,
        ctx: ReconcileContext,
    ) -> None:
        meta = d["metadata"]
        if current is not None:
            revision = str(revision_of(current))
            if (meta.get("annotations") or {}).get(REVISION) != revision:
                patch = {"metadata": {"annotations": {REVISION: revision}}}
                self.apps.patch_namespaced_deployment(
                    meta["name"], meta["namespace"], patch, _content_type=MERGE, _request_timeout=ctx.timeout()
                )
        old_status = d.get("status") or {}
        status = deployment_status(d, current, owned, strategy, old_status)
        if status == old_status:
            return
        # A merge patch: the annotation patch above changed the resourceVersion.
        self.apps.patch_namespaced_deployment_status(
            meta["name"], meta["namespace"], {"status": status}, _content_type=MERGE, _request_timeout=ctx.timeout()
        )
