"""Shared state of the local API server's routes, and the response helpers.

Purpose
    :class:`State` holds what every route shares (etcd configuration, the
    store, the garbage collector, the authenticator and authorizer, per-app
    metrics);
    :class:`Metrics` is a per-app Prometheus registry so several apps can
    live in one process. ``json_response``/``status_response`` build the
    JSON answers; ``in_thread`` runs a blocking storage call off the loop.

Invariants
    * ``require_store`` answers 503 until etcd was reached and the default
      namespaces exist; nothing is served from a half-initialised store.

Concurrency model
    Created once per app in its lifespan; ``connect`` is guarded by a lock
    because readiness probes and the lifespan may race to connect.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import orjson
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge

from local_apiserver import resources, services
from local_apiserver.crd import CrdSync
from local_apiserver.errors import ApiError, tolerating
from local_apiserver.gc import GarbageCollector
from local_apiserver.rbac import (
    BOOTSTRAP_CLUSTER_ROLE_BINDINGS,
    BOOTSTRAP_CLUSTER_ROLES,
    RBAC_GROUP,
    RbacAuthorizer,
    RbacPolicy,
)
from local_apiserver.serviceaccounts import ServiceAccountTokens, service_account_user
from local_apiserver.store import Store
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.kubeapi import Attributes, StaticTokens, UserInfo
from rangeshard.core.policy import authorize
from rangeshard.core.serving import ShutdownSignal

T = TypeVar("T")


class Metrics:
    """Per-app Prometheus registry (so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "local_apiserver_requests",
            "API requests by verb, resource, subresource and HTTP code",
            ["verb", "resource", "subresource", "code"],
            registry=self.registry,
        )
        self.watches = Gauge(
            "local_apiserver_watches", "Open watches per resource", ["resource"], registry=self.registry
        )
        for spec in resources.RESOURCES:
            self.watches.labels(resource=spec.resource).set(0)
        self.client_disconnects = Counter(
            "local_apiserver_client_disconnects",
            "Requests whose client went away before its body was read (an expected event, logged at DEBUG)",
            registry=self.registry,
        )


class State:
    """Everything the routes share; created in the lifespan."""

    def __init__(
        self,
        config: EtcdConfig,
        prefix: str | None,
        bookmark_interval: float,
        authenticator: StaticTokens | None = None,
        service_range: ipaddress.IPv4Network = services.DEFAULT_SERVICE_RANGE,
        authorization_mode: str = "",
    ) -> None:
        self.config = config
        self.service_range = service_range
        self.authenticator = authenticator
        #: "" (the built-in policy of local_apiserver.auth), "RBAC", "AlwaysAllow" or "AlwaysDeny".
        self.authorization_mode = authorization_mode
        self.service_accounts = ServiceAccountTokens()
        self.rbac = RbacAuthorizer(self._load_rbac) if authorization_mode == "RBAC" else None
        self.prefix = prefix
        self.bookmark_interval = bookmark_interval
        self.metrics = Metrics()
        # Built-ins plus the CRDs in etcd; CrdSync re-reads them when a request finds the table stale.
        self.table = resources.ResourceTable()
        self.crds = CrdSync(self.table)
        self.client: EtcdClient | None = None
        self.store: Store | None = None
        self.gc: GarbageCollector | None = None
        self.bootstrapped = False
        #: Set when SIGINT/SIGTERM begins the shutdown: open watches end at once (see rangeshard.core.serving).
        self.shutdown = ShutdownSignal()
        self._connect_lock = threading.Lock()

    def connect(self) -> Store:
        """The store, connecting first if needed (with etcd authentication this talks to etcd)."""
        with self._connect_lock:
            if self.store is None:
                client = EtcdClient(self.config)
                self.client = client
                self.store = Store(client, self.prefix, self.table, self.service_range)
                self.gc = GarbageCollector(self.store)
                self.gc.start()
            return self.store

    def bootstrap(self) -> None:
        """Connect and create the built-in namespaces (and RBAC's bootstrap roles); ``bootstrapped`` once done."""
        store = self.connect()
        store.ensure_namespaces()
        if self.rbac is not None:
            for resource, objects in (
                ("clusterroles", BOOTSTRAP_CLUSTER_ROLES),
                ("clusterrolebindings", BOOTSTRAP_CLUSTER_ROLE_BINDINGS),
            ):
                spec = resources.builtin_spec(RBAC_GROUP, resource)
                for obj in objects:
                    with tolerating(409):
                        store.create(spec, None, obj)
        self.bootstrapped = True

    def _load_rbac(self) -> RbacPolicy:
        store = self.require_store()

        def all_of(resource: str) -> list[dict[str, Any]]:
            return list(store.iter_all(resources.builtin_spec(RBAC_GROUP, resource)))

        return RbacPolicy.from_objects(
            all_of("roles"), all_of("clusterroles"), all_of("rolebindings"), all_of("clusterrolebindings")
        )

    def user_of_token(self, token: str) -> UserInfo | None:
        """The user of a bearer token: the token file's, or a live ServiceAccount's (blocking: a store read)."""
        if self.authenticator is not None:
            user = self.authenticator.authenticate(token)
            if user is not None:
                return user
        claims = self.service_accounts.claims(token)
        if claims is None:
            return None
        namespace, name, uid, _ = claims
        try:
            account = self.require_store().get(resources.core_spec("serviceaccounts"), namespace, name)
        except ApiError:
            return None  # deleted (404) or the store unavailable: not authenticated
        if (account.get("metadata") or {}).get("uid") != uid:
            return None  # re-created: the old account's tokens are void
        return service_account_user(namespace, name, uid)

    async def authorize(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        """``(allowed, reason)`` by the configured ``--authorization-mode``."""
        if self.rbac is not None:
            return await self.rbac.authorize(user, attrs)
        if self.authorization_mode == "AlwaysAllow":
            return True, "AlwaysAllow"
        if self.authorization_mode == "AlwaysDeny":
            return False, "AlwaysDeny"
        return authorize(user, attrs)

    def rbac_written(self, group: str) -> None:
        """A write of an object of ``group`` went through: RBAC reads its objects again."""
        if self.rbac is not None and group == RBAC_GROUP:
            self.rbac.invalidate()

    async def refresh_crds(self) -> None:
        """Re-read the CRDs when the table is stale (a CRD created through another server is served too)."""
        if self.store is not None and self.bootstrapped and self.crds.stale():
            await in_thread(self.crds.refresh, self.store)

    def require_store(self) -> Store:
        if self.store is None or not self.bootstrapped:
            raise ApiError(503, "ServiceUnavailable", "the local API server is starting (etcd not reached yet)")
        return self.store


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def status_response(e: ApiError) -> Response:
    return json_response(e.status(), e.code)


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
