"""Patches: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

Purpose
    Apply the two standard patch formats kube-apiserver accepts besides its
    own strategic merge patch (:mod:`local_apiserver.strategic`).

Invariants
    * Inputs are never mutated; results are fresh structures.
    * Every failure raises ``ApiError`` (400/422) with a message.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import copy
from typing import Any

from local_apiserver.errors import ApiError


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, allow_end: bool, path: str) -> int:
    if token == "-" and allow_end:  # noqa: S105 (a JSON pointer token, not a secret)
        return len(container)
    if not (token.isascii() and token.isdigit()) or (len(token) > 1 and token.startswith("0")):
        raise ApiError(422, "Invalid", f"invalid array index {token!r} in {path!r}")
    idx = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if idx > limit:
        raise ApiError(422, "Invalid", f"array index {idx} out of range in {path!r}")
    return idx


def _parent(doc: Any, tokens: list[str], path: str, op: str = "") -> tuple[dict[str, Any] | list[Any], str]:
    """The object or array holding the last token of ``path``, and that token (422 if a scalar is in the way)."""
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict):
            if t not in cur:
                raise ApiError(422, "Invalid", f"path {path!r}: {t!r} does not exist")
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_index(cur, t, False, path)]
        else:
            raise ApiError(422, "Invalid", f"path {path!r}: cannot descend into a scalar")
    if not isinstance(cur, dict | list):
        raise ApiError(422, "Invalid", f"{op}path {path!r}: cannot descend into a scalar")
    return cur, tokens[-1]


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, list):
        return parent[_index(parent, last, False, path)]
    if last not in parent:
        raise ApiError(422, "Invalid", f"path {path!r} does not exist")
    return parent[last]


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise ApiError(422, "Invalid", "cannot remove the whole document")
    parent, last = _parent(doc, tokens, path, "remove: ")
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, False, path))
    if last not in parent:
        raise ApiError(422, "Invalid", f"remove: path {path!r} does not exist")
    return parent.pop(last)


def _add(doc: Any, path: str, value: Any, replace: bool) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, list):
        if replace:
            parent[_index(parent, last, False, path)] = copy.deepcopy(value)
        else:
            parent.insert(_index(parent, last, True, path), copy.deepcopy(value))
    elif replace and last not in parent:
        raise ApiError(422, "Invalid", f"replace: path {path!r} does not exist")
    else:
        parent[last] = copy.deepcopy(value)
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: apply ``operations`` (a list) to a copy of ``target``."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a JSON array of operations")
    doc = copy.deepcopy(target)
    for n, op in enumerate(operations):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str) or not isinstance(op.get("path"), str):
            raise ApiError(400, "BadRequest", f"JSON patch operation {n} needs string 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise ApiError(400, "BadRequest", f"JSON patch operation {n} ({kind}) needs a 'value'")
        if kind in ("move", "copy") and not isinstance(op.get("from"), str):
            raise ApiError(400, "BadRequest", f"JSON patch operation {n} ({kind}) needs a string 'from'")
        if kind == "add":
            doc = _add(doc, path, op["value"], replace=False)
        elif kind == "replace":
            doc = _add(doc, path, op["value"], replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        elif kind == "copy":
            doc = _add(doc, path, _get(doc, op["from"]), replace=False)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ApiError(422, "Invalid", f"JSON patch test failed at {path!r}")
        else:
            raise ApiError(400, "BadRequest", f"JSON patch operation {n}: unknown op {kind!r}")
    return doc
