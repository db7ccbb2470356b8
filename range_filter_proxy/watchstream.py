"""The upstream watch stream, read over the one HTTP/1.1 layer (:mod:`rangeshard.core.http1`) instead of httpx.

Purpose
    A watch is one long ``GET`` whose chunked body carries one JSON event per
    line. Read through httpx/httpcore every socket read passed through h11's
    pure-Python chunk parser, anyio's stream and timeout scopes and three
    nested async iterators (~16 % of the proxy's CPU at 6,000 events/s in a
    py-spy profile). :func:`open_watch` sends the request on a connection of
    its own (:func:`rangeshard.core.http1client.connect`; TLS through :mod:`ssl`
    when the URL is ``https``), the answer is parsed by httptools, and the
    complete lines of each read (:class:`rangeshard.core.http1.LineSplitter`)
    go to a sink (:meth:`WatchStream.feed`, called from ``data_received``: no
    task switch per read) or are yielded as a list
    (:meth:`WatchStream.batches`). This reader does not honour proxy
    environment variables (it connects directly).

Invariants
    * The request carries exactly the headers it is given (plus ``Host``,
      ``Connection: close``, ``User-Agent``); a header with a line break is
      refused (never sent, never echoed); nothing asks for compression, and
      a compressed body is refused.
    * A line longer than ``max_line`` bytes without a newline raises
      :class:`UpstreamError` (the reflector logs a WARNING and watches again);
      a stream that ends inside a chunked or content-length body, a malformed
      body (at once), a read idle for ``read_timeout`` seconds and a connect
      that takes more than ``connect_timeout`` raise :class:`UpstreamUnavailable`.
    * With a sink, nothing is buffered beyond a pending partial line; without
      one, at most ``_HIGH_WATER`` unread body bytes are.
    * The connection is closed when the stream ends, fails or is abandoned
      (``close`` is idempotent and called from ``finally`` by the owner).

Concurrency model
    One connection per watch on the proxy's event loop; a sink given to
    ``feed`` runs in the transport's read callback (so it must not block).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from urllib.parse import urlencode

from range_filter_proxy.errors import UpstreamError, UpstreamUnavailable
from rangeshard.core import http1, http1client
from rangeshard.core.errors import LineTooLong, PeerError

#: Unread body bytes above which the socket is no longer read (until the consumer catches up).
_HIGH_WATER = 4 * 1024 * 1024
#: Bytes of a non-200 answer kept for its error message.
_ERROR_BODY_LIMIT = 1024 * 1024


def _error(what: str, e: PeerError) -> UpstreamError:
    if isinstance(e, LineTooLong):
        return UpstreamError(f"{what}: an event longer than {e.limit} bytes")
    return UpstreamUnavailable(f"{what}: {e}")


class WatchStream:
    """One open watch response: its status, then its body as batches of lines."""

    def __init__(self, response: http1client.ClientResponse, what: str, max_line: int) -> None:
        self._response = response
        self.status = response.status
        self.what = what
        self.max_line = max_line

    async def read_body(self, limit: int = _ERROR_BODY_LIMIT) -> bytes:
        """The rest of the body, at most ``limit`` bytes (for error answers)."""
        try:
            return await self._response.read(limit)
        except PeerError as e:
            raise _error(self.what, e) from e

    def _lines(self) -> http1.LineSplitter:
        if self._response.encoded:
            raise UpstreamError(f"{self.what}: the upstream compressed a watch response nobody asked to compress")
        return http1.LineSplitter(self.max_line)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The non-blank lines of the body (each with its ``\\n``), as one list per wake-up."""
        lines = self._lines()
        try:
            async for pieces in self._response.pieces():
                out = lines.split(pieces)
                if out:
                    yield out
        except PeerError as e:
            raise _error(self.what, e) from e
        last = lines.rest()
        if last is not None:
            yield [last]

    async def feed(self, sink: Callable[[list[bytes]], None]) -> None:
        """Call ``sink`` with the complete lines of every read, from the protocol itself, until the body ends.

        An exception of ``sink`` closes the connection and is raised here.
        """
        lines = self._lines()

        def split(pieces: list[bytes]) -> None:
            out = lines.split(pieces)
            if out:
                sink(out)

        try:
            await self._response.feed(split)
        except PeerError as e:
            raise _error(self.what, e) from e
        last = lines.rest()
        if last is not None:
            sink([last])

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._response.close()


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
        origin = http1.Origin.parse(base_url)
        target = origin.prefix + path + ("?" + urlencode(params) if params else "")
        fixed = [("User-Agent", "rangeshard-proxy"), ("Connection", "close")]
        request = http1.request_head("GET", target, origin.authority, [*fixed, *headers])
    except ValueError as e:
        raise UpstreamError(f"{what}: {e}") from None  # the header's value is never echoed
    try:
        conn = await http1client.connect(origin, http1client.client_ssl(verify), connect_timeout, _HIGH_WATER)
    except PeerError as e:
        raise _error(what, e) from e
    try:
        if not conn.send(request, read_timeout=read_timeout):
            raise UpstreamUnavailable(f"{what}: the connection closed before the request was sent")
        async with asyncio.timeout(connect_timeout):
            await conn.head
    except TimeoutError as e:
        conn.close()
        raise UpstreamUnavailable(f"{what}: no answer within {connect_timeout}s") from e
    except PeerError as e:
        conn.close()
        raise _error(what, e) from e
    except BaseException:
        conn.close()
        raise
    return WatchStream(http1client.ClientResponse(conn, None), what, max_line)
