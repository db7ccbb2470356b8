"""RBAC authorization of the local API server (``--authorization-mode RBAC``), evaluated as kube does.

Purpose
    :func:`rule_allows`, :func:`subject_applies` and :class:`RbacPolicy`
    evaluate the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings the
    server stores exactly as kube-apiserver's RBAC authorizer
    (``plugin/pkg/auth/authorizer/rbac``) does:

    * a ClusterRoleBinding grants its ClusterRole's rules everywhere; a
      RoleBinding grants its Role's (same namespace) or ClusterRole's rules in
      its own namespace only;
    * subjects: ``User`` by name, ``Group`` by membership
      (``system:authenticated``, ``system:serviceaccounts``,
      ``system:serviceaccounts:<ns>`` included), ``ServiceAccount`` as the
      user ``system:serviceaccount:<ns>:<name>`` (a RoleBinding's subject
      without a namespace means the binding's namespace);
    * a rule matches by verb (``*``), API group (``*``), resource with its
      subresource (``gadgets/status``; ``*`` and ``*/status`` too),
      ``resourceNames`` (when listed, only requests naming one of them), and
      ``nonResourceURLs`` (exact, ``*``, or a prefix ending in ``*``);
    * RBAC only allows: what no rule allows is denied (``no RBAC policy
      matched``).

    :data:`BOOTSTRAP` holds the ClusterRoles and ClusterRoleBindings
    kube-apiserver creates at start-up that manifests refer to
    (``cluster-admin``, ``system:auth-delegator``, ``system:discovery``,
    ``system:public-info-viewer``, ``system:basic-user``, ``system:monitoring``);
    the server creates the missing ones when it starts with RBAC.

    The group ``system:masters`` may do anything (kube-apiserver's privileged
    group, checked before RBAC).

Invariants
    * Evaluation is pure: a :class:`RbacPolicy` is an immutable snapshot of
      the four resources; :class:`RbacAuthorizer` replaces its snapshot when an
      RBAC object was written through this server (``invalidate``) or after
      :data:`REFRESH_SECONDS` (writes through another server), as kube's
      informer-fed authorizer is eventually consistent too.
    * Escalation checks (a user may only grant what they hold) are not
      enforced: whoever may write RBAC objects here may grant anything.

Concurrency model
    :meth:`RbacAuthorizer.authorize` is async; reloading the snapshot runs in
    a worker thread (blocking etcd reads), guarded by an ``anyio`` lock so one
    reload serves every waiting request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from rangeshard.core.kubeapi import Attributes, UserInfo

MASTERS = "system:masters"
RBAC_GROUP = "rbac.authorization.k8s.io"
#: Seconds a snapshot is used before it is read again (writes through this server invalidate at once).
REFRESH_SECONDS = 2.0
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

Obj = dict[str, Any]


def rule_allows(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """Whether one PolicyRule allows ``attrs`` (kube's ``RuleAllows``)."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource:
        return _url_matches(rule.get("nonResourceURLs") or [], attrs.path)
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    if not _resource_matches(rule.get("resources") or [], attrs.resource, attrs.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _resource_matches(rules: Iterable[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    return any(r in ("*", combined) or (subresource and r == f"*/{subresource}") for r in rules)


def _url_matches(rules: Iterable[str], path: str) -> bool:
    return any(r in ("*", path) or (r.endswith("*") and path.startswith(r[:-1])) for r in rules)


def subject_applies(subject: Mapping[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    """Whether a binding's subject is ``user`` (kube's ``appliesToUser``)."""
    kind, name = subject.get("kind"), subject.get("name") or ""
    if kind == "User":
        return user.username == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.username == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"
    return False


@dataclass(frozen=True)
class RbacPolicy:
    """An immutable snapshot of the RBAC objects, evaluated as kube does."""

    roles: Mapping[tuple[str, str], Obj]  # (namespace, name) -> Role
    cluster_roles: Mapping[str, Obj]
    role_bindings: tuple[Obj, ...]
    cluster_role_bindings: tuple[Obj, ...]

    @classmethod
    def from_objects(
        cls, roles: Iterable[Obj], cluster_roles: Iterable[Obj], role_bindings: Iterable[Obj], crbs: Iterable[Obj]
    ) -> RbacPolicy:
        return cls(
            {(_meta(r, "namespace"), _meta(r, "name")): r for r in roles},
            {_meta(r, "name"): r for r in cluster_roles},
            tuple(role_bindings),
            tuple(crbs),
        )

    def authorize(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        """``(allowed, reason)``: the reason names the binding and role that allowed it."""
        if MASTERS in user.groups:
            return True, f"group {MASTERS} may do anything"
        for binding in self.cluster_role_bindings:
            if self._grants(binding, "", user, attrs):
                return True, f'RBAC: allowed by ClusterRoleBinding "{_meta(binding, "name")}"'
        if attrs.namespace and attrs.resource:
            for binding in self.role_bindings:
                ns = _meta(binding, "namespace")
                if ns == attrs.namespace and self._grants(binding, ns, user, attrs):
                    return True, f'RBAC: allowed by RoleBinding "{_meta(binding, "name")}/{ns}"'
        return False, "no RBAC policy matched"

    def _grants(self, binding: Obj, namespace: str, user: UserInfo, attrs: Attributes) -> bool:
        subjects = binding.get("subjects") or []
        if not any(isinstance(s, dict) and subject_applies(s, user, namespace) for s in subjects):
            return False
        return any(isinstance(rule, dict) and rule_allows(rule, attrs) for rule in self._rules(binding, namespace))

    def _rules(self, binding: Obj, namespace: str) -> list[Any]:
        ref = binding.get("roleRef") or {}
        kind, name = ref.get("kind"), ref.get("name") or ""
        if kind == "ClusterRole":
            role = self.cluster_roles.get(name)
        elif kind == "Role" and namespace:
            role = self.roles.get((namespace, name))
        else:
            role = None
        rules = (role or {}).get("rules") or []
        return rules if isinstance(rules, list) else []


def _meta(obj: Obj, field: str) -> str:
    value = (obj.get("metadata") or {}).get(field)
    return value if isinstance(value, str) else ""


class RbacAuthorizer:
    """The RBAC authorizer of a server: a snapshot loaded by ``load``, reloaded when stale (module docstring)."""

    def __init__(self, load: Callable[[], RbacPolicy], refresh_seconds: float = REFRESH_SECONDS) -> None:
        self._load = load
        self._refresh = refresh_seconds
        self._policy: RbacPolicy | None = None
        self._loaded_at = 0.0
        self._lock = anyio.Lock()

    def invalidate(self) -> None:
        """An RBAC object was written: the next request reads the objects again."""
        self._policy = None

    async def policy(self) -> RbacPolicy:
        async with self._lock:
            policy = self._policy
            if policy is None or time.monotonic() - self._loaded_at > self._refresh:
                policy = await anyio.to_thread.run_sync(self._load)
                self._policy, self._loaded_at = policy, time.monotonic()
            return policy

    async def authorize(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        if MASTERS in user.groups:
            return True, f"group {MASTERS} may do anything"
        return (await self.policy()).authorize(user, attrs)


_AUTOUPDATE = {
    "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
    "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
}


def _cluster_role(name: str, rules: list[Obj]) -> Obj:
    return {"metadata": {"name": name, **_AUTOUPDATE}, "rules": rules}


def _binding(name: str, groups: list[str]) -> Obj:
    return {
        "metadata": {"name": name, **_AUTOUPDATE},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
    }


_PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
#: kube-apiserver's bootstrap ClusterRoles that manifests refer to (``kubectl get clusterrole NAME -o yaml``).
BOOTSTRAP_CLUSTER_ROLES: tuple[Obj, ...] = (
    _cluster_role(
        "cluster-admin",
        [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    ),
    _cluster_role(
        "system:auth-delegator",
        [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ],
    ),
    _cluster_role(
        "system:discovery",
        [
            {
                "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *_PUBLIC_URLS],
                "verbs": ["get"],
            }
        ],
    ),
    _cluster_role("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_URLS, "verbs": ["get"]}]),
    _cluster_role(
        "system:basic-user",
        [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            }
        ],
    ),
    _cluster_role(
        "system:monitoring",
        [
            {
                "nonResourceURLs": ["/healthz", "/healthz/*", "/livez", "/livez/*", "/metrics", "/readyz"],
                "verbs": ["get"],
            }
        ],
    ),
)
#: ... and their ClusterRoleBindings.
BOOTSTRAP_CLUSTER_ROLE_BINDINGS: tuple[Obj, ...] = (
    _binding("cluster-admin", [MASTERS]),
    _binding("system:discovery", ["system:authenticated"]),
    _binding("system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]),
    _binding("system:basic-user", ["system:authenticated"]),
    _binding("system:monitoring", ["system:monitoring"]),
)
