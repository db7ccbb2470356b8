"""The one walker of paths through decoded JSON objects (``spec.template.spec``).

Purpose
    Field selectors, field labels, server-side printing, API conversion and the
    scale subresource read (and set) values at dotted paths: :func:`dig` walks a
    sequence of keys, :func:`get_path` a dotted path (a leading ``.`` allowed, as
    in a CRD's scale paths), :func:`set_path` writes one.

Invariants
    * Reading never raises: a missing key or a non-object on the way is ``None``.
    * Writing creates the missing (or non-object) parents as objects.

Concurrency model
    Pure functions (:func:`set_path` mutates only the object it is given).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any


def _keys(path: str) -> list[str]:
    return [p for p in path.strip().lstrip(".").split(".") if p]


def dig(node: Any, keys: Iterable[str]) -> Any:
    """The value under ``keys`` in turn; ``None`` if one is absent or a value on the way is not an object."""
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def get_path(node: Any, path: str) -> Any:
    """The value at the dotted ``path``; ``None`` if absent."""
    return dig(node, _keys(path))


def set_path(node: MutableMapping[str, Any], path: str, value: Any) -> None:
    """Set the value at the dotted ``path``; missing (or non-object) parents become objects."""
    keys = _keys(path)
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, MutableMapping):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value
