"""OpenAPI documents of the local API server: ``/openapi/v2``, ``/openapi/v3`` and ``/openapi/v3/<group-path>``.

Purpose
    kubectl's default validation (``apply -f``, ``create -f``, ``edit``)
    reads ``/openapi/v3`` and, for each object, looks for the ``PATCH``
    operation of its kind (``x-kubernetes-group-version-kind``) and its
    ``fieldValidation`` query parameter: when present, kubectl leaves field
    validation to the server (:mod:`local_apiserver.fieldvalidation`);
    ``kubectl apply`` also computes its strategic merge patches from the
    schemas' ``x-kubernetes-patch-*`` extensions, and ``kubectl explain``
    prints them. This module builds those documents for every served
    resource from the official definitions of Kubernetes v1.32 as shipped by
    the ``kubernetes-validate`` package (JSON-schema form, converted back to
    OpenAPI here), and serves :func:`schema_for` to field validation.

Invariants
    * Every document is derived from the resource table passed in (today
      :data:`local_apiserver.resources.RESOURCES`): a :class:`ResourceSpec`
      with an ``schema`` (a CRD's ``openAPIV3Schema``) is described
      by that schema, every other one by the built-in definition whose
      ``x-kubernetes-group-version-kind`` names its kind.
    * ``/openapi/v3`` lists one ``serverRelativeURL`` per served
      group-version with a content hash, so clients cache safely.
    * ``/openapi/v2`` is served as JSON only; kubectl asks it for protobuf
      (gnostic), which is answered 406, so kubectl falls back as it does for
      servers without v2.

Concurrency model
    The converted definitions are loaded once (``functools.cache``) and never
    mutated; documents are rebuilt when the resource table changes
    (:class:`OpenAPIDocuments`). Building runs in a worker thread; two
    concurrent rebuilds compute the same bytes, so the last write wins harmlessly.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from local_apiserver.resources import ResourceSpec
from rangeshard.core.rest import group_version_path

Obj = dict[str, Any]
#: The Kubernetes version whose definitions are served (as the server's /version says).
SCHEMA_DIR = "v1.32.0-local"
_PACKAGE = "kubernetes_validate"
_V2_REF = "#/definitions/"
_V3_REF = "#/components/schemas/"
_PATCH_TYPES = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)
_PATCH_DEF = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
_STATUS_DEF = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
_DELETE_OPTIONS_DEF = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"
_OBJECT_META_DEF = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_SCALE_DEF = "io.k8s.api.autoscaling.v1.Scale"


class OpenAPIUnavailable(RuntimeError):
    """The definitions package is missing or unreadable."""


def _convert(node: Any, top: bool = False) -> Any:
    """JSON-schema (kubernetes-validate's form) back to OpenAPI: single types, ``#/definitions/`` refs."""
    if isinstance(node, list):
        return [_convert(v) for v in node]
    if not isinstance(node, dict):
        return node
    one_of = node.get("oneOf")
    if isinstance(one_of, list):
        alternatives = {t for alt in one_of if isinstance(alt, dict) for t in _types(alt.get("type"))}
        out: Obj = {k: v for k, v in node.items() if k != "oneOf"}
        out["type"] = "string"
        if "integer" in alternatives:
            out["format"] = "int-or-string"
        return out
    out = {}
    for key, value in node.items():
        if key in ("$schema", "$id"):
            continue
        if key == "$ref" and isinstance(value, str):
            out[key] = _V2_REF + value.rpartition("/")[2]
        elif key == "type":
            kinds = _types(value)
            if kinds:
                out[key] = kinds[0]
        elif key == "properties" and isinstance(value, dict):
            props = {}
            for name, prop in value.items():
                converted = _convert(prop)
                if top and name in ("apiVersion", "kind") and isinstance(converted, dict):
                    converted.pop("enum", None)  # the JSON-schema form pins them; OpenAPI does not
                props[name] = converted
            out[key] = props
        else:
            out[key] = _convert(value)
    return out


def _types(value: Any) -> list[str]:
    if isinstance(value, str):
        return [] if value == "null" else [value]
    if isinstance(value, list):
        return [t for t in value if isinstance(t, str) and t != "null"]
    return []


@functools.cache
def builtin_definitions() -> dict[str, Obj]:
    """The official definitions (``io.k8s.api.apps.v1.Deployment``, ...) in OpenAPI v2 form."""
    try:
        path = importlib.resources.files(_PACKAGE).joinpath("kubernetes-json-schema", SCHEMA_DIR, "_definitions.json")
        raw = orjson.loads(path.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, orjson.JSONDecodeError) as e:
        raise OpenAPIUnavailable(f"cannot read the Kubernetes definitions from {_PACKAGE} ({SCHEMA_DIR}): {e}") from e
    return {name: _convert(node, top=True) for name, node in raw["$defs"].items()}


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, node in builtin_definitions().items():
        for gvk in node.get("x-kubernetes-group-version-kind") or ():
            key = (gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))
            out.setdefault(key, name)
    return out


def _reverse_group(group: str) -> str:
    return ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"


def definition_name(spec: ResourceSpec) -> str:
    """The definition that describes ``spec``'s kind (a CRD's is named as kube-apiserver names it)."""
    if spec.schema is None:
        name = _gvk_index().get((spec.group, spec.version, spec.kind))
        if name is not None:
            return name
    return f"{_reverse_group(spec.group)}.{spec.version}.{spec.kind}"


def _custom_definition(spec: ResourceSpec) -> Obj:
    """A served CRD version's (or an unknown kind's) definition from its ``openAPIV3Schema``."""
    schema: Obj = copy.deepcopy(dict(spec.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}))
    schema.setdefault("type", "object")
    props = schema.setdefault("properties", {})
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    props["metadata"] = {"$ref": _V2_REF + _OBJECT_META_DEF}
    schema["x-kubernetes-group-version-kind"] = [{"group": spec.group, "version": spec.version, "kind": spec.kind}]
    return schema


def definitions_for(specs: Iterable[ResourceSpec]) -> dict[str, Obj]:
    """The definitions of ``specs`` and everything they refer to (v2 refs)."""
    base = builtin_definitions()
    table: dict[str, Obj] = {}
    roots: list[str] = [_STATUS_DEF, _DELETE_OPTIONS_DEF, _PATCH_DEF]
    for spec in specs:
        name = definition_name(spec)
        if name not in base or spec.schema is not None:
            table[name] = _custom_definition(spec)
        roots.append(name)
        list_name = _gvk_index().get((spec.group, spec.version, spec.list_kind))
        if list_name is not None:
            roots.append(list_name)
        if spec.scale:
            roots.append(_SCALE_DEF)
    out: dict[str, Obj] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in out:
            continue
        node = table.get(name) or base.get(name)
        if node is None:
            continue
        out[name] = node
        pending.extend(_refs(node))
    return dict(sorted(out.items()))


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.removeprefix(_V2_REF)
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def schema_for(spec: ResourceSpec) -> tuple[Obj, Mapping[str, Obj]] | None:
    """``(kind schema, all definitions)`` for field validation; None when nothing describes the kind."""
    if spec.schema is not None:
        custom = _custom_definition(spec)
        return custom, builtin_definitions()
    name = _gvk_index().get((spec.group, spec.version, spec.kind))
    if name is None:
        return None
    definitions = builtin_definitions()
    return definitions[name], definitions


# ---- paths ---------------------------------------------------------------------------------------------


def group_path(group: str, version: str) -> str:
    """``api/v1`` or ``apis/<group>/<version>``: the key of a group-version in ``/openapi/v3``."""
    return group_version_path(group, version).removeprefix("/")


def _query(name: str, description: str) -> Obj:
    return {"name": name, "in": "query", "description": description, "schema": {"type": "string"}}


_FIELD_VALIDATION = _query(
    "fieldValidation",
    "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing "
    "unknown or duplicate fields. Valid values are: Ignore, Warn (the default) and Strict.",
)
_WRITE_PARAMS = (
    _query("dryRun", "All: validated, defaulted and checked, not written"),
    _query("fieldManager", "ignored"),
)


def _op(action: str, gvk: Obj, op_id: str, ref: str, *, body: str | None, params: list[Obj]) -> Obj:
    op: Obj = {
        "operationId": op_id,
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }
    if body is not None:
        types = [t for t in _PATCH_TYPES if body != "patch-custom" or "strategic" not in t]
        media = types if body.startswith("patch") else ["application/json", "application/yaml"]
        schema_ref = _V3_REF + _PATCH_DEF if body.startswith("patch") else ref
        op["requestBody"] = {"content": {m: {"schema": {"$ref": schema_ref}} for m in media}, "required": True}
    return op


def _paths(spec: ResourceSpec, kind_ref: str, list_ref: str | None) -> dict[str, Obj]:
    gvk = {"group": spec.group, "version": spec.version, "kind": spec.kind}
    base = group_version_path(spec.group, spec.version)
    coll = f"{base}/namespaces/{{namespace}}/{spec.resource}" if spec.namespaced else f"{base}/{spec.resource}"
    ident = f"{spec.group.replace('.', '_')}{spec.version}{spec.kind}"
    patch_body = "patch" if spec.schema is None else "patch-custom"
    write = [*_WRITE_PARAMS, _FIELD_VALIDATION]

    def read_write(gvk: Obj, name: str, ref: str, patch: str) -> dict[str, Obj]:
        return {
            "get": _op("get", gvk, f"read{name}", ref, body=None, params=[]),
            "put": _op("put", gvk, f"replace{name}", ref, body="object", params=list(write)),
            "patch": _op("patch", gvk, f"patch{name}", ref, body=patch, params=list(write)),
        }

    paths: dict[str, Obj] = {
        coll: {
            "get": _op("list", gvk, f"list{ident}", list_ref or kind_ref, body=None, params=[]),
            "post": _op("post", gvk, f"create{ident}", kind_ref, body="object", params=list(write)),
        },
        f"{coll}/{{name}}": {
            **read_write(gvk, ident, kind_ref, patch_body),
            "delete": _op("delete", gvk, f"delete{ident}", _V3_REF + _STATUS_DEF, body=None, params=[]),
        },
    }
    if spec.status:
        paths[f"{coll}/{{name}}/status"] = read_write(gvk, f"{ident}Status", kind_ref, patch_body)
    if spec.scale:
        scale_gvk = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
        paths[f"{coll}/{{name}}/scale"] = read_write(scale_gvk, f"{ident}Scale", _V3_REF + _SCALE_DEF, "patch")
    return paths


def _to_v3(node: Any) -> Any:
    """v2 definitions to v3 components: ``#/components/schemas/`` refs, a ref with siblings wrapped in ``allOf``."""
    if isinstance(node, list):
        return [_to_v3(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_v3(v) for k, v in node.items() if k != "$ref"}
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _V3_REF + ref.removeprefix(_V2_REF)
        if out:
            out["allOf"] = [{"$ref": target}]
        else:
            out["$ref"] = target
    if out.get("format") == "int-or-string":
        out["x-kubernetes-int-or-string"] = True
    return out


def _info() -> Obj:
    return {"title": "Kubernetes (rangeshard local API server)", "version": "v1.32.0"}


def v3_group_document(specs: Iterable[ResourceSpec], group: str, version: str) -> Obj | None:
    """The OpenAPI v3 document of one served group-version; None if none of ``specs`` is in it."""
    served = [s for s in specs if s.group == group and s.version == version]
    if not served:
        return None
    paths: dict[str, Obj] = {}
    for spec in served:
        list_name = _gvk_index().get((spec.group, spec.version, spec.list_kind))
        list_ref = _V3_REF + list_name if list_name is not None and spec.schema is None else None
        paths.update(_paths(spec, _V3_REF + definition_name(spec), list_ref))
    schemas = {name: _to_v3(node) for name, node in definitions_for(served).items()}
    return {"openapi": "3.0.0", "info": _info(), "paths": paths, "components": {"schemas": schemas}}


def v3_root(documents: Mapping[str, bytes]) -> Obj:
    """``/openapi/v3``: one ``serverRelativeURL`` (with the document's hash) per served group-version."""
    return {
        "paths": {
            path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={hashlib.sha512(doc).hexdigest().upper()}"}
            for path, doc in documents.items()
        }
    }


def v2_document(specs: Iterable[ResourceSpec]) -> Obj:
    """``/openapi/v2`` (Swagger 2.0, JSON): the definitions and the operations of every served resource."""
    served = list(specs)
    paths: dict[str, Obj] = {}
    for spec in served:
        for path, ops in _paths(spec, _V2_REF + definition_name(spec), None).items():
            v2_ops: dict[str, Obj] = {}
            for method, op in ops.items():
                params = [
                    {k: v for k, v in p.items() if k != "schema"} | {"type": "string", "uniqueItems": True}
                    for p in op["parameters"]
                ]
                if "requestBody" in op:
                    params.append({"name": "body", "in": "body", "required": True, "schema": {"type": "object"}})
                v2_ops[method] = {
                    "operationId": op["operationId"],
                    "consumes": ["application/json", "application/yaml"],
                    "produces": ["application/json"],
                    "parameters": params,
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": op["x-kubernetes-action"],
                    "x-kubernetes-group-version-kind": op["x-kubernetes-group-version-kind"],
                }
            paths[path] = v2_ops
    return {"swagger": "2.0", "info": _info(), "paths": paths, "definitions": definitions_for(served)}


class OpenAPIDocuments:
    """The encoded documents of the served resources (``source``), cached per table content.

    The key is each spec and the identity of its ``schema``: a new or changed CRD version shows up in the next
    request, with a new hash in ``/openapi/v3``.
    """

    def __init__(self, source: Callable[[], Iterable[ResourceSpec]]) -> None:
        self.source = source
        self._key: tuple[tuple[ResourceSpec, int], ...] | None = None
        self._specs: tuple[ResourceSpec, ...] = ()
        self._v2: bytes | None = None
        self._v3: dict[str, bytes] | None = None

    def _current(self) -> tuple[ResourceSpec, ...]:
        specs = tuple(self.source())
        key = tuple((s, id(s.schema)) for s in specs)
        if key != self._key:
            self._key, self._specs, self._v2, self._v3 = key, specs, None, None
        return self._specs

    def v3_documents(self) -> dict[str, bytes]:
        specs = self._current()
        if self._v3 is None:
            docs: dict[str, bytes] = {}
            for group, version in dict.fromkeys((s.group, s.version) for s in specs):
                doc = v3_group_document(specs, group, version)
                if doc is not None:
                    docs[group_path(group, version)] = orjson.dumps(doc)
            self._v3 = docs
        return self._v3

    def v3_root(self) -> bytes:
        return orjson.dumps(v3_root(self.v3_documents()))

    def v2(self) -> bytes:
        specs = self._current()
        if self._v2 is None:
            self._v2 = orjson.dumps(v2_document(specs))
        return self._v2
