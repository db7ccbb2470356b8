"""The HTTP layer: FastAPI routes speaking the Kubernetes REST API.

Purpose
    ``create_app(...)`` builds the ASGI application: discovery (``/version``,
    ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]``), health
    (``/healthz``, ``/livez``, ``/readyz``), Prometheus ``/metrics`` and one
    table-driven route for every resource path
    (``/api/v1/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`` and
    ``/apis/<group>/<version>/...``, plus the legacy ``/watch/`` prefix).

Invariants
    * Every answer that is not a success is a Kubernetes ``Status`` with the
      right code (400/404/405/406/409/410/415/422/503/504); a 500 Status is
      answered only for bugs, and is logged with its traceback.
    * Request bodies are JSON (or YAML); protobuf is refused with 415 before
      any decoding; responses are JSON only (406 if the client accepts none).
    * ``local_apiserver_requests_total{verb,resource,subresource,code}`` counts
      every API request; ``local_apiserver_watches{resource}`` is the number of
      open watches.

Concurrency model
    asyncio (uvicorn). Storage calls are synchronous and run in worker threads
    (``anyio.to_thread.run_sync``); watches are bridged by
    :mod:`local_apiserver.watch`; cascading deletion runs on the collector
    thread (:mod:`local_apiserver.gc`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import orjson
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hashing import SelectorSyntaxError, ShardSelector, parse_shard_selector
from local_apiserver import resources
from local_apiserver.auth import (
    Attributes,
    TokenAuthenticator,
    authorize,
    forbidden_error,
    subject_access_review,
    token_review,
    unauthorized,
)
from local_apiserver.errors import (
    ApiError,
    bad_request,
    method_not_allowed,
    not_acceptable,
    not_found_path,
    status_object,
    success_body,
    unsupported_media_type,
)
from local_apiserver.gc import GarbageCollector
from local_apiserver.middleware import Authenticate
from local_apiserver.patch import json_patch, merge_patch
from local_apiserver.resources import ResourceSpec
from local_apiserver.store import Obj, Store, check_precondition, parse_resource_version
from local_apiserver.strategic import strategic_merge
from local_apiserver.validation import check_body_shape, check_scale_body, selector_requirements
from local_apiserver.watch import WatchRequest, timeout_param, watch_events
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.kubeapi import DEFAULT_MAX_BODY_BYTES, BodyLimit, UserInfo
from rangeshard.core.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

KUBE_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-rangeshard-local",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "n/a (rangeshard local_apiserver, Python)",
    "compiler": "cpython",
    "platform": "linux/amd64",
}

PROTOBUF = "application/vnd.kubernetes.protobuf"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
TOKEN_REVIEWS = "apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105 (a path, not a secret)
SUBJECT_ACCESS_REVIEWS = "apis/authorization.k8s.io/v1/subjectaccessreviews"
#: API groups served only for their review resources (create only).
REVIEW_GROUPS = {
    "authentication.k8s.io": ("tokenreviews", "TokenReview"),
    "authorization.k8s.io": ("subjectaccessreviews", "SubjectAccessReview"),
}


class DeleteOptions(BaseModel):
    """The fields of ``meta/v1 DeleteOptions`` this server honours (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    kind: str | None = None
    apiVersion: str | None = None  # noqa: N815 (Kubernetes field name)
    propagationPolicy: Literal["Background", "Foreground", "Orphan"] | None = None  # noqa: N815
    orphanDependents: bool | None = None  # noqa: N815
    gracePeriodSeconds: int | None = None  # noqa: N815
    preconditions: dict[str, str | None] | None = None
    dryRun: list[str] | None = None  # noqa: N815


@dataclass(frozen=True)
class Target:
    """A parsed resource path."""

    spec: ResourceSpec
    namespace: str | None
    name: str | None
    subresource: str
    watch_path: bool


class Metrics:
    """Per-app Prometheus registry (so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "local_apiserver_requests",
            "API requests by verb, resource, subresource and HTTP code",
            ["verb", "resource", "subresource", "code"],
            registry=self.registry,
        )
        self.watches = Gauge(
            "local_apiserver_watches", "Open watches per resource", ["resource"], registry=self.registry
        )
        for spec in resources.RESOURCES:
            self.watches.labels(resource=spec.resource).set(0)


class State:
    """Everything the routes share; created in the lifespan."""

    def __init__(
        self,
        config: EtcdConfig,
        prefix: str | None,
        bookmark_interval: float,
        authenticator: TokenAuthenticator | None = None,
    ) -> None:
        self.config = config
        self.authenticator = authenticator
        self.prefix = prefix
        self.bookmark_interval = bookmark_interval
        self.metrics = Metrics()
        self.client: EtcdClient | None = None
        self.store: Store | None = None
        self.gc: GarbageCollector | None = None
        self.bootstrapped = False
        self._connect_lock = threading.Lock()

    def connect(self) -> Store:
        """The store, connecting first if needed (with etcd authentication this talks to etcd)."""
        with self._connect_lock:
            if self.store is None:
                client = EtcdClient(self.config)
                self.client = client
                self.store = Store(client, self.prefix)
                self.gc = GarbageCollector(self.store)
                self.gc.start()
            return self.store

    def require_store(self) -> Store:
        if self.store is None or not self.bootstrapped:
            raise ApiError(503, "ServiceUnavailable", "the local API server is starting (etcd not reached yet)")
        return self.store


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def status_response(e: ApiError) -> Response:
    return json_response(e.status(), e.code)


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def create_app(
    etcd: EtcdConfig | str,
    *,
    prefix: str | None = None,
    bookmark_interval: float = 60.0,
    startup_timeout: float = 30.0,
    authenticator: TokenAuthenticator | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """Build the local API server application (see module docstring).

    ``etcd`` is an :class:`EtcdConfig` or ``URL[,URL...]``; ``prefix`` the
    storage prefix (default ``/registry``); ``bookmark_interval`` the seconds
    between watch bookmarks when a client allows them; ``authenticator`` (from
    ``--token-file``) turns on authentication and the built-in authorization
    policy (:mod:`local_apiserver.auth`); ``max_body_bytes`` bounds request
    bodies (413 beyond).
    """
    config = etcd if isinstance(etcd, EtcdConfig) else EtcdConfig.from_urls(etcd)
    state = State(config, prefix, bookmark_interval, authenticator)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                store = await in_thread(state.connect)
                await in_thread(store.ensure_namespaces)
                state.bootstrapped = True
                break
            except (ApiError, RangeshardError) as e:
                if time.monotonic() >= deadline:
                    log.warning("etcd not reachable at start-up (%s); serving 503 until it is", e)
                    break
                await anyio.sleep(0.2)
        log.info("local API server ready (etcd %s, prefix %s)", config.urls, prefix or "/registry")
        try:
            yield
        finally:
            gc, state.gc = state.gc, None
            if gc is not None:
                await in_thread(gc.stop)
            if state.client is not None:
                state.client.close()

    app = FastAPI(
        title="rangeshard local API server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.local = state
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if authenticator is not None:
        app.add_middleware(Authenticate, authenticator=authenticator)

    @app.exception_handler(ApiError)
    async def api_error_handler(request: Request, exc: ApiError) -> Response:
        return status_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error_handler(request: Request, exc: StarletteHTTPException) -> Response:
        reasons = {404: "NotFound", 405: "MethodNotAllowed", 400: "BadRequest"}
        reason = reasons.get(exc.status_code, "BadRequest" if exc.status_code < 500 else "InternalError")
        return json_response(status_object(exc.status_code, reason, str(exc.detail)), exc.status_code)

    @app.exception_handler(Exception)
    async def bug_handler(request: Request, exc: Exception) -> Response:
        log.error("bug while serving %s %s", request.method, request.url.path, exc_info=exc)
        return json_response(status_object(500, "InternalError", f"internal error: {type(exc).__name__}"), 500)

    @app.get("/healthz")
    @app.get("/livez")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz() -> Response:
        if not state.bootstrapped or state.client is None:
            if not state.bootstrapped:
                with contextlib.suppress(ApiError, RangeshardError):
                    store = await in_thread(state.connect)
                    await in_thread(store.ensure_namespaces)
                    state.bootstrapped = True
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
        return json_response(
            {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g, v) for g, v in _named_groups()]}
        )

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def api(request: Request, path: str) -> Response:
        info = {"verb": request.method.lower(), "resource": "", "subresource": ""}
        try:
            if path.strip("/") in (TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS):
                response = await _review(state, request, path.strip("/"), info)
            else:
                response = await _dispatch(state, request, path, info)
        except ApiError as e:
            response = status_response(e)
        except Exception as e:  # a bug: answer a Status 500, log the traceback, count it
            log.error("bug while serving %s %s", request.method, request.url.path, exc_info=e)
            response = json_response(status_object(500, "InternalError", f"internal error: {type(e).__name__}"), 500)
        state.metrics.requests.labels(
            verb=info["verb"],
            resource=info["resource"],
            subresource=info["subresource"],
            code=str(response.status_code),
        ).inc()
        return response

    return app


def _named_groups() -> list[tuple[str, list[str]]]:
    return [(g, v) for g, v in resources.groups().items() if g] + [(g, ["v1"]) for g in REVIEW_GROUPS]


def _review_resource_list(group: str) -> dict[str, Any]:
    resource, kind = REVIEW_GROUPS[group]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1",
        "resources": [{"name": resource, "singularName": "", "namespaced": False, "kind": kind, "verbs": ["create"]}],
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]},
    }


def _resource_list(group: str, version: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for spec in resources.by_group_version(group, version):
        entry: dict[str, Any] = {
            "name": spec.resource,
            "singularName": spec.singular,
            "namespaced": spec.namespaced,
            "kind": spec.kind,
            "verbs": list(resources.VERBS),
        }
        if spec.short_names:
            entry["shortNames"] = list(spec.short_names)
        if spec.categories:
            entry["categories"] = list(spec.categories)
        out.append(entry)
        if spec.status:
            out.append(
                {
                    "name": f"{spec.resource}/status",
                    "singularName": "",
                    "namespaced": spec.namespaced,
                    "kind": spec.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if spec.scale:
            out.append(
                {
                    "name": f"{spec.resource}/scale",
                    "singularName": "",
                    "namespaced": spec.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


_NOT_FOUND = "the server could not find the requested resource"


def parse_target(path: str) -> Target | dict[str, Any]:
    """A resource target, or a discovery document; 404 ``ApiError`` for anything else."""
    segs = [s for s in path.strip("/").split("/")]
    if not segs or segs == [""]:
        raise not_found_path(_NOT_FOUND)
    if segs == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"]}
    if segs == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g, v) for g, v in _named_groups()]}
    if segs[0] == "api":
        if len(segs) < 2 or segs[1] not in resources.groups().get("", []):
            raise not_found_path(_NOT_FOUND)
        group, version, rest = "", segs[1], segs[2:]
    elif segs[0] == "apis":
        if len(segs) >= 2 and segs[1] in REVIEW_GROUPS:
            if len(segs) == 2:
                return _group(segs[1], ["v1"]) | {"kind": "APIGroup", "apiVersion": "v1"}
            if len(segs) == 3 and segs[2] == "v1":
                return _review_resource_list(segs[1])
            raise not_found_path(_NOT_FOUND)
        if len(segs) < 2 or segs[1] not in resources.groups() or not segs[1]:
            raise not_found_path(_NOT_FOUND)
        if len(segs) == 2:
            return _group(segs[1], resources.groups()[segs[1]]) | {"kind": "APIGroup", "apiVersion": "v1"}
        if segs[2] not in resources.groups()[segs[1]]:
            raise not_found_path(_NOT_FOUND)
        group, version, rest = segs[1], segs[2], segs[3:]
    else:
        raise not_found_path(_NOT_FOUND)
    if not rest:
        return _resource_list(group, version)
    watch_path = False
    if rest[0] == "watch":
        watch_path = True
        rest = rest[1:]
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        inner = resources.lookup(group, version, rest[2])
        if inner is not None and inner.namespaced:
            namespace = rest[1]
            rest = rest[2:]
    if not rest or len(rest) > 3 or any(not s for s in rest):
        raise not_found_path(_NOT_FOUND)
    spec = resources.lookup(group, version, rest[0])
    if spec is None:
        raise not_found_path(f"{_NOT_FOUND} (no resource {rest[0]!r} in {group or 'core'}/{version})")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if sub and not ((sub == "status" and spec.status) or (sub == "scale" and spec.scale)):
        raise not_found_path(f"{_NOT_FOUND} (no subresource {sub!r} of {spec.resource})")
    return Target(spec, namespace, name, sub, watch_path)


def _check_accept(request: Request) -> None:
    accept = request.headers.get("accept")
    if not accept:
        return
    for item in accept.split(","):
        parts = [p.strip() for p in item.split(";")]
        media = parts[0].lower()
        params = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in parts[1:])}
        if media in ("application/json", "*/*", "application/*") and "as" not in params:
            return
    raise not_acceptable(
        f"only application/json is supported by the local API server (Accept: {accept}); "
        "tables and protobuf are not served"
    )


async def _read_body(request: Request, allowed: tuple[str, ...]) -> tuple[str, Any]:
    """The decoded request body and its media type; 415/400 on unsupported or malformed input."""
    content_type = request.headers.get("content-type", "application/json")
    media = content_type.split(";")[0].strip().lower()
    if media.startswith(PROTOBUF):
        raise unsupported_media_type(
            f"the local API server does not decode protobuf ({content_type}); "
            "kubectl generator commands (create namespace/deployment, run) send protobuf: "
            "write the object as YAML/JSON and use `kubectl create -f FILE` instead"
        )
    if media == APPLY_PATCH:
        raise unsupported_media_type("server-side apply is not supported by the local API server; use kubectl apply")
    if media not in allowed:
        raise unsupported_media_type(f"unsupported media type {content_type!r}; supported: {', '.join(allowed)}")
    raw = await request.body()
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        if media in ("application/yaml", "application/x-yaml"):
            doc = yaml.safe_load(raw)
        else:
            return media, orjson.loads(raw)
    except (orjson.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise bad_request(f"couldn't decode the request body as {media}: {e}") from e
    try:
        # YAML can hold what JSON cannot (lone surrogates, binary, sets, non-string keys): refuse it here.
        return media, orjson.loads(orjson.dumps(doc))
    except (TypeError, orjson.JSONDecodeError) as e:
        raise bad_request(f"the {media} body is not representable as JSON: {e}") from e


def _int_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError as e:
        raise bad_request(f"invalid {name} {value!r}: expected a non-negative integer") from e
    if number < 0:
        raise bad_request(f"invalid {name} {value!r}: must be non-negative")
    return number


def _bool_param(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None or value == "":
        return False
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise bad_request(f"invalid {name} {value!r}: expected true or false")


def _selectors(request: Request, spec: ResourceSpec, name: str | None) -> tuple[LabelSelector, FieldSelector]:
    labels = parse_label_selector(request.query_params.get("labelSelector"))
    allowed = ("metadata.name", "metadata.namespace", *spec.extra_fields)
    fields = parse_field_selector(request.query_params.get("fieldSelector"), allowed, spec.kind)
    if name is not None:
        fields = FieldSelector(
            (*fields.requirements, *parse_field_selector(f"metadata.name={name}", allowed, spec.kind).requirements)
        )
    return labels, fields


def _shard(request: Request) -> ShardSelector | None:
    """The ``shardSelector`` (KEP-5866) of a list/watch, or None; 400 if malformed."""
    text = request.query_params.get("shardSelector")
    if text is None or text == "":
        return None
    try:
        return parse_shard_selector(text)
    except SelectorSyntaxError as e:
        raise bad_request(f"invalid shardSelector: {e}") from e


async def _dispatch(state: State, request: Request, path: str, info: dict[str, str]) -> Response:
    target = parse_target(path)
    method = request.method
    if isinstance(target, dict):
        if method != "GET":
            raise method_not_allowed(f"{method} is not allowed on discovery documents")
        return json_response(target)
    spec = target.spec
    info["resource"] = spec.resource
    info["subresource"] = target.subresource
    if spec.namespaced and target.namespace is None and target.name is not None:
        raise not_found_path(f"{_NOT_FOUND} ({spec.resource} are namespaced: use /namespaces/<ns>/{spec.resource})")
    if request.query_params.get("dryRun"):
        raise bad_request("dryRun is not supported by the local API server")
    _authorize(state, request, _attributes(request, target))
    _check_accept(request)
    store = state.require_store()
    ns = target.namespace

    if target.watch_path or (method == "GET" and target.name is None and _bool_param(request, "watch")):
        if method != "GET" or target.subresource:
            raise method_not_allowed("watch is only allowed with GET on a collection or object")
        info["verb"] = "watch"
        return await _watch(state, store, request, target)

    if method == "GET":
        if target.name is None:
            info["verb"] = "list"
            return await _list(store, request, target)
        info["verb"] = "get"
        obj = await in_thread(store.get, spec, ns, target.name)
        return json_response(to_scale(spec, obj) if target.subresource == "scale" else obj)

    if method == "POST":
        info["verb"] = "create"
        if target.name is not None:
            raise method_not_allowed(f"POST is not allowed on a single {spec.kind} (use PUT or PATCH)")
        if spec.namespaced and ns is None:
            raise method_not_allowed(f"create {spec.resource} under /namespaces/<namespace>/{spec.resource}")
        _, body = await _read_body(request, ("application/json", "application/yaml", "application/x-yaml"))
        created = await in_thread(store.create, spec, ns, body)
        return json_response(created, 201)

    if target.name is None:
        if method == "DELETE":
            info["verb"] = "deletecollection"
            raise method_not_allowed(
                "deletecollection is not supported by the local API server; delete objects one by one"
            )
        raise method_not_allowed(f"{method} is not allowed on a collection")
    name = target.name

    if method == "PUT":
        info["verb"] = "update"
        _, body = await _read_body(request, ("application/json", "application/yaml", "application/x-yaml"))
        if target.subresource == "scale":
            return json_response(await in_thread(_update_scale, store, spec, ns, name, body, None))
        updated = await in_thread(store.update, spec, ns, name, body, subresource=target.subresource)
        return json_response(updated)

    if method == "PATCH":
        info["verb"] = "patch"
        media, patch = await _read_body(request, (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH))
        if media in (MERGE_PATCH, STRATEGIC_PATCH) and not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        schema = "scale" if target.subresource == "scale" else spec.resource

        def apply(doc: Obj) -> Any:
            if media == JSON_PATCH:
                return json_patch(doc, patch)
            if media == STRATEGIC_PATCH:
                return strategic_merge(doc, patch, schema)
            return merge_patch(doc, patch)

        if target.subresource == "scale":
            return json_response(await in_thread(_update_scale, store, spec, ns, name, None, apply))
        return json_response(await in_thread(_patch, store, spec, ns, name, apply, target.subresource))

    if method == "DELETE":
        info["verb"] = "delete"
        if target.subresource:
            raise method_not_allowed(f"DELETE is not allowed on {spec.resource}/{target.subresource}")
        return await _delete(store, request, spec, ns, name)

    raise method_not_allowed(f"{method} is not supported")


def _attributes(request: Request, target: Target) -> Attributes:
    """The authorization attributes of a resource request (verb as kube-apiserver derives it)."""
    method = request.method
    watch = request.query_params.get("watch", "").lower() in ("true", "1")
    if target.watch_path or (method == "GET" and target.name is None and watch):
        verb = "watch"
    elif method in ("GET", "HEAD"):
        verb = "get" if target.name is not None else "list"
    elif method == "DELETE" and target.name is None:
        verb = "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
    spec = target.spec
    return Attributes(
        verb=verb,
        resource=spec.resource,
        group=spec.group,
        namespace=target.namespace or "",
        name=target.name or "",
        subresource=target.subresource,
    )


def _authorize(state: State, request: Request, attrs: Attributes) -> None:
    """403 unless the built-in policy allows the authenticated user (no-op without a token file)."""
    if state.authenticator is None:
        return
    user = request.scope.get("state", {}).get("user")
    if not isinstance(user, UserInfo):
        raise unauthorized()
    allowed, _ = authorize(user, attrs)
    if not allowed:
        log.info("forbidden: user %r cannot %s %s", user.username, attrs.verb, attrs.resource or attrs.path)
        raise forbidden_error(user, attrs)


async def _review(state: State, request: Request, path: str, info: dict[str, str]) -> Response:
    """``POST`` of a TokenReview or SubjectAccessReview."""
    group, _, rest = path.removeprefix("apis/").partition("/")
    resource = rest.rpartition("/")[2]
    info["resource"] = resource
    info["verb"] = "create"
    if request.method != "POST":
        raise method_not_allowed(f"{request.method} is not allowed on {resource}: only create (POST)")
    _authorize(state, request, Attributes(verb="create", resource=resource, group=group))
    _, body = await _read_body(request, ("application/json", "application/yaml", "application/x-yaml"))
    if resource == "tokenreviews":
        return json_response(token_review(state.authenticator, body), 201)
    return json_response(subject_access_review(body), 201)


async def _list(store: Store, request: Request, target: Target) -> Response:
    spec = target.spec
    labels, fields = _selectors(request, spec, None)
    shard = _shard(request)
    limit = _int_param(request, "limit")
    result = await in_thread(
        store.list_page,
        spec,
        target.namespace,
        labels,
        fields,
        limit=limit,
        continue_token=request.query_params.get("continue") or None,
        resource_version=request.query_params.get("resourceVersion"),
        resource_version_match=request.query_params.get("resourceVersionMatch"),
        shard=shard,
    )
    meta: dict[str, Any] = {"resourceVersion": str(result.revision)}
    if result.continue_token:
        meta["continue"] = result.continue_token
    if shard is not None:
        meta["shardInfo"] = {"selector": str(shard)}
    return json_response(
        {"kind": spec.list_kind, "apiVersion": spec.api_version, "metadata": meta, "items": result.items}
    )


async def _watch(state: State, store: Store, request: Request, target: Target) -> Response:
    spec = target.spec
    labels, fields = _selectors(request, spec, target.name)
    req = WatchRequest(
        spec=spec,
        namespace=target.namespace,
        labels=labels,
        fields=fields,
        resource_version=request.query_params.get("resourceVersion"),
        allow_bookmarks=_bool_param(request, "allowWatchBookmarks"),
        timeout_seconds=timeout_param(request.query_params.get("timeoutSeconds")),
        send_initial_events=_bool_param(request, "sendInitialEvents"),
        shard=_shard(request),
    )
    gauge = state.metrics.watches.labels(resource=spec.resource)
    stream = await watch_events(
        store,
        state.config,
        req,
        bookmark_interval=state.bookmark_interval,
        on_open=gauge.inc,
        on_close=gauge.dec,
    )
    return StreamingResponse(stream, media_type="application/json", headers={"Cache-Control": "no-cache"})


def _patch(
    store: Store, spec: ResourceSpec, ns: str | None, name: str, apply: Callable[[Obj], Any], subresource: str
) -> Obj:
    def mutate(current: Obj) -> Obj:
        patched = apply(current)
        check_body_shape(spec, patched)
        meta = patched.get("metadata") or {}
        for immutable in ("name", "uid"):
            if meta.get(immutable) != current["metadata"].get(immutable):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{spec.kind} "{name}" is invalid: metadata.{immutable}: Invalid value: field is immutable',
                )
        rv = meta.get("resourceVersion")
        if rv is not None:
            check_precondition(spec, name, current, parse_resource_version(str(rv), "metadata.resourceVersion"))
        return store.merge_update(spec, current, patched, subresource)

    return store.guaranteed_update(spec, ns, name, mutate)


def to_scale(spec: ResourceSpec, obj: Obj) -> Obj:
    """The autoscaling/v1 Scale view of a replicaset or deployment."""
    meta = obj["metadata"]
    raw_spec, raw_status = obj.get("spec"), obj.get("status")
    body_spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    reqs, _ = selector_requirements(body_spec.get("selector"))
    parts = []
    for r in reqs:
        if r.op == "=":
            parts.append(f"{r.key}={r.values[0]}")
        elif r.op in ("in", "notin"):
            parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
        else:
            parts.append(r.key if r.op == "exists" else f"!{r.key}")
    replicas = body_spec.get("replicas")
    current = status.get("replicas")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
        },
        "spec": {"replicas": replicas if isinstance(replicas, int) else 0},
        "status": {"replicas": current if isinstance(current, int) else 0, "selector": ",".join(parts)},
    }


def _update_scale(
    store: Store,
    spec: ResourceSpec,
    ns: str | None,
    name: str,
    body: Any,
    apply: Callable[[Obj], Any] | None,
) -> Obj:
    def mutate(current: Obj) -> Obj:
        scale = to_scale(spec, current)
        new_scale = apply(scale) if apply is not None else body
        replicas = check_scale_body(new_scale)
        meta = new_scale.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        rv = meta.get("resourceVersion")
        if rv is not None and rv != "":
            check_precondition(spec, name, current, parse_resource_version(str(rv), "metadata.resourceVersion"))
        desired = dict(current)
        desired["spec"] = dict(current.get("spec") or {})
        desired["spec"]["replicas"] = replicas
        return store.merge_update(spec, current, desired, "")

    return to_scale(spec, store.guaranteed_update(spec, ns, name, mutate))


async def _delete(store: Store, request: Request, spec: ResourceSpec, ns: str | None, name: str) -> Response:
    options = DeleteOptions()
    raw = await request.body()
    if raw.strip():
        media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if media.startswith(PROTOBUF):
            raise unsupported_media_type("the local API server does not decode protobuf DeleteOptions; send JSON")
        try:
            options = DeleteOptions.model_validate_json(raw)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise bad_request(f"invalid DeleteOptions: {problems}") from e
    if options.dryRun:
        raise bad_request("dryRun is not supported by the local API server")
    policy = request.query_params.get("propagationPolicy") or options.propagationPolicy
    if policy is None and options.orphanDependents is not None:
        policy = "Orphan" if options.orphanDependents else "Background"
    policy = policy or "Background"
    if policy not in ("Background", "Foreground", "Orphan"):
        raise ApiError(
            422, "Invalid", f"propagationPolicy: Unsupported value: {policy!r}: Background, Foreground, Orphan"
        )
    pre = options.preconditions or {}
    pre_rv = parse_resource_version(pre.get("resourceVersion"), "preconditions.resourceVersion")
    obj, gone_now = await in_thread(
        store.delete,
        spec,
        ns,
        name,
        precondition_uid=pre.get("uid") or None,
        precondition_rv=pre_rv,
        propagation=policy,
    )
    if not gone_now or spec.return_deleted_object:
        return json_response(obj)
    details: dict[str, Any] = {"name": name, "kind": spec.resource, "uid": obj["metadata"].get("uid")}
    if spec.group:
        details["group"] = spec.group
    return json_response(success_body(details))
