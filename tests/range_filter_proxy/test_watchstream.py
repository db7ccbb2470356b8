"""The upstream watch reader (asyncio protocol + httptools) against raw HTTP/1.1 servers written here.

* TLS to the upstream with a private CA, a required client certificate and a
  bearer token: the request carries the proxy's credentials, the events arrive.
* Chunk framing cut at awkward places (inside chunk-size lines, inside events),
  a ``Content-Length`` body, blank lines: the same events as one clean read.
* Failures: 410 and other statuses with a ``Status`` body, a body cut off
  mid-chunk, a line beyond the cap, a compressed body, an idle upstream
  (read timeout), a refused connection.
* A consumer that stops reading pauses the socket (bounded buffer) and
  resumes it: every event still arrives.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from range_filter_proxy.errors import UpstreamError, UpstreamGone, UpstreamUnavailable
from range_filter_proxy.upstream import HttpUpstream, UpstreamConfig
from range_filter_proxy.watchstream import WatchEvent, open_watch
from rangeshard.core.process import free_port
from tests.range_filter_proxy.fakes import INFOS, PODS
from tests.range_filter_proxy.helpers import async_test
from tests.security.certs import make_pki

POD = INFOS[PODS]
Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _line(name: str, rv: int, etype: str = "ADDED") -> bytes:
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}
    return b'{"type":"' + etype.encode() + b'","object":' + orjson.dumps(obj) + b"}\n"


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@asynccontextmanager
async def _server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A one-request-per-connection HTTP server; ``handler`` gets the request head and writes the answer."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await handler(head, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    port = free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port, ssl=tls)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def _writes(*parts: bytes, pause: float = 0.0) -> Handler:
    """A handler writing ``parts`` one by one (each flushed), then closing."""

    async def handler(_head: bytes, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)  # lets each part arrive in its own read; not synchronisation

    return handler


_OK_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _collect(url: str, config: UpstreamConfig | None = None) -> list[WatchEvent]:
    upstream = HttpUpstream(config or UpstreamConfig(url))
    try:
        return [ev async for ev in upstream.watch(PODS, "7")]
    finally:
        await upstream.aclose()


@async_test()
async def test_tls_with_client_certificate_and_bearer_token(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    server_tls.load_cert_chain(pki.server_cert, pki.server_key)
    server_tls.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
    seen: list[bytes] = []
    body = _chunked([_line("a", 8), _line("b", 9)])

    async def handler(head: bytes, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(head)
        writer.write(_OK_CHUNKED + body)
        await writer.drain()

    client_tls = ssl.create_default_context(cafile=str(pki.ca_cert))
    client_tls.load_cert_chain(pki.client_cert, pki.client_key)
    async with _server(handler, server_tls) as url:
        config = UpstreamConfig(url, client_tls, lambda: "Bearer s3cret")
        events = await _collect(url, config)
        assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]
        # Without the client certificate the handshake fails: an unavailable upstream, not a crash.
        with pytest.raises(UpstreamUnavailable):
            await _collect(url, UpstreamConfig(url, ssl.create_default_context(cafile=str(pki.ca_cert))))
        # A CA that did not sign the server's certificate is refused.
        with pytest.raises(UpstreamUnavailable):
            await _collect(url, UpstreamConfig(url, ssl.create_default_context()))
    request = seen[0].decode("latin-1")
    assert request.startswith("GET /api/v1/pods?watch=true&resourceVersion=7&allowWatchBookmarks=true&")
    assert "\r\nAuthorization: Bearer s3cret\r\n" in request
    assert "\r\nAccept: application/json\r\n" in request
    assert "accept-encoding" not in request.lower()


@async_test()
async def test_framing_cut_anywhere_gives_the_same_events() -> None:
    lines = [_line(f"p{i}", 10 + i) for i in range(5)]
    body = _chunked([lines[0] + lines[1][:17], lines[1][17:] + b"\n\r\n", lines[2], lines[3] + lines[4][:-1], b"\n"])
    raw = _OK_CHUNKED + body
    cuts = [5, len(_OK_CHUNKED) + 1, len(_OK_CHUNKED) + 3, len(_OK_CHUNKED) + 200, len(raw) - 4, len(raw) - 1]
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    async with _server(_writes(*parts, pause=0.01)) as url:
        events = await _collect(url)
    assert [e.object["metadata"]["name"] for e in events] == [f"p{i}" for i in range(5)]
    assert all(e.raw is not None and orjson.loads(e.raw) == e.object for e in events)
    # A Content-Length body without a final newline.
    plain = lines[0] + lines[1].rstrip(b"\n")
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(plain)
    async with _server(_writes(head + plain)) as url:
        assert [e.object["metadata"]["name"] for e in await _collect(url)] == ["p0", "p1"]


@async_test()
async def test_error_statuses_become_upstream_errors() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "message": "too old: 7"}
    gone = orjson.dumps(status)
    async with _server(_writes(b"HTTP/1.1 410 Gone\r\nContent-Length: %d\r\n\r\n%s" % (len(gone), gone))) as url:
        with pytest.raises(UpstreamGone, match="too old: 7"):
            await _collect(url)
    denied = orjson.dumps({**status, "code": 403, "message": "pods is forbidden"})
    async with _server(
        _writes(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(denied), denied))
    ) as url:
        with pytest.raises(UpstreamError, match="pods is forbidden") as info:
            await _collect(url)
        assert info.value.code == 403
    # An ERROR event inside the stream: the events before it are still delivered.
    error = b'{"type":"ERROR","object":' + gone + b"}\n"
    got: list[WatchEvent] = []
    async with _server(_writes(_OK_CHUNKED + _chunked([_line("a", 8) + error]))) as url:
        upstream = HttpUpstream(UpstreamConfig(url))
        try:
            with pytest.raises(UpstreamGone):
                async for ev in upstream.watch(PODS, "7"):
                    got.append(ev)
        finally:
            await upstream.aclose()
    assert [e.object["metadata"]["name"] for e in got] == ["a"]


@async_test()
async def test_broken_streams_raise() -> None:
    # Cut off inside a chunk: unavailable, not a clean end.
    cut = _OK_CHUNKED + b"400\r\n" + _line("a", 8)
    async with _server(_writes(cut)) as url:
        with pytest.raises(UpstreamUnavailable, match="inside the response body"):
            await _collect(url)
    # Compressed although nobody asked.
    gz = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked([b"\x1f\x8b"])
    async with _server(_writes(gz)) as url:
        with pytest.raises(UpstreamError, match="compressed"):
            await _collect(url)
    # Garbage instead of HTTP.
    async with _server(_writes(b"SSH-2.0-OpenSSH\r\n\r\n")) as url:
        with pytest.raises(UpstreamUnavailable):
            await _collect(url)
    # Nobody listening.
    with pytest.raises(UpstreamUnavailable):
        await _collect(f"http://127.0.0.1:{free_port()}")
    # A credential with a line break is refused, not sent (and not echoed).
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UpstreamError, match="line break") as info:
        await _collect(url, UpstreamConfig(url, True, lambda: "Bearer t0k\r\nX-Injected: 1"))
    assert "t0k" not in str(info.value)


@async_test()
async def test_line_cap_and_read_timeout() -> None:
    endless = _OK_CHUNKED + _chunked([b'{"type":"ADDED","object":{"x":"' + b"y" * 5000])[:-5]
    async with _server(_writes(endless, pause=5)) as url:
        stream = await open_watch(
            url, "/api/v1/pods", {}, [], verify=True, what="w", connect_timeout=5, read_timeout=30, max_line=4096
        )
        try:
            with pytest.raises(UpstreamError, match="longer than 4096 bytes"):
                async for _ in stream.batches():
                    pass
        finally:
            stream.close()
        stream = await open_watch(
            url, "/api/v1/pods", {}, [], verify=True, what="w", connect_timeout=5, read_timeout=0.3, max_line=1 << 20
        )
        try:
            with pytest.raises(UpstreamUnavailable, match="read timeout"):
                async for _ in stream.batches():
                    pass
        finally:
            stream.close()


@async_test(timeout=60)
async def test_slow_consumer_pauses_the_socket_and_loses_nothing() -> None:
    count = 12_000  # ~1.5 MB per 12k events of ~130 B: several times the 4 MiB buffer in total below
    filler = b"z" * 600
    lines = [_line(f"p{i}", 10 + i).replace(b'"ns"', b'"ns","f":"' + filler + b'"', 1) for i in range(count)]
    body = _chunked([b"".join(lines[i : i + 100]) for i in range(0, count, 100)])
    async with _server(_writes(_OK_CHUNKED + body)) as url:
        stream = await open_watch(
            url, "/api/v1/pods", {}, [], verify=True, what="w", connect_timeout=5, read_timeout=30, max_line=1 << 20
        )
        try:
            got = 0
            async for batch in stream.batches():
                got += len(batch)
                if got < count // 2:
                    await asyncio.sleep(0.002)  # a slow consumer: lets the buffer fill up
        finally:
            stream.close()
    assert got == count


@async_test()
async def test_watch_apply_feeds_events_from_the_read_callback() -> None:
    """The cache's path: events applied as reads arrive, split anywhere; errors end the watch."""
    lines = [_line(f"p{i}", 10 + i) for i in range(4)]
    raw = _OK_CHUNKED + _chunked([lines[0] + lines[1][:9], lines[1][9:] + lines[2], lines[3][:-1]])
    cuts = [len(_OK_CHUNKED) - 3, len(_OK_CHUNKED) + 40, len(raw) - 30]
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    upstream_events: list[WatchEvent] = []
    async with _server(_writes(*parts, pause=0.01)) as url:
        upstream = HttpUpstream(UpstreamConfig(url))
        try:
            count = await upstream.watch_apply(PODS, "7", upstream_events.append)
            assert count == 4
            assert [e.object["metadata"]["name"] for e in upstream_events] == ["p0", "p1", "p2", "p3"]
        finally:
            await upstream.aclose()
    # An ERROR event (410): the events before it are applied, then UpstreamGone.
    gone = b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}\n'
    applied: list[WatchEvent] = []
    async with _server(_writes(_OK_CHUNKED + _chunked([lines[0] + gone + lines[1]]))) as url:
        upstream = HttpUpstream(UpstreamConfig(url))
        try:
            with pytest.raises(UpstreamGone, match="too old"):
                await upstream.watch_apply(PODS, "7", applied.append)
        finally:
            await upstream.aclose()
    assert [e.object["metadata"]["name"] for e in applied] == ["p0"]

    # What the consumer raises ends the watch and reaches the caller.
    def refuse(_ev: WatchEvent) -> None:
        raise UpstreamError("bookmark without a valid resourceVersion")

    async with _server(_writes(_OK_CHUNKED, _chunked([lines[0]]), pause=0.01)) as url:
        upstream = HttpUpstream(UpstreamConfig(url))
        try:
            with pytest.raises(UpstreamError, match="bookmark without"):
                await upstream.watch_apply(PODS, "7", refuse)
        finally:
            await upstream.aclose()
