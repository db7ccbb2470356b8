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
    ``root``                the ``uid`` of the top of the object's chain of    matches no range (not yet created)
                            controller ownerReferences through the ``via``
                            kinds (the object itself without a controller
                            owner); resolved by the proxy's caches
    ``label``               the value of the label ``label`` (an object        matches no range (not yet created)
                            without that label: its own ``metadata.uid``)
    ======================  =================================================  =====================================

    ``label`` is parameterised by the label key: its selector path names it,
    ``object.metadata.labels(tekton.dev/pipelineRun)`` (:func:`label_path`,
    :func:`label_of_path`). :class:`ObjectHashes` keeps the object's labels
    (:attr:`ObjectHashes.labels`) so any label key can be judged; the value's
    hash is memoised.

    ``root`` is parameterised by the kinds a chain may pass through (``via``,
    resources as ``resource.group``): its selector path names them,
    ``object.metadata.ownerReferences.root(replicasets.apps).uid``
    (:func:`root_path`, :func:`root_via`). Only a component that sees the
    intermediate objects can resolve it (the proxy: :mod:`range_filter_proxy.rootchain`);
    :attr:`ObjectHashes.root` holds the resolved hash; computed from the
    object alone it is the chain of one step (the controller owner's uid, else
    the object's own).

    :class:`ObjectHashes` holds the three 64-bit hashes of one object, so an
    object is hashed once and judged under any rule.

Invariants
    * ``ShardBy.of_path(r.path) is r`` for every rule ``r``; the paths are those
      of the ``shardSelector`` grammar (:mod:`hashing.selector`).
    * ``r.key(obj) == r.hash64(ObjectHashes.of(obj)) >> 1`` (``None`` when the
      value is absent): the key lies in an instance's int64 range exactly when
      the 64-bit hash lies in that range's selector term.
    * ``r.matches_absent`` is true only for ``owner``.
    * ``label_of_path(label_path(k)) == k`` for every valid label key ``k``; the
      methods of ``ShardBy.LABEL`` need the key (``label=``), ``ValueError`` without.
    * ``root_via(root_path(v)) == canonical_via(v)``; a root path is spelled
      canonically (``via`` sorted, without duplicates), so one chain has one path.

Concurrency model
    Immutable values and pure functions (the hash cache is a thread-safe
    ``functools.lru_cache``).
"""

from __future__ import annotations

import enum
import functools
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hashing.keys import controller_owner_uid, fnv1a_64
from hashing.resources import resource_label

UID_PATH = "object.metadata.uid"
NAMESPACE_PATH = "object.metadata.namespace"
OWNER_PATH = "object.metadata.ownerReferences.controller.uid"
#: The root path without ``via`` kinds (a chain of one step: the controller owner, else the object).
ROOT_PATH = "object.metadata.ownerReferences.root.uid"
#: Every fixed path a selector may name (plus the root paths with ``via``, :func:`root_path`, and the
#: label paths, :func:`label_path`).
PATHS = (UID_PATH, NAMESPACE_PATH, OWNER_PATH, ROOT_PATH)
_LABEL_PREFIX = "object.metadata.labels("
_LABEL_SUFFIX = ")"
#: A Kubernetes label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters.
_LABEL_KEY_RE = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def check_label_key(key: str) -> str:
    """``key`` if it is a Kubernetes label key (``tenant``, ``tekton.dev/pipelineRun``); ``ValueError`` otherwise."""
    if not isinstance(key, str) or not _LABEL_KEY_RE.fullmatch(key) or len(key.partition("/")[0]) > 253:
        raise ValueError(
            f"label key {key!r} is not a label key like tenant or tekton.dev/pipelineRun "
            "(optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.')"
        )
    return key


def label_path(key: str) -> str:
    """The selector path of the ``label`` rule for the label ``key`` (``ValueError`` for a bad key)."""
    return _LABEL_PREFIX + check_label_key(key) + _LABEL_SUFFIX


@functools.lru_cache(maxsize=256)
def label_of_path(path: str) -> str | None:
    """The label key of a label path; ``None`` when ``path`` is not one."""
    if not (path.startswith(_LABEL_PREFIX) and path.endswith(_LABEL_SUFFIX)):
        return None
    key = path[len(_LABEL_PREFIX) : -len(_LABEL_SUFFIX)]
    return key if _LABEL_KEY_RE.fullmatch(key) else None


@functools.lru_cache(maxsize=65536)
def _value_hash(value: str) -> int:
    return fnv1a_64(value)


#: The longest chain of controller owners followed (cycles and longer chains stop there).
MAX_CHAIN = 8
_ROOT_PREFIX = "object.metadata.ownerReferences.root("
_ROOT_SUFFIX = ").uid"


def canonical_via(via: Iterable[str]) -> tuple[str, ...]:
    """``via`` kinds as a root path spells them: ``resource.group`` (version dropped), sorted, each once.

    Each entry is read by the one resource-name parser (:func:`hashing.resources.resource_label`):
    ``ValueError`` naming the entry for anything that is not a lowercase resource name.
    """
    out: set[str] = set()
    for entry in via:
        try:
            out.add(resource_label(entry))
        except ValueError as e:
            raise ValueError(f"via entry {entry!r} is not a resource like replicasets.apps") from e
    return tuple(sorted(out))


def root_path(via: Iterable[str] = ()) -> str:
    """The selector path of the ``root`` rule through ``via`` (``ValueError`` for a bad entry)."""
    kinds = canonical_via(via)
    if not kinds:
        return ROOT_PATH
    return _ROOT_PREFIX + ",".join(kinds) + _ROOT_SUFFIX


@functools.lru_cache(maxsize=256)
def root_via(path: str) -> tuple[str, ...] | None:
    """The ``via`` kinds of a root path; ``None`` when ``path`` is not a root path (or not canonical).

    Memoised: :meth:`ShardBy.of_path` asks it for every root term a selector evaluates.
    """
    if path == ROOT_PATH:
        return ()
    if not (path.startswith(_ROOT_PREFIX) and path.endswith(_ROOT_SUFFIX)):
        return None
    inner = path[len(_ROOT_PREFIX) : -len(_ROOT_SUFFIX)]
    try:
        kinds = canonical_via(inner.split(","))
    except ValueError:
        return None
    return kinds if root_path(kinds) == path else None


def is_path(path: str) -> bool:
    """Whether ``path`` is one a selector may name (a fixed path, a canonical root path or a label path)."""
    return path in PATHS or root_via(path) is not None or label_of_path(path) is not None


@dataclass(frozen=True, slots=True)
class ObjectHashes:
    """The 64-bit hashes of one object, computed once (the proxy caches these)."""

    uid: int | None
    namespace: int | None
    owner: int | None
    #: The hash of the root uid (``by: root``): from the object alone the chain of one step (the
    #: controller owner's, else its own uid); a resolver that sees further sets it (:meth:`with_root`).
    root: int | None = None
    #: The object's labels (``by: label`` hashes one of their values; :meth:`label`). Not hashed.
    labels: Mapping[str, str] | None = field(default=None, hash=False)

    def with_root(self, root: int | None) -> ObjectHashes:
        """These hashes with ``root`` set (``self`` when it is already that)."""
        if root == self.root:
            return self
        return ObjectHashes(self.uid, self.namespace, self.owner, root, self.labels)

    def with_labels(self, labels: Mapping[str, str] | None) -> ObjectHashes:
        """These hashes with ``labels`` kept (``self`` when there are none, or they are these)."""
        if not labels and not self.labels:
            return self
        if labels is self.labels:
            return self
        return ObjectHashes(self.uid, self.namespace, self.owner, self.root, labels or None)

    def label(self, key: str) -> int | None:
        """The 64-bit hash the ``label`` rule compares: of the value of label ``key``, else of the uid."""
        labels = self.labels
        if labels:
            value = labels.get(key)
            if isinstance(value, str):
                return _value_hash(value)
        return self.uid

    @classmethod
    def of(cls, obj: Mapping[str, Any], namespace: str | None = None, *, with_labels: bool = True) -> ObjectHashes:
        """The hashes of a Kubernetes object (a decoded JSON mapping).

        ``namespace`` stands in for an absent ``metadata.namespace`` (a
        request body takes its namespace from the URL). ``with_labels``: keep
        a copy of its labels (the caller may attach its own with :meth:`with_labels`).
        """
        meta = obj.get("metadata")
        if not isinstance(meta, dict) and not isinstance(meta, Mapping):  # dict first: the ABC check is slow
            return _object_hashes(None, namespace or None, None)
        uid = meta.get("uid")
        ns = meta.get("namespace")
        hashes = _object_hashes(
            uid if isinstance(uid, str) and uid else None,
            ns if isinstance(ns, str) and ns else (namespace or None),
            controller_owner_uid(meta),
        )
        labels = meta.get("labels") if with_labels else None
        if isinstance(labels, Mapping) and labels:
            return hashes.with_labels({k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)})
        return hashes

    @staticmethod
    def of_fields(uid: str | None, namespace: str | None, owner: str | None) -> ObjectHashes:
        """The hashes of an object given its uid, namespace and controller owner uid (``None``/empty: absent)."""
        return _object_hashes(uid or None, namespace or None, owner or None)


@functools.lru_cache(maxsize=65536)
def _object_hashes(uid: str | None, namespace: str | None, owner: str | None) -> ObjectHashes:
    # Objects are updated far more often than created: the same strings give the same
    # (immutable) value, so an update neither hashes nor builds it again.
    uid_hash = fnv1a_64(uid) if uid is not None else None
    owner_hash = fnv1a_64(owner) if owner is not None else None
    return ObjectHashes(
        uid_hash,
        fnv1a_64(namespace) if namespace is not None else None,
        owner_hash,
        owner_hash if owner_hash is not None else uid_hash,  # the root seen from the object alone
    )


class ShardBy(enum.Enum):
    """What places an object in the hash space (see the module docstring's table)."""

    UID = "uid"
    OWNER = "owner"
    NAMESPACE = "namespace"
    ROOT = "root"
    LABEL = "label"

    @property
    def path(self) -> str:
        """The ``shardSelector`` path of this rule (``root``: without ``via``; see :func:`root_path`).

        ``label`` has no path without its key: ``ValueError`` (use :func:`label_path`).
        """
        try:
            return _PATH_OF[self]
        except KeyError:
            raise ValueError("the label rule's path names its label key: use label_path(key)") from None

    def path_for(self, *, via: Iterable[str] = (), label: str | None = None) -> str:
        """The selector path of this rule with its parameters (``root``: ``via``; ``label``: the key)."""
        if self is ShardBy.ROOT:
            return root_path(via)
        if self is ShardBy.LABEL:
            if label is None:
                raise ValueError("by: label needs a label key")
            return label_path(label)
        return _PATH_OF[self]

    @property
    def attribute(self) -> str:
        """The :class:`ObjectHashes` attribute this rule reads (``label``: none, see :func:`path_hash`)."""
        if self is ShardBy.LABEL:
            raise ValueError("the label rule reads ObjectHashes.label(key): use path_hash(path)")
        return str(self.value)

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
            if root_via(path) is not None:
                return ShardBy.ROOT
            if label_of_path(path) is not None:
                return ShardBy.LABEL
            raise ValueError(f"unsupported path {path!r}; supported: {', '.join(PATHS)}") from None

    @classmethod
    def parse(cls, name: str) -> ShardBy:
        """The rule called ``name`` (``uid``, ``owner``, ``namespace``, ``root``, ``label``); ``ValueError`` naming them
        otherwise."""
        try:
            return cls(name.strip())
        except ValueError:
            raise ValueError(f"unknown shard rule {name!r}; one of: {', '.join(r.value for r in cls)}") from None

    def hash64(self, hashes: ObjectHashes, label: str | None = None) -> int | None:
        """The 64-bit hash a selector of this rule compares (``None``: the value is absent).

        ``label``: the label key of the ``label`` rule (``ValueError`` without one).
        """
        if self is ShardBy.UID:
            return hashes.uid
        if self is ShardBy.OWNER:
            return hashes.owner
        if self is ShardBy.ROOT:
            return hashes.root
        if self is ShardBy.LABEL:
            if label is None:
                raise ValueError("by: label needs a label key")
            return hashes.label(label)
        return hashes.namespace

    def key(self, obj: Mapping[str, Any], namespace: str | None = None, label: str | None = None) -> int | None:
        """The 63-bit key of ``obj`` under this rule (``None``: the value is absent; see :attr:`matches_absent`).

        ``root`` from the object alone is the chain of one step (its controller
        owner's uid, else its own): only a resolver sees further up. ``label``:
        the label key of the ``label`` rule.
        """
        value = self.hash64(ObjectHashes.of(obj, namespace), label)
        return value >> 1 if value is not None else None

    def in_range(self, hashes: ObjectHashes, start: int, end: int, label: str | None = None) -> bool:
        """Whether an object with ``hashes`` matches the selector term ``[start, end)`` of this rule."""
        value = self.hash64(hashes, label)
        if value is None:
            return self.matches_absent
        return start <= value < end


def path_hash(path: str) -> Callable[[ObjectHashes], int | None]:
    """The 64-bit hash a term of ``path`` compares, as a function of :class:`ObjectHashes` (for hot loops).

    ``ValueError`` for a path that is not one (:meth:`ShardBy.of_path`).
    """
    rule = ShardBy.of_path(path)
    if rule is ShardBy.LABEL:
        key = label_of_path(path) or ""

        def label_hash(h: ObjectHashes) -> int | None:
            return h.label(key)

        return label_hash
    getter: Callable[[ObjectHashes], int | None] = operator.attrgetter(rule.attribute)
    return getter


_PATH_OF = {
    ShardBy.UID: UID_PATH,
    ShardBy.OWNER: OWNER_PATH,
    ShardBy.NAMESPACE: NAMESPACE_PATH,
    ShardBy.ROOT: ROOT_PATH,
}
_RULE_OF = {path: rule for rule, path in _PATH_OF.items()}
