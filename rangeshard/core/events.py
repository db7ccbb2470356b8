"""Kubernetes Events: the one builder of core/v1 ``Event`` bodies, and the events.k8s.io/v1 view of them.

Purpose
    The controllers (through the API) and the local API server's simulated
    node (directly in the store) record what they do as core/v1 Events, the
    kind ``kubectl get events`` and ``kubectl describe`` read.
    :func:`event_body` builds such an Event for an involved object;
    :func:`to_events_v1` / :func:`from_events_v1` convert between core/v1 and
    ``events.k8s.io/v1`` (kube-apiserver serves one stored Event under both).

Invariants
    * Names are ``<object name>.<nanosecond clock in hex><4 random hex>``
      (unique without a read, and in time order like client-go's recorder,
      so lists sort by time); ``count`` is 1 (no aggregation).
    * Pure functions: no I/O.

Concurrency model
    Pure functions, safe from any thread.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from rangeshard.core.timestamps import format_micro_time, format_time

Obj = dict[str, Any]


def involved_object(obj: Obj, field_path: str | None = None) -> Obj:
    """The ``involvedObject`` reference of ``obj`` (an object as read from the API)."""
    meta = obj.get("metadata") or {}
    ref = {
        "kind": obj.get("kind"),
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "apiVersion": obj.get("apiVersion"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    if field_path:
        ref["fieldPath"] = field_path
    return {k: v for k, v in ref.items() if v is not None}


def event_body(
    obj: Obj,
    reason: str,
    message: str,
    *,
    component: str,
    host: str | None = None,
    event_type: str = "Normal",
    field_path: str | None = None,
) -> Obj:
    """A core/v1 Event saying ``reason: message`` about ``obj``, reported by ``component``."""
    ref = involved_object(obj, field_path)
    now = datetime.now(UTC)
    source: Obj = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{ref.get('name', 'object')}.{time.time_ns():x}{secrets.token_hex(2)}",
            "namespace": ref.get("namespace"),
        },
        "involvedObject": ref,
        "reason": reason,
        "message": message,
        "source": source,
        "firstTimestamp": format_time(now),
        "lastTimestamp": format_time(now),
        "eventTime": format_micro_time(now),
        "count": 1,
        "type": event_type,
        "action": reason,
        "reportingComponent": component,
        "reportingInstance": host or component,
    }


_V1_ONLY = ("involvedObject", "message", "source", "firstTimestamp", "lastTimestamp", "count")


def to_events_v1(ev: Obj) -> Obj:
    """The ``events.k8s.io/v1`` form of a stored core/v1 Event."""
    out = {k: v for k, v in ev.items() if k not in _V1_ONLY}
    out["apiVersion"] = "events.k8s.io/v1"
    out["kind"] = "Event"
    if "involvedObject" in ev:
        out["regarding"] = ev["involvedObject"]
    if "message" in ev:
        out["note"] = ev["message"]
    source = ev.get("source") or {}
    if "deprecatedSource" not in out and source:
        out["deprecatedSource"] = source
    out.setdefault("reportingController", ev.get("reportingComponent") or source.get("component", ""))
    out.pop("reportingComponent", None)
    for old, new in (("firstTimestamp", "deprecatedFirstTimestamp"), ("lastTimestamp", "deprecatedLastTimestamp")):
        if ev.get(old):
            out[new] = ev[old]
    if ev.get("count"):
        out["deprecatedCount"] = ev["count"]
    if not out.get("eventTime"):
        out["eventTime"] = ev.get("firstTimestamp") or ev.get("lastTimestamp")
    return out


def from_events_v1(ev: Obj) -> Obj:
    """The core/v1 form (as stored) of an ``events.k8s.io/v1`` Event."""
    renamed = {
        "regarding": "involvedObject",
        "note": "message",
        "deprecatedSource": "source",
        "deprecatedFirstTimestamp": "firstTimestamp",
        "deprecatedLastTimestamp": "lastTimestamp",
        "deprecatedCount": "count",
        "reportingController": "reportingComponent",
    }
    return {**{renamed.get(k, k): v for k, v in ev.items()}, "apiVersion": "v1", "kind": "Event"}
