"""Kubernetes ``Status`` answers: :class:`ApiError` and its constructors.

Purpose
    Every failure the HTTP layer answers is an :class:`ApiError` carrying the
    fields of a Kubernetes ``metav1.Status`` (code, reason, message, details);
    the app turns it into JSON. :class:`ApiError`, :func:`status_object` and
    :func:`bad_request` are the ones shared with the proxy
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

from typing import Any

from rangeshard.core.kubeapi import ApiError, bad_request, status_object

__all__ = ["ApiError", "bad_request", "status_object"]  # re-exported: the shared Status helpers


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


def not_found_path(message: str) -> ApiError:
    return ApiError(404, "NotFound", message)


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


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", message)


def not_acceptable(message: str) -> ApiError:
    return ApiError(406, "NotAcceptable", message)


def forbidden(group_resource: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{group_resource} "{name}" is forbidden: {why}', _details(group_resource, name))


def timeout(message: str) -> ApiError:
    return ApiError(504, "Timeout", message)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "ServiceUnavailable", message)
