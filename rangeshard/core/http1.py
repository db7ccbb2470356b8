"""The one HTTP/1.1 layer: heads, body framing, keep-alive, chunks and bounded lines, a client pool and a server.

Purpose
    Every hand-written HTTP/1.1 hop of rangeshard goes through here: the
    external endpoint (its server for the controller, its pool to the proxy),
    the proxy's upstream watch reader and pass-through, and the chunks of the
    proxy's downstream watches. The pieces, as h11 cuts them:

    * sans I/O: :func:`request_head`, :func:`response_head` (the one writer of
      each), :func:`chunk` / :data:`LAST_CHUNK` (the one chunk encoder),
      :class:`Origin` (where a client sends), :class:`LineSplitter` (the one
      bounded splitter of a streamed body into lines, :data:`MAX_LINE_BYTES`
      for every watch stream), :data:`IDEMPOTENT` (what may be sent twice);
    * I/O on asyncio, parsing with httptools (llhttp, C):
      :class:`ClientPool` (keep-alive connections to one origin,
      :class:`ClientResponse` back, its body as it arrives) over
      :class:`ClientConnection`, and :class:`Server` (one handler coroutine
      per :class:`Request`, answered through a :class:`Response`).

Invariants
    * **Never twice.** A request goes out again, on a new connection, only
      when it is idempotent (``GET``, ``HEAD``, ``OPTIONS``) and a reused
      connection ended before its answer, or when provably no byte of it left
      the process (the transport was already closing when it was written).
      Otherwise the caller gets :class:`~rangeshard.core.errors.AnswerLost`:
      the request may have been applied.
    * **Bounded.** A line of a streamed body longer than the limit raises
      :class:`~rangeshard.core.errors.LineTooLong`; the splitter keeps at most
      the limit (plus one read) pending, as a list joined once, never copied
      per read. Above ``high_water`` unread body bytes a connection stops
      reading its socket until the consumer catches up.
    * **Malformed is fatal at once.** Bytes the parser refuses (a bad head,
      bad chunk framing) abort the connection in the same callback and the
      reader gets :class:`~rangeshard.core.errors.BodyBroken` (or
      ``AnswerLost`` before the head); nobody waits for the peer to close.
    * A connection is reused only after a complete answer that allows it,
      not after a ``HEAD`` (its answer's framing is ambiguous to a parser),
      and not once it was idle longer than ``idle_seconds``.
    * A response body goes out with ``Content-Length`` when its length is
      known (the head together with the first body bytes), else chunked (the
      head at once: a watch's client waits for it). Requests on one server
      connection are answered in order; a closed client connection cancels
      its handler.
    * A header with a line break is refused (``ValueError`` naming the
      header, never its value: it may be a token).

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
import http
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from rangeshard.core.errors import AnswerLost, BodyBroken, LineTooLong, PeerError, Unreachable
from rangeshard.core.requestinfo import OBJECT_BODY_METHODS

log = logging.getLogger(__name__)

#: Methods a client may send again after a connection died before the answer (RFC 9110 9.2.2, as Go and httpx).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
#: The longest line of a watch stream, wherever one is split (the proxy's upstream reader, the endpoint's relay).
#: kube-apiserver refuses request bodies over 3 MiB, so no object's JSON comes near it.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Unread body bytes above which a connection stops reading its socket.
HIGH_WATER = 1 << 20
#: The last chunk of a chunked body (no trailers).
LAST_CHUNK = b"0\r\n\r\n"

Headers = list[tuple[str, str]]


# ---- sans I/O ---------------------------------------------------------------------------------------------


def _header_lines(first: str, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [first]
    for key, value in headers:
        if "\n" in key or "\r" in key or "\n" in value or "\r" in value:
            raise ValueError(f"the header {key.strip()!r} has a line break")
        lines.append(f"{key}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


def request_head(method: str, target: str, authority: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """The head of ``method target`` to ``authority`` (``Host`` first); ``ValueError``: a header with a line break."""
    return _header_lines(f"{method} {target} HTTP/1.1", [("Host", authority), *headers])


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """The head of an answer with ``status`` (its reason phrase looked up) and ``headers`` as given."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return _header_lines(f"HTTP/1.1 {status} {phrase}", headers)


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (empty data is no chunk: the last chunk is :data:`LAST_CHUNK`)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


def chunk_of(parts: list[bytes], size: int) -> bytes:
    """``parts`` (``size`` bytes together) as one chunk, in one copy."""
    return b"".join([b"%x\r\n" % size, *parts, b"\r\n"])


@dataclass(frozen=True)
class Origin:
    """Where requests go: TLS or not, host and port to connect to, the ``Host`` header, a path prefix."""

    tls: bool
    host: str
    port: int
    authority: str
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        """``http(s)://HOST[:PORT][/PREFIX]`` (credentials in it are never sent); ``ValueError`` otherwise."""
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"unsupported URL {base_url!r}: want http(s)://HOST[:PORT][/PREFIX]")
        tls = url.scheme == "https"
        port = url.port or (443 if tls else 80)  # a bad port is a ValueError too
        return cls(tls, url.hostname, port, url.netloc.rpartition("@")[2], url.path.rstrip("/"))


class LineSplitter:
    """Body pieces into lines, at most ``limit`` bytes each; a line spread over pieces waits as a list.

    Only ``\\n`` ends a line (a lone ``\\r`` is JSON whitespace); lines keep
    their ``\\n`` (a watch line is passed on as it came, without another
    copy); blank lines are dropped.
    """

    __slots__ = ("limit", "pending", "size")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self.pending: list[bytes] = []
        self.size = 0

    def split(self, pieces: list[bytes]) -> list[bytes]:
        """The complete non-blank lines in ``pieces`` after what was pending; :class:`LineTooLong` over the limit."""
        out: list[bytes] = []
        pending = self.pending
        for data in pieces:
            if b"\r" in data:  # bytes.splitlines would also split at a lone \r
                lines = [line + b"\n" for line in data.split(b"\n")]
                lines[-1] = lines[-1][:-1]
            else:
                lines = data.splitlines(keepends=True)
            if not lines:
                continue
            tail = lines[-1]
            complete = tail.endswith(b"\n")
            if pending:
                first = lines[0]
                if len(lines) == 1 and not complete:  # the pending line goes on: no join until it ends
                    lines.pop()
                    pending.append(first)
                    self.size += len(first)
                else:
                    pending.append(first)
                    lines[0] = b"".join(pending)
                    pending.clear()
                    self.size = 0
            if lines and not complete:
                lines.pop()
                if tail:
                    pending.append(tail)
                    self.size += len(tail)
            if self.size > self.limit:
                self._too_long()
            out.extend([line for line in lines if len(line) > 1 and not line.isspace()])
        return out

    def block(self, pieces: list[bytes]) -> bytes:
        """The complete lines in ``pieces`` after what was pending, as they came (blank ones too), in one block.

        For a relay that passes lines on unchanged: one search per piece, one
        join per call; :class:`LineTooLong` as :meth:`split`.
        """
        out: list[bytes] = []
        pending = self.pending
        for data in pieces:
            end = data.rfind(b"\n") + 1
            if end and pending and self.size + data.find(b"\n") > self.limit:
                self._too_long()
            tail = data[end:] if end else data
            if end:
                out.extend(pending)
                out.append(data if end == len(data) else data[:end])
                pending.clear()
                self.size = 0
            if tail:
                pending.append(tail)
                self.size += len(tail)
                if self.size > self.limit:
                    self._too_long()
        return out[0] if len(out) == 1 else b"".join(out)

    def _too_long(self) -> None:
        self.pending.clear()
        self.size = 0
        raise LineTooLong(f"a line longer than {self.limit} bytes", self.limit)

    def rest(self) -> bytes | None:
        """The last line if the body did not end with a newline (``None`` if it did, or it is blank)."""
        last = b"".join(self.pending)
        self.pending.clear()
        self.size = 0
        return last if last and not last.isspace() else None


# ---- the client ---------------------------------------------------------------------------------------------


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


# ---- the server ----------------------------------------------------------------------------------------------


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
