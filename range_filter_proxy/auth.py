"""Who may read through the proxy: authentication and authorization modes.

Purpose
    The proxy serves lists and watches from caches it fills with its *own*
    upstream credentials, so without a check anybody who reaches its port
    reads everything those credentials can read. :class:`ProxyAuth` decides,
    per ``--auth-mode``:

    ``none``
        No check (the historical behaviour and the default: ``rangeshard up``
        and the shipped manifests, whose managers send no credentials, rely on
        it). Pass-through forwards the client's ``Authorization`` or, if it
        sent none, the proxy's own credentials.
    ``static``
        Bearer tokens from ``--token-file`` (kube-apiserver's
        ``--token-auth-file`` format: ``token,user,uid[,"g1,g2"]``) and the
        local API server's fixed policy: group ``system:masters`` may do
        anything, group ``rangeshard:readers`` may read (cached list/watch,
        ``GET``/``HEAD`` pass-through), every other user may only read
        discovery (``/api``, ``/apis[/G[/V]]``, ``/version``) and ``/metrics``.
        Pass-through replaces the client's token (which the upstream does not
        know) with the proxy's own credentials. For local use.
    ``delegate``
        Like kube-rbac-proxy / an aggregated API server: a cache-served list
        or watch (and ``/metrics``) needs a bearer token that the upstream
        accepts in a ``TokenReview`` (authentication.k8s.io/v1), and a
        ``SubjectAccessReview`` (authorization.k8s.io/v1) must allow its
        user the verb (``list``/``watch``) on the resource, group and
        namespace. Both answers are cached for ``--auth-cache-ttl`` seconds in
        bounded LRU caches. Pass-through forwards the client's
        ``Authorization`` unchanged and never adds the proxy's own
        credentials, so the upstream authorizes every other request itself.

    Failures are Kubernetes ``Status`` objects: 401 ``Unauthorized`` (no or
    bad token), 403 ``Forbidden`` (policy / SubjectAccessReview said no),
    503 ``ServiceUnavailable`` (the upstream could not review).

Invariants
    * Tokens are never logged, never put in an error message, and never kept
      in clear: caches and the static table are keyed by their SHA-256.
    * ``/healthz`` and ``/readyz`` stay public (probes); everything else is
      checked as described above.

Concurrency model
    One instance per app, used from the event loop only; the caches are
    plain dicts mutated between awaits (no locks needed). Two concurrent
    requests with the same uncached token may both review it; that is cheap
    and harmless.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from range_filter_proxy.errors import ApiError, UpstreamError
from range_filter_proxy.upstream import Upstream
from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import (
    Attributes,
    StaticTokens,
    UserInfo,
    bearer_token,
    forbidden,
    token_digest,
    unauthorized,
)
from rangeshard.core.policy import authorize as static_policy
from rangeshard.core.rest import GVR

log = logging.getLogger(__name__)

#: The review resources ``delegate`` mode posts to.
TOKEN_REVIEWS = GVR("authentication.k8s.io", "v1", "tokenreviews")
SUBJECT_ACCESS_REVIEWS = GVR("authorization.k8s.io", "v1", "subjectaccessreviews")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class AuthMode(enum.StrEnum):
    """``--auth-mode`` values (see module docstring)."""

    NONE = "none"
    STATIC = "static"
    DELEGATE = "delegate"


@dataclass(frozen=True)
class AuthSettings:
    """The proxy's authentication configuration (``--auth-mode``, ``--token-file``, cache bounds)."""

    mode: AuthMode = AuthMode.NONE
    users: Mapping[str, UserInfo] = field(default_factory=dict, repr=False)
    cache_ttl: float = 10.0
    cache_size: int = 10_000


class TtlCache(Generic[K, V]):
    """A bounded LRU map whose entries expire ``ttl`` seconds after they were put."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        self.ttl = ttl
        self.max_entries = max(1, max_entries)
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> tuple[bool, V | None]:
        """``(True, value)`` if present and fresh, else ``(False, None)``."""
        entry = self._data.get(key)
        if entry is None:
            return False, None
        expires, value = entry
        if time.monotonic() >= expires:
            del self._data[key]
            return False, None
        self._data.move_to_end(key)
        return True, value

    def put(self, key: K, value: V) -> None:
        if self.ttl <= 0:
            return
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


def _review_failed(what: str, e: UpstreamError) -> ApiError:
    log.warning("%s failed: %s", what, e)
    return ApiError(503, "ServiceUnavailable", f"the proxy could not verify the request: {what} failed (HTTP {e.code})")


class ProxyAuth:
    """Authentication and authorization of one proxy (see module docstring)."""

    def __init__(self, settings: AuthSettings, reviewer: Upstream | None = None) -> None:
        if settings.mode is AuthMode.STATIC and not settings.users:
            raise ConfigError("--auth-mode static needs --token-file")
        if settings.mode is AuthMode.DELEGATE and reviewer is None:
            raise ConfigError("--auth-mode delegate needs an HTTP upstream to send reviews to")
        if settings.mode is not AuthMode.STATIC and settings.users:
            raise ConfigError("--token-file is only used with --auth-mode static")
        if settings.cache_ttl < 0 or settings.cache_size < 1:
            raise ConfigError("--auth-cache-ttl must be >= 0 and --auth-cache-size >= 1")
        self.mode = settings.mode
        self.reviewer = reviewer
        self._users = StaticTokens(dict(settings.users))
        self._authn: TtlCache[str, UserInfo | None] = TtlCache(settings.cache_ttl, settings.cache_size)
        self._authz: TtlCache[tuple[UserInfo, Attributes], tuple[bool, str]] = TtlCache(
            settings.cache_ttl, settings.cache_size
        )

    async def authenticate(self, authorization: str | None) -> UserInfo | None:
        """The user behind an ``Authorization`` header; None in mode ``none``; else 401."""
        if self.mode is AuthMode.NONE:
            return None
        token = bearer_token(authorization)
        if token is None:
            raise unauthorized()
        key = token_digest(token)
        if self.mode is AuthMode.STATIC:
            user = self._users.authenticate(token)
        else:
            hit, user = self._authn.get(key)
            if not hit:
                user = await self._token_review(token)
                self._authn.put(key, user)
        if user is None:
            raise unauthorized()
        return user

    async def authorize(self, user: UserInfo | None, attrs: Attributes) -> None:
        """Raise 403 unless ``user`` may do ``attrs`` (no-op in mode ``none``)."""
        if self.mode is AuthMode.NONE:
            return
        if user is None:
            raise unauthorized()
        if self.mode is AuthMode.STATIC:
            if not static_policy(user, attrs)[0]:
                raise forbidden(user, attrs)
            return
        hit, answer = self._authz.get((user, attrs))
        if not hit or answer is None:
            answer = await self._subject_access_review(user, attrs)
            self._authz.put((user, attrs), answer)
        allowed, reason = answer
        if not allowed:
            raise forbidden(user, attrs, reason)

    async def check(self, authorization: str | None, attrs: Attributes) -> UserInfo | None:
        """Authenticate, then authorize."""
        user = await self.authenticate(authorization)
        await self.authorize(user, attrs)
        return user

    async def _review(self, resource: GVR, kind: str, spec: dict[str, Any]) -> dict[str, Any] | None:
        """Send a ``kind`` review of ``spec`` to the upstream; the ``status`` of its answer, if it has one."""
        if self.reviewer is None:  # excluded by __init__
            raise unauthorized()
        doc = {"apiVersion": resource.api_version, "kind": kind, "spec": spec}
        try:
            answer = await self.reviewer.post_json(resource.path(), doc)
        except UpstreamError as e:
            raise _review_failed(kind, e) from e
        status = answer.get("status") if isinstance(answer, dict) else None
        return status if isinstance(status, dict) else None

    async def _token_review(self, token: str) -> UserInfo | None:
        status = await self._review(TOKEN_REVIEWS, "TokenReview", {"token": token})
        if status is None or status.get("authenticated") is not True:
            return None
        user = status.get("user")
        if not isinstance(user, dict) or not isinstance(user.get("username"), str):
            return None
        groups = user.get("groups") or []
        extra_doc = user.get("extra") or {}
        extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
        if isinstance(extra_doc, dict):
            extra = tuple(
                sorted((str(k), tuple(str(x) for x in v)) for k, v in extra_doc.items() if isinstance(v, list))
            )
        return UserInfo(
            username=user["username"],
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
            extra=extra,
        )

    async def _subject_access_review(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        spec: dict[str, Any] = {"user": user.username, "groups": list(user.groups)}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        if attrs.resource:
            fields = ("verb", "group", "version", "resource", "namespace")
            spec["resourceAttributes"] = {f: getattr(attrs, f) for f in fields}
        else:
            spec["nonResourceAttributes"] = {"verb": attrs.verb, "path": attrs.path}
        status = await self._review(SUBJECT_ACCESS_REVIEWS, "SubjectAccessReview", spec)
        if status is None:
            return False, "the SubjectAccessReview answer has no status"
        reason = status.get("reason")
        return status.get("allowed") is True and status.get("denied") is not True, (
            reason if isinstance(reason, str) else ""
        )
