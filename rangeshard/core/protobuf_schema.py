"""The message table of Kubernetes' protobuf encoding, for the kinds the local API server decodes.

Purpose
    Loads the data file ``protobuf_schema.json`` beside this module (data,
    not code: 2,000 lines of field tables; ``kinds``, ``deleteOptions`` and
    ``messages``): for each protobuf message of the built-in kinds that
    :mod:`rangeshard.core.protobuf_decode` reads, its fields by number, each
    written as in the Go type it comes from (``k8s.io/api`` and
    ``k8s.io/apimachinery`` v0.36.3, read off each struct field's
    ``protobuf:"<wire>,<number>,..."`` and ``json:"<name>,<options>"`` tags;
    one JSON option as Kubernetes 1.32, the version the local API server
    reports, writes it: a zero ``creationTimestamp`` is ``null``):

    ``"<jsonName> <type>[,omitempty]"``, where ``<type>`` is
      * ``string``, ``bool``, ``int32``, ``int64``, or ``[]byte`` (inside a
        map only here: ``map[string][]byte``), with Go's shapes ``*T``
        (a pointer: written when set, zero or not), ``[]T`` (repeated) and
        ``map[string]T`` (map entries: key = 1, value = 2);
      * a message of this table: ``Name`` in the same package,
        ``pkg.v1.Name`` in another;
      * a Kubernetes type with its own encoding: ``Time`` and ``MicroTime``
        (``Timestamp``: seconds = 1, nanos = 2; RFC 3339, seconds resp.
        microseconds), ``IntOrString`` (type = 1, intVal = 2, strVal = 3),
        ``Quantity`` (string = 1), ``RawExtension`` and ``FieldsV1``
        (raw = 1, JSON bytes);
    or ``"...<type>"``: a struct embedded inline (its fields are the
    parent's in JSON, one message at that number on the wire).

    :data:`KINDS` maps an object's ``(apiVersion, kind)`` to its message.
    ``meta.v1.DeleteOptions`` is read for any apiVersion (client-go names the
    group version of the resource it deletes).

Invariants
    * A field listed here has the number, JSON name and Go shape Kubernetes
      publishes; a field not listed is unknown and its message is refused,
      never dropped (the decoder's rule).
    * The table is closed: every message a field names is a key of
      :data:`MESSAGES` (the decoder checks it when it loads).
    * Alpha and beta fields of v0.36 are listed like the others: their
      numbers are published, and a client that sets one is not refused.

Concurrency model
    Read once at import; immutable module data after that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import orjson

_DATA: Final[dict[str, Any]] = orjson.loads(Path(__file__).with_name("protobuf_schema.json").read_bytes())

#: The kinds whose protobuf bodies are decoded: ``(apiVersion, kind)`` -> message.
KINDS: Final[dict[tuple[str, str], str]] = {(api_version, kind): m for api_version, kind, m in _DATA["kinds"]}
#: The message of ``DeleteOptions`` (any apiVersion).
DELETE_OPTIONS: Final[str] = _DATA["deleteOptions"]
#: Every message: field number -> ``"<jsonName> <type>[,omitempty]"`` or ``"...<type>"`` (inline).
MESSAGES: Final[dict[str, dict[int, str]]] = {
    name: {int(number): field for number, field in fields.items()} for name, fields in _DATA["messages"].items()
}
