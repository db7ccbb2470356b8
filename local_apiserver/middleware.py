"""ASGI middleware of the local API server: bearer-token authentication.

Purpose
    :class:`Authenticate` rejects every request without a valid bearer token
    with ``401 Unauthorized`` (except the probes ``/healthz``, ``/livez``,
    ``/readyz``): a token of the token file, or a ServiceAccount token this
    server issued (checked against the store in a worker thread); answers a
    non-resource path the configured authorizer does not allow with ``403``
    (:meth:`State.authorize`: the static policy of :mod:`rangeshard.core.policy`
    without ``--authorization-mode``; under ``RBAC`` the ``nonResourceURLs``
    rules, kube's bootstrap ``system:discovery`` and
    ``system:public-info-viewer`` giving discovery to every authenticated
    user and ``/metrics`` only where granted);
    and stores the user in ``scope["state"]["user"]`` for the handlers'
    authorization of resource requests. The request body limit (413) is the
    :class:`rangeshard.core.kubeapi.BodyLimit` the proxy uses too.

Invariants
    * Tokens are never logged.

Concurrency model
    Stateless per request; runs on uvicorn's event loop.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from local_apiserver.errors import ApiError
from local_apiserver.state import State
from rangeshard.core.kubeapi import Attributes, bearer_token, forbidden, send_status, unauthorized
from rangeshard.core.policy import PUBLIC_PATHS
from rangeshard.core.rest import parse_rest_path

log = logging.getLogger(__name__)


def _header(scope: Scope, name: bytes) -> str | None:
    return next((bytes(v).decode("latin-1") for k, v in scope.get("headers") or [] if k.lower() == name), None)


class Authenticate:
    """401 for requests without a valid bearer token (see module docstring)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        token = bearer_token(_header(scope, b"authorization"))
        user = None
        if token is not None:
            static = self.state.authenticator
            user = static.authenticate(token) if static is not None else None
            if user is None:
                user = await anyio.to_thread.run_sync(self.state.user_of_token, token)
        if user is None:
            log.debug("unauthenticated %s %s", scope.get("method"), scope.get("path"))
            await send_status(send, unauthorized())
            return
        path = str(scope.get("path") or "/")
        if parse_rest_path(path) is None:  # a non-resource path: the configured authorizer decides here
            attrs = Attributes(verb=str(scope.get("method") or "GET").lower(), path=path)
            try:
                allowed, _reason = await self.state.authorize(user, attrs)
            except ApiError as e:  # RBAC before its objects can be read (etcd down at start-up): 503
                await send_status(send, e)
                return
            if not allowed:
                await send_status(send, forbidden(user, attrs))
                return
        state: dict[str, Any] = scope.setdefault("state", {})
        state["user"] = user
        await self.app(scope, receive, send)
