"""Authentication and authorization of the local API server: a static token file and a fixed policy.

Purpose
    With ``--token-file FILE`` the local API server authenticates every
    request by its ``Authorization: Bearer <token>`` header against the file
    (kube-apiserver's ``--token-auth-file`` format: CSV lines
    ``token,user,uid[,"group1,group2"]``) and authorizes it with the static
    policy the proxy's ``static`` mode uses too (:mod:`rangeshard.core.policy`,
    documented in ``docs/security.md``).

    :func:`token_review` and :func:`parse_subject_access_review` with
    :func:`subject_access_review_answer` answer the ``TokenReview`` and
    ``SubjectAccessReview`` APIs from the same file and the server's
    authorizer, so a proxy can delegate to this server exactly as to a real
    kube-apiserver.

Invariants
    * Tokens are never logged, never part of an error message and never kept
      in memory in clear: the table is keyed by the SHA-256 of each token.
    * Every authenticated user carries the group ``system:authenticated``.
    * Without a token file nothing is authenticated (every request is
      allowed, as before); ``TokenReview`` then answers ``authenticated: false``.

Concurrency model
    Immutable after loading; safe from any thread and task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from local_apiserver.errors import bad_request, invalid_request
from rangeshard.core.kubeapi import Attributes, StaticTokens, UserInfo


def _object(body: Any, kind: str, api_version: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a {kind} object")
    if body.get("kind") not in (None, kind):
        raise bad_request(f"expected kind {kind}, got {body.get('kind')!r}")
    if body.get("apiVersion") not in (None, api_version):
        raise bad_request(f"expected apiVersion {api_version}, got {body.get('apiVersion')!r}")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise bad_request(f"{kind}: spec must be an object")
    return spec


def _strings(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"{field} must be a list of strings")
    return list(value)


def _review(kind: str, api_version: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The answer to a review: the request's ``spec`` and its ``status``."""
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


def token_review(
    authenticator: StaticTokens | None, body: Any, user_of: Callable[[str], UserInfo | None] | None = None
) -> dict[str, Any]:
    """Answer a ``TokenReview`` (authentication.k8s.io/v1); ``user_of`` also knows ServiceAccount tokens."""
    api_version = "authentication.k8s.io/v1"
    spec = _object(body, "TokenReview", api_version)
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise bad_request("token is required for TokenReview in authentication")
    audiences = _strings(spec.get("audiences"), "spec.audiences")
    status: dict[str, Any] = {"authenticated": False, "user": {}}
    if authenticator is None:
        status["error"] = "token authentication is not configured (no --token-file)"
    else:
        user = user_of(token) if user_of is not None else authenticator.authenticate(token)
        if user is not None:
            status = {"authenticated": True, "user": user.to_json()}
            if audiences:
                status["audiences"] = audiences
        else:
            status["error"] = "invalid bearer token"
    return _review("TokenReview", api_version, spec, status)


def subject_access_review_answer(spec: dict[str, Any], allowed: bool, reason: str) -> dict[str, Any]:
    """The ``SubjectAccessReview`` answered: the request's spec and the decision."""
    status = {"allowed": allowed, "reason": reason}
    return _review("SubjectAccessReview", "authorization.k8s.io/v1", spec, status)


def parse_subject_access_review(body: Any) -> tuple[dict[str, Any], UserInfo, Attributes]:
    """The spec of a ``SubjectAccessReview``, its user and the attributes to decide (400/422 when malformed)."""
    api_version = "authorization.k8s.io/v1"
    spec = _object(body, "SubjectAccessReview", api_version)
    user = spec.get("user") or ""
    uid = spec.get("uid") or ""
    if not isinstance(user, str) or not isinstance(uid, str):
        raise bad_request("spec.user and spec.uid must be strings")
    groups = _strings(spec.get("groups"), "spec.groups")
    if not user and not groups:
        raise invalid_request(
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": '
            "at least one of user or group must be specified"
        )
    res, nonres = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    attrs_doc = res if res is not None else nonres
    if (res is None) == (nonres is None) or not isinstance(attrs_doc, dict):
        raise invalid_request(
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
            "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        )

    def text(name: str) -> str:
        value = attrs_doc.get(name) or ""
        if not isinstance(value, str):
            raise bad_request(f"{name} must be a string")
        return value

    if res is not None:
        attrs = Attributes(
            verb=text("verb"),
            resource=text("resource") or "-",  # an empty resource is still a resource request
            group=text("group"),
            namespace=text("namespace"),
            name=text("name"),
            subresource=text("subresource"),
        )
    else:
        attrs = Attributes(verb=text("verb"), path=text("path"))
    return spec, UserInfo(user, uid, tuple(groups)), attrs
