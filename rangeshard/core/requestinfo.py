"""What a request does, as kube-apiserver's ``RequestInfoFactory`` reads it: the one request classifier.

Purpose
    Every server and relay of ours asks the same questions of a request:
    which verb (``get`` vs ``list`` vs ``watch``, ``delete`` vs
    ``deletecollection``), which resource and subresource, is it a write, is
    it a watch. :func:`classify` answers them once from the method, the path
    (:func:`rangeshard.core.rest.parse_rest_path`) and the query;
    :func:`verb` is the verb rule alone, for a caller that parsed the path
    itself (the local API server's routing). Used by the local API server
    (authorization, metrics, its handlers), the range filter proxy
    (authorization of pass-through requests) and the external endpoint.

Invariants
    * Resource requests get kube's verbs: ``POST`` create, ``PUT`` update,
      ``PATCH`` patch, ``GET``/``HEAD`` get; a ``GET``/``HEAD`` of a
      collection is ``list``, or ``watch`` with ``watch=true``; the
      ``/watch/`` path prefix is ``watch`` whatever the method; a ``DELETE``
      of a collection is ``deletecollection``; any other method is its lower
      case name. A non-resource request's verb is the lower case method.
    * ``watch`` is read with :func:`rangeshard.core.listoptions.parse_bool`
      (Go's ``strconv.ParseBool`` set): ``watch=tRuE`` is not a watch; the
      ``400`` every server answers for it is :attr:`RequestInfo.invalid`,
      so a caller that refuses it refuses it in the same words.
    * Writes are ``POST``, ``PUT``, ``PATCH`` and ``DELETE``
      (:data:`WRITE_METHODS`), whatever the path; all but ``DELETE`` send
      the object (or a patch of it) as their body (:data:`OBJECT_BODY_METHODS`).

Concurrency model
    Pure functions and frozen values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rangeshard.core.kubeapi import ApiError
from rangeshard.core.listoptions import parse_bool
from rangeshard.core.rest import GVR, RestPath, parse_rest_path

#: The HTTP methods that write.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The writes whose body is the object (or a patch of it); a ``DELETE``'s is ``DeleteOptions``, if any.
OBJECT_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get", "HEAD": "get"}


def is_write(method: str) -> bool:
    """Whether ``method`` writes (``POST``, ``PUT``, ``PATCH``, ``DELETE``)."""
    return method in WRITE_METHODS


def verb(method: str, *, named: bool, watch: bool, watch_prefix: bool = False) -> str:
    """kube's verb of a resource request: ``named`` (the path names an object), ``watch`` (``watch=true``)."""
    if watch_prefix:
        return "watch"
    found = _METHOD_VERBS.get(method, method.lower())
    if found == "get" and not named:
        return "watch" if watch else "list"
    if found == "delete" and not named:
        return "deletecollection"
    return found


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request, classified (see module docstring); ``path`` is ``None`` for a non-resource request."""

    method: str
    verb: str
    path: RestPath | None
    #: The ``400`` of an unparsable ``watch`` parameter (the request is then classified as no watch).
    invalid: ApiError | None = None

    @property
    def resource(self) -> GVR | None:
        return self.path.gvr if self.path is not None else None

    @property
    def subresource(self) -> str:
        return self.path.subresource if self.path is not None else ""

    @property
    def collection(self) -> bool:
        """A resource request without an object name (list, watch, create, deletecollection)."""
        return self.path is not None and self.path.collection

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


def classify(method: str, path: str, params: Mapping[str, str]) -> RequestInfo:
    """Classify ``method path?params`` (``params``: the query, first value of each name)."""
    method = method.upper()
    target = parse_rest_path(path)
    if target is None:
        return RequestInfo(method, method.lower(), None)
    invalid: ApiError | None = None
    watch = False
    if method in ("GET", "HEAD") and target.collection:
        try:
            watch = bool(parse_bool(params, "watch"))
        except ApiError as e:
            invalid = e
    found = verb(method, named=not target.collection, watch=watch, watch_prefix=target.watch_prefix)
    return RequestInfo(method, found, target, invalid)
