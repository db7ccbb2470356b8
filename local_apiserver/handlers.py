"""The verb handlers of the local API server: get, list, watch, create, update, patch, delete.

Purpose
    ``dispatch`` routes one resource request (already past the middleware):
    ``_prepare`` records its facts, authorizes, checks ``Accept`` (Tables for
    GETs that ask, :mod:`local_apiserver.tables`) and parses the list options
    into a :class:`Call`; ``derive_verb`` derives the verb as kube-apiserver
    does (``request_verb``, which authorization uses too; 405 for what it
    refuses); ``VERBS`` holds one handler per verb
    (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``,
    ``delete``, ``deletecollection``), which applies field validation to
    written bodies (:mod:`local_apiserver.fieldvalidation`) and calls the
    store (the ``scale`` subresource through :mod:`local_apiserver.scale`). Also ``DeleteOptions`` handling
    (shared by ``delete`` and ``deletecollection``, which deletes each match
    through the single delete) and the TokenReview/SubjectAccessReview
    endpoints (``review``).

Invariants
    * The verb recorded in ``info`` (for metrics) is the one kube-apiserver
      would derive (``list``/``watch``/``deletecollection`` included).
    * Updates go through ``Store.guaranteed_update``: a stale
      ``resourceVersion`` is a 409, never a lost write.

Concurrency model
    Coroutines on the server's event loop; storage calls run in worker
    threads (:func:`local_apiserver.state.in_thread`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from local_apiserver import fieldvalidation, serviceaccounts, tables
from local_apiserver.auth import parse_subject_access_review, subject_access_review_answer, token_review
from local_apiserver.errors import (
    ApiError,
    bad_request,
    invalid_request,
    method_not_allowed,
    not_found_path,
    success_body,
    tolerating,
)
from local_apiserver.patch import json_patch, merge_patch
from local_apiserver.resources import CRD_RESOURCE, ResourceSpec
from local_apiserver.routing import (
    JSON_PATCH,
    MERGE_PATCH,
    NOT_FOUND,
    PROTOBUF,
    STRATEGIC_PATCH,
    Target,
    check_accept,
    decode_protobuf,
    parse_target,
    query_selectors,
    read_body,
    shard_param,
)
from local_apiserver.scale import to_scale, update_scale
from local_apiserver.state import State, in_thread, json_response
from local_apiserver.store import DRY_RUN, Obj, Store, check_precondition, parse_resource_version
from local_apiserver.strategic import strategic_merge
from local_apiserver.validation import check_body_shape
from local_apiserver.watch import WatchRequest, watch_events
from rangeshard.core import requestinfo
from rangeshard.core.kubeapi import Attributes, UserInfo, forbidden, unauthorized
from rangeshard.core.listoptions import ListQuery, parse_bool
from rangeshard.core.protobuf_decode import decode_delete_options

log = logging.getLogger(__name__)

#: The media types of create and update bodies.
BODY_MEDIA = ("application/json", "application/yaml", "application/x-yaml")


class DeleteOptions(BaseModel):
    """The fields of ``meta/v1 DeleteOptions`` this server honours (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    kind: str | None = None
    apiVersion: str | None = None  # noqa: N815 (Kubernetes field name)
    propagationPolicy: str | None = None  # noqa: N815 (checked with kube's 422, not pydantic's 400)
    orphanDependents: bool | None = None  # noqa: N815
    gracePeriodSeconds: int | None = None  # noqa: N815
    preconditions: dict[str, str | None] | None = None
    dryRun: list[str] | None = None  # noqa: N815


@dataclass(frozen=True)
class Call:
    """One routed resource request: what every verb handler receives."""

    state: State
    request: Request
    target: Target
    store: Store
    table: tables.TableRequest | None
    query: ListQuery | None

    @property
    def spec(self) -> ResourceSpec:
        return self.target.spec

    @property
    def list_query(self) -> ListQuery:
        """The list options of a list or watch (routing parsed them: every GET on a collection, every watch)."""
        if self.query is None:
            raise bad_request("this request has no list options")
        return self.query

    @property
    def name(self) -> str:
        """The object's name (only handlers of object verbs ask; routing guaranteed one)."""
        return self.target.name or ""

    def field_validation(self, options: str) -> str:
        """The ``fieldValidation`` directive of a write (``options``: CreateOptions, UpdateOptions, PatchOptions)."""
        raw = self.request.query_params.get("fieldValidation")
        return fieldvalidation.directive(raw, options, custom=self.spec.crd is not None)

    async def crds_written(self) -> None:
        """After a write of a CRD: this process serves its resources at once."""
        if self.spec.resource == CRD_RESOURCE and self.spec.crd is None:
            await in_thread(self.state.crds.refresh, self.store, force=True)


async def dispatch(state: State, request: Request, path: str, info: dict[str, str]) -> Response:
    """Route one request past the middleware: discovery documents, or a resource request to its verb's handler."""
    await state.refresh_crds()
    target = parse_target(path, state.table)
    if isinstance(target, dict):
        if request.method != "GET":
            raise method_not_allowed(f"{request.method} is not allowed on discovery documents")
        return json_response(target)
    call = await _prepare(state, request, target, info)
    verb = derive_verb(request.method, target, call.query)
    info["verb"] = verb
    if target.subresource == "token" and verb != "create":
        raise method_not_allowed(f"{request.method} is not allowed on serviceaccounts/token: only create (POST)")
    if target.subresource and verb in ("delete", "deletecollection"):
        raise method_not_allowed(f"DELETE is not allowed on {target.spec.resource}/{target.subresource}")
    response = await VERBS[verb](call)
    if verb not in ("get", "list", "watch"):
        state.rbac_written(target.spec.group)
    return response


async def _prepare(state: State, request: Request, target: Target, info: dict[str, str]) -> Call:
    """Record the request's facts in ``info``, check what every verb needs (authorization first) and route it."""
    spec = target.spec
    attrs = _attributes(request, target)
    info.update({k: v for k, v in dataclasses.asdict(attrs).items() if k not in ("verb", "path")})
    if spec.namespaced and target.namespace is None and target.name is not None:
        raise not_found_path(f"{NOT_FOUND} ({spec.resource} are namespaced: use /namespaces/<ns>/{spec.resource})")
    dry_run = request.query_params.getlist("dryRun")
    if dry_run and (
        request.method not in requestinfo.WRITE_METHODS or (target.name is None and request.method == "DELETE")
    ):
        raise bad_request("dryRun is allowed on create, update, patch and delete of one object only")
    _dry_run(dry_run)
    info["verb"] = attrs.verb  # the audit event of a 403 names the verb too
    await _authorize(state, request, attrs)
    table = tables.requested(request, target) if request.method == "GET" else None
    if table is None:
        check_accept(request)
    store = state.require_store()
    query = None
    if target.watch_path or (request.method == "GET" and target.name is None):
        query = ListQuery.parse(request.query_params, watch_path=target.watch_path)
    return Call(state, request, target, store, table, query)


def _dry_run(values: list[str]) -> None:
    """``dryRun=All`` (query or DeleteOptions): validate, default and check, write nothing; other values 400.

    Set in this request's own context (every request is a task of its own), read by the store at its one
    write edge (:data:`local_apiserver.store.DRY_RUN`). On a read it means nothing, as in kube.
    """
    if not values:
        return
    bad = [v for v in values if v != "All"]
    if bad:
        raise bad_request(f'Invalid dry run value: {bad[0]!r}: supported values: "All"')
    DRY_RUN.set(True)


def request_verb(method: str, target: Target, watch: bool) -> str:
    """The verb kube-apiserver derives for a request (:func:`rangeshard.core.requestinfo.verb`)."""
    return requestinfo.verb(method, named=target.name is not None, watch=watch, watch_prefix=target.watch_path)


def derive_verb(method: str, target: Target, query: ListQuery | None) -> str:
    """:func:`request_verb` of a routed request; 405 for the combinations kube-apiserver refuses."""
    if query is not None and query.watch:
        if method != "GET" or target.subresource:
            raise method_not_allowed("watch is only allowed with GET on a collection or object")
        return "watch"
    if method not in ("GET", "POST", "DELETE") and (target.name is None or not requestinfo.is_write(method)):
        refused = "is not allowed on a collection" if target.name is None else "is not supported"
        raise method_not_allowed(f"{method} {refused}")
    return request_verb(method, target, False)


async def _get(call: Call) -> Response:
    obj = await in_thread(call.store.get, call.spec, call.target.namespace, call.target.name)
    shown = to_scale(call.spec, obj) if call.target.subresource == "scale" else obj
    return json_response(call.table.single(shown) if call.table is not None else shown)


async def _create(call: Call) -> Response:
    spec, ns = call.spec, call.target.namespace
    if call.target.subresource == "token":
        return await _token_request(call)
    if call.target.name is not None:
        raise method_not_allowed(f"POST is not allowed on a single {spec.kind} (use PUT or PATCH)")
    if spec.namespaced and ns is None:
        raise method_not_allowed(f"create {spec.resource} under /namespaces/<namespace>/{spec.resource}")
    mode = call.field_validation("CreateOptions")
    media, body = await read_body(call.request, BODY_MEDIA)
    warnings = await _validate_fields(call.request, spec, mode, media, body)
    created = await in_thread(call.store.create, spec, ns, body)
    await call.crds_written()
    return _with_warnings(json_response(created, 201), warnings)


async def _token_request(call: Call) -> Response:
    """``POST serviceaccounts/<name>/token``: a token of an existing ServiceAccount (404 otherwise)."""
    _, body = await read_body(call.request, BODY_MEDIA)
    audiences, expiration = serviceaccounts.parse_token_request(body)
    ns = call.target.namespace or ""
    account = await in_thread(call.store.get, call.spec, ns, call.name)
    uid = str((account.get("metadata") or {}).get("uid") or "")
    token, expires = call.state.service_accounts.issue(ns, call.name, uid, audiences, expiration)
    return json_response(serviceaccounts.token_request_answer(audiences, expiration, token, expires), 201)


async def _update(call: Call) -> Response:
    spec, ns, name = call.spec, call.target.namespace, call.name
    mode = call.field_validation("UpdateOptions")
    media, body = await read_body(call.request, BODY_MEDIA)
    if call.target.subresource == "scale":
        return json_response(await in_thread(update_scale, call.store, spec, ns, name, body, None))
    warnings = await _validate_fields(call.request, spec, mode, media, body)
    updated = await in_thread(call.store.update, spec, ns, name, body, subresource=call.target.subresource)
    await call.crds_written()
    return _with_warnings(json_response(updated), warnings)


async def _patch(call: Call) -> Response:
    spec, ns, name, subresource = call.spec, call.target.namespace, call.name, call.target.subresource
    mode = call.field_validation("PatchOptions")
    media, patch = await read_body(call.request, (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH))
    duplicates = fieldvalidation.duplicate_fields(await call.request.body(), media) if mode != "Ignore" else ()
    if media in (MERGE_PATCH, STRATEGIC_PATCH) and not isinstance(patch, dict):
        raise bad_request("a merge patch must be a JSON object")
    warnings: list[str] = []

    def apply(doc: Obj) -> Any:
        if media == JSON_PATCH:
            patched = json_patch(doc, patch)
        elif media == STRATEGIC_PATCH:
            patched = strategic_merge(doc, patch, "scale" if subresource == "scale" else spec.resource)
        else:
            patched = merge_patch(doc, patch)
        if subresource != "scale":
            warnings[:] = fieldvalidation.check(spec, mode, patched, duplicates)
        return patched

    if subresource == "scale":
        return json_response(await in_thread(update_scale, call.store, spec, ns, name, None, apply))
    patched = await in_thread(_apply_patch, call.store, spec, ns, name, apply, subresource)
    await call.crds_written()
    return _with_warnings(json_response(patched), warnings)


async def _validate_fields(request: Request, spec: ResourceSpec, mode: str, media: str, body: Any) -> list[str]:
    """Field validation of a create/update body (400 under Strict); the warnings to send under Warn."""
    checked = mode != "Ignore" and media != PROTOBUF  # protobuf has no duplicate keys to report
    duplicates = fieldvalidation.duplicate_fields(await request.body(), media) if checked else ()
    return await in_thread(fieldvalidation.check, spec, mode, body, duplicates)


def _with_warnings(response: Response, warnings: list[str]) -> Response:
    for key, value in fieldvalidation.warning_headers(warnings):
        response.headers.append(key, value)
    return response


def _attributes(request: Request, target: Target) -> Attributes:
    """The authorization attributes of a resource request (verb as kube-apiserver derives it)."""
    method = request.method
    try:
        watch = bool(parse_bool(request.query_params, "watch"))
    except ApiError:
        watch = False  # answered with a 400 by the handler; authorization sees a read
    spec = target.spec
    return Attributes(
        verb=request_verb(method, target, watch),
        resource=spec.resource,
        group=spec.group,
        version=spec.version,
        namespace=target.namespace or "",
        name=target.name or "",
        subresource=target.subresource,
    )


async def _authorize(state: State, request: Request, attrs: Attributes) -> None:
    """403 unless ``--authorization-mode`` allows the authenticated user (no-op without a token file)."""
    if state.authenticator is None:
        return
    user = request.scope.get("state", {}).get("user")
    if not isinstance(user, UserInfo):
        raise unauthorized()
    allowed, _ = await state.authorize(user, attrs)
    if not allowed:
        log.info("forbidden: user %r cannot %s %s", user.username, attrs.verb, attrs.resource or attrs.path)
        raise forbidden(user, attrs)


async def review(state: State, request: Request, path: str, info: dict[str, str]) -> Response:
    """``POST`` of a TokenReview or SubjectAccessReview."""
    group, _, rest = path.removeprefix("apis/").partition("/")
    resource = rest.rpartition("/")[2]
    info["resource"] = resource
    info["verb"] = "create"
    if request.method != "POST":
        raise method_not_allowed(f"{request.method} is not allowed on {resource}: only create (POST)")
    await _authorize(state, request, Attributes(verb="create", resource=resource, group=group))
    _, body = await read_body(request, BODY_MEDIA)
    if resource == "tokenreviews":
        answer = await in_thread(token_review, state.authenticator, body, state.user_of_token)
        return json_response(answer, 201)
    spec, user, attrs = parse_subject_access_review(body)
    allowed, reason = await state.authorize(user, attrs)
    return json_response(subject_access_review_answer(spec, allowed, reason), 201)


async def _list(call: Call) -> Response:
    spec, request, query = call.spec, call.request, call.list_query
    labels, fields = query_selectors(request, spec, None)
    shard = shard_param(request)
    result = await in_thread(
        call.store.list_page,
        spec,
        call.target.namespace,
        labels,
        fields,
        limit=query.limit,
        continue_token=query.continue_token,
        resource_version=query.resource_version,
        resource_version_match=query.resource_version_match,
        shard=shard,
    )
    meta: dict[str, Any] = {"resourceVersion": str(result.revision)}
    if result.continue_token:
        meta["continue"] = result.continue_token
    if shard is not None:
        meta["shardInfo"] = {"selector": str(shard)}
    if call.table is not None:
        return json_response(call.table.of(result.items, meta))
    return _list_response(spec, meta, result.items)


def _list_response(spec: ResourceSpec, meta: dict[str, Any], items: list[Obj]) -> Response:
    return json_response({"kind": spec.list_kind, "apiVersion": spec.api_version, "metadata": meta, "items": items})


async def _watch(call: Call) -> Response:
    spec, request, query, state = call.spec, call.request, call.list_query, call.state
    labels, fields = query_selectors(request, spec, call.target.name)
    req = WatchRequest(
        spec=spec,
        namespace=call.target.namespace,
        labels=labels,
        fields=fields,
        resource_version=query.resource_version,
        allow_bookmarks=query.allow_watch_bookmarks,
        timeout_seconds=float(query.timeout_seconds) if query.timeout_seconds else None,
        send_initial_events=bool(query.send_initial_events),
        shard=shard_param(request),
    )
    gauge = state.metrics.watches.labels(resource=spec.resource)
    stream = await watch_events(
        call.store,
        state.config,
        req,
        bookmark_interval=state.bookmark_interval,
        on_open=gauge.inc,
        on_close=gauge.dec,
        shutdown=state.shutdown,
    )
    if call.table is not None:
        stream = call.table.watch(stream)
    return StreamingResponse(stream, media_type="application/json", headers={"Cache-Control": "no-cache"})


def _apply_patch(
    store: Store, spec: ResourceSpec, ns: str | None, name: str, apply: Callable[[Obj], Any], subresource: str
) -> Obj:
    def mutate(current: Obj) -> Obj:
        patched = apply(current)
        check_body_shape(spec, patched)
        meta = patched.get("metadata") or {}
        for immutable in ("name", "uid"):
            if meta.get(immutable) != current["metadata"].get(immutable):
                raise invalid_request(
                    f'{spec.kind} "{name}" is invalid: metadata.{immutable}: Invalid value: field is immutable'
                )
        rv = meta.get("resourceVersion")
        if rv is not None:
            check_precondition(spec, name, current, parse_resource_version(str(rv), "metadata.resourceVersion"))
        return store.merge_update(spec, current, patched, subresource)

    return store.guaranteed_update(spec, ns, name, mutate)


@dataclass(frozen=True)
class _Deletion:
    """What a delete or deletecollection asks (``DeleteOptions`` body and query): ``Store.delete``'s options."""

    propagation: str
    grace_period_seconds: int | None
    precondition_uid: str | None
    precondition_rv: int | None


async def _deletion(request: Request) -> _Deletion:
    """The ``DeleteOptions`` of a DELETE (body and query); 400/415/422 as kube-apiserver answers."""
    options = DeleteOptions()
    raw = await request.body()
    if raw.strip():
        media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        try:
            if media == PROTOBUF:  # kube-controller-manager's deletes
                options = DeleteOptions.model_validate(await decode_protobuf(raw, decode_delete_options))
            else:
                options = DeleteOptions.model_validate_json(raw)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise bad_request(f"invalid DeleteOptions: {problems}") from e
    if options.dryRun:
        _dry_run(options.dryRun)
    policy = request.query_params.get("propagationPolicy") or options.propagationPolicy
    if policy is not None and options.orphanDependents is not None:
        raise invalid_request("propagationPolicy: Invalid value: orphanDependents and it cannot be both set")
    if policy is None and options.orphanDependents is not None:
        policy = "Orphan" if options.orphanDependents else "Background"
    policy = policy or "Background"
    if policy not in ("Background", "Foreground", "Orphan"):
        raise invalid_request(f"propagationPolicy: Unsupported value: {policy!r}: Background, Foreground, Orphan")
    grace = options.gracePeriodSeconds
    raw_grace = request.query_params.get("gracePeriodSeconds")
    if raw_grace is not None:
        try:
            grace = int(raw_grace)
        except ValueError as e:
            raise bad_request(f"invalid gracePeriodSeconds {raw_grace!r}: expected an integer") from e
    if grace is not None and grace < 0:
        grace = None  # kube: a negative grace period means "the object's default"
    pre = options.preconditions or {}
    pre_rv = parse_resource_version(pre.get("resourceVersion"), "preconditions.resourceVersion")
    return _Deletion(policy, grace, pre.get("uid") or None, pre_rv)


def _delete_one(store: Store, spec: ResourceSpec, ns: str | None, name: str, how: _Deletion) -> tuple[Obj, bool]:
    """One object's delete (finalizers, graceful pods, GC propagation): ``store.delete`` with ``how``."""
    return store.delete(spec, ns, name, **dataclasses.asdict(how))


async def _delete(call: Call) -> Response:
    spec, ns, name = call.spec, call.target.namespace, call.name
    how = await _deletion(call.request)
    obj, gone_now = await in_thread(_delete_one, call.store, spec, ns, name, how)
    if not gone_now or spec.return_deleted_object:
        return json_response(obj)
    details: dict[str, Any] = {"name": name, "kind": spec.resource, "uid": obj["metadata"].get("uid")}
    if spec.group:
        details["group"] = spec.group
    return json_response(success_body(details))


async def _deletecollection(call: Call) -> Response:
    """DELETE on a collection: every object the label/field selectors match, deleted as a single delete is.

    As kube-apiserver's ``DeleteCollection``: the collection is listed at one
    revision, each object goes through the single delete (finalizers,
    graceful pods, GC propagation, preconditions, so watchers see the same
    events), an object already gone is skipped, any other error ends the
    request; the answer is the list kind holding the listed objects.
    """
    spec, ns = call.spec, call.target.namespace
    if "deletecollection" not in spec.verbs:
        raise method_not_allowed(f"deletecollection is not supported on {spec.group_resource}")
    if spec.namespaced and ns is None:
        raise method_not_allowed(
            f"DELETE is not allowed on all {spec.resource}: delete a collection under "
            f"/namespaces/<namespace>/{spec.resource}"
        )
    labels, fields = query_selectors(call.request, spec, None)
    how = await _deletion(call.request)
    listed = await in_thread(call.store.list_page, spec, ns, labels, fields)
    deleted = await in_thread(_delete_listed, call.store, spec, listed.items, how)
    log.info("deletecollection of %s in %s: %d deleted", spec.group_resource, ns or "(cluster)", len(deleted))
    await call.crds_written()
    return _list_response(spec, {"resourceVersion": str(listed.revision)}, deleted)


def _delete_listed(store: Store, spec: ResourceSpec, items: list[Obj], how: _Deletion) -> list[Obj]:
    """Delete each listed object (one already gone is skipped, as kube does); the ones deleted or marked."""
    deleted: list[Obj] = []
    for obj in items:
        meta = obj["metadata"]
        with tolerating(404):
            _delete_one(store, spec, meta.get("namespace"), meta["name"], how)
        deleted.append(obj)
    return deleted


#: One handler per verb (the verb as kube-apiserver names it, also the metrics' ``verb`` label).
VERBS: dict[str, Callable[[Call], Awaitable[Response]]] = {
    "get": _get,
    "list": _list,
    "watch": _watch,
    "create": _create,
    "update": _update,
    "patch": _patch,
    "delete": _delete,
    "deletecollection": _deletecollection,
}
