"""The HTTP face of the range filter proxy (FastAPI): routing and the app factory.

Purpose
    Speaks the Kubernetes REST API. :class:`Proxy` routes each request:
    ``GET`` on a collection of a resource that supports list+watch
    (``/api/v1/pods``, ``/apis/apps/v1/namespaces/x/replicasets``, ...; paths
    read by :func:`rangeshard.core.rest.parse_rest_path`) is answered from the
    shared watch cache (:mod:`range_filter_proxy.listing`); every other
    request is passed through to the upstream
    (:mod:`range_filter_proxy.passthrough`, with write fencing).
    ``/healthz``, ``/readyz`` and ``/metrics`` belong to the proxy itself.
    :func:`create_app` assembles the parts from one settings root,
    :class:`ProxySettings`.

Invariants
    * Bad input is answered with a Kubernetes ``Status`` (400/410/422/504...),
      never a 500: every parser's error is caught and translated here.
    * Who may read is decided by :class:`range_filter_proxy.auth.ProxyAuth`
      (``--auth-mode``) before a list/watch is served from the cache, and
      before pass-through in ``static`` mode; request bodies are bounded by
      :class:`rangeshard.core.kubeapi.BodyLimit` (413 beyond).
    * What the upstream can do is asked of its interface
      (:class:`range_filter_proxy.upstream.Upstream`), never probed.

Concurrency model
    One event loop (uvicorn). Handlers await the cache and the upstream; the
    synchronous parts of the cache (dispatch, watcher registration) never
    await. Background tasks (one per cache, one resolving configured
    resources, the heap keeper, the fence's registry watch, the progress
    tracker (:mod:`range_filter_proxy.progress`, with ``--etcd``), the loop-lag
    probe behind ``range_filter_proxy_event_loop_lag_seconds``) are started and
    stopped by the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from hashing.resources import parse_resource_name
from range_filter_proxy.auth import AuthMode, AuthSettings, ProxyAuth
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.cached import CacheSettings
from range_filter_proxy.errors import UpstreamError, UpstreamUnavailable
from range_filter_proxy.fencing import FenceSettings, WriteFence
from range_filter_proxy.heap import HeapKeeper, HeapSettings
from range_filter_proxy.listing import CollectionServer, json_response
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.paging import PagingSettings
from range_filter_proxy.passthrough import PassThrough, send_json
from range_filter_proxy.progress import ProgressCollector, ProgressSettings, ProgressTracker
from range_filter_proxy.tables import ProxyTables
from range_filter_proxy.upstream import HttpUpstream, Upstream, UpstreamConfig
from range_filter_proxy.watchresponse import ProxyApp
from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    BodyLimit,
    ClientGone,
    Receive,
    RequestTooLarge,
    Scope,
    Send,
    send_status,
    status_object,
)
from rangeshard.core.kubeapi import Attributes as AuthAttributes
from rangeshard.core.loops import probe_loop_lag, start_task
from rangeshard.core.requestinfo import RequestInfo, classify
from rangeshard.core.serving import ShutdownSignal

log = logging.getLogger(__name__)

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """The one settings root of a proxy: every part's settings, as ``rangeshard proxy`` sets them."""

    #: Cached from start-up (``pods``, ``replicasets.apps``, ``deployments.v1.apps``); ``/readyz`` waits for them.
    resources: tuple[str, ...] = ()
    #: The watch caches (bookmarks, history, consistent reads, queues).
    settings: CacheSettings = field(default_factory=CacheSettings)
    #: Who may read (``--auth-mode``).
    auth: AuthSettings = field(default_factory=AuthSettings)
    #: Largest accepted request body (413 beyond).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: The process-wide heap keeper (only for a process that runs nothing but this app); ``None``: off.
    heap: HeapSettings | None = None
    #: Write fencing against the registry in etcd; ``None``: off.
    fencing: FenceSettings | None = None
    #: ``limit``/``continue`` snapshots.
    paging: PagingSettings = field(default_factory=PagingSettings)
    #: Measure each controller instance's progress on its main resource (needs ``fencing``: the registry view).
    progress: bool = True


class Proxy:
    """One proxy's parts (caches, list serving, pass-through, auth, metrics) and its request routing."""

    def __init__(self, upstream: Upstream, config: ProxySettings, metrics: ProxyMetrics) -> None:
        if config.max_body_bytes < 1:
            raise ConfigError("--max-request-body-bytes must be positive")
        try:
            self.resource_specs = [parse_resource_name(r) for r in config.resources if r.strip()]
        except ValueError as e:
            raise ConfigError(f"invalid resource list: {e}") from e
        self.upstream = upstream
        self.metrics = metrics
        self.auth = ProxyAuth(config.auth, upstream if upstream.reviews else None)
        self.fence = WriteFence(config.fencing, on_read=metrics.fencing_reads.inc) if config.fencing else None
        self.heap_keeper = HeapKeeper(config.heap) if config.heap is not None else None
        self.manager = CacheManager(upstream, metrics, config.settings)
        self.progress: ProgressTracker | None = None
        if config.fencing is not None and config.progress:
            self.progress = ProgressTracker(ProgressSettings(config.fencing.etcd, config.fencing.prefix), self.manager)
            metrics.registry.register(ProgressCollector(self.progress))
        #: Set when SIGINT/SIGTERM begins the shutdown: every downstream stream ends at once.
        self.shutdown = ShutdownSignal()
        self.shutdown.on_set(self._end_streams)
        self.collections = CollectionServer(self.manager, ProxyTables(upstream), config.paging, self.shutdown)
        self.passthrough = PassThrough(
            upstream, self.manager, metrics, self.auth.mode, self.fence, self.shutdown, config.max_body_bytes
        )

        def busy() -> float:
            state = upstream.pool_state()
            return state[0] - state[1] if state else 0

        def waiting() -> float:
            state = upstream.pool_state()
            return state[2] if state else 0

        metrics.upstream_connections_busy.set_function(busy)
        metrics.upstream_requests_waiting.set_function(waiting)

    def _end_streams(self) -> None:
        for cache in list(self.manager.caches.values()):
            for w in list(cache.watchers.values()):
                w.close("proxy shutting down")

    async def _watch_pool(self, every: float = 2.0, warn_every: float = 30.0) -> None:
        """Say so (WARNING, at most every ``warn_every`` s) while requests wait for an upstream connection."""
        warned = -warn_every
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            state = self.upstream.pool_state()
            if state is None or state[2] == 0 or loop.time() - warned < warn_every:
                continue
            warned = loop.time()
            now = time.monotonic()
            oldest = sorted(self.passthrough.open_responses.values(), key=lambda r: r[2])[:5]
            sent = self.upstream.unanswered()
            detail = self.upstream.pool_detail()
            log.warning(
                "upstream connection pool full: %d connections (%d idle; %s), %d requests waiting; "
                "%d sent without an answer yet, the oldest: %s; %d relayed answers open, the oldest: %s",
                state[0],
                state[1],
                detail,
                state[2],
                len(sent),
                ", ".join(f"{w} ({now - at:.0f}s)" for w, at in sent[:5]) or "none",
                len(self.passthrough.open_responses),
                ", ".join(f"{m} {t} ({now - at:.0f}s)" for m, t, at in oldest) or "none",
            )

    @contextlib.asynccontextmanager
    async def running(self, owns_upstream: bool) -> AsyncIterator[None]:
        """Start the background parts; stop them (and close an upstream we made) on exit."""
        self.manager.start_configured(self.resource_specs)
        if self.heap_keeper is not None:
            self.heap_keeper.start()
        if self.fence is not None:
            await self.fence.start()
        if self.progress is not None:
            await self.progress.start()
        lag_probe = start_task(probe_loop_lag(self.metrics.loop_lag.observe, "proxy"), "loop-lag-probe")
        pool_watch = start_task(self._watch_pool(), "upstream-pool-watch")
        try:
            yield
        finally:
            lag_probe.cancel()
            pool_watch.cancel()
            if self.progress is not None:
                await self.progress.stop()
            if self.fence is not None:
                await self.fence.stop()
            if self.heap_keeper is not None:
                await self.heap_keeper.stop()
            await self.manager.stop()
            if owns_upstream:
                await self.upstream.aclose()

    def readiness(self, *, verbose: bool) -> tuple[bool, str]:
        """``/readyz``: ready?, and its text (kube-apiserver's ``[+]``/``[-]`` lines when ``verbose``)."""
        _, caches_missing = self.manager.ready()
        fencing_missing = self.fence is not None and not self.fence.tracker.observed.is_set()
        missing = caches_missing + (["write fencing: registry not listed yet"] if fencing_missing else [])
        ok = not missing
        if not verbose:
            return ok, "ok" if ok else "not ready: " + "; ".join(missing)
        lines = [
            f"[{'-' if caches_missing else '+'}]watch-caches "
            + ("failed: " + "; ".join(caches_missing) if caches_missing else "ok"),
        ]
        if self.fence is not None:
            lines.append(
                "[-]write-fencing failed: registry not listed yet" if fencing_missing else "[+]write-fencing ok"
            )
        lines.append(f"[+]upstream-shard-selector ok: {self.manager.upstream_shard_selector_detail}")
        lines.append("readyz check passed" if ok else "readyz check failed")
        return ok, "\n".join(lines) + "\n"

    async def dispatch(self, request: Request) -> Response:
        """Serve a cacheable collection GET from the cache; pass everything else through."""
        what = classify(request.method, request.url.path, request.query_params)
        cp = what.path
        if request.method == "GET" and cp is not None and cp.collection and not cp.watch_prefix:
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
                if what.invalid is not None:
                    raise what.invalid
                attrs = AuthAttributes(
                    verb=what.verb,
                    resource=info.gvr.resource,
                    group=info.gvr.group,
                    version=info.gvr.version,
                    namespace=cp.namespace or "",
                )
                await self.auth.check(request.headers.get("authorization"), attrs)
                return await self.collections.serve(request, info, cp.namespace)
        await self._authorize_passthrough(what, request.url.path, request.headers.get("authorization"))
        return self.passthrough.forward(request)

    async def _authorize_passthrough(self, what: RequestInfo, path: str, authorization: str | None) -> None:
        """In ``static`` mode, whether the client may make a request that is passed through (else 401/403)."""
        if self.auth.mode is not AuthMode.STATIC:
            return
        target = what.path
        attrs = (
            AuthAttributes(verb=what.verb, path=path)
            if target is None
            else AuthAttributes(  # a resource request: named as kube-apiserver names it (its 403 too)
                verb=what.verb,
                resource=target.gvr.resource,
                group=target.gvr.group,
                version=target.gvr.version,
                namespace=target.namespace or "",
                name=target.name or "",
                subresource=target.subresource,
            )
        )
        await self.auth.check(authorization, attrs)

    async def relay(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Pass a request through at the ASGI level, before any routing; ``False``: the app routes it.

        Everything but a collection ``GET`` (which the cache may serve) and the
        proxy's own paths: one ``classify``, the ``static`` mode's check, the
        pass-through (:meth:`PassThrough.serve`), and every error as the app's
        exception handlers answer it.
        """
        path: str = scope["path"]
        if path in _OWN_PATHS:
            return False
        method: str = scope["method"]
        query: bytes = scope["query_string"]
        what = classify(method, path, dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)) if query else {})
        cp = what.path
        if method == "GET" and cp is not None and cp.collection and not cp.watch_prefix:
            return False
        try:
            if self.auth.mode is AuthMode.STATIC:
                authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
                await self._authorize_passthrough(what, path, authorization)
            await self.passthrough.serve(scope, receive, send)
        except RequestTooLarge as e:
            await send_status(send, e, [(b"connection", b"close")])
        except ClientGone:
            self.metrics.client_disconnects.inc()
            log.debug("client disconnected during %s %s", method, path)
        except (ApiError, UpstreamError) as e:
            code, doc = error_status(e)
            await send_json(send, code, orjson.dumps(doc))
        return True


#: Paths the proxy answers itself (never passed through).
_OWN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def error_status(exc: ApiError | UpstreamError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and ``Status`` body an error of a request is answered with."""
    if isinstance(exc, ApiError):
        return exc.code, exc.status()
    if exc.status is not None and 400 <= exc.code < 600:
        return exc.code, exc.status
    code = 503 if exc.code >= 500 else exc.code
    return code, status_object(code, "ServiceUnavailable" if code == 503 else "BadRequest", f"upstream: {exc}")


def create_app(
    upstream: Upstream | UpstreamConfig | str,
    config: ProxySettings | None = None,
    *,
    metrics: ProxyMetrics | None = None,
    **fields: Any,
) -> FastAPI:
    """Build the proxy app.

    ``upstream`` is a URL, an :class:`UpstreamConfig` (from kubeconfig /
    in-cluster loading) or any :class:`Upstream` implementation (tests use an
    in-memory one; pass-through then answers 404). ``config`` is the settings
    root; keyword ``fields`` override single fields of it
    (``create_app(url, resources=["pods"], settings=CacheSettings(...))``).
    """
    owns = not isinstance(upstream, Upstream)
    if isinstance(upstream, str):
        upstream = UpstreamConfig(upstream.rstrip("/"))
    if isinstance(upstream, UpstreamConfig):
        upstream = HttpUpstream(upstream)
    config = replace(config or ProxySettings(), **fields)
    state = Proxy(upstream, config, metrics or ProxyMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with state.running(owns):
            yield

    app = ProxyApp(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.proxy = state
    app.relay = state.relay
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return json_response(exc.code, exc.status())

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _exc: ClientDisconnect) -> Response:
        # Expected (a SIGKILLed manager mid-write): a counter and a DEBUG line, no traceback.
        state.metrics.client_disconnects.inc()
        log.debug("client disconnected during %s %s", request.method, request.url.path)
        return json_response(400, status_object(400, "BadRequest", "client disconnected before the body was read"))

    @app.exception_handler(UpstreamError)
    async def _upstream_error(_request: Request, exc: UpstreamError) -> Response:
        return json_response(*error_status(exc))

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        ok, text = state.readiness(verbose="verbose" in request.query_params)
        return PlainTextResponse(text, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request) -> Response:
        await state.auth.check(request.headers.get("authorization"), AuthAttributes(verb="get", path="/metrics"))
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{path:path}", methods=_ALL_METHODS)
    async def everything(request: Request) -> Response:
        return await state.dispatch(request)

    return app
