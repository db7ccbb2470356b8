"""Authentication and authorization of the local API server: a static token file and a fixed policy.

Purpose
    With ``--token-file FILE`` the local API server authenticates every
    request by its ``Authorization: Bearer <token>`` header against the file
    (kube-apiserver's ``--token-auth-file`` format: CSV lines
    ``token,user,uid[,"group1,group2"]``) and authorizes it with one built-in
    policy, documented in ``docs/security.md``:

    * group ``system:masters`` may do anything;
    * group ``rangeshard:readers`` may ``get``, ``list`` and ``watch`` every
      resource;
    * group ``rangeshard:auth-delegators`` may ``create`` ``tokenreviews``
      (authentication.k8s.io) and ``subjectaccessreviews``
      (authorization.k8s.io), which is what a proxy in ``delegate`` mode needs;
    * every authenticated user may ``GET`` non-resource paths (discovery,
      ``/version``, ``/metrics``), and nothing else.

    :func:`token_review` and :func:`subject_access_review` answer the
    ``TokenReview`` and ``SubjectAccessReview`` APIs from the same file and
    policy, so a proxy can delegate to this server exactly as to a real
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

import logging
from collections.abc import Mapping
from typing import Any

from local_apiserver.errors import ApiError, bad_request, invalid_request
from rangeshard.core.kubeapi import Attributes, UserInfo, token_digest

log = logging.getLogger(__name__)

MASTERS = "system:masters"
AUTH_DELEGATORS = "rangeshard:auth-delegators"
READERS = "rangeshard:readers"
READ_VERBS = frozenset({"get", "list", "watch"})
REVIEW_RESOURCES = frozenset(
    {("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")}
)
#: Paths answered without authentication (probes), as kube-apiserver's public-info rule does.
PUBLIC_PATHS = frozenset({"/healthz", "/livez", "/readyz"})


class TokenAuthenticator:
    """Bearer tokens from a token file."""

    def __init__(self, users: Mapping[str, UserInfo]) -> None:
        self._users = dict(users)

    def authenticate(self, token: str) -> UserInfo | None:
        """The user of ``token``, or None."""
        if not token:
            return None
        return self._users.get(token_digest(token))

    def authenticate_header(self, authorization: str | None) -> UserInfo | None:
        """The user of an ``Authorization`` header value (``Bearer <token>``), or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.authenticate(token.strip())


def authorize(user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
    """The built-in policy (module docstring): ``(allowed, reason)``."""
    if MASTERS in user.groups:
        return True, f"group {MASTERS} may do anything"
    if not attrs.resource:
        if attrs.verb in ("get", "head"):
            return True, "authenticated users may read non-resource paths"
        return False, "only get on non-resource paths is allowed"
    if attrs.verb in READ_VERBS and READERS in user.groups:
        return True, f"group {READERS} may get, list and watch"
    if attrs.verb == "create" and (attrs.group, attrs.resource) in REVIEW_RESOURCES and AUTH_DELEGATORS in user.groups:
        return True, f"group {AUTH_DELEGATORS} may create {attrs.resource}"
    return False, "no rule of the built-in policy allows it"


def unauthorized() -> ApiError:
    """401 Unauthorized, as kube-apiserver words it."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden_error(user: UserInfo, attrs: Attributes) -> ApiError:
    """403 Forbidden with kube-apiserver's message."""
    who = f'User "{user.username}"'
    if not attrs.resource:
        message = f'forbidden: {who} cannot {attrs.verb} path "{attrs.path}"'
        return ApiError(403, "Forbidden", message, {})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    group_resource = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    subject = f'{group_resource} "{attrs.name}"' if attrs.name else group_resource
    message = (
        f'{subject} is forbidden: {who} cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    )
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.group:
        details["group"] = attrs.group
    if attrs.name:
        details["name"] = attrs.name
    return ApiError(403, "Forbidden", message, details)


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


def token_review(authenticator: TokenAuthenticator | None, body: Any) -> dict[str, Any]:
    """Answer a ``TokenReview`` (authentication.k8s.io/v1)."""
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
        user = authenticator.authenticate(token)
        if user is not None:
            status = {"authenticated": True, "user": user.to_json()}
            if audiences:
                status["audiences"] = audiences
        else:
            status["error"] = "invalid bearer token"
    return _review("TokenReview", api_version, spec, status)


def subject_access_review(body: Any) -> dict[str, Any]:
    """Answer a ``SubjectAccessReview`` (authorization.k8s.io/v1) with the built-in policy."""
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
    allowed, reason = authorize(UserInfo(user, uid, tuple(groups)), attrs)
    return _review("SubjectAccessReview", api_version, spec, {"allowed": allowed, "reason": reason})
