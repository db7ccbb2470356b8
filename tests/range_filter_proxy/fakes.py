"""An in-memory implementation of the proxy's own ``Upstream`` interface.

It behaves like an API server backed by etcd as far as the watch cache can
tell: one global, increasing resourceVersion shared by every resource, a
compactable event log (watches from before the compaction get 410), watches
that can be disconnected or answered with 410, and bookmarks on demand.
It counts open watches and lists so tests can assert the proxy's upstream load.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from range_filter_proxy.errors import UpstreamError, UpstreamGone
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.upstream import ListResult, Upstream
from range_filter_proxy.watchstream import WatchEvent
from rangeshard.core.rest import GVR

PODS = GVR("", "v1", "pods")
REPLICASETS = GVR("apps", "v1", "replicasets")
NAMESPACES = GVR("", "v1", "namespaces")

INFOS = {
    PODS: ResourceInfo(PODS, "Pod", True, frozenset({"get", "list", "watch", "create", "delete"})),
    REPLICASETS: ResourceInfo(REPLICASETS, "ReplicaSet", True, frozenset({"get", "list", "watch"})),
    NAMESPACES: ResourceInfo(NAMESPACES, "Namespace", False, frozenset({"get", "list", "watch"})),
}


class FakeUpstream(Upstream):
    """In-memory upstream; every method must be called from the test's event loop."""

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[GVR, dict[tuple[str, str], dict[str, Any]]] = {g: {} for g in INFOS}
        self.log: list[tuple[int, GVR, str, dict[str, Any]]] = []
        self.compacted_rv = 0
        self.open_watches: dict[GVR, int] = dict.fromkeys(INFOS, 0)
        self.watch_calls: dict[GVR, int] = dict.fromkeys(INFOS, 0)
        self.list_calls: dict[GVR, int] = dict.fromkeys(INFOS, 0)
        self._queues: list[tuple[GVR, asyncio.Queue[tuple[str, dict[str, Any]] | BaseException | None]]] = []
        self.fail_watches_with_gone = 0
        #: Answer lists with a shardSelector as a KEP-5866 server does (with metadata.shardInfo), ...
        self.native_shard_selector = False
        #: ... or refuse them with this HTTP status (e.g. 400); else ignore the parameter, as an older server does.
        self.refuse_shard_selector: int | None = None
        #: Lists with a shardSelector (the proxy's probe), counted apart from list_calls.
        self.shard_selector_lists: list[str] = []

    # ---- Upstream interface ---------------------------------------------------------------

    async def discover(self, group: str, version: str) -> dict[str, ResourceInfo]:
        found = {g.resource: i for g, i in INFOS.items() if g.group == group and g.version == version}
        if not found:
            raise UpstreamError(f"no group/version {group}/{version}", 404)
        return found

    async def preferred_version(self, group: str) -> str:
        return "v1"

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        selector = (params or {}).get("shardSelector")
        if selector is not None:
            self.shard_selector_lists.append(selector)
            if self.refuse_shard_selector is not None:
                raise UpstreamError("shardSelector: unknown parameter (forced)", self.refuse_shard_selector)
            items = [copy.deepcopy(o) for _, o in sorted(self.objects[gvr].items())][:1]
            info = {"selector": selector} if self.native_shard_selector else None
            return ListResult(items, str(self.rv), None, info)
        self.list_calls[gvr] += 1
        items = [copy.deepcopy(o) for _, o in sorted(self.objects[gvr].items())]
        return ListResult(items, str(self.rv))

    async def current_resource_version(self, gvr: GVR) -> str:
        return str(self.rv)

    async def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        self.watch_calls[gvr] += 1
        start = int(resource_version)
        if self.fail_watches_with_gone > 0:
            self.fail_watches_with_gone -= 1
            raise UpstreamGone("too old resource version (forced)")
        if start < self.compacted_rv:
            raise UpstreamGone(f"too old resource version: {start} ({self.compacted_rv})")
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | BaseException | None] = asyncio.Queue()
        for rv, g, etype, obj in self.log:
            if g == gvr and rv > start:
                queue.put_nowait((etype, copy.deepcopy(obj)))
        entry = (gvr, queue)
        self._queues.append(entry)
        self.open_watches[gvr] += 1
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield WatchEvent(item[0], item[1])
        finally:
            self.open_watches[gvr] -= 1
            self._queues.remove(entry)

    # ---- test controls -----------------------------------------------------------------------

    def _emit(self, gvr: GVR, etype: str, obj: dict[str, Any]) -> None:
        self.log.append((self.rv, gvr, etype, copy.deepcopy(obj)))
        for g, q in self._queues:
            if g == gvr:
                q.put_nowait((etype, copy.deepcopy(obj)))

    def create(
        self,
        gvr: GVR,
        name: str,
        namespace: str | None = "default",
        *,
        labels: dict[str, str] | None = None,
        owner_uid: str | None = None,
        uid: str | None = None,
        spec: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        self.rv += 1
        meta: dict[str, Any] = {"name": name, "uid": uid or str(uuid.uuid4()), "resourceVersion": str(self.rv)}
        if namespace is not None:
            meta["namespace"] = namespace
        if labels:
            meta["labels"] = dict(labels)
        if owner_uid is not None:
            meta["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": True}
            ]
        info = INFOS[gvr]
        obj = {"kind": info.kind, "apiVersion": gvr.api_version, "metadata": meta, "spec": spec or {}}
        self.objects[gvr][(namespace or "", name)] = obj
        self._emit(gvr, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(self, gvr: GVR, name: str, namespace: str | None = "default", **changes: Any) -> dict[str, Any]:
        obj = self.objects[gvr][(namespace or "", name)]
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        if "labels" in changes:
            meta["labels"] = changes["labels"]
        if "owner_uid" in changes:
            owner = changes["owner_uid"]
            meta["ownerReferences"] = (
                [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": True}]
                if owner
                else []
            )
        if "spec" in changes:
            obj["spec"] = changes["spec"]
        self._emit(gvr, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def delete(self, gvr: GVR, name: str, namespace: str | None = "default") -> None:
        obj = self.objects[gvr].pop((namespace or "", name))
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(gvr, "DELETED", obj)

    def bump(self) -> None:
        """Advance the global RV without touching any watched resource (another resource changed)."""
        self.rv += 1

    def bookmark(self, gvr: GVR) -> None:
        """Send a BOOKMARK at the current RV to every open watch of ``gvr``."""
        obj = {"kind": INFOS[gvr].kind, "apiVersion": gvr.api_version, "metadata": {"resourceVersion": str(self.rv)}}
        for g, q in self._queues:
            if g == gvr:
                q.put_nowait(("BOOKMARK", obj))

    def disconnect(self, gvr: GVR, error: BaseException | None = None) -> None:
        """End every open watch of ``gvr`` (cleanly, or by raising ``error``)."""
        for g, q in self._queues:
            if g == gvr:
                q.put_nowait(error)

    def compact(self) -> None:
        """Forget the event log: watches from any older RV now get 410."""
        self.compacted_rv = self.rv
        self.log.clear()


def uid_in_lower_half(lower: bool, tag: str = "") -> str:
    """A deterministic uid whose 64-bit FNV-1a hash lies in the lower (or upper) half of the space."""
    from hashing import fnv1a_64  # noqa: PLC0415

    i = 0
    while True:
        uid = f"uid-{tag}-{i}"
        if (fnv1a_64(uid) < 1 << 63) == lower:
            return uid
        i += 1
