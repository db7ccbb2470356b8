"""Serving a collection's list and watch from the shared watch cache.

Purpose
    :class:`CollectionServer` answers ``GET`` on a cached collection
    (``/api/v1/pods``, ``/apis/apps/v1/namespaces/x/replicasets``, ...):
    :class:`ListOptions` parses the query (``shardSelector``,
    ``labelSelector``, ``fieldSelector``, namespace, resourceVersion rules,
    ``limit``/``continue``; a built-in kind's field labels are kube's, from
    :mod:`rangeshard.core.fieldlabels`), a list is cut from the cache (paged from one
    snapshot, :mod:`range_filter_proxy.paging`) or, for ``Exact``
    resourceVersion matches, listed upstream and filtered here; a watch is a
    :class:`~range_filter_proxy.watcher.Watcher` on the cache.

Invariants
    * Responses are always JSON; ``as=Table`` requests get a ``meta.k8s.io``
      Table (:mod:`range_filter_proxy.tables`).
    * List responses carry ``metadata.shardInfo.selector`` when a shard
      selector was applied; ``remainingItemCount`` only when nothing filtered.
    * ``limit``, ``continue``, ``timeoutSeconds`` and ``resourceVersionMatch``
      are validated as kube-apiserver does (400 / 422 ``Status``,
      :mod:`rangeshard.core.listoptions`); an expired continue token is 410.
    * Once the shutdown has begun, a new watch is closed at once.

Concurrency model
    Coroutines on the proxy's event loop; the page snapshots are touched only
    from that loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request, Response

from hashing import SelectorSyntaxError, ShardSelector, parse_shard_selector
from hashing.rules import root_via
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.cached import CachedObject, WatchFilter, parse_rv
from range_filter_proxy.freshreads import consistent_snapshot, list_upstream, upstream_current_rv, wait_not_older_than
from range_filter_proxy.paging import ContinueToken, PageSnapshots, PagingSettings, selectors_digest
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.tables import ProxyTables
from range_filter_proxy.watchcache import WatchCache
from range_filter_proxy.watchresponse import WatchResponse
from rangeshard.core import fieldlabels, tables
from rangeshard.core.fieldlabels import Extractor
from rangeshard.core.kubeapi import bad_request
from rangeshard.core.listoptions import ListQuery
from rangeshard.core.selectors import SelectorParseError, parse_field_selector, parse_label_selector
from rangeshard.core.serving import ShutdownSignal


def json_response(code: int, doc: dict[str, Any]) -> Response:
    """``doc`` as a JSON response."""
    return Response(orjson.dumps(doc), status_code=code, media_type="application/json")


@dataclass(slots=True)
class ListOptions:
    """The query parameters of a collection GET: the common ones (``query``) and the proxy's own."""

    query: ListQuery
    resource_version: int | None
    timeout: float | None
    continue_token: ContinueToken | None
    shard_text: str | None
    filter: WatchFilter
    #: Digest of namespace and selectors: a continue token is only valid for the selectors it was issued for.
    selectors: str
    #: No label, field or shard selector: a page may say how many items remain (``remainingItemCount``).
    unfiltered: bool

    @classmethod
    def parse(cls, request: Request, namespace: str | None, info: ResourceInfo | None = None) -> ListOptions:
        """Parse and validate (400 for unparsable values, 422 for forbidden combinations).

        The field selector labels of a built-in kind ``info`` names are kube's
        (:mod:`rangeshard.core.fieldlabels`, the local API server's table):
        others are a 400, and each is read as kube reads it; any dotted path
        is accepted for other resources.
        """
        q = request.query_params
        query = ListQuery.parse(q)
        rv: int | None = None
        if query.resource_version is not None:
            try:
                rv = parse_rv(query.resource_version)
            except ValueError as e:
                raise bad_request(f"invalid resource version: {query.resource_version!r}") from e
        token: ContinueToken | None = None
        if query.continue_token is not None and not query.watch:
            token = ContinueToken.decode(query.continue_token)
        shard_text = q.get("shardSelector") or None
        shard: ShardSelector | None = None
        try:
            if shard_text is not None:
                shard = parse_shard_selector(shard_text)
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"), *_field_labels(info))
        except SelectorSyntaxError as e:
            raise bad_request(f"invalid shard selector: {e}") from e
        except SelectorParseError as e:
            raise bad_request(str(e)) from e
        if namespace is None:
            namespace = fields.value_of("metadata.namespace")
        label_text, field_text = q.get("labelSelector") or None, q.get("fieldSelector") or None
        return cls(
            query,
            rv,
            float(query.timeout_seconds) if query.timeout_seconds else None,
            token,
            shard_text,
            WatchFilter(namespace, labels, fields, shard),
            selectors_digest(namespace, label_text, field_text, shard_text),
            label_text is None and field_text is None and shard_text is None,
        )


def _field_labels(info: ResourceInfo | None) -> tuple[Mapping[str, Extractor] | None, str]:
    """What :func:`parse_field_selector` takes for ``info``: kube's labels of a built-in kind, else any path."""
    if info is None or not fieldlabels.known(info.gvr.group, info.gvr.resource):
        return None, "this resource"
    return fieldlabels.field_labels(info.gvr.group, info.gvr.resource), info.kind


def list_body(
    info: ResourceInfo,
    items: Sequence[CachedObject],
    rv: int,
    opts: ListOptions,
    continue_token: str | None = None,
    remaining: int = 0,
) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if continue_token:
        meta["continue"] = continue_token
        if opts.unfiltered and remaining > 0:
            meta["remainingItemCount"] = remaining
    if opts.shard_text is not None:
        meta["shardInfo"] = {"selector": opts.shard_text}
    head = orjson.dumps({"kind": info.list_kind, "apiVersion": info.gvr.api_version, "metadata": meta})
    # head ends with "}}": re-open it to append the items without re-serialising them.
    return head[:-1] + b',"items":[' + b",".join(o.raw for o in items) + b"]}"


class CollectionServer:
    """List and watch of cached collections (see module docstring)."""

    def __init__(
        self, manager: CacheManager, tables: ProxyTables, paging: PagingSettings, shutdown: ShutdownSignal
    ) -> None:
        self.manager = manager
        self.tables = tables
        self.paging = paging
        self.shutdown = shutdown
        #: Snapshots behind continue tokens, per resource.
        self.pages: dict[str, PageSnapshots] = {}

    async def serve(self, request: Request, info: ResourceInfo, namespace: str | None) -> Response:
        opts = ListOptions.parse(request, namespace, info)
        table = tables.table_version(request.headers.get("accept"))
        include = "Metadata"
        if table is not None:
            try:
                include = tables.include_object(request.query_params.get("includeObject"))
            except ValueError as e:
                raise bad_request(str(e)) from e
        cache = self.manager.cache_for(info)
        shard = opts.filter.shard
        if shard is not None:
            vias = {v for v in (root_via(p) for p in shard.paths) if v is not None}
            if len(vias) > 1:
                raise bad_request("shardSelector: root paths with different via kinds in one selector")
            for via in vias:
                await self.manager.ensure_chain(cache, via)
        if opts.query.watch:
            watch = await self._watch(cache, opts)
            if table is not None:
                columns = await self.tables.columns(info)
                watch.transform = lambda lines: tables.table_watch(lines, columns, include=include, version=table)
            return watch
        listed = await self._list(cache, opts)
        if table is None:
            return listed
        doc = orjson.loads(listed.body)
        built = tables.build_table(
            await self.tables.columns(info), doc["items"], include=include, version=table, list_meta=doc["metadata"]
        )
        return json_response(200, built)

    def _pages(self, cache: WatchCache) -> PageSnapshots:
        return self.pages.setdefault(cache.info.gvr.label, PageSnapshots(self.paging))

    async def _list(self, cache: WatchCache, opts: ListOptions) -> Response:
        info = cache.info
        token = opts.continue_token
        if token is not None:
            if token.selectors != opts.selectors:
                raise bad_request("continue key is not valid: it was issued for a list with other selectors")
            await cache.wait_synced()
            page, cont, remaining = self._pages(cache).next_page(token, opts.query.limit)
            body = list_body(info, page, token.rv, opts, cont, remaining)
        elif opts.query.resource_version_match == "Exact":
            body = await self._list_upstream(cache, opts)
        else:
            if opts.resource_version is None:
                items, rv = await consistent_snapshot(cache, opts.filter)
            else:
                await wait_not_older_than(cache, opts.resource_version)
                items, rv = cache.select(opts.filter), cache.rv
            if opts.query.limit is None:
                body = list_body(info, items, rv, opts)
            else:
                page, cont, remaining = self._pages(cache).first_page(rv, opts.selectors, items, opts.query.limit)
                body = list_body(info, page, rv, opts, cont, remaining)
        cache.stats.bytes_out += len(body)
        return Response(body, media_type="application/json")

    async def _list_upstream(self, cache: WatchCache, opts: ListOptions) -> bytes:
        """Exact-RV lists: list upstream (every page of it, so no upstream continue token escapes), filter here."""
        params: dict[str, str] = {}
        if opts.query.resource_version is not None:
            params["resourceVersion"] = opts.query.resource_version
        if opts.query.resource_version_match is not None:
            params["resourceVersionMatch"] = opts.query.resource_version_match
        chosen, rv = await list_upstream(cache, opts.filter, params)
        return list_body(cache.info, chosen, rv, opts)

    async def _watch(self, cache: WatchCache, opts: ListOptions) -> WatchResponse:
        await cache.wait_synced()
        filt = opts.filter
        timeout = opts.timeout if opts.timeout is not None else float(random.randint(1800, 3600))
        rv = opts.resource_version
        initial: list[CachedObject] | None = None
        initial_rv: int | None = None
        resume_from: int | None = None
        if opts.query.send_initial_events:
            if rv is None:
                initial, initial_rv = await consistent_snapshot(cache, filt)
            elif rv != 0:
                await wait_not_older_than(cache, rv)
        elif opts.query.send_initial_events is False:
            current = max(await upstream_current_rv(cache), cache.rv) if rv is None else cache.rv
            resume_from = rv if rv else current  # 0 and unset: from now
        elif rv is None:
            initial, initial_rv = await consistent_snapshot(cache, filt)
        elif rv != 0:
            resume_from = rv
        w = cache.add_watcher(
            filt,
            resume_from=resume_from,
            initial=initial,
            initial_rv=initial_rv,
            bookmarks=opts.query.allow_watch_bookmarks,
            initial_events_end=bool(opts.query.send_initial_events),
            timeout=timeout,
        )
        if self.shutdown.is_set:
            w.close("proxy shutting down")
        return WatchResponse(w)
