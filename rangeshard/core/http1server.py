"""The one HTTP/1.1 server: one handler coroutine per request, answers framed by :mod:`rangeshard.core.http1`.

Purpose
    :class:`Server` serves connections on an already bound socket
    (httptools parsing) and runs one handler per :class:`Request`, answered
    through a :class:`Response`. The external endpoint serves its controller
    with it.

Invariants
    * A response body goes out with ``Content-Length`` when its length is
      known (the head together with the first body bytes: one segment for a
      small answer), else chunked (the head at once: a watch's client waits
      for it).
    * Requests on one connection are answered in order, one at a time; a
      connection closed by the client cancels the handler of its request.
    * The body of a request is read completely before the handler runs; a
      client that reads slowly makes the handler wait (:meth:`Response.drain`).
    * A handler that fails before answering is a 500 ``Status``; one that
      fails inside a body cuts the connection (a cut answer, not a wrong one).

Concurrency model
    Everything runs on the event loop the server was started on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from rangeshard.core.http1 import LAST_CHUNK, Headers, chunk, response_head

log = logging.getLogger(__name__)


class Request:
    """One request of a client: method, target (path and query, as sent), headers, complete body."""

    __slots__ = ("body", "headers", "keep_alive", "method", "target")

    def __init__(self, method: str, target: str, headers: Headers, body: bytes, keep_alive: bool) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


class Response:
    """The answer to one :class:`Request`: :meth:`start`, :meth:`write` (any number), :meth:`end`."""

    __slots__ = ("_chunked", "_conn", "_head", "_no_body", "ended", "started")

    def __init__(self, conn: _ServerConnection, head_only: bool) -> None:
        self._conn = conn
        self._no_body = head_only
        self._chunked = False
        self._head = b""
        self.started = False
        self.ended = False

    def start(self, status: int, headers: Headers, length: int | None) -> None:
        """Status and headers; ``length`` frames the body (``None``: chunked, and the head goes out now)."""
        self.started = True
        out = list(headers)
        bodiless = status < 200 or status in (204, 304)
        if length is not None and not bodiless:
            out.append(("Content-Length", str(length)))  # an answer to HEAD too: the length of what GET sends
        elif not (bodiless or self._no_body):
            self._chunked = True
            out.append(("Transfer-Encoding", "chunked"))
        self._no_body = self._no_body or bodiless
        if not self._conn.keep_alive:
            out.append(("Connection", "close"))
        self._head = response_head(status, out)
        if self._chunked:  # a stream: the client waits for the head before any event
            self._send(b"")

    def write(self, data: bytes) -> None:
        if self._no_body or not data:
            return
        self._send(chunk(data) if self._chunked else data)

    def end(self) -> None:
        """The body is complete (the last chunk of a chunked body)."""
        if self.ended:
            return
        self.ended = True
        self._send(LAST_CHUNK if self._chunked else b"")

    def _send(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        if data:
            self._conn.send(data)

    async def drain(self) -> None:
        """Until the client took what was written (its socket buffer is below the transport's limit)."""
        await self._conn.drained()


Handler = Callable[[Request, Response], Awaitable[None]]
_INTERNAL_ERROR = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","code":500}'


class _ServerConnection(asyncio.Protocol):
    """One client connection: httptools request parsing, requests handled in order."""

    def __init__(self, handler: Handler, name: str, on_lost: Callable[[_ServerConnection], None]) -> None:
        self._handler = handler
        self._name = name
        self._on_lost = on_lost
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: Headers = []
        self._body: list[bytes] = []
        self._queue: collections.deque[Request] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self.keep_alive = True
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # relayed as a plain request (no upgrade headers pass); the rest of the bytes is dropped
        except httptools.HttpParserError as e:
            log.debug("%s: malformed request: %s", self._name, e)
            self.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        self._wake_drain()
        self._on_lost(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drain()

    # ---- httptools callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        for k, v in self._headers:
            if k.lower() == "expect" and v.lower() == "100-continue":
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method().decode("latin-1")
        body = b"".join(self._body)
        self._queue.append(
            Request(method, self._url.decode("latin-1"), self._headers, body, self._parser.should_keep_alive())
        )
        if self._task is None:
            self._next()

    # ---- handling --------------------------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closed or not self._queue:
            self._task = None
            return
        request = self._queue.popleft()
        self.keep_alive = request.keep_alive
        self._task = asyncio.get_running_loop().create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        response = Response(self, request.method == "HEAD")
        try:
            await self._handler(request, response)
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception:
            log.exception("%s: %s %s failed", self._name, request.method, request.target.split("?")[0])
            if response.started:  # a body was under way: the client sees a cut answer, not a wrong one
                self.close(abort=True)
                return
            response.start(500, [("Content-Type", "application/json")], len(_INTERNAL_ERROR))
            response.write(_INTERNAL_ERROR)
        response.end()
        if not self.keep_alive:
            self.close()
        self._next()

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drained(self) -> None:
        if self._paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def _wake_drain(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self, abort: bool = False) -> None:
        self.closed = True
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()


class Server:
    """An HTTP/1.1 server on an already bound socket, running ``handler`` per request."""

    def __init__(self, handler: Handler, name: str) -> None:
        self.handler = handler
        self.name = name
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()

        def connection() -> _ServerConnection:
            protocol = _ServerConnection(self.handler, self.name, self._connections.discard)
            self._connections.add(protocol)
            return protocol

        self._server = await loop.create_server(connection, sock=sock)

    def close(self) -> None:
        """Stop accepting; close every connection (their handlers are cancelled)."""
        if self._server is not None:
            self._server.close()
        for protocol in list(self._connections):
            protocol.close(abort=True)
