"""What discovery says about a resource.

Purpose
    A :class:`ResourceInfo` is what an ``APIResourceList`` says about one
    resource (kind, namespaced, verbs), around its identity, the foundation's
    :class:`rangeshard.core.rest.GVR` (REST paths are parsed by
    :func:`rangeshard.core.rest.parse_rest_path`).

Invariants
    * A resource is cacheable only if discovery lists both ``list`` and
      ``watch`` for it; subresources are never listed here.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rangeshard.core.rest import GVR


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """What discovery says about one resource."""

    gvr: GVR
    kind: str
    namespaced: bool
    verbs: frozenset[str]

    @property
    def list_kind(self) -> str:
        """``PodList`` for ``Pod``."""
        return f"{self.kind}List"

    @property
    def cacheable(self) -> bool:
        """True if the resource supports both list and watch."""
        return {"list", "watch"} <= self.verbs


def parse_resource_list(group: str, version: str, doc: Mapping[str, Any]) -> dict[str, ResourceInfo]:
    """Parse an ``APIResourceList`` discovery document (subresources skipped)."""
    out: dict[str, ResourceInfo] = {}
    resources = doc.get("resources")
    if not isinstance(resources, list):
        return out
    for item in resources:
        if not isinstance(item, Mapping):
            continue
        name = item.get("name")
        kind = item.get("kind")
        if not isinstance(name, str) or "/" in name or not isinstance(kind, str):
            continue
        verbs = item.get("verbs")
        out[name] = ResourceInfo(
            GVR(group, version, name),
            kind,
            bool(item.get("namespaced")),
            frozenset(v for v in verbs if isinstance(v, str)) if isinstance(verbs, list) else frozenset(),
        )
    return out
