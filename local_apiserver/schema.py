"""OpenAPI v3 schema validation and defaulting of custom resources (the ``openAPIV3Schema`` of a CRD).

Purpose
    :func:`schema_problems` checks an object against the structural schema of
    its CRD version and returns ``(field, message)`` causes in
    kube-apiserver's wording (``spec.size: Invalid value: "x": spec.size in
    body must be of type integer``); :func:`apply_schema_defaults` fills the
    schema's ``default`` values into an object.

    Implemented: ``type`` (object, array, string, integer, number, boolean),
    ``nullable``, ``properties``, ``required``, ``enum``,
    ``additionalProperties``, ``items``, ``minimum``/``maximum`` (and
    ``exclusive*``), ``minLength``/``maxLength``, ``pattern``,
    ``minItems``/``maxItems``, ``x-kubernetes-int-or-string``,
    ``x-kubernetes-preserve-unknown-fields`` and ``default``. Unknown fields
    (not in ``properties``, where unknown fields are not preserved) are
    errors naming the field, not silently pruned. Not implemented (accepted
    and ignored): ``format``, ``x-kubernetes-validations`` (CEL),
    ``x-kubernetes-list-type``/``-map-keys``, ``oneOf``/``anyOf``/``allOf``/``not``.

Invariants
    * ``metadata``, ``apiVersion`` and ``kind`` at the root are never checked
      against the schema (kube-apiserver validates them itself).
    * Validation never mutates; defaulting mutates only the object given.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson

_ROOT_FIELDS = ("apiVersion", "kind", "metadata")
_TYPE_NAMES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _show(value: Any) -> str:
    text = orjson.dumps(value).decode() if not isinstance(value, dict | list) else f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _type_ok(typ: str, value: Any, schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = _TYPE_NAMES.get(typ)
    return expected is None or isinstance(value, expected)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def schema_problems(schema: dict[str, Any], obj: dict[str, Any]) -> list[tuple[str, str]]:
    """Every way ``obj`` breaks ``schema`` (the root object's own metadata/apiVersion/kind excluded)."""
    out: list[tuple[str, str]] = []
    root = {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in _ROOT_FIELDS}
    required = [r for r in schema.get("required") or [] if r not in _ROOT_FIELDS]
    _check({**schema, "properties": props, "required": required}, root, "", out)
    return out


def _check(schema: dict[str, Any], value: Any, path: str, out: list[tuple[str, str]]) -> None:
    if value is None:
        if not schema.get("nullable") and schema.get("type"):
            out.append((path, f'Invalid value: "null": {path} in body must be of type {schema["type"]}: "null"'))
        return
    typ = schema.get("type")
    if isinstance(typ, str) and not _type_ok(typ, value, schema):
        shown = _show(type(value).__name__)
        out.append((path, f"Invalid value: {_show(value)}: {path} in body must be of type {typ}: {shown}"))
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        supported = ", ".join(_show(e) for e in enum)
        out.append((path, f"Unsupported value: {_show(value)}: supported values: {supported}"))
    if isinstance(value, dict):
        _check_object(schema, value, path, out)
    elif isinstance(value, list):
        _check_array(schema, value, path, out)
    elif isinstance(value, str):
        _check_string(schema, value, path, out)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(schema, value, path, out)


def _check_object(schema: dict[str, Any], value: dict[str, Any], path: str, out: list[tuple[str, str]]) -> None:
    props: dict[str, Any] = schema.get("properties") or {}
    for req in schema.get("required") or []:
        if req not in value:
            out.append((_join(path, req), "Required value"))
    extra = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    for key, item in value.items():
        sub = props.get(key)
        if isinstance(sub, dict):
            _check(sub, item, _join(path, key), out)
        elif isinstance(extra, dict):
            _check(extra, item, _join(path, key), out)
        elif extra is True or preserve or (not props and extra is None and schema.get("type") != "object"):
            continue
        else:
            out.append((_join(path, key), f'Invalid value: unknown field "{_join(path, key)}"'))
    for bound, cmp, word in (
        ("minProperties", len(value).__lt__, "at least"),
        ("maxProperties", len(value).__gt__, "at most"),
    ):
        limit = schema.get(bound)
        if isinstance(limit, int) and cmp(limit):
            out.append((path, f"Invalid value: {len(value)}: {path} in body should have {word} {limit} properties"))


def _check_array(schema: dict[str, Any], value: list[Any], path: str, out: list[tuple[str, str]]) -> None:
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _check(items, item, f"{path}[{i}]", out)
    low, high = schema.get("minItems"), schema.get("maxItems")
    if isinstance(low, int) and len(value) < low:
        out.append((path, f"Invalid value: {len(value)}: {path} in body should have at least {low} items"))
    if isinstance(high, int) and len(value) > high:
        out.append((path, f"Too many: {len(value)}: must have at most {high} items"))


def _check_string(schema: dict[str, Any], value: str, path: str, out: list[tuple[str, str]]) -> None:
    low, high, pattern = schema.get("minLength"), schema.get("maxLength"), schema.get("pattern")
    if isinstance(low, int) and len(value) < low:
        out.append((path, f"Invalid value: {_show(value)}: {path} in body should be at least {low} chars long"))
    if isinstance(high, int) and len(value) > high:
        out.append((path, f"Too long: may not be more than {high} bytes"))
    if isinstance(pattern, str):
        try:
            matched = re.search(pattern, value) is not None
        except re.error:
            matched = True  # a pattern Python cannot compile is not enforced
        if not matched:
            out.append((path, f"Invalid value: {_show(value)}: {path} in body should match '{pattern}'"))


def _check_number(schema: dict[str, Any], value: float, path: str, out: list[tuple[str, str]]) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int | float) and (value < low or (schema.get("exclusiveMinimum") is True and value == low)):
        word = "greater than" if schema.get("exclusiveMinimum") is True else "greater than or equal to"
        out.append((path, f"Invalid value: {_show(value)}: {path} in body should be {word} {low}"))
    if isinstance(high, int | float) and (value > high or (schema.get("exclusiveMaximum") is True and value == high)):
        word = "less than" if schema.get("exclusiveMaximum") is True else "less than or equal to"
        out.append((path, f"Invalid value: {_show(value)}: {path} in body should be {word} {high}"))


def apply_schema_defaults(schema: dict[str, Any], obj: Any) -> None:
    """Fill ``default`` values of ``schema`` into ``obj`` in place (missing fields only, recursively)."""
    if isinstance(obj, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        for key, sub in props.items():
            if not isinstance(sub, dict):
                continue
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_schema_defaults(sub, obj[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in obj.items():
                if key not in props:
                    apply_schema_defaults(extra, item)
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in obj:
                apply_schema_defaults(items, item)
