"""Lists after a range change: never older than the giver's last writes, served from the proxy's cache.

Purpose
    A list without a resourceVersion is a consistent read: the proxy can
    serve it from its watch cache only once it proved the cache as fresh as
    the API server, which a real kube-apiserver allows about once a minute
    for a quiet resource (its bookmarks); otherwise the proxy lists upstream
    (``range_filter_proxy_consistent_read_fallbacks_total``), O(all objects)
    per handover. What a taker needs is less: data not older than what it
    saw itself and than what the giver wrote before it let the keys go. So:

    * every instance records, per ``shard`` resource (``plural.group``
      label), the highest resourceVersion of its successful writes
      (:class:`WrittenVersions`: the in-process fenced API client, the
      external endpoint's write relay);
    * it publishes them in its registry record
      (``handoverResourceVersions``) with every heartbeat, in the same etcd
      transaction as the unlock of its receivers, and when it parks or
      leaves (:class:`controller_manager.sharding.ShardInstance`);
    * every instance keeps the highest version each peer published, over
      every registry view it saw (:class:`PeerFloors`), so a record that
      vanished (a crash, a leave) still counts;
    * a list after a range change asks for
      ``resourceVersion=<floor>&resourceVersionMatch=NotOlderThan``
      (:func:`list_params`), floor = the highest of its own last version and
      the peers' published ones for that resource, which the proxy answers
      from its cache once the cache reached it (a ``504`` if it does not in
      time; the list is then a consistent read once, :func:`list_params`).

Invariants
    * A giver publishes in the transaction that unlocks its receivers,
      after its drain (no reconcile, no write of a moved key in flight): the
      view in which a receiver sees itself unlocked holds every write of the
      giver, and its first list after it is not older than any of them.
    * Versions only grow: :meth:`WrittenVersions.record` and
      :meth:`PeerFloors.seen` keep the maximum per resource; a value that
      is not a decimal integer is ignored.
    * A crashed giver's writes after its last heartbeat are not published:
      its range moves only after its lease expired (``leaseTTLSeconds``
      after its last keepalive), far longer than the proxy's cache lags
      (docs/reliability.md).

Concurrency model
    :class:`WrittenVersions` and :class:`PeerFloors` are locked: written by
    workers (or the endpoint's loop) and the state-machine thread, read by
    informers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from rangeshard.core.objpath import dig


def as_version(value: object) -> int | None:
    """A resourceVersion as an int (``None``: not a decimal integer, e.g. ``""``)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def version_of(doc: Any) -> int | None:
    """``metadata.resourceVersion`` of a decoded object or list (``None`` when absent or not a number)."""
    return as_version(dig(doc, ("metadata", "resourceVersion")))


def written_version(data: Any) -> int | None:
    """The resourceVersion of a write's JSON answer (the object as written; ``None``: empty, not JSON, a Status)."""
    try:
        return version_of(orjson.loads(data)) if isinstance(data, bytes | str) and data else None
    except orjson.JSONDecodeError:
        return None


def merge(into: dict[str, int], versions: Mapping[str, object] | None) -> bool:
    """Raise ``into``'s versions to ``versions``' (per label); True if one grew."""
    grew = False
    for label, value in (versions or {}).items():
        rv = as_version(value)
        if rv is not None and rv > into.get(label, 0):
            into[label] = rv
            grew = True
    return grew


class WrittenVersions:
    """The highest resourceVersion of this instance's successful writes, per resource label."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}

    def record(self, label: str, resource_version: object) -> None:
        with self._lock:
            merge(self._versions, {label: resource_version})

    def get(self, label: str) -> int:
        with self._lock:
            return self._versions.get(label, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._versions)


class PeerFloors:
    """The highest version every peer ever published, per resource label (records that vanished included)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}

    def seen(self, published: Iterable[Mapping[str, object] | None]) -> None:
        """Fold in what the records of one registry view publish (``handoverResourceVersions`` each)."""
        with self._lock:
            for versions in published:
                merge(self._versions, versions)

    def get(self, label: str) -> int:
        with self._lock:
            return self._versions.get(label, 0)


def list_params(floor: int, *, unreachable: bool = False) -> dict[str, str]:
    """The resourceVersion parameters of the first page of a list after a (re)start or range change.

    ``floor``: the highest version known of the resource (own and peers'):
    "not older than" it, served from the proxy's cache. Without one, any
    version (``0``), as client-go's first list: nothing of the resource was
    seen or published yet. ``unreachable``: the last list at a floor timed out
    (``504``, the cache never got there): a consistent read, once.
    """
    if unreachable:
        return {}
    if floor <= 0:
        return {"resourceVersion": "0"}
    return {"resourceVersion": str(floor), "resourceVersionMatch": "NotOlderThan"}
