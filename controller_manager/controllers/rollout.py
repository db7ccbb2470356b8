"""Rollout arithmetic of the Deployment controller: strategy bounds, scale steps, revisions, status.

Purpose
    Pure functions over Deployment and ReplicaSet objects (plain dicts), so
    the rules of a rolling update can be read and tested on their own:

    * :class:`Strategy` resolves ``maxSurge``/``maxUnavailable`` (ints or
      percentages of ``spec.replicas``; surge rounds up, unavailable down;
      both 0 means unavailable 1; ``Recreate`` has surge and unavailable 0);
    * :func:`new_rs_target` is the new ReplicaSet's next size: at most
      ``replicas + maxSurge`` pods asked for in total;
    * :func:`old_scale_downs` says how far each old ReplicaSet may shrink now
      so that at least ``replicas - maxUnavailable`` pods stay available
      (unavailable old pods go first, then the oldest ReplicaSets);
    * :func:`deployment_status` computes ``status`` with the ``Available``
      and ``Progressing`` conditions.

Invariants
    Inputs are never modified. Sizes come from ``spec.replicas``,
    availability from ``status.availableReplicas`` of ReplicaSets whose
    status is :func:`synced`.

Concurrency model
    Pure functions and a frozen dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rangeshard.core.timestamps import format_time

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"

Obj = dict[str, Any]


def _resolve(value: Any, total: int, round_up: bool, default: str) -> int:
    if value is None:
        value = default
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = float(value[:-1])
        except ValueError:
            pct = float(default[:-1])
        scaled = pct * total / 100
        return max(math.ceil(scaled) if round_up else math.floor(scaled), 0)
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return _resolve(default, total, round_up, default)


@dataclass(frozen=True)
class Strategy:
    """The resolved update strategy of a Deployment."""

    recreate: bool
    surge: int
    unavailable: int

    @classmethod
    def of(cls, spec: Obj, replicas: int) -> Strategy:
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            return cls(True, 0, 0)
        rolling = strategy.get("rollingUpdate") or {}
        surge = _resolve(rolling.get("maxSurge"), replicas, True, "25%")
        unavailable = _resolve(rolling.get("maxUnavailable"), replicas, False, "25%")
        if surge == 0 and unavailable == 0:
            unavailable = 1
        return cls(False, surge, min(unavailable, replicas) if replicas else unavailable)


def rs_replicas(rs: Obj) -> int:
    return int((rs.get("spec") or {}).get("replicas", 0) or 0)


def available(rs: Obj) -> int:
    return int((rs.get("status") or {}).get("availableReplicas", 0) or 0)


def revision_of(rs: Obj) -> int:
    try:
        return int(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION, 0))
    except (TypeError, ValueError):
        return 0


def synced(rs: Obj) -> bool:
    """The ReplicaSet's status describes its current spec."""
    meta = rs.get("metadata") or {}
    observed = int((rs.get("status") or {}).get("observedGeneration", 0) or 0)
    return observed >= int(meta.get("generation") or 1)


def _age_key(rs: Obj) -> tuple[str, str]:
    meta = rs.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


def new_rs_target(want: int, strategy: Strategy, new_replicas: int, old_replicas: int) -> int:
    """The new ReplicaSet's size for this step (never more than ``want + surge`` pods in total)."""
    if new_replicas >= want:
        return want
    room = want + strategy.surge - (new_replicas + old_replicas)
    if room <= 0:
        return new_replicas
    return new_replicas + min(room, want - new_replicas)


def old_scale_downs(want: int, strategy: Strategy, new_rs: Obj, old: list[Obj]) -> list[tuple[Obj, int]]:
    """``(ReplicaSet, new size)`` for old ReplicaSets that may shrink now (see module docstring)."""
    sizes = {id(rs): rs_replicas(rs) for rs in old}
    if not any(sizes.values()):
        return []
    min_available = want - strategy.unavailable
    total = rs_replicas(new_rs) + sum(sizes.values())
    new_unavailable = max(rs_replicas(new_rs) - available(new_rs), 0)
    budget = total - min_available - new_unavailable
    ordered = sorted(old, key=_age_key)
    # 1. Old pods that are not available can go without reducing availability.
    for rs in ordered:
        if budget <= 0:
            break
        unhealthy = sizes[id(rs)] - available(rs)
        if unhealthy <= 0:
            continue
        down = min(budget, unhealthy)
        sizes[id(rs)] -= down
        budget -= down
    # 2. Available old pods beyond the minimum, oldest ReplicaSets first.
    excess = available(new_rs) + sum(min(available(rs), sizes[id(rs)]) for rs in old) - min_available
    for rs in ordered:
        if excess <= 0:
            break
        down = min(sizes[id(rs)], excess)
        sizes[id(rs)] -= down
        excess -= down
    return [(rs, sizes[id(rs)]) for rs in ordered if sizes[id(rs)] != rs_replicas(rs)]


def _condition(old: list[Obj], kind: str, status: str, reason: str, message: str) -> Obj:
    prev = next((c for c in old if c.get("type") == kind), None)
    now = format_time()
    if prev is not None and (prev.get("status"), prev.get("reason"), prev.get("message")) == (status, reason, message):
        return prev
    return {
        "type": kind,
        "status": status,
        "lastUpdateTime": now,
        "lastTransitionTime": prev.get("lastTransitionTime", now)
        if prev is not None and prev.get("status") == status
        else now,
        "reason": reason,
        "message": message,
    }


def deployment_status(d: Obj, current: Obj | None, owned: list[Obj], strategy: Strategy, old_status: Obj) -> Obj:
    """The Deployment's ``status`` (kept identical to ``old_status`` when nothing changed)."""
    meta = d.get("metadata") or {}
    spec = d.get("spec") or {}
    want = int(spec.get("replicas", 1))

    def total(field: str) -> int:
        return sum(int((rs.get("status") or {}).get(field, 0) or 0) for rs in owned)

    replicas = total("replicas")
    avail = total("availableReplicas")
    updated = int((current.get("status") or {}).get("replicas", 0) or 0) if current is not None else 0
    old_conds = [c for c in old_status.get("conditions") or [] if isinstance(c, dict)]
    if avail >= want - strategy.unavailable:
        availability = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
    else:
        availability = ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
    name = (current.get("metadata") or {}).get("name") if current is not None else None
    complete = (
        current is not None
        and updated == want
        and replicas == want
        and avail == want
        and rs_replicas(current) == want
        and synced(current)
    )
    progress: tuple[str, str, str] | None = None
    if spec.get("paused"):
        progress = ("Unknown", "DeploymentPaused", "Deployment is paused")
    elif complete:
        progress = ("True", "NewReplicaSetAvailable", f'ReplicaSet "{name}" has successfully progressed.')
    elif name is not None:
        progress = ("True", "ReplicaSetUpdated", f'ReplicaSet "{name}" is progressing.')
    conds = [_condition(old_conds, "Available", *availability)]
    conds += [_condition(old_conds, "Progressing", *progress)] if progress is not None else []
    return {
        **old_status,
        "observedGeneration": int(meta.get("generation") or 1),
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": total("readyReplicas"),
        "availableReplicas": avail,
        "unavailableReplicas": max(sum(rs_replicas(rs) for rs in owned) - avail, 0),
        "conditions": conds,
    }
