"""Whole Kubernetes protobuf objects as the JSON the same object has, driven by :mod:`rangeshard.core.protobuf_schema`.

Purpose
    :func:`decode_object` reads a ``k8s\\0`` body (the envelope through
    :func:`rangeshard.core.protobuf_wire.read_envelope`)
    of a kind in :data:`~rangeshard.core.protobuf_schema.KINDS` into the dict
    ``json.Marshal`` gives for the Go object ``proto.Unmarshal`` makes of it:
    kube-apiserver's answer to that body. :func:`decode_delete_options` does
    the same for a ``DeleteOptions`` body. The local API server then handles
    the dict exactly as a JSON body.

    JSON shape, as Go's ``encoding/json`` writes the Go type of each field:
      * a value scalar with ``omitempty`` is left out when zero (Go's encoder
        writes every non-pointer field, set or not); without it, it is
        written, zero when absent from the wire;
      * a pointer (``*T``) is written exactly when it is on the wire, zero or
        not;
      * a struct value is always written (its zero form when absent); of the
        special types, a zero ``Time``/``MicroTime`` and an absent
        ``RawExtension`` are ``null``, a zero ``IntOrString`` is ``0``, a zero
        ``Quantity`` ``"0"`` (so a zero ``creationTimestamp`` is ``null``, as
        kubectl 1.32 and the Kubernetes 1.32 the local API server reports
        write it);
      * a slice or map with ``omitempty`` is left out when empty, one without
        is ``null``; ``[]byte`` is base64 (standard alphabet, padded);
      * ``Time`` keeps seconds only (kube drops the nanoseconds of a protobuf
        ``Time``), ``MicroTime`` microseconds; ``Quantity`` strings are kept
        as written (Go's encoder writes the canonical form).

Invariants
    * Nothing is dropped: a field number the table does not know raises
      :class:`UnsupportedProtobuf` naming the kind, the message and the number;
      a kind not in the table raises it naming the kind. Both are 415s.
    * Anything malformed (a truncated body, a wire type that does not fit the
      field, a string that is not UTF-8, raw JSON that is not JSON) raises
      :class:`~rangeshard.core.protobuf_wire.ProtobufError` (a 400), never another
      exception.
    * A singular field given twice: the last scalar wins, messages merge
      (protobuf's rule); repeated scalars are read packed or not.

Concurrency model
    Pure functions; the parsed table is built once at import and never
    changed.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from rangeshard.core.protobuf_schema import DELETE_OPTIONS, KINDS, MESSAGES
from rangeshard.core.protobuf_wire import LENGTH, VARINT, ProtobufError, iter_fields, iter_varints, read_envelope
from rangeshard.core.timestamps import format_micro_time, format_time


class UnsupportedProtobuf(ProtobufError):
    """A well-formed protobuf body this server cannot decode without losing data: an unknown kind or field (415)."""


_SCALARS: Final = frozenset({"string", "bool", "int32", "int64", "bytes"})
_SPECIALS: Final = frozenset({"Time", "MicroTime", "IntOrString", "Quantity", "RawExtension", "FieldsV1"})


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message, parsed from its table entry."""

    number: int
    name: str  # the JSON name; "" for an inline struct
    shape: str  # "value", "pointer", "list", "map" or "inline"
    type: str  # a scalar, a special type or a qualified message name
    omitempty: bool

    @property
    def is_message(self) -> bool:
        return self.type not in _SCALARS and self.type not in _SPECIALS


def _parse_field(message: str, number: int, text: str) -> Field:
    package = message.rsplit(".", 1)[0]

    def qualify(type_: str) -> str:
        if type_ == "[]byte":
            return "bytes"
        if type_ in _SCALARS or type_ in _SPECIALS or "." in type_:
            return type_
        return f"{package}.{type_}"

    if text.startswith("..."):
        return Field(number, "", "inline", qualify(text[3:]), False)
    name, _, rest = text.partition(" ")
    type_, *options = rest.split(",")
    if type_.startswith("map[string]"):
        shape, type_ = "map", type_.removeprefix("map[string]")
    elif type_.startswith("[]") and type_ != "[]byte":
        shape, type_ = "list", type_[2:]
    elif type_.startswith("*"):
        shape, type_ = "pointer", type_[1:]
    else:
        shape = "value"
    return Field(number, name, shape, qualify(type_), "omitempty" in options)


def _load(table: dict[str, dict[int, str]]) -> dict[str, dict[int, Field]]:
    parsed = {msg: {n: _parse_field(msg, n, text) for n, text in fields.items()} for msg, fields in table.items()}
    for msg, fields in parsed.items():
        for f in fields.values():
            if f.is_message and f.type not in parsed:
                raise ProtobufError(f"protobuf table: {msg} field {f.number} names the unknown message {f.type}")
            if f.type == "bytes" and f.shape != "map":
                raise ProtobufError(f"protobuf table: {msg} field {f.number}: []byte is read only as a map value")
    return parsed


_TABLE: Final = _load(MESSAGES)
#: The message every built-in kind holds at field 1.
OBJECT_META: Final = "meta.v1.ObjectMeta"


def known_kinds() -> list[tuple[str, str]]:
    """The ``(apiVersion, kind)`` pairs whose protobuf bodies :func:`decode_object` reads."""
    return sorted(KINDS)


# ---- scalars ------------------------------------------------------------------------------------------------


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


class _Reader:
    """Decodes the messages of one body; ``kind`` names it in errors; ``skip_unknown``: the metadata-only mode."""

    def __init__(self, kind: str, *, skip_unknown: bool = False) -> None:
        self.kind = kind
        self.skip_unknown = skip_unknown

    def fail(self, where: str, what: str) -> ProtobufError:
        return ProtobufError(f"{self.kind} protobuf body: {where}: {what}")

    def scalar(self, type_: str, wire: int, value: int | bytes, where: str) -> Any:
        if type_ in ("string", "bytes"):
            if not isinstance(value, bytes):
                raise self.fail(where, f"wire type {wire} for a {type_} field (length-delimited)")
            if type_ == "bytes":
                return base64.b64encode(value).decode("ascii")
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise self.fail(where, "a string that is not UTF-8") from e
        if not isinstance(value, int) or wire != VARINT:
            article = "a" if type_ == "bool" else "an"
            raise self.fail(where, f"wire type {wire} for {article} {type_} field (a varint)")
        if type_ == "bool":
            return value != 0
        return _signed(value, 32 if type_ == "int32" else 64)

    def special(self, type_: str, data: bytes, where: str) -> Any:
        if type_ in ("Time", "MicroTime"):
            if not data:
                return None
            seconds = nanos = 0
            for number, wire, value in iter_fields(data):
                if number not in (1, 2):
                    raise UnsupportedProtobuf(f"unknown field {number} of {self.kind} ({type_} at {where})")
                if number == 1:
                    seconds = self.scalar("int64", wire, value, f"{where}.seconds")
                else:
                    nanos = self.scalar("int32", wire, value, f"{where}.nanos")
            try:
                moment = datetime.fromtimestamp(seconds, UTC)
            except (OverflowError, OSError, ValueError) as e:
                raise self.fail(where, f"a time of {seconds} seconds is out of range") from e
            if type_ == "Time":
                return format_time(moment)  # kube drops the nanoseconds of a protobuf Time
            micros = abs(nanos) // 1000 * (1 if nanos >= 0 else -1)  # Go truncates towards zero
            return format_micro_time(moment + timedelta(microseconds=micros))
        if type_ == "IntOrString":
            kind_, int_val, str_val = 0, 0, ""
            for number, wire, value in iter_fields(data):
                if number == 1:
                    kind_ = self.scalar("int64", wire, value, f"{where}.type")
                elif number == 2:
                    int_val = self.scalar("int32", wire, value, f"{where}.intVal")
                elif number == 3:
                    str_val = self.scalar("string", wire, value, f"{where}.strVal")
                else:
                    raise UnsupportedProtobuf(f"unknown field {number} of {self.kind} (IntOrString at {where})")
            if kind_ not in (0, 1):
                raise self.fail(where, f"IntOrString of type {kind_} (0: int, 1: string)")
            return str_val if kind_ == 1 else int_val
        if type_ == "Quantity":
            text = "0"
            for number, wire, value in iter_fields(data):
                if number != 1:
                    raise UnsupportedProtobuf(f"unknown field {number} of {self.kind} (Quantity at {where})")
                text = self.scalar("string", wire, value, where)
            return text
        # RawExtension, FieldsV1: raw = 1 holds JSON.
        raw: bytes | None = None
        for number, _wire, value in iter_fields(data):
            if number != 1:
                raise UnsupportedProtobuf(f"unknown field {number} of {self.kind} ({type_} at {where})")
            if not isinstance(value, bytes):
                raise self.fail(where, f"{type_}.raw is not length-delimited")
            raw = value
        if raw is None:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise self.fail(where, f"{type_} bytes are not JSON (an embedded protobuf object is not decoded)") from e

    def zero(self, field: Field) -> tuple[bool, Any]:
        """Whether Go's JSON writes ``field`` when it is absent from the wire, and what."""
        if field.shape in ("pointer", "inline"):
            return False, None
        if field.shape in ("list", "map"):
            return (not field.omitempty), None
        if field.type in _SCALARS and field.omitempty:
            return False, None
        return True, self.zero_element(field.type)  # (``bytes`` is only ever a map value: see _load)

    def value(self, field: Field, type_: str, wire: int, value: int | bytes, where: str) -> Any:
        """One element: a scalar, a special type or a message."""
        if type_ in _SCALARS:
            return self.scalar(type_, wire, value, where)
        if not isinstance(value, bytes) or wire != LENGTH:
            raise self.fail(where, f"wire type {wire} for a message field (length-delimited)")
        if type_ in _SPECIALS:
            return self.special(type_, value, where)
        return self.message(type_, value, where)

    def map_entry(self, field: Field, data: int | bytes, where: str) -> tuple[str, Any]:
        if not isinstance(data, bytes):
            raise self.fail(where, "a map entry that is not length-delimited")
        key, value, has_value = "", None, False
        for number, wire, item in iter_fields(data):
            if number == 1:
                key = self.scalar("string", wire, item, f"{where} key")
            elif number == 2:
                value, has_value = self.value(field, field.type, wire, item, f"{where}[{key}]"), True
            else:
                raise UnsupportedProtobuf(f"unknown field {number} of {self.kind} (map entry at {where})")
        if not has_value:
            value = self.zero_element(field.type)
        return key, value

    def zero_element(self, type_: str) -> Any:
        """The value Go's JSON writes for an element of ``type_`` that is absent from the wire."""
        if type_ in _SCALARS:
            return {"string": "", "bool": False, "int32": 0, "int64": 0, "bytes": ""}[type_]
        if type_ in _SPECIALS:
            return {"IntOrString": 0, "Quantity": "0"}.get(type_)
        return self.message(type_, b"", "")

    def repeated(self, field: Field, wire: int, value: int | bytes, where: str) -> list[Any]:
        """The elements of one occurrence of a repeated field (a packed run of varints is several)."""
        if field.type in ("bool", "int32", "int64") and wire == LENGTH and isinstance(value, bytes):
            return [self.scalar(field.type, VARINT, number, where) for number in iter_varints(value)]
        return [self.value(field, field.type, wire, value, where)]

    def message(self, name: str, data: bytes, where: str) -> dict[str, Any]:
        fields = _TABLE[name]
        singular: dict[int, Any] = {}
        merged: dict[int, bytes] = {}
        lists: dict[int, list[Any]] = {}
        maps: dict[int, dict[str, Any]] = {}
        for number, wire, value in iter_fields(data):
            field = fields.get(number)
            if field is None and self.skip_unknown:
                continue
            if field is None:
                at = f" at {where}" if where else ""
                raise UnsupportedProtobuf(
                    f"unknown field {number} of {self.kind} (in {name}{at}): the local API server "
                    "does not drop data it cannot decode; send JSON"
                )
            path = f"{where}.{field.name}" if where and field.name else field.name or where
            if field.shape == "list":
                lists.setdefault(number, []).extend(self.repeated(field, wire, value, path))
            elif field.shape == "map":
                key, item = self.map_entry(field, value, path)
                maps.setdefault(number, {})[key] = item
            elif (field.is_message or field.type in _SPECIALS) and isinstance(value, bytes):
                merged[number] = merged.get(number, b"") + value  # protobuf merges a repeated message
            else:
                singular[number] = self.value(field, field.type, wire, value, path)
        out: dict[str, Any] = {}
        for number, field in fields.items():
            path = f"{where}.{field.name}" if where and field.name else field.name or where
            result: Any
            present = True
            if number in lists:
                result = lists[number]
            elif number in maps:
                result = maps[number]
            elif number in merged:
                result = self.value(field, field.type, LENGTH, merged[number], path)
            elif number in singular:
                result = singular[number]
            else:
                present, result = False, None
            if field.shape == "inline":
                out.update(result if present else self.message(field.type, b"", path))
            elif not present:
                written, zero = self.zero(field)
                if written:
                    out[field.name] = zero
            elif not (field.shape == "value" and _omitted(field, result)):
                out[field.name] = result
        return out


def _omitted(field: Field, value: Any) -> bool:
    """Whether Go's JSON leaves out a value field that is on the wire (a struct value never is)."""
    return field.type in _SCALARS and field.omitempty and value in ("", 0, False)  # Go's zero values


def _decode(data: bytes, pick: Callable[[str, str], str]) -> dict[str, Any]:
    envelope = read_envelope(data)
    message = pick(envelope.api_version, envelope.kind)
    body = _Reader(envelope.kind).message(message, envelope.raw, "")
    return {"kind": envelope.kind, "apiVersion": envelope.api_version} | body


def decode_object(data: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf object of a kind in the table (module docstring).

    Raises :class:`UnsupportedProtobuf` for a kind or field the table does not
    know and :class:`~rangeshard.core.protobuf_wire.ProtobufError` for a malformed body.
    """

    def pick(api_version: str, kind: str) -> str:
        message = KINDS.get((api_version, kind))
        if message is None:
            named = f"{kind} ({api_version})" if kind else "an object whose envelope names no kind"
            raise UnsupportedProtobuf(f"the local API server does not decode protobuf bodies of {named}; send JSON")
        return message

    return _decode(data, pick)


def object_identity(data: bytes) -> dict[str, Any]:
    """``{"apiVersion", "kind", "metadata"}`` of a protobuf body of any built-in kind: the metadata-only mode.

    Every built-in kind holds its ``ObjectMeta`` at field 1; repeated field-1
    occurrences merge (protobuf's rule, as Go's ``proto.Unmarshal`` and
    :func:`decode_object` read them), the merged message is read by the same
    table as a whole object's, unknown fields skipped (a newer server's field
    does not hide the metadata), ``null`` values left out. The write fence
    uses it to find a write's shard key. Raises
    :class:`~rangeshard.core.protobuf_wire.ProtobufError` when the body is not an
    object with metadata (another message type, a truncated or garbled body).
    """
    envelope = read_envelope(data)
    if not envelope.kind:
        raise ProtobufError("the envelope names no kind")
    meta: bytes | None = None
    for number, wire, value in iter_fields(envelope.raw):
        if number == 1:
            if not isinstance(value, bytes):
                raise ProtobufError(f"{envelope.kind} protobuf body: metadata: wire type {wire} for a message")
            meta = (meta or b"") + value
    if meta is None:
        raise ProtobufError(f"the {envelope.kind} in the body has no metadata (field 1)")
    decoded = _Reader(envelope.kind, skip_unknown=True).message(OBJECT_META, meta, "metadata")
    metadata = {k: v for k, v in decoded.items() if v is not None}
    return {"apiVersion": envelope.api_version, "kind": envelope.kind, "metadata": metadata}


def decode_delete_options(data: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf ``DeleteOptions`` body (any apiVersion: client-go names the resource's)."""

    def pick(api_version: str, kind: str) -> str:
        if kind != "DeleteOptions":
            raise UnsupportedProtobuf(f"a DELETE body must be DeleteOptions, not {kind or 'nameless'} ({api_version})")
        return DELETE_OPTIONS

    return _decode(data, pick)
