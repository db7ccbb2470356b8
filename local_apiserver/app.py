"""The HTTP layer: FastAPI routes speaking the Kubernetes REST API.

Purpose
    ``create_app(...)`` builds the ASGI application: discovery (``/version``,
    ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]``), health
    (``/healthz``, ``/livez``, ``/readyz``), Prometheus ``/metrics``, OpenAPI
    (``/openapi/v2``, ``/openapi/v3[/<group-path>]``, :mod:`local_apiserver.openapi`) and one
    table-driven route for every resource path
    (``/api/v1/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`` and
    ``/apis/<group>/<version>/...``, plus the legacy ``/watch/`` prefix).
    Paths and parameters are parsed in :mod:`local_apiserver.routing`, each
    verb is handled in :mod:`local_apiserver.handlers`, and what routes share
    lives in :mod:`local_apiserver.state`.

Invariants
    * Every answer that is not a success is a Kubernetes ``Status`` with the
      right code (400/404/405/406/409/410/415/422/503/504); a 500 Status is
      answered only for bugs, and is logged with its traceback.
    * Request bodies are JSON (or YAML), or protobuf of the built-in kinds
      :mod:`rangeshard.core.protobuf_schema` lists (decoded to the same JSON;
      any other protobuf body is a 415 naming its kind or unknown field);
      responses are JSON (a ``meta.k8s.io`` Table when a GET asks
      for one first, :mod:`local_apiserver.tables`; 406 if the client accepts neither).
    * ``local_apiserver_requests_total{verb,resource,subresource,code}`` counts
      every API request; ``local_apiserver_watches{resource}`` is the number of
      open watches.
    * With an audit log (``audit_log``, :mod:`local_apiserver.audit`) every
      request that reaches the API route (resources, reviews, discovery) is
      written as one ``audit.k8s.io/v1`` event at stage ``ResponseComplete``.

Concurrency model
    asyncio (uvicorn). Storage calls are synchronous and run in worker threads
    (``anyio.to_thread.run_sync``); watches are bridged by
    :mod:`local_apiserver.watch`; cascading deletion runs on the collector
    thread (:mod:`local_apiserver.gc`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from local_apiserver.audit import AuditLog, facts_from_info
from local_apiserver.errors import ApiError, status_object
from local_apiserver.handlers import dispatch, review
from local_apiserver.kubelet import SimulatedNode
from local_apiserver.middleware import Authenticate
from local_apiserver.openapi import OpenAPIDocuments, OpenAPIUnavailable
from local_apiserver.routing import KUBE_VERSION, SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, parse_target
from local_apiserver.services import DEFAULT_SERVICE_RANGE
from local_apiserver.state import State, in_thread, json_response, status_response
from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.kubeapi import DEFAULT_MAX_BODY_BYTES, BodyLimit, StaticTokens

log = logging.getLogger(__name__)
T = TypeVar("T")


def create_app(
    etcd: EtcdConfig | str,
    *,
    prefix: str | None = None,
    bookmark_interval: float = 60.0,
    startup_timeout: float = 30.0,
    authenticator: StaticTokens | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    audit_log: AuditLog | None = None,
    simulate_node: str | None = None,
    service_range: ipaddress.IPv4Network = DEFAULT_SERVICE_RANGE,
    authorization_mode: str = "",
) -> FastAPI:
    """Build the local API server application (see module docstring).

    ``etcd`` is an :class:`EtcdConfig` or ``URL[,URL...]``; ``prefix`` the
    storage prefix (default ``/registry``); ``bookmark_interval`` the seconds
    between watch bookmarks when a client allows them; ``authenticator`` (from
    ``--token-file``) turns on authentication (ServiceAccount tokens included,
    :mod:`local_apiserver.serviceaccounts`) and the built-in authorization
    policy (:mod:`local_apiserver.auth`), or ``authorization_mode`` ``RBAC``
    (:mod:`local_apiserver.rbac`), ``AlwaysAllow``, ``AlwaysDeny``; ``max_body_bytes`` bounds request
    bodies (413 beyond); ``audit_log`` (from ``--audit-log-path``) receives
    one audit event per API request and is closed at shutdown; ``simulate_node``
    names a simulated node that binds, runs and stops pods
    (:mod:`local_apiserver.kubelet`); ``service_range`` is where Services'
    cluster IPs come from (:mod:`local_apiserver.services`).
    """
    config = etcd if isinstance(etcd, EtcdConfig) else EtcdConfig.from_urls(etcd)
    state = State(config, prefix, bookmark_interval, authenticator, service_range, authorization_mode)
    app = FastAPI(
        title="rangeshard local API server",
        lifespan=_lifespan(state, startup_timeout, simulate_node, audit_log),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.local = state
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if authenticator is not None:
        app.add_middleware(Authenticate, state=state)
    _add_error_handlers(app, state)
    _add_health_routes(app, state)
    _add_openapi_routes(app, state)
    _add_discovery_routes(app, state)
    _add_api_route(app, state, audit_log)  # last: it matches every path
    return app


def _lifespan(
    state: State, startup_timeout: float, simulate_node: str | None, audit_log: AuditLog | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start-up (reach etcd within ``startup_timeout``, else serve 503 until it is; the simulated node) and shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await _bootstrap(state, startup_timeout)
        log.info("local API server ready (etcd %s, prefix %s)", state.config.urls, state.prefix or "/registry")
        node: SimulatedNode | None = None
        if simulate_node:
            node = SimulatedNode(await in_thread(state.connect), state.config, simulate_node)
            node.start()
            log.info("simulating node %s", simulate_node)
        try:
            yield
        finally:
            if node is not None:
                await in_thread(node.stop)
            gc, state.gc = state.gc, None
            if gc is not None:
                await in_thread(gc.stop)
            if state.client is not None:
                state.client.close()
            if audit_log is not None:
                audit_log.close()

    return lifespan


async def _bootstrap(state: State, timeout: float) -> None:
    """Connect and create the built-in namespaces, retrying until ``timeout`` (then ``/readyz`` keeps trying)."""
    deadline = time.monotonic() + timeout
    retry = Backoff(0.2, 1.0)
    while True:
        try:
            await in_thread(state.bootstrap)
            return
        except (ApiError, RangeshardError) as e:
            if time.monotonic() >= deadline:
                log.warning("etcd not reachable at start-up (%s); serving 503 until it is", e)
                return
            await anyio.sleep(retry.next_delay())


def _bug(request: Request, exc: Exception) -> Response:
    """A bug: a Status 500, its traceback logged."""
    log.error("bug while serving %s %s", request.method, request.url.path, exc_info=exc)
    return json_response(status_object(500, "InternalError", f"internal error: {type(exc).__name__}"), 500)


def _client_gone(state: State, request: Request) -> Response:
    """Expected (a killed client mid-write): a counter and a DEBUG line, no traceback. Nobody reads the answer."""
    state.metrics.client_disconnects.inc()
    log.debug("client disconnected during %s %s", request.method, request.url.path)
    return json_response(status_object(400, "BadRequest", "client disconnected before the body was read"), 400)


def _add_error_handlers(app: FastAPI, state: State) -> None:
    """Every failure outside the API route answers a Kubernetes ``Status`` too."""

    @app.exception_handler(ApiError)
    async def api_error_handler(request: Request, exc: ApiError) -> Response:
        return status_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error_handler(request: Request, exc: StarletteHTTPException) -> Response:
        reasons = {404: "NotFound", 405: "MethodNotAllowed", 400: "BadRequest"}
        reason = reasons.get(exc.status_code, "BadRequest" if exc.status_code < 500 else "InternalError")
        return json_response(status_object(exc.status_code, reason, str(exc.detail)), exc.status_code)

    @app.exception_handler(ClientDisconnect)
    async def client_gone_handler(request: Request, exc: ClientDisconnect) -> Response:
        return _client_gone(state, request)

    @app.exception_handler(Exception)
    async def bug_handler(request: Request, exc: Exception) -> Response:
        return _bug(request, exc)


def _add_health_routes(app: FastAPI, state: State) -> None:
    """``/healthz``, ``/livez``, ``/readyz`` (etcd answers; bootstraps late if start-up could not) and ``/metrics``."""

    @app.get("/healthz")
    @app.get("/livez")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz() -> Response:
        if not state.bootstrapped:
            with contextlib.suppress(ApiError, RangeshardError):
                await in_thread(state.bootstrap)
            if not state.bootstrapped:
                return PlainTextResponse("etcd not reached yet", status_code=503)
        try:
            await in_thread(state.require_store().revision)
        except (ApiError, RangeshardError) as e:
            return PlainTextResponse(f"etcd unavailable: {e}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _add_openapi_routes(app: FastAPI, state: State) -> None:
    """``/openapi/v2`` and ``/openapi/v3[/<group-path>]`` of the built-ins and the served CRD versions."""
    documents = OpenAPIDocuments(state.table.specs)

    @app.get("/openapi/v2")
    async def openapi_v2(request: Request) -> Response:
        accept = request.headers.get("accept", "")
        if accept and "protobuf" in accept and "json" not in accept:
            return status_response(
                ApiError(406, "NotAcceptable", "/openapi/v2 is served as application/json only (no protobuf)")
            )
        return _openapi(await _build(state, documents.v2))

    @app.get("/openapi/v3")
    async def openapi_v3() -> Response:
        return _openapi(await _build(state, documents.v3_root))

    @app.get("/openapi/v3/{group_path:path}")
    async def openapi_v3_group(group_path: str) -> Response:
        docs = await _build(state, documents.v3_documents)
        doc = docs.get(group_path.strip("/"))
        if doc is None:
            return status_response(ApiError(404, "NotFound", f"no OpenAPI v3 document for {group_path!r}"))
        return _openapi(doc)


def _add_discovery_routes(app: FastAPI, state: State) -> None:
    """The discovery roots ``/version``, ``/api`` and ``/apis`` (group and version documents are resource paths)."""

    @app.get("/version")
    async def version() -> Response:
        return json_response(KUBE_VERSION)

    @app.get("/api")
    async def api_versions(request: Request) -> Response:
        host = request.headers.get("host", "127.0.0.1")
        return json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
            }
        )

    @app.get("/apis")
    async def api_groups() -> Response:
        await state.refresh_crds()  # CRDs' groups (local_apiserver.crd)
        return json_response(parse_target("apis", state.table))


def _add_api_route(app: FastAPI, state: State, audit_log: AuditLog | None) -> None:
    """The one route of every resource path and the reviews: counted in the metrics and audited."""

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def api(request: Request, path: str) -> Response:
        received = datetime.now(UTC)
        info = {"verb": request.method.lower(), "resource": "", "subresource": ""}
        try:
            if path.strip("/") in (TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS):
                response = await review(state, request, path.strip("/"), info)
            else:
                response = await dispatch(state, request, path, info)
        except ApiError as e:
            response = status_response(e)
        except ClientDisconnect:
            response = _client_gone(state, request)
        except Exception as e:  # a bug: answer a Status 500, log the traceback, count it
            response = _bug(request, e)
        state.metrics.requests.labels(
            verb=info["verb"],
            resource=info["resource"],
            subresource=info["subresource"],
            code=str(response.status_code),
        ).inc()
        if audit_log is not None:
            response = await audit_log.record(request, facts_from_info(info), response, received)
        return response


async def _build(state: State, fn: Callable[[], T]) -> T:
    await state.refresh_crds()  # a CRD created through another server is described too
    try:
        return await in_thread(fn)
    except OpenAPIUnavailable as e:
        raise ApiError(503, "ServiceUnavailable", str(e)) from e


def _openapi(body: bytes) -> Response:
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-cache, private"})
