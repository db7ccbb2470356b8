"""The upstream watch stream, read with an asyncio protocol and httptools instead of httpx.

Purpose
    A watch is one long ``GET`` whose chunked body carries one JSON event per
    line. Read through httpx/httpcore every socket read passed through h11's
    pure-Python chunk parser, anyio's stream and timeout scopes and three
    nested async iterators (~16 % of the proxy's CPU at 6,000 events/s in a
    py-spy profile). :func:`open_watch` sends the request itself over
    ``loop.create_connection`` (TLS through :mod:`ssl` when the URL is
    ``https``), parses the response with ``httptools`` (C; chunked and
    content-length bodies) and hands the complete lines of each read to a
    sink (:meth:`WatchStream.feed`, called from ``data_received``: no task
    switch per read) or yields them as a list (:meth:`WatchStream.batches`).
    Everything else the proxy sends upstream (lists, discovery, reviews,
    pass-through) still goes through httpx, which also honours proxy
    environment variables; this reader does not (it connects directly).

Invariants
    * The request carries exactly the headers it is given (plus ``Host``,
      ``Connection: close``, ``User-Agent``); a header with a line break is
      refused (never sent, never echoed); nothing asks for compression, and
      a compressed body is refused.
    * A line longer than ``max_line`` bytes without a newline raises
      :class:`UpstreamError`; a stream that ends inside a chunked or
      content-length body, a read idle for ``read_timeout`` seconds and a
      connect that takes more than ``connect_timeout`` raise
      :class:`UpstreamUnavailable`.
    * With a sink, nothing is buffered beyond a pending partial line; without
      one, at most ``_HIGH_WATER`` unread body bytes are: reading from the
      socket is paused above it and resumed when the consumer catches up.
    * The connection is closed when the stream ends, fails or is abandoned
      (``close`` is idempotent and called from ``finally`` by the owner).

Concurrency model
    One protocol per watch on the proxy's event loop. The transport calls
    :class:`_WatchProtocol` synchronously; a sink given to ``feed`` runs in
    that callback (so it must not block). Otherwise the consumer task awaits one
    future at a time in :meth:`WatchStream._read` and takes every body piece
    buffered since, so a burst that arrived in several reads is handled in
    one event-loop turn.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from typing import cast
from urllib.parse import urlencode

import httptools

from range_filter_proxy.errors import UpstreamError, UpstreamUnavailable
from rangeshard.core.relay import Origin, request_head

#: Unread body bytes above which the socket is no longer read (until the consumer catches up).
_HIGH_WATER = 4 * 1024 * 1024
#: Bytes of a non-200 answer kept for its error message.
_ERROR_BODY_LIMIT = 1024 * 1024


class _Lines:
    """Splits body pieces into lines; a line spread over pieces waits in ``pending`` (at most ``max_line`` bytes)."""

    __slots__ = ("max_line", "pending", "size", "what")

    def __init__(self, max_line: int, what: str) -> None:
        self.max_line = max_line
        self.what = what
        self.pending: list[bytes] = []
        self.size = 0

    def split(self, pieces: list[bytes]) -> list[bytes]:
        """The complete non-blank lines in ``pieces`` (after what was pending), each with its ``\\n``.

        Lines keep their line end so that a watch line can be passed on to
        downstream watchers as it came (:mod:`range_filter_proxy.cached`),
        without another copy. Only ``\\n`` ends a line: a lone ``\\r`` is JSON
        whitespace (``bytes.splitlines`` would split there, so pieces holding
        one are split the slow way).
        """
        out: list[bytes] = []
        pending = self.pending
        for data in pieces:
            if b"\r" in data:
                lines = [line + b"\n" for line in data.split(b"\n")]
                lines[-1] = lines[-1][:-1]
            else:
                lines = data.splitlines(keepends=True)
            if not lines:
                continue
            if pending:
                pending.append(lines[0])
                lines[0] = b"".join(pending)
                pending.clear()
                self.size = 0
            tail = lines[-1]
            if not tail.endswith(b"\n"):
                lines.pop()
                if tail:
                    pending.append(tail)
                    self.size += len(tail)
                    if self.size > self.max_line:
                        raise UpstreamError(f"{self.what}: an event longer than {self.max_line} bytes")
            out.extend([line for line in lines if not line.isspace()])
        return out

    def rest(self) -> bytes | None:
        """The last line if the body did not end with a newline."""
        last = b"".join(self.pending)
        self.pending.clear()
        return last if last and not last.isspace() else None


class _WatchProtocol(asyncio.Protocol):
    """HTTP/1.1 response parsing (httptools callbacks) and body buffering for one watch."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers_done: asyncio.Future[None] = loop.create_future()
        self.framed = False  # chunked or content-length: the end is in the data, not the connection close
        self.encoded = False
        self.complete = False
        self.lost = False
        self.error: Exception | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._read_timeout = read_timeout
        self._last_data = loop.time()
        self._idle_timer: asyncio.TimerHandle | None = loop.call_later(read_timeout, self._check_idle)
        #: Set by :meth:`WatchStream.feed`: complete lines go straight to it from ``data_received``.
        self.sink: Callable[[list[bytes]], None] | None = None
        self.lines: _Lines | None = None

    # ---- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamUnavailable(f"malformed HTTP response: {e}"))
            return
        if self.sink is not None:
            if self._body:
                self.deliver()
            if self.complete:
                self._wake()
            return
        if self._size > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_idle_timer()
        if not self.headers_done.done():
            self._head_failed(UpstreamUnavailable(f"connection closed before a response: {exc!r}"))
        elif not self.complete and self.framed and self.error is None:
            self.error = UpstreamUnavailable(f"connection closed inside the response body: {exc!r}")
        self._wake()

    # ---- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname in (b"transfer-encoding", b"content-length"):
            self.framed = True
        elif lname == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            self.encoded = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # ---- helpers ---------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        if not self.headers_done.done():
            self._head_failed(error)
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _head_failed(self, error: Exception) -> None:
        self.headers_done.set_exception(error)
        self.headers_done.exception()  # retrieved: nobody may be waiting any more (connect timed out)

    def _check_idle(self) -> None:
        idle = self._loop.time() - self._last_data
        if idle >= self._read_timeout:
            self._idle_timer = None
            self._fail(UpstreamUnavailable(f"no data for {idle:.0f}s (read timeout)"))
        else:
            self._idle_timer = self._loop.call_later(self._read_timeout - idle, self._check_idle)

    def take(self) -> list[bytes]:
        """Every body piece buffered (``[]`` if none); resumes reading if it was paused."""
        body = self._body
        if not body:
            return body
        self._body = []
        self._size = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return body

    def deliver(self) -> None:
        """Hand the complete lines buffered so far to the sink; its exception ends the stream."""
        sink, lines = self.sink, self.lines
        if sink is None or lines is None:
            return
        try:
            out = lines.split(self.take())
            if out:
                sink(out)
        except Exception as e:  # whatever the sink raised is the stream's error, re-raised by feed
            self._fail(e)

    async def wait(self) -> None:
        """Until more data arrived or the stream ended."""
        if self._body or self.complete or self.lost or self.error is not None:
            return
        self._waiter = self._loop.create_future()
        await self._waiter

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def close(self) -> None:
        self._stop_idle_timer()
        if self.transport is not None and not self.lost:
            self.transport.close()


class WatchStream:
    """One open watch response: its status, then its body as batches of lines."""

    def __init__(self, protocol: _WatchProtocol, what: str, max_line: int) -> None:
        self._p = protocol
        self.status = protocol.status
        self.what = what
        self.max_line = max_line

    async def _read(self) -> list[bytes]:
        """The next body pieces; ``[]`` at the end of the body. Raises what the connection raised."""
        p = self._p
        while True:
            pieces = p.take()
            if pieces:
                return pieces
            if p.error is not None:
                raise p.error
            if p.complete or p.lost:
                return pieces
            await p.wait()

    async def read_body(self, limit: int = _ERROR_BODY_LIMIT) -> bytes:
        """The rest of the body, at most ``limit`` bytes (for error answers)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            pieces = await self._read()
            if not pieces:
                break
            parts.extend(pieces)
            size += sum(len(x) for x in pieces)
        return b"".join(parts)[:limit]

    def _lines(self) -> _Lines:
        if self._p.encoded:
            raise UpstreamError(f"{self.what}: the upstream compressed a watch response nobody asked to compress")
        return _Lines(self.max_line, self.what)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The non-blank lines of the body (without ``\\n``), as one list per wake-up."""
        lines = self._lines()
        while True:
            pieces = await self._read()
            if not pieces:
                break
            out = lines.split(pieces)
            if out:
                yield out
        last = lines.rest()
        if last is not None:
            yield [last]

    async def feed(self, sink: Callable[[list[bytes]], None]) -> None:
        """Call ``sink`` with the complete lines of every read, from the protocol itself, until the body ends.

        No task switch per read: the lines are handled inside ``data_received``.
        An exception of ``sink`` closes the connection and is raised here.
        """
        p = self._p
        p.lines = lines = self._lines()
        p.sink = sink
        try:
            p.deliver()  # what arrived together with the response head
            while p.error is None and not p.complete and not p.lost:
                await p.wait()
            if p.error is not None:
                raise p.error
            last = lines.rest()
            if last is not None:
                sink([last])
        finally:
            p.sink = None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._p.close()


def _client_ssl(verify: ssl.SSLContext | bool) -> ssl.SSLContext:
    if isinstance(verify, ssl.SSLContext):
        return verify
    ctx = ssl.create_default_context()
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def open_watch(
    base_url: str,
    path: str,
    params: dict[str, str],
    headers: Sequence[tuple[str, str]],
    *,
    verify: ssl.SSLContext | bool,
    what: str,
    connect_timeout: float,
    read_timeout: float,
    max_line: int,
) -> WatchStream:
    """Connect, send ``GET base_url + path ? params`` and wait for the response head.

    ``base_url`` may carry a path prefix (``https://host:6443/prefix``).
    Connection failures raise :class:`UpstreamUnavailable`; the caller
    closes the returned stream.
    """
    try:
        origin = Origin.parse(base_url)
        target = origin.prefix + path + ("?" + urlencode(params) if params else "")
        fixed = [("User-Agent", "rangeshard-proxy"), ("Connection", "close")]
        request = request_head("GET", target, origin.authority, [*fixed, *headers])
    except ValueError as e:
        raise UpstreamError(f"{what}: {e}") from None  # the header's value is never echoed
    loop = asyncio.get_running_loop()
    protocol = _WatchProtocol(loop, read_timeout)
    try:
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(
                lambda: protocol,
                origin.host,
                origin.port,
                ssl=_client_ssl(verify) if origin.tls else None,
                server_hostname=origin.host if origin.tls else None,
            )
            transport = protocol.transport
            if transport is None:  # create_connection calls connection_made before it returns
                raise UpstreamUnavailable(f"{what}: no transport after connecting")
            transport.write(request)
            await protocol.headers_done
    except (OSError, ssl.SSLError, TimeoutError) as e:
        protocol.close()
        raise UpstreamUnavailable(f"{what}: {e!r}") from e
    except BaseException:
        protocol.close()
        raise
    return WatchStream(protocol, what, max_line)
