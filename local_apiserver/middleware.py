"""ASGI middleware of the local API server: request body size limit and bearer-token authentication.

Purpose
    :class:`BodyLimit` answers ``413 RequestEntityTooLarge`` (a Kubernetes
    ``Status``) for a request whose body is larger than the limit
    (``--max-request-body-bytes``, default 3 MiB like kube-apiserver): at once
    when ``Content-Length`` says so, otherwise as soon as the streamed body
    crosses the limit (the handler reading it gets :class:`RequestTooLarge`,
    an :class:`ApiError`). :class:`Authenticate` rejects every request without
    a valid bearer token with ``401 Unauthorized`` (except the probes
    ``/healthz``, ``/livez``, ``/readyz``) and stores the user in
    ``scope["state"]["user"]`` for the handlers' authorization.

Invariants
    * No body larger than the limit is ever held in memory.
    * Tokens are never logged.

Concurrency model
    Stateless per request; runs on uvicorn's event loop.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from local_apiserver.auth import PUBLIC_PATHS, TokenAuthenticator, unauthorized
from local_apiserver.errors import ApiError

log = logging.getLogger(__name__)

#: kube-apiserver's limit of a request body (``MaxRequestBodyBytes``).
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024


class RequestTooLarge(ApiError):
    """The request body is larger than the configured limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


async def send_status(send: Send, error: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send ``error`` as a complete JSON ``Status`` response."""
    body = orjson.dumps(error.body())
    await send(
        {
            "type": "http.response.start",
            "status": error.code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class BodyLimit:
    """Reject request bodies larger than ``max_bytes`` with 413 (see module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            await send_status(send, RequestTooLarge(self.max_bytes), [(b"connection", b"close")])
            return
        seen = 0
        limit = self.max_bytes

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise RequestTooLarge(limit)
            return message

        await self.app(scope, limited, send)


class Authenticate:
    """401 for requests without a valid bearer token (see module docstring)."""

    def __init__(self, app: ASGIApp, authenticator: TokenAuthenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        user = self.authenticator.authenticate_header(_header(scope, b"authorization"))
        if user is None:
            log.debug("unauthenticated %s %s", scope.get("method"), scope.get("path"))
            await send_status(send, unauthorized())
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        state["user"] = user
        await self.app(scope, receive, send)
