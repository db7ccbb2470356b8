"""The workload of an external instance: the objects of its main resource the endpoint served the controller.

Purpose
    An in-process controller publishes its workload (``workloadNum`` and the
    histogram ``rangeshard rebalance`` plans with) from its informer. An
    external controller has no informer of ours, but every list and watch of
    its ``shard`` resources passes the endpoint, which already decodes each
    answer for its resourceVersion. :class:`MainObjects` keeps, from those
    answers, the key (by the entry's shard rule) of every object of the
    **main** resource (the ``shard`` entry with ``main: true``, else the
    first) the controller was given, and :meth:`MainObjects.workload` turns
    the ones in the instance's range into the count and histogram a
    registry record carries, exactly as the in-process controllers do.

Invariants
    * A list replaces what was known of its scope (its namespace, or all);
      ``ADDED``/``MODIFIED`` events set an object, ``DELETED`` removes it;
      answers cut by a reset are not applied (the endpoint checks the
      serving period first).
    * Objects outside the range are never counted; after a range change the
      controller relists (the endpoint resets its watches), which replaces
      them.

Concurrency model
    Written on the endpoint's event loop, read by the shard instance's
    heartbeat thread: one lock.
"""

from __future__ import annotations

import threading
from typing import Any

from hashing import HashRange, ShardBy
from registry.histogram import workload_histogram

Key = tuple[str, str]


def _identity(obj: Any) -> tuple[Key, Any] | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    return (str(meta.get("namespace") or ""), meta["name"]), obj


class MainObjects:
    """Keys of the main resource's objects the controller was served (see module docstring)."""

    def __init__(self, rule: ShardBy, label: str | None = None) -> None:
        self.rule = rule
        #: The label key of a ``by: label`` main resource.
        self.label = label
        self._lock = threading.Lock()
        self._keys: dict[Key, int | None] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def listed(self, doc: Any, namespace: str | None) -> None:
        """A list answer (decoded) of ``namespace`` (``None``: every namespace) replaces what was known of it."""
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            return
        found = {}
        for item in items:
            ident = _identity(item)
            if ident is not None:
                found[ident[0]] = self.rule.key(item, ident[0][0] or None, self.label)
        with self._lock:
            if namespace is None:
                self._keys = found
            else:
                self._keys = {k: v for k, v in self._keys.items() if k[0] != namespace}
                self._keys.update(found)

    def event(self, doc: Any) -> None:
        """One watch event (decoded)."""
        if not isinstance(doc, dict):
            return
        ident = _identity(doc.get("object"))
        if ident is None:
            return
        (key, obj), etype = ident, doc.get("type")
        with self._lock:
            if etype == "DELETED":
                self._keys.pop(key, None)
            elif etype in ("ADDED", "MODIFIED"):
                self._keys[key] = self.rule.key(obj, key[0] or None, self.label)

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        """``(objects in rng, histogram)`` for the registry record (the in-process controllers' shape)."""
        with self._lock:
            keys = [k for k in self._keys.values() if k is not None and rng.contains(k)]
        hist = workload_histogram(keys, rng)
        return sum(hist["objects"]), hist
