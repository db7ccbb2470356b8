"""The one HTTP/1.1 layer (``rangeshard.core.http1``, ``http1client``) against raw loopback servers written here.

* The line splitter is bounded and linear: a line spread over many reads is
  kept as its pieces (never joined per read), one beyond the limit raises
  ``LineTooLong`` and leaves nothing pending; only ``\\n`` ends a line.
* Never twice: a write whose reused connection the server read and closed
  without answering raises ``AnswerLost`` and reached the server once; an
  idempotent ``GET`` in the same case is sent once more, on a new
  connection, and answered.
* A malformed chunked body fails the reader at once, while the server
  keeps the connection open; so does a malformed head (before any answer).
* Heads and chunks: one writer each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from rangeshard.core import http1, http1client
from rangeshard.core.errors import AnswerLost, BodyBroken, LineTooLong
from tests.range_filter_proxy.helpers import async_test

Serve = Callable[[int, bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def test_the_splitter_keeps_a_long_line_as_pieces_and_cuts_it_at_the_limit() -> None:
    lines = http1.LineSplitter(10_000)
    for _ in range(90):  # 9,000 bytes of one line over 90 reads: no join per read
        assert lines.split([b"x" * 100]) == []
    assert len(lines.pending) == 90 and lines.size == 9_000
    assert lines.split([b"yy\n{", b"}\n\n  \n"]) == [b"x" * 9_000 + b"yy\n", b"{}\n"]
    assert lines.pending == [] and lines.size == 0
    lines.split([b"z" * 6_000])
    with pytest.raises(LineTooLong) as info:
        lines.split([b"z" * 5_000])
    assert info.value.limit == 10_000 and "longer than 10000 bytes" in str(info.value)
    assert lines.pending == [] and lines.size == 0, "nothing of the cut line stays"
    with pytest.raises(LineTooLong):
        http1.LineSplitter(10).split([b"a" * 11])  # one read alone
    assert http1.LineSplitter(10).split([b"a\rb\n"]) == [b"a\rb\n"], "only \\n ends a line"


def test_the_block_splitter_passes_complete_lines_on_as_they_came_and_is_bounded_too() -> None:
    lines = http1.LineSplitter(1_000)
    assert lines.block([b'{"a":1}\n{"b"', b":2}\r\n\n{"]) == b'{"a":1}\n{"b":2}\r\n\n'
    for _ in range(9):  # 900 bytes of one line over 9 reads: kept as pieces
        assert lines.block([b"x" * 100]) == b""
    assert len(lines.pending) == 10 and lines.size == 901
    assert lines.block([b"}\n"]) == b"{" + b"x" * 900 + b"}\n"
    lines.block([b"y" * 999])
    with pytest.raises(LineTooLong):
        lines.block([b"yy\n"])  # the pending line ends, but past the limit
    assert lines.pending == [] and lines.size == 0
    with pytest.raises(LineTooLong):
        lines.block([b"z" * 600, b"z" * 600])
    assert lines.block([b"last"]) == b"" and lines.rest() == b"last"


def test_heads_and_chunks() -> None:
    assert http1.response_head(200, [("A", "1")]) == b"HTTP/1.1 200 OK\r\nA: 1\r\n\r\n"
    assert http1.response_head(599, []) == b"HTTP/1.1 599 \r\n\r\n"
    assert http1.chunk(b"abc") == b"3\r\nabc\r\n" and http1.chunk(b"") == b""
    assert http1.chunk_of([b"ab", b"cdefghijklmnop"], 16) == b"10\r\nabcdefghijklmnop\r\n"
    with pytest.raises(ValueError, match="line break"):
        http1.response_head(200, [("X", "a\r\nB: 2")])


def _ok(body: bytes = b"{}") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@asynccontextmanager
async def _server(serve: Serve) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A raw HTTP/1.1 server: ``serve(connection number, request, ...)`` answers; False closes the connection."""
    seen: list[bytes] = []
    count = 0

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        number = count
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                seen.append(request)
                if not await serve(number, request, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


@async_test()
async def test_a_write_is_never_sent_twice_and_an_idempotent_read_is() -> None:
    async def serve(number: int, request: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if number == 1 and not request.startswith(b"GET /first"):
            return False  # read the request, died before answering
        writer.write(_ok())
        return True

    async with _server(serve) as (url, seen):
        pool = http1client.ClientPool(url)
        try:
            first = await pool.request("GET", "/first", [])
            assert await first.read() == b"{}"
            first.close()  # the connection goes back to the pool
            with pytest.raises(AnswerLost):
                await pool.request("POST", "/api/v1/namespaces/a/pods", [], b'{"metadata":{"generateName":"x-"}}')
            assert [r.split(b" ")[0] for r in seen] == [b"GET", b"POST"], "the POST arrived exactly once"

            again = await pool.request("GET", "/first", [])  # the pool recovers, on a new connection
            assert again.status == 200
            again.close()
        finally:
            pool.close()

    async def drop_second(number: int, request: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if number == 1 and request.startswith(b"GET /again"):
            return False
        writer.write(_ok())
        return True

    async with _server(drop_second) as (url, seen):
        pool = http1client.ClientPool(url)
        try:
            (await pool.request("GET", "/first", [])).close()
            answer = await pool.request("GET", "/again", [])
            assert answer.status == 200 and await answer.read() == b"{}"
            answer.close()
            lines = [r.split(b"\r\n")[0] for r in seen]
            assert lines == [b"GET /first HTTP/1.1", *[b"GET /again HTTP/1.1"] * 2], (
                "sent once more, on a new connection"
            )
        finally:
            pool.close()


@async_test()
async def test_a_malformed_body_or_head_fails_the_reader_at_once() -> None:
    hold = asyncio.Event()

    async def bad_chunk(_n: int, _req: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz-not-hex\r\n")
        await hold.wait()  # the connection stays open: only the framing says it is broken
        return False

    async with _server(bad_chunk) as (url, _seen):
        pool = http1client.ClientPool(url)
        try:
            answer = await pool.request("GET", "/api/v1/pods?watch=true", [])
            started = time.monotonic()
            with pytest.raises(BodyBroken, match="malformed"):
                await answer.read()
            assert time.monotonic() - started < 5
            answer.close()
        finally:
            hold.set()
            pool.close()

    async def bad_head(_n: int, _req: bytes, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await hold.wait()
        return False

    hold.clear()
    async with _server(bad_head) as (url, _seen):
        pool = http1client.ClientPool(url)
        try:
            with pytest.raises(AnswerLost, match="malformed"):
                await pool.request("GET", "/", [])
        finally:
            hold.set()
            pool.close()
