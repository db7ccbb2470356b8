"""The one HTTP/1.1 layer, sans I/O: heads, chunks, where a client sends, bounded lines.

Purpose
    Every hand-written HTTP/1.1 hop of rangeshard goes through this layer:
    the external endpoint (its server for the controller, its pool to the
    proxy), the proxy's upstream watch reader and pass-through, and the
    chunks of the proxy's downstream watches. As h11 cuts it, three modules:

    * here, sans I/O: :func:`request_head`, :func:`response_head` (the one
      writer of each), :func:`chunk` / :func:`chunk_of` / :data:`LAST_CHUNK`
      (the one chunk encoder), :class:`Origin` (where a client sends),
      :class:`LineSplitter` (the one bounded splitter of a streamed body into
      lines, :data:`MAX_LINE_BYTES` for every watch stream), :data:`IDEMPOTENT`
      (what may be sent twice);
    * :mod:`rangeshard.core.http1client` - keep-alive connections to one
      origin that never send a write twice;
    * :mod:`rangeshard.core.http1server` - one handler coroutine per request.

    Both I/O modules run on asyncio and parse with httptools (llhttp, C).

Invariants
    * **Bounded.** A line of a streamed body longer than the limit raises
      :class:`~rangeshard.core.errors.LineTooLong`; the splitter keeps at most
      the limit (plus one read) pending, as a list joined once, never copied
      per read.
    * A header with a line break is refused (``ValueError`` naming the
      header, never its value: it may be a token).

Concurrency model
    Pure functions and a splitter object owned by one reader.
"""

from __future__ import annotations

import http
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from rangeshard.core.errors import LineTooLong

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
