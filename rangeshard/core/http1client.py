"""The one HTTP/1.1 client: keep-alive connections to one origin that never send a write twice.

Purpose
    :class:`ClientPool` keeps connections to one origin (:mod:`rangeshard.core.http1`
    heads, parsed by httptools) and sends requests over them,
    :class:`ClientResponse` back (status and headers at once, the body as it
    arrives, or to a sink from the read callback itself) over
    :class:`ClientConnection`; :func:`connect` makes one connection (the
    proxy's upstream watches take one each). Used by the external endpoint
    (to the proxy), the proxy's upstream watch reader and its pass-through.

Invariants
    * **Never twice.** A request goes out again, on a new connection, only
      when it is idempotent (``GET``, ``HEAD``, ``OPTIONS``) and a reused
      connection ended before its answer, or when provably no byte of it left
      the process (the transport was already closing when it was written).
      Otherwise the caller gets :class:`~rangeshard.core.errors.AnswerLost`:
      the request may have been applied.
    * **Malformed is fatal at once.** Bytes the parser refuses (a bad head,
      bad chunk framing) abort the connection in the same callback and the
      reader gets :class:`~rangeshard.core.errors.BodyBroken` (or
      ``AnswerLost`` before the head); nobody waits for the peer to close.
    * Above ``high_water`` unread body bytes a connection stops reading its
      socket until the consumer catches up.
    * A connection is reused only after a complete answer that allows it,
      not after a ``HEAD`` (its answer's framing is ambiguous to a parser),
      and not once it was idle longer than ``idle_seconds``; a closed
      :class:`ClientResponse` never touches its connection again.

Concurrency model
    Everything runs on one event loop; protocols are called synchronously by
    their transport. A sink given to :meth:`ClientResponse.feed` runs inside
    ``data_received`` (no task switch per read), so it must not block.
    :meth:`ClientResponse.abort` may be reached from other threads only
    through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import cast

import httptools

from rangeshard.core.errors import AnswerLost, BodyBroken, PeerError, Unreachable
from rangeshard.core.http1 import HIGH_WATER, IDEMPOTENT, Headers, Origin, request_head
from rangeshard.core.requestinfo import OBJECT_BODY_METHODS


class ClientConnection(asyncio.Protocol):
    """One connection to a server: one request at a time, the answer parsed by httptools, its body buffered."""

    def __init__(self, loop: asyncio.AbstractEventLoop, high_water: int = HIGH_WATER) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._high_water = high_water
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self.lost = False
        self.requests = 0
        self.idle_since = loop.time()
        self._read_timeout: float | None = None
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        #: Called from ``data_received`` with the body pieces of each read (:meth:`ClientResponse.feed`).
        self.sink: Callable[[list[bytes]], None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.head: asyncio.Future[None] = self._loop.create_future()
        self.status = 0
        self.headers: Headers = []
        self.length: int | None = None
        self.framed = False  # chunked or a length: the end is in the data, not the connection's close
        self.encoded = False
        self.complete = False
        self.head_only = False
        self.error: PeerError | None = None
        self.sink_error: Exception | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    def send(self, data: bytes, head_only: bool = False, read_timeout: float | None = None) -> bool:
        """Write one request (the previous answer is complete); ``False`` if provably no byte of it left.

        ``read_timeout``: the answer fails with :class:`BodyBroken` after that
        many seconds without a byte from the server.
        """
        if self.requests:
            self._reset()
        self.requests += 1
        self.head_only = head_only
        if head_only:
            self.reusable = False
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            return False
        transport.write(data)
        if transport.is_closing():  # the first send failed: nothing was written
            return False
        if read_timeout is not None:
            self._read_timeout = read_timeout
            self._last_data = self._loop.time()
            self._timer = self._loop.call_later(read_timeout, self._check_idle)
        return True

    # ---- transport callbacks ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.complete or not self.requests:  # bytes nobody asked for: the connection cannot be trusted
            self.reusable = False
            return
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(f"a malformed answer: {e}")
            return
        if self.sink is not None:
            if self._body:
                try:
                    self.sink(self.take())
                except Exception as e:  # what the sink raised ends the answer; feed raises it
                    self.sink_error = e
                    self._fail("the reader of the body stopped")
                    return
            if self.complete:
                self._wake()
            return
        if self._size > self._high_water and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        self._stop_timer()
        if self.requests and self.head.done() and not self.framed:
            self.complete = True  # a body delimited by the connection's end
        elif self.requests and not self.complete:
            where = "inside the response body" if self.head.done() else "before a response"
            self._fail(f"the connection closed {where}{f' ({exc!r})' if exc else ''}")
        self._wake()

    # ---- httptools callbacks ------------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        self.headers.append((key, text))
        lower = key.lower()
        if lower == "content-length":
            self.framed = True
            if text.strip().isdigit():
                self.length = int(text)
        elif lower == "transfer-encoding":
            self.framed = True
        elif lower == "content-encoding" and text.strip().lower() not in ("", "identity"):
            self.encoded = True

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
        self.idle_since = self._loop.time()
        self._stop_timer()

    # ---- the reader's side ----------------------------------------------------------------------------------------
    def take(self) -> list[bytes]:
        """Every body piece buffered (``[]`` if none); resumes reading if it was paused."""
        body = self._body
        if body:
            self._body, self._size = [], 0
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
        return body

    async def wait(self) -> None:
        """Until more body arrived or the answer ended (completely, cut, or failed)."""
        if self._body or self.complete or self.lost or self.error is not None:
            return
        self._waiter = self._loop.create_future()
        await self._waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, why: str) -> None:
        """The answer failed: before its head the request's answer is lost, after it the body is broken."""
        if self.error is None:
            self.error = BodyBroken(why) if self.head.done() else AnswerLost(why)
        if not self.head.done():
            self.head.set_exception(self.error)
            self.head.exception()  # retrieved: the request may have been given up already
        self.close()
        self._wake()

    def _check_idle(self) -> None:
        self._timer = None
        if self._read_timeout is None or self.complete or self.lost:
            return
        idle = self._loop.time() - self._last_data
        if idle >= self._read_timeout:
            self._fail(f"no data for {idle:.0f}s (read timeout)")
        else:
            self._timer = self._loop.call_later(self._read_timeout - idle, self._check_idle)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Abort the connection (idempotent)."""
        self.reusable = False
        self._stop_timer()
        if self.transport is not None and not self.lost:
            self.transport.abort()


def client_ssl(verify: ssl.SSLContext | str | bool | None) -> ssl.SSLContext | None:
    """A client's TLS context: ``verify`` itself, one trusting the CA file ``verify``, one checking nothing
    (``False``), or ``None``: the system's trust, made when a TLS connection needs it."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return None


async def connect(
    origin: Origin, ssl_context: ssl.SSLContext | None, timeout: float, high_water: int = HIGH_WATER
) -> ClientConnection:
    """A new connection to ``origin`` (TLS with ``ssl_context``); :class:`Unreachable` if it cannot be made."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            _, protocol = await loop.create_connection(
                lambda: ClientConnection(loop, high_water),
                origin.host,
                origin.port,
                ssl=(ssl_context or ssl.create_default_context()) if origin.tls else None,
                server_hostname=origin.host if origin.tls else None,
            )
    except (OSError, ssl.SSLError, TimeoutError) as e:
        raise Unreachable(f"cannot connect to {origin.authority}: {e!r}") from e
    return protocol


class ClientResponse:
    """An answer: status and headers at once, the body as it arrives; :meth:`close` when done."""

    def __init__(self, conn: ClientConnection, pool: ClientPool | None) -> None:
        self._conn = conn
        self._pool = pool
        self.status = conn.status
        self.headers = conn.headers
        self.length = conn.length
        self._closed = False

    @property
    def complete(self) -> bool:
        return self._conn.complete

    @property
    def encoded(self) -> bool:
        """The body has a ``Content-Encoding`` other than identity."""
        return self._conn.encoded

    async def pieces(self) -> AsyncIterator[list[bytes]]:
        """The body, as the pieces each wake-up found; raises the connection's :class:`PeerError`."""
        conn = self._conn
        while True:
            pieces = conn.take()
            if pieces:
                yield pieces
                continue
            if conn.error is not None:
                raise conn.error
            if conn.complete or conn.lost:
                return
            await conn.wait()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (at most ``limit`` bytes: the rest is not read)."""
        parts: list[bytes] = []
        size = 0
        async for pieces in self.pieces():
            parts.extend(pieces)
            size += sum(map(len, pieces))
            if limit is not None and size >= limit:
                self.abort()
                return b"".join(parts)[:limit]
        return b"".join(parts)

    async def feed(self, sink: Callable[[list[bytes]], None]) -> None:
        """Call ``sink`` with the body pieces of every read, from the protocol itself, until the body ends.

        An exception of ``sink`` aborts the connection and is raised here.
        """
        conn = self._conn
        conn.sink = sink
        try:
            pieces = conn.take()  # what arrived together with the head
            if pieces:
                sink(pieces)
            while conn.error is None and not conn.complete and not conn.lost:
                await conn.wait()
            if conn.sink_error is not None:
                raise conn.sink_error
            if conn.error is not None:
                raise conn.error
        finally:
            conn.sink = None

    def abort(self) -> None:
        """End the answer now (its connection is closed): a blocked reader returns or raises.

        A no-op once the answer was closed: its connection may serve another request by then.
        """
        if not self._closed:
            self._conn.close()

    def close(self) -> None:
        """Release the connection: back to the pool after a complete answer that allows it, else closed."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.release(self._conn)
        else:
            self._conn.close()


class ClientPool:
    """Keep-alive connections to one origin, ``base_url`` (``http``, or ``https`` with ``ssl_context``).

    ``max_connections`` caps the connections in use at once (a request
    waits for one, :meth:`state` counts it); ``None``: no cap.
    """

    def __init__(
        self,
        base_url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 30.0,
        max_idle: int = 32,
        idle_seconds: float = 4.0,
        max_connections: int | None = None,
    ) -> None:
        self.origin = Origin.parse(base_url)
        self.ssl = ssl_context if ssl_context is not None or not self.origin.tls else ssl.create_default_context()
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        #: An idle connection older than this is closed, not reused: below the common servers' keep-alive
        #: timeouts (uvicorn 5 s), so a request rarely meets a connection the server is closing.
        self.idle_seconds = idle_seconds
        self.max_connections = max_connections
        self._idle: list[ClientConnection] = []
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def state(self) -> tuple[int, int, int]:
        """``(connections, idle connections, requests waiting for one)``."""
        return self._busy + len(self._idle), len(self._idle), sum(1 for w in self._waiters if not w.done())

    def encode(self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
        """The request as it goes out: ``target`` under the origin's prefix, the body framed by its length."""
        sent = [(k, v) for k, v in headers if k.lower() not in ("content-length", "expect", "transfer-encoding")]
        if body or method in OBJECT_BODY_METHODS:
            sent.append(("Content-Length", str(len(body))))
        return request_head(method, self.origin.prefix + target, self.origin.authority, sent) + body

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
    ) -> ClientResponse:
        """Send ``method target`` with ``headers`` and ``body``; the answer once its head arrived.

        Raises :class:`Unreachable` (nothing was sent), :class:`AnswerLost`
        (sent, no answer: a write may have been applied) and ``ValueError``
        for a header with a line break.
        """
        data = self.encode(method, target, headers, body)
        head_only = method == "HEAD"
        again = method in IDEMPOTENT
        while True:
            conn, reused = await self._connection(head_only)
            answered = False
            try:
                if not conn.send(data, head_only, read_timeout):
                    if reused:
                        continue  # the connection was closing: provably nothing of the request left
                    raise Unreachable(f"the connection to {self.origin.authority} closed before the request was sent")
                try:
                    await conn.head
                except AnswerLost:
                    if reused and again:
                        continue  # a reused connection the server had dropped; idempotent, so once more
                    raise
                answered = True
                return ClientResponse(conn, self)
            finally:
                if not answered:
                    conn.close()
                    self._done()

    async def _connection(self, head_only: bool) -> tuple[ClientConnection, bool]:
        """A connection in use (counted until :meth:`release` or a failed request gives it back)."""
        while self.max_connections is not None and self._busy >= self.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the free connection goes to the next one
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
        self._busy += 1
        try:
            now = asyncio.get_running_loop().time()
            while self._idle and not head_only:
                conn = self._idle.pop()
                if conn.reusable and not conn.lost and now - conn.idle_since < self.idle_seconds:
                    return conn, True
                conn.close()
            return await connect(self.origin, self.ssl, self.connect_timeout), False
        except BaseException:
            self._done()
            raise

    def _done(self) -> None:
        self._busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def release(self, conn: ClientConnection) -> None:
        self._done()
        if conn.complete and conn.reusable and not conn.lost and conn.error is None and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
