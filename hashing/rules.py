"""The one shard rule: which hash places an object.

Purpose
    :class:`ShardBy` answers, for every component, "which hash places this
    object": its selector path (what an informer, the endpoint and the proxy
    put in a ``shardSelector``), the 64-bit hash the selector compares, and
    the 63-bit key (what the write fence and the audit check compare with an
    instance's range). Nothing else in the code base decides it.

    ======================  =================================================  =====================================
    rule                    hashed value                                       object without that value
    ======================  =================================================  =====================================
    ``uid``                 ``metadata.uid``                                   matches no range (not yet created)
    ``owner``               the ``uid`` of the ownerReference with             matches **every** range: an orphan
                            ``controller: true``                               stays visible, so it can be adopted
    ``namespace``           ``metadata.namespace``                             matches no range (cluster-scoped)
    ======================  =================================================  =====================================

    :class:`ObjectHashes` holds the three 64-bit hashes of one object, so an
    object is hashed once and judged under any rule.

Invariants
    * ``ShardBy.of_path(r.path) is r`` for every rule ``r``; the paths are those
      of the ``shardSelector`` grammar (:mod:`hashing.selector`).
    * ``r.key(obj) == r.hash64(ObjectHashes.of(obj)) >> 1`` (``None`` when the
      value is absent): the key lies in an instance's int64 range exactly when
      the 64-bit hash lies in that range's selector term.
    * ``r.matches_absent`` is true only for ``owner``.

Concurrency model
    Immutable values and pure functions (the hash cache is a thread-safe
    ``functools.lru_cache``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hashing.keys import controller_owner_uid, fnv1a_64

UID_PATH = "object.metadata.uid"
NAMESPACE_PATH = "object.metadata.namespace"
OWNER_PATH = "object.metadata.ownerReferences.controller.uid"
#: Every path a selector may name.
PATHS = (UID_PATH, NAMESPACE_PATH, OWNER_PATH)


@dataclass(frozen=True, slots=True)
class ObjectHashes:
    """The 64-bit hashes of one object, computed once (the proxy caches these)."""

    uid: int | None
    namespace: int | None
    owner: int | None

    @classmethod
    def of(cls, obj: Mapping[str, Any], namespace: str | None = None) -> ObjectHashes:
        """The hashes of a Kubernetes object (a decoded JSON mapping).

        ``namespace`` stands in for an absent ``metadata.namespace`` (a
        request body takes its namespace from the URL).
        """
        meta = obj.get("metadata")
        if not isinstance(meta, dict) and not isinstance(meta, Mapping):  # dict first: the ABC check is slow
            return _object_hashes(None, namespace or None, None)
        uid = meta.get("uid")
        ns = meta.get("namespace")
        return _object_hashes(
            uid if isinstance(uid, str) and uid else None,
            ns if isinstance(ns, str) and ns else (namespace or None),
            controller_owner_uid(meta),
        )

    @staticmethod
    def of_fields(uid: str | None, namespace: str | None, owner: str | None) -> ObjectHashes:
        """The hashes of an object given its uid, namespace and controller owner uid (``None``/empty: absent)."""
        return _object_hashes(uid or None, namespace or None, owner or None)


@functools.lru_cache(maxsize=65536)
def _object_hashes(uid: str | None, namespace: str | None, owner: str | None) -> ObjectHashes:
    # Objects are updated far more often than created: the same strings give the same
    # (immutable) value, so an update neither hashes nor builds it again.
    return ObjectHashes(
        fnv1a_64(uid) if uid is not None else None,
        fnv1a_64(namespace) if namespace is not None else None,
        fnv1a_64(owner) if owner is not None else None,
    )


class ShardBy(enum.Enum):
    """What places an object in the hash space (see the module docstring's table)."""

    UID = "uid"
    OWNER = "owner"
    NAMESPACE = "namespace"

    @property
    def path(self) -> str:
        """The ``shardSelector`` path of this rule."""
        return _PATH_OF[self]

    @property
    def attribute(self) -> str:
        """The :class:`ObjectHashes` attribute this rule reads."""
        return self.value

    @property
    def matches_absent(self) -> bool:
        """Whether an object without the hashed value matches every range (``owner``) or none."""
        return self is ShardBy.OWNER

    @classmethod
    def of_path(cls, path: str) -> ShardBy:
        """The rule of a selector path; ``ValueError`` naming the supported paths otherwise."""
        try:
            return _RULE_OF[path]
        except KeyError:
            raise ValueError(f"unsupported path {path!r}; supported: {', '.join(PATHS)}") from None

    @classmethod
    def parse(cls, name: str) -> ShardBy:
        """The rule called ``name`` (``uid``, ``owner``, ``namespace``); ``ValueError`` naming them otherwise."""
        try:
            return cls(name.strip())
        except ValueError:
            raise ValueError(f"unknown shard rule {name!r}; one of: {', '.join(r.value for r in cls)}") from None

    def hash64(self, hashes: ObjectHashes) -> int | None:
        """The 64-bit hash a selector of this rule compares (``None``: the value is absent)."""
        if self is ShardBy.UID:
            return hashes.uid
        if self is ShardBy.OWNER:
            return hashes.owner
        return hashes.namespace

    def key(self, obj: Mapping[str, Any], namespace: str | None = None) -> int | None:
        """The 63-bit key of ``obj`` under this rule (``None``: the value is absent; see :attr:`matches_absent`)."""
        value = self.hash64(ObjectHashes.of(obj, namespace))
        return value >> 1 if value is not None else None

    def in_range(self, hashes: ObjectHashes, start: int, end: int) -> bool:
        """Whether an object with ``hashes`` matches the selector term ``[start, end)`` of this rule."""
        value = self.hash64(hashes)
        if value is None:
            return self.matches_absent
        return start <= value < end


_PATH_OF = {ShardBy.UID: UID_PATH, ShardBy.OWNER: OWNER_PATH, ShardBy.NAMESPACE: NAMESPACE_PATH}
_RULE_OF = {path: rule for rule, path in _PATH_OF.items()}
