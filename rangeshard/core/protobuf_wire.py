"""The Kubernetes protobuf wire format and the ``k8s\\0`` envelope, read with no generated code.

Purpose
    Kubernetes' own components (kube-controller-manager, kubelet, the
    scheduler) and kubectl's ``create`` generators send request bodies as
    ``application/vnd.kubernetes.protobuf``: the four magic bytes ``k8s\\0``
    followed by a ``runtime.Unknown`` message (``typeMeta`` = 1 with
    ``apiVersion`` = 1 and ``kind`` = 2; ``raw`` = 2, the object's own
    message; ``contentEncoding`` = 3; ``contentType`` = 4). This module reads
    the wire format and the envelope, with no generated code:
    :func:`iter_fields` is the sans-I/O wire reader and :func:`read_envelope`
    the envelope's, on which the table decoder
    (:mod:`rangeshard.core.protobuf_decode`: whole objects for the local API
    server, the ``ObjectMeta`` alone for the proxy's write fence) builds.

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

from rangeshard.core.errors import RangeshardError

#: The media type of Kubernetes protobuf bodies.
PROTOBUF_MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
#: The four bytes every Kubernetes protobuf body starts with.
MAGIC = b"k8s\x00"

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


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
