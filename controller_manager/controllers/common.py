"""Helpers shared by the built-in controllers: label selectors, pod readiness, owner references.

Concurrency model: pure functions.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rangeshard.core.timestamps import parse_time


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str] | None) -> bool:
    """Evaluate a LabelSelector (matchLabels + matchExpressions). An empty selector matches nothing."""
    if not selector:
        return False
    labels = labels or {}
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    for k, v in match_labels.items():
        if labels.get(k) != v:
            return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def is_ready(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return True
    return False


def ready_since(pod: dict[str, Any]) -> datetime | None:
    """When the pod's ``Ready`` condition last became true (None if not ready or unknown)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def available_in(ready: list[dict[str, Any]], min_ready_seconds: int) -> tuple[int, float | None]:
    """How many ``ready`` pods are available (ready for ``min_ready_seconds``), and seconds until the next one is."""
    if min_ready_seconds <= 0:
        return len(ready), None
    now = datetime.now(UTC)
    count = 0
    wait: float | None = None
    for pod in ready:
        since = ready_since(pod)
        left = min_ready_seconds - (now - since).total_seconds() if since is not None else 0.0
        if left <= 0:
            count += 1
        else:
            wait = left if wait is None else min(wait, left)
    return count, wait


def is_terminating(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def owner_ref(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The controller ``ownerReference`` to ``obj``, an ``apps/v1`` object of ``kind``."""
    meta = obj["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
