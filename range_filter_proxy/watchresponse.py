"""The HTTP body of a downstream watch, and the app class that lets it skip the middleware on every chunk.

Purpose
    :class:`WatchResponse` writes :meth:`Watcher.stream` as a chunked
    response. Starlette's ``StreamingResponse`` runs every stream in an anyio
    task group with a disconnect listener racing the body; here one named
    task waits for the client's disconnect and cuts the watcher (which ends
    its stream at once, even when no event is flowing), and the body loop
    only sends. :class:`ProxyApp` (the proxy's ``FastAPI``) puts the server's
    own ``send`` in the request scope under :data:`RAW_SEND`; a watch sends
    its body chunks through it, past the ``send`` wrappers of every
    middleware (Starlette's error and exception middlewares, the body limit:
    four to six Python frames per chunk, ~6 % of the proxy's CPU at 6,000
    events/s). The response start and the final empty chunk still go through
    the wrapped ``send``, so every middleware sees a normal response begin
    and end.

    When the server is uvicorn's httptools protocol and the response is
    chunked, :class:`UvicornChunkSink` also gives the watcher a direct sink:
    live events are then written from the cache's end-of-turn flush straight
    to the connection's transport, framed as HTTP chunks exactly as uvicorn
    frames them (see :mod:`range_filter_proxy.watcher`). It reads a few
    attributes of uvicorn's ``RequestResponseCycle`` (``transport``,
    ``flow.write_paused``, ``disconnected``, ``chunked_encoding``,
    ``response_started``, ``response_complete``); if any is missing or not
    as expected (another server, another uvicorn protocol or version) there
    is no sink and every chunk takes the ASGI ``send``, as before. It
    writes no attribute of uvicorn's, only reads them; the chunks it writes
    are framed by the one encoder (:func:`rangeshard.core.http1.chunk_of`).
    Two tests fail when uvicorn changes under it:
    ``tests/range_filter_proxy/test_direct_writes.py`` (live events must take
    the direct path under a real uvicorn, and its framing must parse) and
    ``tests/range_filter_proxy/test_e2e.py`` (the ``rangeshard proxy``
    process gets a sink).

Invariants
    * The middlewares between the server and the app only observe a response
      (none of them rewrites body chunks); a middleware that must see every
      body chunk would have to be added outside :class:`ProxyApp`.
    * Without :data:`RAW_SEND` in the scope (an app called in process,
      ``httpx.ASGITransport``) the given ``send`` is used for everything.

Concurrency model
    One task per downstream watch (the server's request task) plus its
    disconnect listener, on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Response

from range_filter_proxy.watcher import Watcher
from rangeshard.core.http1 import chunk_of

log = logging.getLogger(__name__)

#: Scope key of the ASGI server's own ``send`` callable (set by :class:`ProxyApp`).
RAW_SEND = "rangeshard.raw_send"


class ProxyApp(FastAPI):
    """The proxy's FastAPI app: remembers the server's ``send`` in the scope for watch bodies, and offers each
    request to :attr:`relay` (the pass-through, before any routing) first."""

    #: Serves a request at the ASGI level and says so (``True``), or leaves it to the app.
    relay: Callable[[Any, Any, Any], Awaitable[bool]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            relay = self.relay
            if relay is not None and await relay(scope, receive, send):
                return
            scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


class UvicornChunkSink:
    """A watch's direct sink: HTTP chunks written straight to uvicorn's transport (see module docstring)."""

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any, flow: Any, transport: Any) -> None:
        self._cycle = cycle
        self._flow = flow
        self._transport = transport

    @classmethod
    def of(cls, send: Any) -> UvicornChunkSink | None:
        """The sink behind ``send`` if it is uvicorn's httptools cycle of a started chunked response, else ``None``."""
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        flow = getattr(cycle, "flow", None)
        if (
            cycle is None
            or getattr(cycle, "chunked_encoding", None) is not True
            or getattr(cycle, "response_started", None) is not True
            or getattr(cycle, "response_complete", True) is not False
            or not isinstance(getattr(cycle, "disconnected", None), bool)
            or not isinstance(getattr(flow, "write_paused", None), bool)
            or not callable(getattr(transport, "write", None))
            or not callable(getattr(transport, "is_closing", None))
        ):
            return None
        return cls(cycle, flow, transport)

    def ready(self) -> bool:
        """True while the client is connected and the transport's buffer is below its high-water mark."""
        return not (self._cycle.disconnected or self._flow.write_paused or self._transport.is_closing())

    def write_chunk(self, parts: list[bytes], size: int) -> None:
        """One HTTP chunk of ``parts`` (:func:`rangeshard.core.http1.chunk_of`, uvicorn's framing too), in one write."""
        self._transport.write(chunk_of(parts, size))


class WatchResponse(Response):
    """The chunked body of one downstream watch, written straight from :meth:`Watcher.stream`."""

    media_type = "application/json"

    def __init__(
        self, watcher: Watcher, transform: Callable[[AsyncIterator[bytes]], AsyncGenerator[bytes, None]] | None = None
    ) -> None:
        self.watcher = watcher
        #: Rewrites the event lines on their way out (Table watches); None sends them as they are.
        self.transform = transform
        self.status_code = 200
        self.background = None
        self.init_headers(None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        w = self.watcher

        async def until_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    w.cut("client disconnected")
                    return

        listener = asyncio.create_task(until_disconnect(), name=f"watch-{w.id}:disconnect")
        stream = w.stream() if self.transform is None else self.transform(w.stream())
        body_send = scope.get(RAW_SEND, send)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self.transform is None and not w.closed:
                w.sink = UvicornChunkSink.of(body_send)
            async for chunk in stream:
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            log.debug("watch %d: client connection lost", w.id)
        except RuntimeError as e:
            # uvloop's transport refuses a write once the peer is gone ("... the handler is closed"):
            # a client killed mid-watch, an expected event.
            if "closed" not in str(e):
                raise
            log.debug("watch %d: client connection lost (%s)", w.id, e)
        finally:
            listener.cancel()
            await stream.aclose()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
