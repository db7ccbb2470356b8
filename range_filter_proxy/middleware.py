"""ASGI middleware of the proxy: the request body size limit.

Purpose
    :class:`BodyLimit` answers ``413 RequestEntityTooLarge`` (a Kubernetes
    ``Status``) for a request whose body is larger than the limit
    (``--max-request-body-bytes``, default 3 MiB like kube-apiserver's
    ``MaxRequestBodyBytes``), cache-served or passed through: at once when
    ``Content-Length`` says so, otherwise as soon as a streamed (chunked) body
    crosses the limit; the handler reading it then gets
    :class:`RequestTooLarge`, an :class:`ApiError`, and pass-through answers
    413 instead of forwarding the rest.

Invariants
    * A body is never read, buffered or forwarded past the limit.

Concurrency model
    Stateless per request; runs on uvicorn's event loop.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from range_filter_proxy.errors import ApiError

#: kube-apiserver's limit of a request body (``MaxRequestBodyBytes``).
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024


class RequestTooLarge(ApiError):
    """The request body is larger than the configured limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


async def send_status(send: Send, error: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send ``error`` as a complete JSON ``Status`` response."""
    body = orjson.dumps(error.status())
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


class BodyLimit:
    """Reject request bodies larger than ``max_bytes`` with 413 (see module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers") or []:
            if key.lower() == b"content-length":
                text = bytes(value).decode("latin-1").strip()
                if text.isdigit() and int(text) > self.max_bytes:
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
