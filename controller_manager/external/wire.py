"""The external endpoint's sockets: HTTP/1.1 in from the controller, and out to the proxy, on one event loop.

Purpose
    The endpoint relays every request of its controller, so its own cost is
    added to each of them. These are its sockets, as lean as the job allows:
    :class:`Server` serves connections (:class:`Request` in,
    :class:`Response` out) and runs one handler coroutine per request;
    :class:`UpstreamPool` keeps connections to the proxy alive and sends
    requests over them (:class:`UpstreamResponse` back, its body as it
    arrives). Both sides parse HTTP with httptools (llhttp, C); what a
    request and its answer become on the way is the handler's business
    (:mod:`controller_manager.external.endpoint`, with
    :mod:`rangeshard.core.relay`'s rules).

Invariants
    * A response body goes out with ``Content-Length`` when its length is
      known (the head then goes out together with the first body bytes: one
      segment for a small answer), else chunked (the head at once: a watch's
      client waits for it).
    * Requests on one client connection are answered in order, one at a
      time; a connection closed by the client cancels the handler of its
      request (and with it the upstream request).
    * An upstream connection is reused only after a complete answer that
      allows it; one reused and closed by the proxy before any answer is
      replaced by a new connection once (the proxy dropped it while idle).
      A ``HEAD`` goes over a connection used once.
    * The body of a request is read completely before the handler runs
      (the controller's writes are small; watches and lists have none).
      Above :data:`HIGH_WATER` unread bytes the upstream socket is not
      read until the handler catches up; a client that reads slowly makes
      the handler wait (:meth:`Response.drain`).

Concurrency model
    Everything here runs on the endpoint's event loop thread, except
    :meth:`UpstreamResponse.abort`, which other threads reach only through
    ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

import httptools

from rangeshard.core.relay import Origin, request_head
from rangeshard.core.requestinfo import OBJECT_BODY_METHODS

log = logging.getLogger(__name__)

#: Unread upstream body bytes above which the upstream socket is paused.
HIGH_WATER = 1 << 20
Headers = list[tuple[str, str]]


class Request:
    """One request of the controller: method, target (path and query, as sent), headers, complete body."""

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

    def __init__(self, conn: _ServerProtocol, head_only: bool) -> None:
        self._conn = conn
        self._no_body = head_only
        self._chunked = False
        self._head = b""
        self.started = False
        self.ended = False

    def start(self, status: int, headers: Headers, length: int | None) -> None:
        """Status and headers; ``length`` frames the body (``None``: chunked, and the head goes out now)."""
        self.started = True
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers)]
        bodiless = status < 200 or status in (204, 304)
        if length is not None and not bodiless:
            lines.append(f"Content-Length: {length}")  # an answer to HEAD too: the length of what GET sends
        elif not (bodiless or self._no_body):
            self._chunked = True
            lines.append("Transfer-Encoding: chunked")
        self._no_body = self._no_body or bodiless
        if not self._conn.keep_alive:
            lines.append("Connection: close")
        self._head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self._chunked:  # a stream: the client waits for the head before any event
            self._send(b"")

    def write(self, data: bytes) -> None:
        if self._no_body or not data:
            return
        if self._chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        self._send(data)

    def end(self) -> None:
        """The body is complete (the last chunk of a chunked body)."""
        if self.ended:
            return
        self.ended = True
        self._send(b"0\r\n\r\n" if self._chunked else b"")

    def _send(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        if data:
            self._conn.send(data)

    async def drain(self) -> None:
        """Until the client took what was written (its socket buffer is below the transport's limit)."""
        await self._conn.drained()


Handler = Callable[[Request, Response], Awaitable[None]]


class _ServerProtocol(asyncio.Protocol):
    """One client connection: httptools request parsing, requests handled in order."""

    def __init__(self, handler: Handler, name: str, on_lost: Callable[[_ServerProtocol], None]) -> None:
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

    # ---- transport callbacks ----------------------------------------------------------------
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
            self._close()

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

    # ---- httptools callbacks ---------------------------------------------------------------
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
        request = Request(
            method, self._url.decode("latin-1"), self._headers, b"".join(self._body), self._parser.should_keep_alive()
        )
        self._queue.append(request)
        if self._task is None:
            self._next()

    # ---- handling ----------------------------------------------------------------------------
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
            self._close()
            raise
        except Exception:
            log.exception("%s: %s %s failed", self._name, request.method, request.target.split("?")[0])
            if response.started:  # a body was under way: the client sees a cut answer, not a wrong one
                self._close(abort=True)
                return
            body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","code":500}'
            response.start(500, [("Content-Type", "application/json")], len(body))
            response.write(body)
        response.end()
        if not self.keep_alive:
            self._close()
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

    def _close(self, abort: bool = False) -> None:
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
        self._connections: set[_ServerProtocol] = set()

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()

        def connection() -> _ServerProtocol:
            protocol = _ServerProtocol(self.handler, self.name, self._connections.discard)
            self._connections.add(protocol)
            return protocol

        self._server = await loop.create_server(connection, sock=sock)

    def close(self) -> None:
        """Stop accepting; close every connection (their handlers are cancelled)."""
        if self._server is not None:
            self._server.close()
        for protocol in list(self._connections):
            protocol._close(abort=True)


class UpstreamResponse:
    """An answer of the proxy: status and headers at once, the body as it arrives; :meth:`close` when done."""

    def __init__(self, conn: _ClientProtocol, pool: UpstreamPool) -> None:
        self._conn = conn
        self._pool = pool
        self.status = conn.status
        self.headers = conn.headers
        self.length = conn.length
        self._closed = False

    @property
    def complete(self) -> bool:
        return self._conn.complete

    async def pieces(self) -> AsyncIterator[list[bytes]]:
        """The body, as the pieces each wake-up found; raises :class:`UpstreamBroken` if the body was cut."""
        conn = self._conn
        while True:
            pieces = conn.take()
            if pieces:
                yield pieces
                continue
            if conn.complete:
                return
            if conn.lost:
                raise UpstreamBroken("the proxy closed the connection inside an answer")
            await conn.wait()

    async def read(self) -> bytes:
        parts: list[bytes] = []
        async for pieces in self.pieces():
            parts.extend(pieces)
        return b"".join(parts)

    def abort(self) -> None:
        """End the answer now (its connection is closed): a blocked :meth:`pieces` returns or raises."""
        self._conn.reusable = False
        self._conn.close()

    def close(self) -> None:
        """Release the connection: back to the pool after a complete answer that allows it, else closed."""
        if self._closed:
            return
        self._closed = True
        self._pool.release(self._conn)


class UpstreamError(Exception):
    """The proxy could not be reached or sent no answer."""


class UpstreamBroken(UpstreamError):
    """The connection ended inside an answer's body."""


class _ClientProtocol(asyncio.Protocol):
    """One connection to the proxy: httptools response parsing, the body buffered between reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self.used = False
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self.head: asyncio.Future[None] = self._loop.create_future()
        self.status = 0
        self.headers: Headers = []
        self.length: int | None = None
        self.framed = False
        self.complete = False
        self.head_only = False
        self._body: list[bytes] = []
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    def begin(self, request: bytes, head_only: bool) -> None:
        """Send one request (the previous answer is complete); the answer starts at :attr:`head`."""
        if self.used:
            self._reset()
        self.used = True
        self.head_only = head_only
        if head_only:
            self.reusable = False
        if self.transport is not None:
            self.transport.write(request)

    # ---- transport callbacks ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.complete:  # bytes after a complete answer, unasked: the connection cannot be trusted
            self.reusable = False
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.reusable = False
            self._fail(UpstreamError(f"malformed answer of the proxy: {e}"))
            return
        if self._size > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self.head.done() and not self.framed:
            self.complete = True  # a body delimited by the connection's end
        self._fail(UpstreamError(f"the proxy closed the connection: {exc or 'end of stream'}"))

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        self.headers.append((key, text))
        lower = key.lower()
        if lower == "content-length" and text.strip().isdigit():
            self.length = int(text)
            self.framed = True
        elif lower == "transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if not self._parser.should_keep_alive():
            self.reusable = False
        if self.head_only or self.status in (204, 304):
            self.complete = True
            self.framed = True
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # ---- the handler's side -------------------------------------------------------------------
    def take(self) -> list[bytes]:
        body = self._body
        if body:
            self._body, self._size = [], 0
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
        return body

    async def wait(self) -> None:
        if self._body or self.complete or self.lost:
            return
        self._waiter = self._loop.create_future()
        await self._waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: the request may have been given up already
        self._wake()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.lost:
            self.transport.abort()


class UpstreamPool:
    """Keep-alive connections to the proxy at ``base_url`` (``http`` or ``https`` with ``ca_cert``)."""

    def __init__(
        self, base_url: str, *, ca_cert: str | None = None, connect_timeout: float = 30.0, max_idle: int = 32
    ) -> None:
        self.origin = Origin.parse(base_url)
        self.ssl: ssl.SSLContext | None = None
        if self.origin.tls:
            self.ssl = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: list[_ClientProtocol] = []

    async def request(self, method: str, target: str, headers: Headers, body: bytes) -> UpstreamResponse:
        """Send ``method target`` with ``headers`` and ``body``; the answer once its head arrived.

        Raises :class:`UpstreamError` when the proxy cannot be reached or
        closes the connection before answering.
        """
        # The body goes out complete, framed by its length (an empty object body too).
        sent = [(k, v) for k, v in headers if k.lower() not in ("content-length", "expect")]
        if body or method in OBJECT_BODY_METHODS:
            sent.append(("Content-Length", str(len(body))))
        try:
            data = request_head(method, self.origin.prefix + target, self.origin.authority, sent) + body
        except ValueError as e:
            raise UpstreamError(str(e)) from None  # the header's value is never echoed
        head_only = method == "HEAD"
        while True:
            conn, reused = await self._connection(head_only)
            conn.begin(data, head_only)
            try:
                await conn.head
            except UpstreamError:
                conn.close()
                if reused and not conn.status:
                    continue  # dropped by the proxy while idle: once more on a new connection
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamResponse(conn, self)

    async def _connection(self, head_only: bool) -> tuple[_ClientProtocol, bool]:
        while self._idle and not head_only:
            conn = self._idle.pop()
            if conn.reusable and not conn.lost:
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: _ClientProtocol(loop),
                    self.origin.host,
                    self.origin.port,
                    ssl=self.ssl,
                    server_hostname=self.origin.host if self.ssl is not None else None,
                )
        except (OSError, ssl.SSLError, TimeoutError) as e:
            raise UpstreamError(f"cannot connect to {self.origin.authority}: {e!r}") from e
        return protocol, False

    def release(self, conn: _ClientProtocol) -> None:
        if conn.complete and conn.reusable and not conn.lost and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
