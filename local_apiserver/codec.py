"""How objects are stored in etcd: the stored form, resource versions, continue tokens.

Purpose
    The codec of :class:`~local_apiserver.store.Store`: :func:`decode` turns an
    etcd key-value into the API form of its object, :func:`encode` an object
    into the bytes stored, :func:`parse_resource_version` reads a client's
    ``resourceVersion`` and :func:`encode_continue`/:func:`decode_continue`
    write and read the ``continue`` tokens of paged lists.

Invariants
    * ``metadata.resourceVersion`` is never stored: it is the key's etcd mod
      revision, set by :func:`decode`.
    * A continue token names the etcd revision its list was read at and the
      key to go on from; anything else is a 400, as kube-apiserver answers.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import copy
from typing import Any

import orjson

from local_apiserver.conversion import to_api, to_storage
from local_apiserver.errors import bad_request, unavailable
from local_apiserver.resources import ResourceSpec
from rangeshard.core.etcd import KV

Obj = dict[str, Any]


def parse_resource_version(value: str | None, what: str = "resourceVersion") -> int | None:
    """``None``/"" -> None; a non-negative integer string -> int; anything else -> 400."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit():
        raise bad_request(f"invalid {what}: {value!r} is not a valid resource version (expected a decimal integer)")
    rv = int(value)
    if rv > 2**63 - 1:
        # etcd revisions are int64: a larger value can never exist (and would overflow the request).
        raise bad_request(f"invalid {what}: {value!r} is larger than any resource version (2^63-1)")
    return rv


def decode(spec: ResourceSpec, kv: KV) -> Obj:
    """The API form of the object stored at ``kv`` (its ``resourceVersion``: the key's mod revision); 503 if corrupt."""
    try:
        obj = orjson.loads(kv.value)
    except orjson.JSONDecodeError as e:
        raise unavailable(f"corrupt object at {kv.key}: {e}") from e
    if not isinstance(obj, dict):
        raise unavailable(f"corrupt object at {kv.key}: not a JSON object")
    obj.setdefault("kind", spec.kind)
    if spec.crd is not None:
        obj["apiVersion"] = spec.api_version  # the versions of a CRD share storage (conversion "None")
    obj.setdefault("apiVersion", spec.api_version)
    obj = to_api(spec, obj)
    obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
    return obj


def encode(obj: Obj) -> bytes:
    """The stored form of ``obj``: without ``resourceVersion`` and ``selfLink``."""
    stored = copy.copy(to_storage(obj))
    meta = dict(stored.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("selfLink", None)
    stored["metadata"] = meta
    return orjson.dumps(stored)


def encode_continue(revision: int, start_suffix: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start_suffix})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = orjson.loads(base64.urlsafe_b64decode(padded.encode()))
        rv = data["rv"]
        start = data["start"]
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(rv, int) or rv <= 0 or not isinstance(start, str):
            raise ValueError("bad fields")
        if "/" in start.rstrip("\0").strip("/") and start.count("/") > 1:
            raise ValueError("bad start key")
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError) as e:
        raise bad_request(f"continue key is not valid: {e}") from e
    return rv, start
