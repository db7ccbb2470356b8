"""Server-side field validation: ``fieldValidation=Strict|Warn|Ignore`` on create, update and patch.

Purpose
    kube-apiserver decodes a written object against its kind's schema: fields
    the schema does not know and fields given twice are errors with
    ``Strict`` (400 ``BadRequest``: ``... strict decoding error: unknown field
    "spec.foo", duplicate field "replicas"``), warnings with ``Warn`` (the
    default: the request succeeds and each problem comes back as a
    ``Warning: 299 - "unknown field \\"spec.foo\\""`` header) and silently
    dropped with ``Ignore``. Unknown fields are never stored. kubectl's
    default validation relies on this once ``/openapi/v3`` advertises the
    ``fieldValidation`` parameter (:mod:`local_apiserver.openapi`).

Invariants
    * The schema of a kind comes from :func:`local_apiserver.openapi.schema_for`
      (the official definitions, or a CRD's ``openAPIV3Schema``);
      ``x-kubernetes-preserve-unknown-fields``, free-form objects
      (``RawExtension``) and int-or-string values are not descended into.
    * Unknown-field paths are written as kube-apiserver writes them
      (``spec.template.spec.containers[0].foo``); duplicate fields by key
      (``duplicate field "replicas"``), in document order.
    * Pruning mutates the object in place and only removes what the schema
      does not know.

Concurrency model
    Pure functions over decoded bodies; safe from any thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from local_apiserver.errors import bad_request, invalid_request
from local_apiserver.openapi import OpenAPIUnavailable, schema_for
from local_apiserver.resources import ResourceSpec

Obj = dict[str, Any]
DIRECTIVES = ("Ignore", "Strict", "Warn")
_REF = "#/definitions/"


#: The directive used for a custom resource when the request names none: unknown fields are left in place
#: so the CRD's openAPIV3Schema validation answers 422 Invalid naming the field (kube-apiserver would prune
#: them silently; issue 13 asks for the error, so nothing is dropped without the client saying so).
SCHEMA = "Schema"


def directive(value: str | None, options_kind: str, *, custom: bool = False) -> str:
    """The ``fieldValidation`` directive (``Warn`` when absent; :data:`SCHEMA` for a custom resource).

    422 for anything else, as kube-apiserver.
    """
    if value is None or value == "":
        return SCHEMA if custom else "Warn"
    if value not in DIRECTIVES:
        raise invalid_request(
            f'{options_kind}.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "{value}": '
            'supported values: "", "Ignore", "Strict", "Warn"'
        )
    return value


# ---- duplicates ------------------------------------------------------------------------------------------


def _json_pairs(found: list[str]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                found.append(key)
            out[key] = value
        return out

    return hook


class _DuplicateKeyLoader(yaml.SafeLoader):
    """A safe loader that records keys given twice in one mapping."""

    duplicates: list[str]


def _construct_mapping(loader: _DuplicateKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str) and key in seen:
            loader.duplicates.append(key)
        if isinstance(key, str):
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_DuplicateKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def duplicate_fields(raw: bytes, media: str) -> tuple[str, ...]:
    """Keys given twice in one object of ``raw`` (JSON or YAML), in document order."""
    found: list[str] = []
    try:
        if media in ("application/yaml", "application/x-yaml"):
            loader = _DuplicateKeyLoader(raw)
            loader.duplicates = found
            try:
                loader.get_single_data()
            finally:
                loader.dispose()
        else:
            json.loads(raw, object_pairs_hook=_json_pairs(found))
    except (ValueError, yaml.YAMLError):
        return ()  # the body was decoded already; a parser disagreement is not the client's error
    return tuple(found)


# ---- unknown fields ---------------------------------------------------------------------------------------


def _resolve(schema: Any, definitions: Mapping[str, Obj]) -> Obj:
    for _ in range(32):
        if not isinstance(schema, dict):
            return {}
        ref = schema.get("$ref")
        if isinstance(ref, str):
            schema = definitions.get(ref.removeprefix(_REF), {})
            continue
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of and not schema.get("properties"):
            schema = all_of[0]
            continue
        return schema
    return {}


def _walk(value: Any, schema: Any, definitions: Mapping[str, Obj], path: str, out: list[str], prune: bool) -> None:
    node = _resolve(schema, definitions)
    if not node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("format") == "int-or-string":
        return
    if isinstance(value, dict):
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if isinstance(props, dict) and props:
            for key in list(value):
                child = f"{path}.{key}" if path else key
                if key in props:
                    _walk(value[key], props[key], definitions, child, out, prune)
                else:
                    out.append(child)
                    if prune:
                        del value[key]
        elif isinstance(extra, dict):
            for key, item in value.items():
                _walk(item, extra, definitions, f"{path}.{key}" if path else key, out, prune)
    elif isinstance(value, list):
        items = node.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _walk(item, items, definitions, f"{path}[{i}]", out, prune)


def unknown_fields(spec: ResourceSpec, obj: Any, *, prune: bool) -> tuple[str, ...]:
    """Paths of the fields of ``obj`` that ``spec``'s schema does not know (removed when ``prune``)."""
    try:
        found = schema_for(spec)
    except OpenAPIUnavailable:
        return ()
    if found is None:
        return ()
    schema, definitions = found
    out: list[str] = []
    _walk(obj, schema, definitions, "", out, prune)
    return tuple(out)


def check(spec: ResourceSpec, mode: str, obj: Any, duplicates: tuple[str, ...] = ()) -> list[str]:
    """Apply ``mode`` to a decoded object: raise 400 (Strict), or prune and return the warnings (Warn/Ignore).

    :data:`SCHEMA` checks nothing here: the custom resource's schema validation reports unknown fields.
    """
    if mode == SCHEMA:
        return []
    unknown = unknown_fields(spec, obj, prune=mode != "Strict")
    messages = [f'duplicate field "{d}"' for d in duplicates] + [f'unknown field "{u}"' for u in unknown]
    if not messages:
        return []
    if mode == "Strict":
        raise bad_request(
            f'{spec.kind} in version "{spec.version}" cannot be handled as a {spec.kind}: '
            f"strict decoding error: {', '.join(messages)}"
        )
    return messages if mode == "Warn" else []


def warning_headers(messages: list[str]) -> list[tuple[str, str]]:
    """``Warning`` headers (RFC 7234, code 299) for field-validation warnings.

    A header value must be printable ASCII (field names come from the client and may hold anything):
    backslash and quote are escaped, every other character outside ``' '..'~'`` becomes a
    ``\\uXXXX``/``\\UXXXXXXXX`` escape, so a strange key is reported, never a broken response.
    """
    return [("Warning", '299 - "' + _header_text(m) + '"') for m in messages]


def _header_text(text: str) -> str:
    out: list[str] = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(out)
