"""The fast decoding of upstream watch lines: only the metadata the cache needs, typed, in one C pass.

Purpose
    A watch line of kube-apiserver is ``{"type":"T","object":<object>}`` and
    the watch cache needs only a few fields of the object: kind, apiVersion,
    and from ``metadata`` the name, namespace, uid, resourceVersion, labels
    and the controller ownerReference (for the shard hashes and the
    filters). ``orjson.loads`` builds the whole object as Python dicts and
    strings (~100 objects for a 1.2 KiB pod) and frees them right after:
    ~3 us per line and the largest single cost of the proxy (issue 17's
    profiles). :func:`decode_line` decodes the line with ``msgspec`` into
    :class:`WireLine`, whose structs name just those fields; every other
    member is skipped by the C parser without building anything (~1 us).

    The object's bytes the cache stores are cut out of the line, as before
    (see :func:`range_filter_proxy.watchstream.decode_watch_line`), so the
    object itself never needs to exist as a dict on this path.

Invariants
    * :func:`decode_line` returns ``None`` whenever the fast path cannot
      vouch for its answer: invalid JSON, a type other than the struct's
      (a label value that is not a string, a resourceVersion that is a
      number, a ``controller`` that is not a boolean...), an unknown
      top-level member, a missing ``metadata``/``kind``/``apiVersion``, or an
      event type other than ``ADDED``/``MODIFIED``/``DELETED``. The caller
      then decodes the line with the general path, which gives the exact
      error (or the lenient reading) it always gave.
    * What the fast path returns agrees with the general path on every field
      it carries (``tests/range_filter_proxy/test_wire.py`` checks this for
      generated objects).

    The structs are not tracked by the cyclic garbage collector
    (``gc=False``): they hold only strings, a dict of strings and each
    other, so they can never be part of a reference cycle, and at thousands
    of events a second they would otherwise trigger young collections.

Concurrency model
    Pure functions over immutable decoders; called from the proxy's event
    loop (the upstream read callback).
"""

from __future__ import annotations

import msgspec


class WireOwnerRef(msgspec.Struct, frozen=True, gc=False):
    """The two fields of an ownerReference the shard hash needs."""

    uid: str = ""
    controller: bool = False


class WireMeta(msgspec.Struct, frozen=True, gc=False):
    """The ``metadata`` fields the watch cache reads (everything else is skipped, not built)."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # noqa: N815 (the wire name)
    labels: dict[str, str] = {}
    ownerReferences: tuple[WireOwnerRef, ...] = ()  # noqa: N815

    def controller_uid(self) -> str | None:
        """The uid of the ownerReference with ``controller: true`` (the first one), if any."""
        return controller_uid(self.ownerReferences)


def controller_uid(refs: tuple[WireOwnerRef, ...]) -> str | None:
    """The uid of the first ownerReference with ``controller: true`` and a uid, if any."""
    for ref in refs:
        if ref.controller and ref.uid:
            return ref.uid
    return None


class WireObject(msgspec.Struct, frozen=True, gc=False):
    """An object as the cache sees it: its type and its metadata."""

    kind: str = ""
    apiVersion: str = ""  # noqa: N815
    metadata: WireMeta | None = None


class WireLine(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One watch line: exactly ``type`` and ``object`` (another member sends the line to the general path)."""

    type: str
    object: WireObject


_DECODER = msgspec.json.Decoder(WireLine)
#: The event types that carry an object (the others: BOOKMARK, ERROR).
OBJECT_EVENTS = frozenset(("ADDED", "MODIFIED", "DELETED"))


def decode_line(line: bytes) -> WireLine | None:
    """The line's type and metadata, or ``None`` when the general decoder must judge it (see module docstring)."""
    try:
        decoded = _DECODER.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    obj = decoded.object
    if decoded.type not in OBJECT_EVENTS or obj.metadata is None or not obj.kind or not obj.apiVersion:
        return None
    return decoded
