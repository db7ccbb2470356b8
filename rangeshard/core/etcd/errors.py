"""gRPC and pyetcd failures, mapped once onto rangeshard's error tree.

Purpose
    :func:`translate` turns what a pyetcd call raised into a :class:`~rangeshard.core.errors.RegistryError`
    subclass (raised ``from e``); :func:`retry_kind` says whether another member may answer it. Callers
    tell errors apart by type (``except RevisionCompacted``), never by message.

Invariants
    * By type: pyetcd's classes, else the gRPC status code (unwrapped from pyetcd's wrapper classes).
      Where etcd gives errors one code (OUT_OF_RANGE: compacted or future revision), its exact error
      description (etcd's ``rpctypes``) is looked up, as etcd's own Go client does.
    * gRPC's own text is read in one place: whether an UNAVAILABLE call was never sent
      (:data:`_UNSENT`); gRPC gives a refused and a reset connection the same code.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

from typing import Literal

import grpc
import pyetcd.exceptions as etcd_exc

from rangeshard.core.errors import (
    EtcdAuthFailed,
    EtcdRequestTooLarge,
    FutureRevision,
    RegistryError,
    RegistryUnavailable,
    RevisionCompacted,
    WatchCompacted,
)

#: ``"unsent"``: the request never reached a member that could act on it (any call may be
#: retried); ``"unknown"``: it may have been applied (only idempotent calls are retried);
#: ``None``: an answer (a permission error, a compacted revision...), not retried.
RetryKind = Literal["unsent", "unknown"] | None

_Code = grpc.StatusCode
_BY_CODE: dict[grpc.StatusCode, type[RegistryError]] = {
    _Code.UNAVAILABLE: RegistryUnavailable,
    _Code.DEADLINE_EXCEEDED: RegistryUnavailable,
    _Code.CANCELLED: RegistryUnavailable,
    _Code.UNAUTHENTICATED: EtcdAuthFailed,
    _Code.PERMISSION_DENIED: EtcdAuthFailed,
    _Code.RESOURCE_EXHAUSTED: EtcdRequestTooLarge,  # gRPC's message limit (etcd's own two are below)
}
# etcd's errors that share a code with others, by their exact description (api/v3rpc/rpctypes/error.go).
_BY_DESCRIPTION: dict[str, type[RegistryError]] = {
    "etcdserver: mvcc: required revision has been compacted": RevisionCompacted,
    "etcdserver: mvcc: required revision is a future revision": FutureRevision,
    "etcdserver: request is too large": EtcdRequestTooLarge,
    "etcdserver: authentication failed, invalid user ID or password": EtcdAuthFailed,
    "etcdserver: mvcc: database space exceeded": RegistryError,
    "etcdserver: too many requests": RegistryUnavailable,
}
_STALE = (_Code.UNAUTHENTICATED, "etcdserver: invalid auth token")  # authenticate again
# gRPC's words (lowercased) for a connection that was never made, and etcd's for a member without a leader.
_UNSENT = ("failed to connect", "connection refused", "no leader", "name resolution", "dns", "no route to host")


def status(e: BaseException) -> tuple[grpc.StatusCode | None, str]:
    """The gRPC status code and description of ``e`` (or of the ``RpcError`` pyetcd re-raised as ``e``)."""
    rpc = e if isinstance(e, grpc.RpcError) else e.__context__
    if isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code"):
        return rpc.code(), str(rpc.details() or "")
    return None, ""


def translate(e: BaseException, what: str) -> RegistryError:
    """Map a pyetcd/gRPC error to our tree (the caller raises it ``from e``)."""
    if isinstance(e, etcd_exc.RevisionCompactedError):
        rev = int(e.compacted_revision)
        return WatchCompacted(f"{what}: revision compacted (at {rev})", rev)
    if isinstance(e, etcd_exc.WatchTimedOut):
        return RegistryUnavailable(f"{what}: etcd did not confirm the watch in time")
    if isinstance(e, etcd_exc.NoServerAvailableError):
        return RegistryUnavailable(f"{what}: etcd unreachable (no member available)")
    code, details = status(e)
    if code is None:
        if isinstance(e, etcd_exc.ConnectionFailedError | etcd_exc.ConnectionTimeoutError):
            return RegistryUnavailable(f"{what}: etcd unreachable ({e})")
        return RegistryError(f"{what}: {type(e).__name__}: {e}")
    cls = _BY_DESCRIPTION.get(details) or _BY_CODE.get(code, RegistryError)
    if cls is RegistryUnavailable:
        return cls(f"{what}: etcd unreachable ({details or code.name})")
    return cls(f"{what}: etcd error {code.name}: {details}")


def retry_kind(e: BaseException) -> RetryKind:
    """Whether another member may answer what failed here (see :data:`RetryKind`)."""
    if isinstance(e, etcd_exc.NoServerAvailableError):
        return "unsent"
    if isinstance(e, etcd_exc.WatchTimedOut):
        return "unknown"
    code, details = status(e)
    if code == _Code.UNAVAILABLE:
        return "unsent" if any(s in details.lower() for s in _UNSENT) else "unknown"
    if code == _Code.DEADLINE_EXCEEDED:
        return "unknown"
    if code is None and isinstance(e, etcd_exc.ConnectionFailedError | etcd_exc.ConnectionTimeoutError):
        return "unknown"
    return None


def token_rejected(e: BaseException) -> bool:
    """etcd's answer to a stale auth token (expired, or invalidated by an auth change)."""
    return status(e) == _STALE


def details(e: BaseException) -> str:
    """A short description of ``e`` for a log line."""
    return status(e)[1] or type(e).__name__
