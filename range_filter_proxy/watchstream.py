"""The upstream watch stream, read over the one HTTP/1.1 layer (:mod:`rangeshard.core.http1`), and its lines decoded.

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
    environment variables (it connects directly). :func:`decode_watch_line`
    turns one line into a :class:`WatchEvent` (the fast metadata-only path of
    :mod:`range_filter_proxy.wire` where the line is kube-apiserver's encoding).

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
from typing import Any
from urllib.parse import urlencode

import orjson

from range_filter_proxy.errors import UpstreamError, UpstreamGone, UpstreamUnavailable
from range_filter_proxy.wire import WireObject, decode_line
from rangeshard.core import http1, http1client
from rangeshard.core.errors import LineTooLong, PeerError
from rangeshard.core.http1 import MAX_LINE_BYTES
from rangeshard.core.kubeapi import WATCH_LINE_PREFIXES, status_message, watch_line_prefix

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


class WatchEvent:
    """One decoded watch event (``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``).

    ``raw`` is the object's JSON exactly as the upstream sent it, when it could
    be cut out of the line without re-serialising (see :func:`decode_watch_line`);
    the cache then keeps those bytes instead of encoding ``object`` again.
    On the fast path they are not cut out at all: ``data[start:end]`` holds
    them inside the whole line (``data``), and ``line_type`` says that
    ``data`` is exactly the line ``{"type":"<line_type>","object":<raw>}\\n``,
    which a downstream watcher can be sent as it is. ``wire`` is the object's
    metadata as the fast decoder read it (:mod:`range_filter_proxy.wire`);
    then ``object`` is decoded from the bytes only if somebody asks for it
    (the watch cache never does).
    """

    __slots__ = ("_object", "data", "end", "line_type", "start", "type", "wire")

    def __init__(
        self,
        type: str,
        object: dict[str, Any] | None = None,
        raw: bytes | None = None,
        wire: WireObject | None = None,
        line: bytes | None = None,
        start: int = 0,
        end: int = -1,
        line_type: str | None = None,
    ) -> None:
        data = raw if line is None else line
        if object is None and (data is None or wire is None):
            raise ValueError("a WatchEvent needs its object, or its raw bytes and wire metadata")
        self.type = type
        self._object = object
        self.wire = wire
        #: The object's bytes (``start == 0``, ``end == -1``) or a line holding them at ``[start:end]``.
        self.data = data
        self.start = start
        self.end = end
        self.line_type = line_type

    @property
    def raw(self) -> bytes | None:
        """The object's JSON as received, if the line held it unambiguously (a copy when it sits in a line)."""
        data = self.data
        if data is None or self.end < 0:
            return data
        return data[self.start : self.end]

    @property
    def object(self) -> dict[str, Any]:
        """The event's object as a dict (decoded from the bytes on first use when the fast path read it)."""
        if self._object is None:
            data = self.data or b""
            decoded = orjson.loads(data if self.end < 0 else memoryview(data)[self.start : self.end])
            self._object = decoded if isinstance(decoded, dict) else {}
        return self._object

    def __repr__(self) -> str:
        name = self.wire.metadata.name if self.wire is not None and self.wire.metadata is not None else None
        if name is None:
            meta = self.object.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
        return f"WatchEvent({self.type!r}, name={name!r})"


#: A watch line longer than this (no newline in sight) is a broken upstream, not an object (the endpoint's too).
MAX_WATCH_LINE_BYTES = MAX_LINE_BYTES


def decode_watch_line(line: bytes, what: str) -> WatchEvent:
    """Decode one line of a JSON watch stream (``what`` names the stream in errors).

    ``ERROR`` events raise :class:`UpstreamGone` (410) or :class:`UpstreamError`.
    When the line is exactly ``{"type":"T","object":<object>}`` (kube-apiserver's
    encoding: two members, in that order, no whitespace around them) the
    object's bytes are returned in :attr:`WatchEvent.raw`; they are a slice of
    a line that decoded as a whole, so they are that object's valid JSON.
    Such a line of an object event is read by the fast decoder
    (:func:`range_filter_proxy.wire.decode_line`: metadata only, into
    :attr:`WatchEvent.wire`); anything it does not vouch for by the general one.
    """
    if line.startswith(b'{"type":"'):
        wire = decode_line(line)
        if wire is not None:
            prefix = WATCH_LINE_PREFIXES.get(wire.type)
            if prefix is not None and line.startswith(prefix):
                # The object's bytes stay inside the line: no copy. A line ending exactly
                # in "}\n" is kube-apiserver's encoding, passed on to watchers as it is.
                if line.endswith(b"}\n"):
                    kind = wire.type
                    return WatchEvent(kind, None, None, wire.object, line, len(prefix), len(line) - 2, kind)
                if not line.endswith(b"}"):
                    line = line.rstrip()
                if line.endswith(b"}"):
                    return WatchEvent(wire.type, None, None, wire.object, line, len(prefix), len(line) - 1)
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise UpstreamError(f"{what}: undecodable event: {e}") from e
    etype = doc.get("type") if isinstance(doc, dict) else None
    obj = doc.get("object") if isinstance(doc, dict) else None
    if not isinstance(etype, str) or not isinstance(obj, dict):
        raise UpstreamError(f"{what}: malformed event {line[:200]!r}")
    if etype == "ERROR":
        code = obj.get("code")
        message = status_message(obj, f"{what}: ERROR event")
        if code == 410:
            raise UpstreamGone(message, obj)
        raise UpstreamError(message, code if isinstance(code, int) else 502, obj)
    raw: bytes | None = None
    if len(doc) == 2:
        prefix = watch_line_prefix(etype)
        if not line.endswith(b"}"):
            line = line.rstrip()
        if line.startswith(prefix) and line.endswith(b"}"):
            raw = line[len(prefix) : -1]
    return WatchEvent(etype, obj, raw)
