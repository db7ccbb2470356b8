"""Conversion between a served resource's API form and its stored form (resources sharing storage).

Purpose
    kube-apiserver serves some objects under two APIs; here that is Events:
    stored as core/v1 ``Event`` and also served as ``events.k8s.io/v1``
    (``regarding``/``note``/``reportingController`` instead of
    ``involvedObject``/``message``/``reportingComponent``). :func:`to_api`
    turns a stored object into the form of the resource it is read through,
    :func:`to_storage` an object of any served form into the stored form.

Invariants
    * Resources without ``stored_as`` are returned unchanged (no copy).
    * ``to_storage(to_api(spec, stored))`` keeps every field.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

from typing import Any

from local_apiserver.resources import ResourceSpec
from rangeshard.core.events import from_events_v1, to_events_v1

Obj = dict[str, Any]


def to_api(spec: ResourceSpec, obj: Obj) -> Obj:
    """The stored ``obj`` as the resource ``spec`` serves it."""
    if spec.group == "events.k8s.io":
        return to_events_v1(obj)
    return obj


def to_storage(obj: Obj) -> Obj:
    """``obj`` (in any served form) in its stored form."""
    if obj.get("apiVersion") == "events.k8s.io/v1" and obj.get("kind") == "Event":
        return from_events_v1(obj)
    return obj
