"""The HTTP face of the range filter proxy (FastAPI).

Purpose
    Speaks the Kubernetes REST API. ``GET`` on a collection of a resource that
    supports list+watch (``/api/v1/pods``, ``/apis/apps/v1/namespaces/x/replicasets``,
    ...) is answered from the shared watch cache with ``shardSelector``,
    ``labelSelector``, ``fieldSelector`` and namespace filtering and kube-apiserver's
    resourceVersion rules; every other request is passed through to the
    upstream unchanged (status, headers, streaming body, the client's
    ``Authorization``). ``/healthz``, ``/readyz`` and ``/metrics`` belong to the
    proxy itself.

Invariants
    * Bad input is answered with a Kubernetes ``Status`` (400/410/422/504...),
      never a 500: every parser's error is caught and translated here.
    * Responses served from the cache are always JSON, whatever the client
      asked for (protobuf requests are answered as JSON; ``as=Table`` requests
      get a ``meta.k8s.io`` Table, :mod:`range_filter_proxy.tables`);
      pass-through requests have protobuf removed from their ``Accept`` header
      for the same reason.
    * List responses carry ``metadata.shardInfo.selector`` when a shard
      selector was applied.
    * With write fencing on (``fence``, ``--etcd``), a write carrying an owner
      token is forwarded only if :class:`range_filter_proxy.fencing.WriteFence`
      lets it pass; else ``409`` (``fenced_status``), counted in
      ``range_filter_proxy_fenced_writes_total{reason}``. Writes without a
      token pass unchanged.
    * ``limit``/``continue`` pages are cut from one snapshot per list
      (:mod:`range_filter_proxy.paging`): consistent at the first page's
      resourceVersion; an expired token is 410 ``Expired``. ``limit``,
      ``continue``, ``timeoutSeconds`` and ``resourceVersionMatch`` are
      validated as kube-apiserver does (400 / 422 ``Status``).
    * Who may read is decided by :class:`range_filter_proxy.auth.ProxyAuth`
      (``--auth-mode``) before a list/watch is served from the cache, and
      before pass-through in ``static`` mode; request bodies are bounded by
      :class:`rangeshard.core.kubeapi.BodyLimit` (413 beyond).

Concurrency model
    One event loop (uvicorn). Handlers await the cache and the upstream; the
    synchronous parts of the cache (dispatch, watcher registration) never
    await. Background tasks (one per cache, one resolving configured
    resources) are owned by the :class:`CacheManager` and stopped in the
    lifespan's shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from hashing import SelectorSyntaxError, ShardSelector, parse_shard_selector
from range_filter_proxy.auth import AuthMode, AuthSettings, ProxyAuth
from range_filter_proxy.cache import CacheManager, WatchCache
from range_filter_proxy.cached import CachedObject, CacheSettings, WatchFilter, parse_rv
from range_filter_proxy.errors import UpstreamError, UpstreamUnavailable
from range_filter_proxy.fencing import FenceSettings, WriteFence, shard_hash_of
from range_filter_proxy.heap import HeapKeeper, HeapSettings
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.paging import ContinueToken, PageSnapshots, PagingSettings, selectors_digest
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.tables import ProxyTables
from range_filter_proxy.upstream import HttpUpstream, Upstream, UpstreamConfig
from range_filter_proxy.watchresponse import ProxyApp, WatchResponse
from rangeshard.core import tables
from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    BodyLimit,
    RequestTooLarge,
    bad_request,
    status_object,
)
from rangeshard.core.kubeapi import Attributes as AuthAttributes
from rangeshard.core.listoptions import ListQuery, parse_bool
from rangeshard.core.ownertoken import (
    FENCED_HEADER,
    SHARD_HASH_HEADER,
    OwnerToken,
    fenced_status,
    parse_shard_hash,
)
from rangeshard.core.rest import parse_resource_name, parse_rest_path
from rangeshard.core.selectors import SelectorParseError, parse_field_selector, parse_label_selector
from rangeshard.core.serving import ShutdownSignal, until_shutdown

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_PASSTHROUGH_VERBS = {
    "GET": "get",
    "HEAD": "head",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _json_response(code: int, doc: dict[str, Any]) -> Response:
    return Response(orjson.dumps(doc), status_code=code, media_type="application/json")


@dataclass(slots=True)
class ListOptions:
    """The query parameters of a collection GET, parsed and validated."""

    watch: bool
    resource_version: int | None
    resource_version_raw: str | None
    match: str | None
    send_initial_events: bool | None
    bookmarks: bool
    timeout: float | None
    limit: int | None
    continue_token: ContinueToken | None
    shard_text: str | None
    filter: WatchFilter
    #: Digest of namespace and selectors: a continue token is only valid for the selectors it was issued for.
    selectors: str
    #: No label, field or shard selector: a page may say how many items remain (``remainingItemCount``).
    unfiltered: bool

    @classmethod
    def parse(cls, request: Request, namespace: str | None) -> ListOptions:
        """Parse and validate (400 for unparsable values, 422 for forbidden combinations)."""
        q = request.query_params
        common = ListQuery.parse(q)
        watch = common.watch
        rv_raw = common.resource_version
        rv: int | None = None
        if rv_raw is not None:
            try:
                rv = parse_rv(rv_raw)
            except ValueError as e:
                raise bad_request(f"invalid resource version: {rv_raw!r}") from e
        match = common.resource_version_match
        send_initial = common.send_initial_events
        bookmarks = common.allow_watch_bookmarks
        timeout = float(common.timeout_seconds) if common.timeout_seconds else None
        limit = common.limit
        token: ContinueToken | None = None
        if common.continue_token is not None and not watch:
            token = ContinueToken.decode(common.continue_token)
        shard_text = q.get("shardSelector") or None
        shard: ShardSelector | None = None
        try:
            if shard_text is not None:
                shard = parse_shard_selector(shard_text)
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"))
        except SelectorSyntaxError as e:
            raise bad_request(f"invalid shardSelector: {e}") from e
        except SelectorParseError as e:
            raise bad_request(str(e)) from e
        if namespace is None:
            namespace = fields.value_of("metadata.namespace")
        label_text, field_text = q.get("labelSelector") or None, q.get("fieldSelector") or None
        return cls(
            watch,
            rv,
            rv_raw,
            match,
            send_initial,
            bookmarks,
            timeout,
            limit,
            token,
            shard_text,
            WatchFilter(namespace, labels, fields, shard),
            selectors_digest(namespace, label_text, field_text, shard_text),
            label_text is None and field_text is None and shard_text is None,
        )


def _list_body(
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


class ProxyState:
    """Everything one app owns: upstream, caches, metrics."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        owns_upstream: bool,
        settings: CacheSettings,
        resources: Sequence[str],
        metrics: ProxyMetrics,
        auth: ProxyAuth,
        fence: WriteFence | None = None,
        paging: PagingSettings | None = None,
    ) -> None:
        self.upstream = upstream
        self.fence = fence
        self.auth = auth
        self.owns_upstream = owns_upstream
        self.metrics = metrics
        self.manager = CacheManager(upstream, metrics, settings)
        self.paging = paging or PagingSettings()
        #: Snapshots behind continue tokens, per resource.
        self.pages: dict[str, PageSnapshots] = {}
        self.resource_specs = [parse_resource_name(r) for r in resources if r.strip()]
        self.tables = ProxyTables(upstream)
        #: Set when SIGINT/SIGTERM begins the shutdown: every downstream stream ends at once.
        self.shutdown = ShutdownSignal()
        self.shutdown.on_set(self._end_streams)

    def _end_streams(self) -> None:
        for cache in list(self.manager.caches.values()):
            for w in list(cache.watchers.values()):
                w.close("proxy shutting down")

    # ---- cache-served collection requests ------------------------------------------------

    async def serve_collection(self, request: Request, info: ResourceInfo, namespace: str | None) -> Response:
        opts = ListOptions.parse(request, namespace)
        table = tables.table_version(request.headers.get("accept"))
        include = "Metadata"
        if table is not None:
            try:
                include = tables.include_object(request.query_params.get("includeObject"))
            except ValueError as e:
                raise bad_request(str(e)) from e
        cache = self.manager.cache_for(info)
        if opts.watch:
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
        return _json_response(200, built)

    def _pages(self, cache: WatchCache) -> PageSnapshots:
        label = cache.info.gvr.label
        pages = self.pages.get(label)
        if pages is None:
            pages = self.pages[label] = PageSnapshots(self.paging)
        return pages

    async def _list(self, cache: WatchCache, opts: ListOptions) -> Response:
        info = cache.info
        token = opts.continue_token
        if token is not None:
            if token.selectors != opts.selectors:
                raise bad_request("continue key is not valid: it was issued for a list with other selectors")
            await cache.wait_synced()
            page, cont, remaining = self._pages(cache).next_page(token, opts.limit)
            body = _list_body(info, page, token.rv, opts, cont, remaining)
        elif opts.match == "Exact":
            body = await self._list_upstream(cache, opts)
        else:
            if opts.resource_version is None:
                items, rv = await cache.consistent_snapshot(opts.filter)
            else:
                await cache.wait_not_older_than(opts.resource_version)
                items, rv = cache.select(opts.filter), cache.rv
            if opts.limit is None:
                body = _list_body(info, items, rv, opts)
            else:
                page, cont, remaining = self._pages(cache).first_page(rv, opts.selectors, items, opts.limit)
                body = _list_body(info, page, rv, opts, cont, remaining)
        cache.stats.bytes_out += len(body)
        return Response(body, media_type="application/json")

    async def _list_upstream(self, cache: WatchCache, opts: ListOptions) -> bytes:
        """Exact-RV lists: list upstream (whole, so no upstream continue token escapes), filter here."""
        params: dict[str, str] = {}
        if opts.resource_version_raw is not None:
            params["resourceVersion"] = opts.resource_version_raw
        if opts.match is not None:
            params["resourceVersionMatch"] = opts.match
        listed = await cache.upstream.list(cache.info.gvr, params)
        items = [CachedObject.build(i, cache.info) for i in listed.items]
        try:
            rv = parse_rv(listed.resource_version)
        except ValueError as e:
            raise UpstreamError(f"{cache.info.gvr}: upstream list resourceVersion is not an integer") from e
        chosen = [o for o in items if opts.filter.matches(o)]
        return _list_body(cache.info, chosen, rv, opts)

    async def _watch(self, cache: WatchCache, opts: ListOptions) -> WatchResponse:
        await cache.wait_synced()
        filt = opts.filter
        timeout = opts.timeout if opts.timeout is not None else float(random.randint(1800, 3600))
        rv = opts.resource_version
        initial: list[CachedObject] | None = None
        initial_rv: int | None = None
        resume_from: int | None = None
        if opts.send_initial_events:
            if rv is None:
                initial, initial_rv = await cache.consistent_snapshot(filt)
            elif rv != 0:
                await cache.wait_not_older_than(rv)
        elif opts.send_initial_events is False:
            if rv is None:
                resume_from = max(await cache.upstream_current_rv(), cache.rv)
            else:
                resume_from = cache.rv if rv == 0 else rv
        elif rv is None:
            initial, initial_rv = await cache.consistent_snapshot(filt)
        elif rv != 0:
            resume_from = rv
        w = cache.add_watcher(
            filt,
            resume_from=resume_from,
            initial=initial,
            initial_rv=initial_rv,
            bookmarks=opts.bookmarks,
            initial_events_end=bool(opts.send_initial_events),
            timeout=timeout,
        )
        if self.shutdown.is_set:
            w.close("proxy shutting down")
        return WatchResponse(w)

    # ---- write fencing ---------------------------------------------------------------------

    async def fence_write(self, request: Request, fence: WriteFence) -> Response | None:
        """The 409 of a fenced write with an owner token, or ``None`` to pass it through."""
        token = OwnerToken.parse(request.headers.get("user-agent"))
        if token is None:
            return None
        self.metrics.fencing_checks.inc()
        body: Any = None
        if request.method in ("POST", "PUT", "PATCH"):
            # A merge/strategic patch may set ownerReferences (adoption); a JSON patch is a list (ignored).
            raw = await request.body()  # kept by Starlette: request.stream() replays it upstream
            with contextlib.suppress(orjson.JSONDecodeError):
                body = orjson.loads(raw) if raw else None
        cached: Any = None
        target = parse_rest_path(request.url.path)
        if target is not None and target.name is not None:
            cache = self.manager.caches.get(target.gvr)
            if cache is not None:
                hit = cache.objects.get((target.namespace or "", target.name))
                cached = hit.obj if hit is not None else None
        declared = parse_shard_hash(request.headers.get(SHARD_HASH_HEADER))
        shard_hash, verdict = shard_hash_of(declared, body, cached)
        if verdict is None:
            verdict = await fence.check(token, shard_hash)
        if verdict is None:
            return None
        self.metrics.fenced_writes.labels(verdict.reason).inc()
        log.info("fenced %s %s of %s: %s", request.method, request.url.path, token, verdict.why)
        response = _json_response(409, fenced_status(token, verdict.reason, verdict.why))
        response.headers[FENCED_HEADER] = verdict.reason
        return response

    # ---- pass-through ------------------------------------------------------------------------

    async def passthrough(self, request: Request) -> Response:
        forward = getattr(self.upstream, "forward", None)
        if forward is None:
            raise ApiError(404, "NotFound", f"the proxy cannot pass {request.method} {request.url.path} through")
        if self.fence is not None and request.method in _WRITE_METHODS:
            fenced = await self.fence_write(request, self.fence)
            if fenced is not None:
                return fenced
        self.metrics.passthrough_requests.labels(request.method).inc()
        headers: list[tuple[str, str]] = []
        for key, value in request.headers.items():
            k = key.lower()
            if k in _HOP_BY_HOP:
                continue
            if k == "authorization" and self.auth.mode is AuthMode.STATIC:
                continue  # the client's static token means nothing upstream; the proxy's own credentials are used
            if k == "accept" and "protobuf" in value:
                kept = [p for p in value.split(",") if "protobuf" not in p]
                headers.append((key, ",".join(kept).strip() or "application/json"))
            else:
                headers.append((key, value))
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        target = raw_path.decode("latin-1")
        query = request.scope.get("query_string") or b""
        if query:
            target += "?" + query.decode("latin-1")
        has_body = request.method not in ("GET", "HEAD", "OPTIONS") or "content-length" in request.headers
        body: AsyncIterator[bytes] | None = request.stream() if has_body else None
        try:
            resp = await forward(
                request.method, target, headers, body, own_credentials=self.auth.mode is not AuthMode.DELEGATE
            )
        except UpstreamError as e:
            too_large = e.__cause__
            while too_large is not None and not isinstance(too_large, RequestTooLarge):
                too_large = too_large.__cause__ or too_large.__context__
            if isinstance(too_large, RequestTooLarge):
                raise too_large from e
            raise
        out_headers = {k: v for k, v in resp.headers.multi_items() if k.lower() not in _HOP_BY_HOP}

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()

        return StreamingResponse(
            until_shutdown(relay(), self.shutdown),
            status_code=resp.status_code,
            headers=out_headers,
            background=BackgroundTask(resp.aclose),
        )

    async def dispatch(self, request: Request) -> Response:
        if request.method == "GET":
            cp = parse_rest_path(request.url.path)
            if cp is not None and cp.collection and not cp.watch_prefix:
                # A shard-filtered request is served from a cache or by an upstream that knows the
                # resource (which answers 404 otherwise), never passed through on a stale or failed discovery:
                # an upstream without shardSelector support would answer it unfiltered.
                sharded = "shardSelector" in request.query_params
                try:
                    info = await self.manager.resource_info(
                        cp.gvr.group, cp.gvr.version, cp.gvr.resource, fresh_miss=sharded
                    )
                except UpstreamError as e:
                    if sharded:
                        raise UpstreamUnavailable(
                            f"discovery of {cp.gvr.group or 'core'}/{cp.gvr.version} failed ({e}); a request with a "
                            "shardSelector is not passed through unfiltered"
                        ) from e
                    log.warning("discovery of %s failed: %s; passing through", cp.gvr.api_version, e)
                    info = None
                if info is not None and info.cacheable and (cp.namespace is None or info.namespaced):
                    watch = bool(parse_bool(request.query_params, "watch"))
                    attrs = AuthAttributes(
                        verb="watch" if watch else "list",
                        resource=info.gvr.resource,
                        group=info.gvr.group,
                        version=info.gvr.version,
                        namespace=cp.namespace or "",
                    )
                    await self.auth.check(request.headers.get("authorization"), attrs)
                    return await self.serve_collection(request, info, cp.namespace)
        if self.auth.mode is AuthMode.STATIC:
            method = request.method.upper()
            verb = _PASSTHROUGH_VERBS.get(method, method.lower())
            await self.auth.check(
                request.headers.get("authorization"), AuthAttributes(verb=verb, path=request.url.path)
            )
        return await self.passthrough(request)


def create_app(
    upstream: Upstream | UpstreamConfig | str,
    *,
    resources: Sequence[str] = (),
    settings: CacheSettings | None = None,
    metrics: ProxyMetrics | None = None,
    auth: AuthSettings | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    heap: HeapSettings | None = None,
    fencing: FenceSettings | None = None,
    paging: PagingSettings | None = None,
) -> FastAPI:
    """Build the proxy app.

    ``upstream`` is a URL, an :class:`UpstreamConfig` (from kubeconfig /
    in-cluster loading) or any :class:`Upstream` implementation (tests use an
    in-memory one; pass-through then answers 404). ``resources`` are cached
    from start-up (``pods``, ``replicasets.apps``, ``deployments.v1.apps``);
    ``/readyz`` is 200 once they have synced. ``auth`` chooses who may read
    (:mod:`range_filter_proxy.auth`; default: mode ``none``);
    ``max_body_bytes`` bounds request bodies (413 beyond). ``heap`` turns on
    the process-wide :class:`~range_filter_proxy.heap.HeapKeeper` (only for
    a process that runs nothing but this app, as ``rangeshard proxy`` does).
    ``fencing`` turns on write fencing against the registry in etcd
    (:mod:`range_filter_proxy.fencing`).
    """
    owns = False
    if isinstance(upstream, str):
        upstream = UpstreamConfig(upstream.rstrip("/"))
    if isinstance(upstream, UpstreamConfig):
        upstream = HttpUpstream(upstream)
        owns = True
    auth_settings = auth or AuthSettings()
    reviewer = upstream if isinstance(upstream, HttpUpstream) else None
    proxy_auth = ProxyAuth(auth_settings, reviewer)
    if max_body_bytes < 1:
        raise ConfigError("--max-request-body-bytes must be positive")
    metrics = metrics or ProxyMetrics()
    fence = WriteFence(fencing, on_read=metrics.fencing_reads.inc) if fencing is not None else None
    try:
        state = ProxyState(
            upstream,
            owns_upstream=owns,
            settings=settings or CacheSettings(),
            resources=resources,
            metrics=metrics,
            auth=proxy_auth,
            fence=fence,
            paging=paging,
        )
    except ValueError as e:
        raise ConfigError(f"invalid resource list: {e}") from e

    keeper = HeapKeeper(heap) if heap is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.manager.start_configured(state.resource_specs)
        if keeper is not None:
            keeper.start()
        if fence is not None:
            await fence.start()
        try:
            yield
        finally:
            if fence is not None:
                await fence.stop()
            if keeper is not None:
                await keeper.stop()
            await state.manager.stop()
            if state.owns_upstream and isinstance(state.upstream, HttpUpstream):
                await state.upstream.aclose()

    app = ProxyApp(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.proxy = state
    app.state.heap_keeper = keeper
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return _json_response(exc.code, exc.status())

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _exc: ClientDisconnect) -> Response:
        # Expected (a SIGKILLed manager mid-write): a counter and a DEBUG line, no traceback.
        state.metrics.client_disconnects.inc()
        log.debug("client disconnected during %s %s", request.method, request.url.path)
        return _json_response(400, status_object(400, "BadRequest", "client disconnected before the body was read"))

    @app.exception_handler(UpstreamError)
    async def _upstream_error(_request: Request, exc: UpstreamError) -> Response:
        if exc.status is not None and 400 <= exc.code < 600:
            return _json_response(exc.code, exc.status)
        code = 503 if exc.code >= 500 else exc.code
        return _json_response(
            code, status_object(code, "ServiceUnavailable" if code == 503 else "BadRequest", f"upstream: {exc}")
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        ok, missing = state.manager.ready()
        fencing_missing = fence is not None and not fence.tracker.observed.is_set()
        if fencing_missing:
            ok, missing = False, [*missing, "write fencing: registry not listed yet"]
        if "verbose" in request.query_params:
            # kube-apiserver's verbose format: one [+]/[-] line per check, then the verdict.
            caches_missing = [m for m in missing if not m.startswith("write fencing")]
            lines = [
                f"[{'-' if caches_missing else '+'}]watch-caches "
                + ("failed: " + "; ".join(caches_missing) if caches_missing else "ok"),
            ]
            if fence is not None:
                lines.append(
                    "[-]write-fencing failed: registry not listed yet" if fencing_missing else "[+]write-fencing ok"
                )
            lines.append(f"[+]upstream-shard-selector ok: {state.manager.upstream_shard_selector_detail}")
            lines.append("readyz check passed" if ok else "readyz check failed")
            return PlainTextResponse("\n".join(lines) + "\n", status_code=200 if ok else 503)
        if ok:
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready: " + "; ".join(missing), status_code=503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request) -> Response:
        await state.auth.check(request.headers.get("authorization"), AuthAttributes(verb="get", path="/metrics"))
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{path:path}", methods=_ALL_METHODS)
    async def everything(request: Request) -> Response:
        return await state.dispatch(request)

    return app
