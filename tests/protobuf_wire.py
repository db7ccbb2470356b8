"""Hand-made Kubernetes protobuf bodies for tests: fields by number, the ``k8s\\0`` + ``runtime.Unknown`` envelope.

Deliberately tiny and independent of rangeshard's reader and table: a field is
a varint for an ``int`` (negative ints as 10-byte two's complement, as Go writes
them) and length-delimited for ``bytes``; callers name every field number.
"""

from __future__ import annotations

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def field(number: int, value: int | bytes) -> bytes:
    """One field: a varint for an int, length-delimited for bytes."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def body(api_version: str, kind: str, raw: bytes) -> bytes:
    """``raw`` (the object's message) in the envelope Go writes (empty contentEncoding and contentType included)."""
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, b"") + field(4, b"")


def meta(name: str, *more: bytes) -> bytes:
    """Field 1 of every built-in kind: an ObjectMeta with ``name`` (1) and any further ObjectMeta fields."""
    return field(1, field(1, name.encode()) + b"".join(more))
