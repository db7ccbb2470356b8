"""Kubernetes ``Status`` answers: :class:`ApiError` and its constructors.

Purpose
    Every failure the HTTP layer answers is an :class:`ApiError` carrying the
    fields of a Kubernetes ``metav1.Status`` (code, reason, message, details);
    the app turns it into JSON. :class:`ApiError`, :func:`status_object`,
    :func:`bad_request` and the 410 ``Expired`` (:func:`gone`,
    :func:`expired_status` and their messages) are the ones shared with the proxy
    (:mod:`rangeshard.core.kubeapi`); the constructors here mirror kube-apiserver's
    ``k8s.io/apimachinery/pkg/api/errors`` so clients (kubectl, the official
    Python client) see the reasons and messages they expect.

Invariants
    * ``ApiError`` is a :class:`rangeshard.core.errors.RangeshardError`: an expected
      failure, never a bug.
    * ``status_object`` always returns ``kind: Status, apiVersion: v1``.

Concurrency model
    Plain values; safe from any thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rangeshard.core.errors import (
    EtcdRequestTooLarge,
    FutureRevision,
    RegistryError,
    RegistryUnavailable,
    RevisionCompacted,
)
from rangeshard.core.kubeapi import (
    EXPIRED_CONTINUE_MESSAGE,
    ApiError,
    bad_request,
    expired_status,
    gone,
    status_object,
    too_old_message,
)

#: re-exported: the shared Status helpers
__all__ = [
    "EXPIRED_CONTINUE_MESSAGE",
    "ApiError",
    "bad_request",
    "expired_status",
    "gone",
    "status_object",
    "too_old_message",
]


@contextlib.contextmanager
def tolerating(*codes: int) -> Iterator[None]:
    """Swallow an :class:`ApiError` with one of ``codes`` (404: already gone, 409: already there or replaced)."""
    try:
        yield
    except ApiError as e:
        if e.code not in codes:
            raise


def success_body(details: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


def _details(group_resource: str, name: str | None) -> dict[str, Any]:
    kind, _, api_group = group_resource.partition(".")
    details: dict[str, Any] = {"kind": kind}
    if api_group:
        details["group"] = api_group
    if name:
        details["name"] = name
    return details


def not_found(group_resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{group_resource} "{name}" not found', _details(group_resource, name))


def already_exists(group_resource: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{group_resource} "{name}" already exists', _details(group_resource, name))


def conflict(group_resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource} "{name}": {why}',
        _details(group_resource, name),
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are ``(field, message)`` pairs."""
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    details: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
    }
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


def forbidden(group_resource: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{group_resource} "{name}" is forbidden: {why}', _details(group_resource, name))


def _plain(code: int, reason: str) -> Callable[[str], ApiError]:
    def make(message: str) -> ApiError:
        return ApiError(code, reason, message)

    return make


#: The Status errors without details, ``constructor(message)``: as kube's ``NewGone``, ``NewTimeoutError``...
not_found_path = _plain(404, "NotFound")
method_not_allowed = _plain(405, "MethodNotAllowed")
unsupported_media_type = _plain(415, "UnsupportedMediaType")
not_acceptable = _plain(406, "NotAcceptable")
timeout = _plain(504, "Timeout")
unavailable = _plain(503, "ServiceUnavailable")
invalid_request = _plain(422, "Invalid")  # an Invalid without field causes (a request option, not an object)


def etcd_errors(e: RegistryError) -> ApiError:
    """Translate an etcd failure into the Status kube-apiserver would answer."""
    if isinstance(e, RevisionCompacted):
        return gone(f"too old resource version: {e}")
    if isinstance(e, FutureRevision):
        return timeout("Too large resource version: the requested resourceVersion is newer than the store's")
    if isinstance(e, EtcdRequestTooLarge):
        # etcd's --max-request-bytes (1.5 MiB by default) is below the 3 MiB body limit, as with
        # kube-apiserver, which answers 413 for etcd's ErrRequestTooLarge too.
        return ApiError(413, "RequestEntityTooLarge", "Request entity too large: the object is too large for etcd")
    if isinstance(e, RegistryUnavailable):
        return unavailable(f"etcd is unavailable: {e}")
    return unavailable(f"storage error: {e}")
