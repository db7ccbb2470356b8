"""Small async helpers for the proxy tests: run a coroutine, poll with a deadline, serve an app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import orjson
import uvicorn

from rangeshard.core.process import free_port

P = ParamSpec("P")
T = TypeVar("T")


def async_test(timeout: float = 30.0) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, T]]:
    """Run an ``async def`` test in a fresh event loop, failing after ``timeout`` seconds."""

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            async def guarded() -> T:
                return await asyncio.wait_for(fn(*args, **kwargs), timeout)

            return asyncio.run(guarded())

        return wrapper

    return decorate


async def eventually(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or predicate}")
        await asyncio.sleep(0.01)  # poll interval


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn inside the current loop; yield its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="test-uvicorn")
    await eventually(lambda: server.started or task.done(), what="uvicorn started")
    if task.done():
        task.result()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def read_events(lines: AsyncIterator[str], n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Read ``n`` watch events from a line iterator."""
    out: list[dict[str, Any]] = []

    async def take() -> None:
        async for line in lines:
            if line.strip():
                out.append(orjson.loads(line))
                if len(out) >= n:
                    return

    await asyncio.wait_for(take(), timeout)
    return out


async def assert_statuses(client: Any, path: str, cases: list[tuple[dict[str, str], int, str]]) -> None:
    """GET ``path`` with each case's params: a ``Status`` with that code whose message contains the text."""
    for params, code, text in cases:
        resp = await client.get(path, params=params)
        assert resp.status_code == code, (params, resp.text)
        body = resp.json()
        assert body["kind"] == "Status" and body["code"] == code and text in body["message"], (params, body)


async def open_raw_watch(url: str, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``GET target`` over a bare socket with a 4 KiB receive buffer (a reader that can stall the proxy)."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
    await writer.drain()
    return reader, writer
