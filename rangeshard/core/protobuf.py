"""A write's body read far enough to find its object's metadata, of any media type a Kubernetes client sends.

Purpose
    :func:`read_write_body` reads JSON, the YAML of a server-side apply
    patch, and Kubernetes protobuf (the ``ObjectMeta`` alone, through the
    table decoder's metadata-only mode,
    :func:`rangeshard.core.protobuf_decode.object_identity`); the proxy's
    write fence uses it to find a write's shard key. The wire reader itself
    is :mod:`rangeshard.core.protobuf_wire` (its names are re-exported here).

Invariants
    Nothing here changes a body: callers forward the bytes they read, byte
    for byte.

Concurrency model
    Pure functions over ``bytes``.
"""

from __future__ import annotations

from typing import Any

import orjson
import yaml

from rangeshard.core.protobuf_decode import object_identity
from rangeshard.core.protobuf_wire import MAGIC, PROTOBUF_MEDIA_TYPE, ProtobufError, is_protobuf

__all__ = ["MAGIC", "PROTOBUF_MEDIA_TYPE", "ProtobufError", "is_protobuf", "object_identity", "read_write_body"]


def read_write_body(raw: bytes, content_type: str | None) -> Any:
    """The decoded body of a write, as far as its metadata goes; ``None`` when it is none of ours to read.

    Protobuf: :func:`rangeshard.core.protobuf_decode.object_identity` (raises :class:`ProtobufError` when it
    cannot be read: the caller decides whether that is fatal). JSON and the
    YAML of ``application/apply-patch+yaml``: the parsed document. Anything
    else, or malformed JSON/YAML (the API server answers that one), is
    ``None``.
    """
    if not raw:
        return None
    if is_protobuf(content_type) or raw.startswith(MAGIC):
        return object_identity(raw)
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media.endswith("yaml"):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError:
            return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
