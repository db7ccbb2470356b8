"""Reading Kubernetes protobuf bodies: the wire format, the ``k8s\\0`` envelope, and ``ObjectMeta``.

Purpose
    Kubernetes' own components (kube-controller-manager, kubelet, the
    scheduler) and kubectl's ``create`` generators send request bodies as
    ``application/vnd.kubernetes.protobuf``: the four magic bytes ``k8s\\0``
    followed by a ``runtime.Unknown`` message (``typeMeta`` = 1 with
    ``apiVersion`` = 1 and ``kind`` = 2; ``raw`` = 2, the object's own
    message; ``contentEncoding`` = 3; ``contentType`` = 4). Every built-in
    kind's message holds its ``ObjectMeta`` at field 1. This module reads
    exactly that much, with no generated code: :func:`read_envelope`,
    :func:`read_object_meta` (the JSON shape of the metadata: ``name``,
    ``generateName``, ``namespace``, ``uid``, ``resourceVersion``,
    ``generation``, ``labels``, ``annotations``, ``ownerReferences``,
    ``finalizers``) and :func:`object_identity` (envelope + metadata as a
    JSON-shaped partial object), which the proxy's write fence uses to find
    a write's shard key. :func:`iter_fields` is the sans-I/O wire reader
    the full decoder (:mod:`rangeshard.core.protobuf_decode`, which the
    local API server uses) builds on, with :func:`read_envelope`. :func:`read_write_body` reads a write's body of
    any media type a Kubernetes client sends (JSON, the YAML of a server-side
    apply patch, protobuf) far enough to find its object's metadata.

    Field numbers (``k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto``):
    ObjectMeta name 1, generateName 2, namespace 3, selfLink 4, uid 5,
    resourceVersion 6, generation 7, labels 11, annotations 12,
    ownerReferences 13, finalizers 14; OwnerReference kind 1, name 3, uid 4,
    apiVersion 5, controller 6, blockOwnerDeletion 7.

Invariants
    * Nothing here changes a body: callers forward the bytes they read,
      byte for byte.
    * Malformed input raises :class:`ProtobufError` (never ``IndexError`` or
      a decode error of another kind), naming what was wrong and where.
    * Unknown fields are skipped (a newer server's field is not an error
      when only the metadata is wanted).

Concurrency model
    Pure functions over ``bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from rangeshard.core.errors import RangeshardError

#: The media type of Kubernetes protobuf bodies.
PROTOBUF_MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
#: The four bytes every Kubernetes protobuf body starts with.
MAGIC = b"k8s\x00"

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MAX_DEPTH_BYTES = 64 * 1024 * 1024


class ProtobufError(RangeshardError):
    """A body that is not a well-formed Kubernetes protobuf message (the message says what and where)."""


def is_protobuf(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names Kubernetes protobuf (parameters ignored)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == PROTOBUF_MEDIA_TYPE


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError(f"truncated varint at byte {pos}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError(f"varint longer than 10 bytes at byte {pos}")


def iter_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """The ``(field number, wire type, value)`` of each field of one message, in order.

    Varints and fixed-width values are ints (unsigned; fixed ones little
    endian), length-delimited values are ``bytes``. Groups (wire types 3/4,
    unused by Kubernetes) are refused.
    """
    pos = 0
    end = len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise ProtobufError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = _varint(data, pos)
            yield field, wire, value
        elif wire == LENGTH:
            size, pos = _varint(data, pos)
            if size > end - pos:
                raise ProtobufError(f"field {field}: {size} bytes announced, {end - pos} left")
            yield field, wire, data[pos : pos + size]
            pos += size
        elif wire == FIXED64:
            if pos + 8 > end:
                raise ProtobufError(f"field {field}: truncated fixed64")
            yield field, wire, int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise ProtobufError(f"field {field}: truncated fixed32")
            yield field, wire, int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ProtobufError(f"field {field}: unsupported wire type {wire}")


def iter_varints(data: bytes) -> Iterator[int]:
    """The varints of a packed repeated field's bytes, in order."""
    pos = 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        yield value


def _text(field: int, value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{what} (field {field}) is not a string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtobufError(f"{what} (field {field}) is not UTF-8") from e


def _bytes(field: int, value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{what} (field {field}) is not a message")
    return value


def _int(field: int, value: int | bytes, what: str) -> int:
    if isinstance(value, bytes):
        raise ProtobufError(f"{what} (field {field}) is not a number")
    return value - (1 << 64) if value >= 1 << 63 else value  # int64 as two's complement


@dataclass(frozen=True, slots=True)
class Envelope:
    """The ``runtime.Unknown`` a Kubernetes protobuf body carries."""

    api_version: str
    kind: str
    raw: bytes
    content_encoding: str = ""
    content_type: str = ""


def read_envelope(data: bytes) -> Envelope:
    """Read the ``k8s\\0`` + ``runtime.Unknown`` envelope of a protobuf body."""
    if not data.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf body: it does not start with the bytes 'k8s\\x00'")
    api_version = kind = encoding = content_type = ""
    raw = b""
    for field, _wire, value in iter_fields(data[len(MAGIC) :]):
        if field == 1:
            for f, _w, v in iter_fields(_bytes(field, value, "typeMeta")):
                if f == 1:
                    api_version = _text(f, v, "typeMeta.apiVersion")
                elif f == 2:
                    kind = _text(f, v, "typeMeta.kind")
        elif field == 2:
            raw = _bytes(field, value, "raw")
        elif field == 3:
            encoding = _text(field, value, "contentEncoding")
        elif field == 4:
            content_type = _text(field, value, "contentType")
    if encoding:
        raise ProtobufError(f"contentEncoding {encoding!r} is not supported")
    return Envelope(api_version, kind, raw, encoding, content_type)


def _owner_reference(data: bytes) -> dict[str, Any]:
    ref: dict[str, Any] = {}
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    for field, _wire, value in iter_fields(data):
        if field in names:
            ref[names[field]] = _text(field, value, f"ownerReferences[].{names[field]}")
        elif field == 6:
            ref["controller"] = bool(_int(field, value, "ownerReferences[].controller"))
        elif field == 7:
            ref["blockOwnerDeletion"] = bool(_int(field, value, "ownerReferences[].blockOwnerDeletion"))
    return ref


def _map_entry(data: bytes, what: str) -> tuple[str, str]:
    key = val = ""
    for field, _wire, value in iter_fields(data):
        if field == 1:
            key = _text(field, value, f"{what} key")
        elif field == 2:
            val = _text(field, value, f"{what} value")
    return key, val


#: ObjectMeta's string fields by number.
_META_STRINGS = {1: "name", 2: "generateName", 3: "namespace", 4: "selfLink", 5: "uid", 6: "resourceVersion"}


def read_object_meta(message: bytes) -> dict[str, Any]:
    """The JSON-shaped metadata of an ``ObjectMeta`` message (the fields listed in the module docstring).

    As in JSON (``omitempty``), empty strings and a zero generation are left
    out: Go's proto2 encoder writes every string field, set or not.
    """
    meta: dict[str, Any] = {}
    for field, _wire, value in iter_fields(message):
        if field in _META_STRINGS:
            text = _text(field, value, f"metadata.{_META_STRINGS[field]}")
            if text:
                meta[_META_STRINGS[field]] = text
        elif field == 7:
            generation = _int(field, value, "metadata.generation")
            if generation:
                meta["generation"] = generation
        elif field in (11, 12):
            what = "labels" if field == 11 else "annotations"
            k, v = _map_entry(_bytes(field, value, f"metadata.{what}"), f"metadata.{what}")
            meta.setdefault(what, {})[k] = v
        elif field == 13:
            refs = meta.setdefault("ownerReferences", [])
            refs.append(_owner_reference(_bytes(field, value, "metadata.ownerReferences")))
        elif field == 14:
            meta.setdefault("finalizers", []).append(_text(field, value, "metadata.finalizers"))
    return meta


def object_identity(data: bytes) -> dict[str, Any]:
    """``{"apiVersion", "kind", "metadata"}`` of a protobuf body of a built-in kind (its ``ObjectMeta`` is field 1).

    Raises :class:`ProtobufError` when the body is not an object with
    metadata (another message type, a truncated or garbled body).
    """
    envelope = read_envelope(data)
    if not envelope.kind:
        raise ProtobufError("the envelope names no kind")
    meta: dict[str, Any] | None = None
    for field, _wire, value in iter_fields(envelope.raw):
        if field == 1:
            meta = read_object_meta(_bytes(field, value, f"{envelope.kind}.metadata"))
            break
    if meta is None:
        raise ProtobufError(f"the {envelope.kind} in the body has no metadata (field 1)")
    return {"apiVersion": envelope.api_version, "kind": envelope.kind, "metadata": meta}


def read_write_body(raw: bytes, content_type: str | None) -> Any:
    """The decoded body of a write, as far as its metadata goes; ``None`` when it is none of ours to read.

    Protobuf: :func:`object_identity` (raises :class:`ProtobufError` when it
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
