"""The one static authorization policy: the local API server's (``--token-file``) and the proxy's ``static`` mode.

Purpose
    :func:`authorize` decides a request of an authenticated user by its
    groups, the same way in both servers (docs/security.md):

    * group ``system:masters`` may do anything;
    * group ``rangeshard:readers`` may ``get``, ``list`` and ``watch`` every
      resource;
    * group ``rangeshard:auth-delegators`` may ``create`` ``tokenreviews``
      (authentication.k8s.io) and ``subjectaccessreviews``
      (authorization.k8s.io), which is what a proxy in ``delegate`` mode needs;
    * every authenticated user may ``get`` the discovery paths, as
      kube-apiserver's ``system:discovery`` and ``system:public-info-viewer``
      roles allow (``/api``, ``/apis`` and below, ``/openapi`` and below,
      ``/version``, ``/healthz``, ``/livez``, ``/readyz``), and ``/metrics``;
      nothing else.

    :data:`PUBLIC_PATHS` (the probes) need no authentication at all.

Invariants
    * ``head`` is ``get`` (kube-apiserver maps the method so).
    * Pure: no I/O, no state; the reason is for logs and SubjectAccessReview
      answers, never shows a token.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

from rangeshard.core.kubeapi import Attributes, UserInfo

MASTERS = "system:masters"
READERS = "rangeshard:readers"
AUTH_DELEGATORS = "rangeshard:auth-delegators"
READ_VERBS = frozenset({"get", "list", "watch"})
REVIEW_RESOURCES = frozenset(
    {("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")}
)
#: Paths answered without authentication (probes), as kube-apiserver's public-info rule does.
PUBLIC_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
_DISCOVERY_ROOTS = ("api", "apis", "openapi", "version", "metrics", "healthz", "livez", "readyz")


def is_discovery_path(path: str) -> bool:
    """Whether every authenticated user may read ``path`` (a non-resource path; see the module docstring)."""
    first = path.strip("/").split("/", 1)[0]
    return first in _DISCOVERY_ROOTS and (first in ("api", "apis", "openapi") or path.strip("/") == first)


def authorize(user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
    """The policy (module docstring): ``(allowed, reason)``."""
    verb = "get" if attrs.verb == "head" else attrs.verb
    if MASTERS in user.groups:
        return True, f"group {MASTERS} may do anything"
    if not attrs.resource:
        if verb == "get" and is_discovery_path(attrs.path):
            return True, "authenticated users may read the discovery paths"
        return False, "only get on the discovery paths (/api, /apis, /openapi, /version, /metrics) is allowed"
    if verb in READ_VERBS and READERS in user.groups:
        return True, f"group {READERS} may get, list and watch"
    if verb == "create" and (attrs.group, attrs.resource) in REVIEW_RESOURCES and AUTH_DELEGATORS in user.groups:
        return True, f"group {AUTH_DELEGATORS} may create {attrs.resource}"
    return False, "no rule of the static policy allows it"
