"""Request parsing of the local API server: paths, discovery documents, parameters, bodies.

Purpose
    ``parse_target`` maps a URL path to a resource :class:`Target` or to a
    discovery document (``/api``, ``/apis``, ``/apis/<group>[/<version>]``);
    the ``*_param`` helpers and ``selectors``/``shard_param`` parse query
    parameters; ``read_body`` decodes JSON/YAML bodies and the protobuf
    bodies of the built-in kinds in :mod:`rangeshard.core.protobuf_schema`
    (through :func:`rangeshard.core.protobuf_decode.decode_object`, into the
    JSON the same object has); ``check_accept`` refuses media types the
    server does not produce.

Invariants
    * Anything that does not parse is an ``ApiError`` (400/404/406/415) naming
      the problem; nothing here touches storage.
    * A protobuf body is decoded whole or refused: a kind or field the table
      does not know is a 415 naming it (nothing is dropped), a malformed one a
      400. Only creates and updates take protobuf, as in kube-apiserver.

Concurrency model
    Pure functions over the request (``read_body`` awaits the body; a large
    protobuf body is decoded in a worker thread, off the event loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from fastapi import Request

from hashing import SelectorSyntaxError, ShardSelector, parse_shard_selector, root_via
from local_apiserver import resources
from local_apiserver.errors import bad_request, not_acceptable, not_found_path, unsupported_media_type
from local_apiserver.resources import ResourceSpec
from local_apiserver.state import in_thread
from rangeshard.core.fieldlabels import field_labels
from rangeshard.core.kubeapi import media_ranges
from rangeshard.core.protobuf_decode import UnsupportedProtobuf, decode_object
from rangeshard.core.protobuf_wire import PROTOBUF_MEDIA_TYPE, ProtobufError
from rangeshard.core.rest import group_version, parse_rest_path, split_group_version
from rangeshard.core.selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector

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

PROTOBUF = PROTOBUF_MEDIA_TYPE
#: The hint of a 415 for a protobuf body the server cannot decode (an unknown kind or field). kubectl 1.32
#: sends protobuf from its typed `create <kind>` generators, Kubernetes' own controllers for every write.
PROTOBUF_HINT = (
    "; send it as JSON (client-go: ContentType application/json; kubectl: "
    "`kubectl create ... --dry-run=client -o yaml | kubectl apply -f -`)"
)
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


@dataclass(frozen=True)
class Target:
    """A parsed resource path."""

    spec: ResourceSpec
    namespace: str | None
    name: str | None
    subresource: str
    watch_path: bool


_BUILTIN_TABLE = resources.ResourceTable()


def named_groups(table: resources.ResourceTable = _BUILTIN_TABLE) -> list[tuple[str, list[str]]]:
    return [(g, v) for g, v in table.groups().items() if g] + [(g, ["v1"]) for g in REVIEW_GROUPS]


def _review_resource_list(group: str) -> dict[str, Any]:
    resource, kind = REVIEW_GROUPS[group]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1",
        "resources": [{"name": resource, "singularName": "", "namespaced": False, "kind": kind, "verbs": ["create"]}],
    }


def group_document(name: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]},
    }


def _resource_list(table: resources.ResourceTable, group: str, version: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for spec in table.by_group_version(group, version):
        entry: dict[str, Any] = {
            "name": spec.resource,
            "singularName": spec.singular,
            "namespaced": spec.namespaced,
            "kind": spec.kind,
            "verbs": list(spec.verbs),
        }
        if spec.short_names:
            entry["shortNames"] = list(spec.short_names)
        if spec.categories:
            entry["categories"] = list(spec.categories)
        out.append(entry)
        for subresource, served, kind in (
            ("status", spec.status, {"kind": spec.kind}),
            ("scale", spec.scale, {"group": "autoscaling", "version": "v1", "kind": "Scale"}),
        ):
            if served:
                sub = {"name": f"{spec.resource}/{subresource}", "singularName": "", "namespaced": spec.namespaced}
                out.append(sub | kind | {"verbs": ["get", "patch", "update"]})
        if spec.group == "" and spec.resource == "serviceaccounts":
            out.append(
                {
                    "name": "serviceaccounts/token",
                    "singularName": "",
                    "namespaced": True,
                    "group": "authentication.k8s.io",
                    "version": "v1",
                    "kind": "TokenRequest",
                    "verbs": ["create"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": out,
    }


NOT_FOUND = "the server could not find the requested resource"


def parse_target(path: str, table: resources.ResourceTable = _BUILTIN_TABLE) -> Target | dict[str, Any]:
    """A resource target, or a discovery document; 404 ``ApiError`` for anything else.

    ``table`` is the app's resource table (built-ins plus the CRDs it serves). Group, version,
    namespace, resource, name and subresource are read by :func:`rangeshard.core.rest.parse_rest_path`.
    """
    groups = table.groups()
    segs = path.strip("/").split("/")
    if segs == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"]}
    if segs == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [group_document(g, v) for g, v in named_groups(table)],
        }
    if len(segs) == 2 and segs[0] == "apis" and segs[1] and (segs[1] in groups or segs[1] in REVIEW_GROUPS):
        versions = groups.get(segs[1]) or ["v1"]
        return group_document(segs[1], versions) | {"kind": "APIGroup", "apiVersion": "v1"}
    split = split_group_version(path)
    if split is None:
        raise not_found_path(NOT_FOUND)
    group, version, rest = split
    if group in REVIEW_GROUPS:
        if version == "v1" and not rest:
            return _review_resource_list(group)
        raise not_found_path(NOT_FOUND)
    if version not in groups.get(group, []):
        raise not_found_path(NOT_FOUND)
    if not rest:
        return _resource_list(table, group, version)
    parsed = parse_rest_path(path)
    if parsed is None or parsed.tail:
        raise not_found_path(NOT_FOUND)
    resource = parsed.gvr.resource
    spec = table.lookup(group, version, resource)
    if spec is None:
        raise not_found_path(f"{NOT_FOUND} (no resource {resource!r} in {group or 'core'}/{version})")
    if parsed.namespace is not None and not spec.namespaced:
        raise not_found_path(f"{NOT_FOUND} ({spec.group_resource} is cluster-scoped, not in a namespace)")
    sub = parsed.subresource
    token = sub == "token" and spec.group == "" and spec.resource == "serviceaccounts"
    if sub and not ((sub == "status" and spec.status) or (sub == "scale" and spec.scale) or token):
        raise not_found_path(f"{NOT_FOUND} (no subresource {sub!r} of {spec.resource})")
    return Target(spec, parsed.namespace, parsed.name, sub, parsed.watch_prefix)


def check_accept(request: Request) -> None:
    accept = request.headers.get("accept")
    if not accept:
        return
    for media, params in media_ranges(accept):
        if media in ("application/json", "*/*", "application/*") and "as" not in params:
            return
    raise not_acceptable(
        f"only application/json (and meta.k8s.io/v1 Table for GET) is served by the local API server "
        f"(Accept: {accept}); protobuf is not served"
    )


async def read_body(request: Request, allowed: tuple[str, ...]) -> tuple[str, Any]:
    """The decoded request body and its media type; 415/400 on unsupported or malformed input.

    JSON and YAML as ``allowed``; protobuf wherever JSON is (creates and updates), decoded to the same JSON.
    """
    content_type = request.headers.get("content-type", "application/json")
    media = content_type.split(";")[0].strip().lower()
    if media == PROTOBUF and "application/json" in allowed:
        return PROTOBUF, await decode_protobuf(await request.body(), decode_object)
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


#: Protobuf bodies above this size are decoded in a worker thread (a 3 MiB body takes about a second in Python).
DECODE_IN_THREAD_BYTES = 64 * 1024


async def decode_protobuf(raw: bytes, decode: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
    """A protobuf body through ``decode`` (an object or DeleteOptions); 415 if undecodable, 400 if malformed."""
    try:
        return await in_thread(decode, raw) if len(raw) > DECODE_IN_THREAD_BYTES else decode(raw)
    except UnsupportedProtobuf as e:
        raise unsupported_media_type(f"{e}{PROTOBUF_HINT}") from e
    except ProtobufError as e:
        raise bad_request(f"couldn't decode the request body as {PROTOBUF}: {e}") from e


def query_selectors(request: Request, spec: ResourceSpec, name: str | None) -> tuple[LabelSelector, FieldSelector]:
    labels = parse_label_selector(request.query_params.get("labelSelector"))
    allowed = field_labels(spec.group, spec.resource)
    fields = parse_field_selector(request.query_params.get("fieldSelector"), allowed, spec.kind)
    if name is not None:
        fields = FieldSelector(
            (*fields.requirements, *parse_field_selector(f"metadata.name={name}", allowed, spec.kind).requirements)
        )
    return labels, fields


def shard_param(request: Request) -> ShardSelector | None:
    """The ``shardSelector`` (KEP-5866) of a list/watch, or None; 400 if malformed."""
    text = request.query_params.get("shardSelector")
    if text is None or text == "":
        return None
    try:
        selector = parse_shard_selector(text)
    except SelectorSyntaxError as e:
        raise bad_request(f"invalid shard selector: {e}") from e
    for path in selector.paths:
        if root_via(path):  # a chain through other kinds: only the proxy holds them
            raise bad_request(
                f"invalid shard selector: path {path} follows owner chains, which only the range filter proxy "
                "resolves (from its caches); send it through the proxy"
            )
    return selector
