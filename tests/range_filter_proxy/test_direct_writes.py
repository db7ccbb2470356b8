"""Live watch events written straight to the connection at the end of each event-loop turn (issue 17).

* Through a real uvicorn (httptools) server: events arrive complete and in
  order, most chunks take the direct path, and the response stays valid
  HTTP/1.1 chunked framing (httpx parses it).
* A reader that stops reading: the transport's buffer fills, the direct path
  hands over to the task path (which waits for the connection to drain), and
  once the client reads again it gets every event, in order.
* Bookmarks written by the task never go back behind events the direct path
  wrote (resourceVersions of everything received never decrease).
* The watcher's output-path transitions, with an in-memory sink of our own
  interface: no direct write while the task has a chunk in flight, when the
  sink is not ready, or after the stream ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from range_filter_proxy import CacheSettings, create_app
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import WatchFilter
from range_filter_proxy.metrics import ProxyMetrics
from tests.range_filter_proxy.fakes import INFOS, PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually, open_raw_watch, read_events, serve


def _writes(app: Any, path: str) -> float:
    value = app.state.proxy.metrics.registry.get_sample_value(
        "range_filter_proxy_watch_writes_total", {"resource": "pods", "path": path}
    )
    return float(value or 0.0)


def _names(events: list[dict[str, Any]]) -> list[str]:
    return [e["object"]["metadata"]["name"] for e in events]


@async_test(timeout=60)
async def test_live_events_take_the_direct_path_complete_and_in_order() -> None:
    fake = FakeUpstream()
    app = create_app(fake, settings=CacheSettings())
    manager = app.state.proxy.manager
    params = {"watch": "1", "resourceVersion": "0"}
    async with (
        serve(app) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
        client.stream("GET", "/api/v1/pods", params=params) as resp,
    ):
        assert resp.status_code == 200
        lines = resp.aiter_lines()
        await eventually(lambda: sum(len(c.watchers) for c in manager.caches.values()) == 1, what="watch open")
        got: list[str] = []
        for burst in range(10):
            for i in range(50):
                fake.create(PODS, f"p{burst:02d}-{i:02d}")
            got += _names(await read_events(lines, 50))
    assert got == [f"p{b:02d}-{i:02d}" for b in range(10) for i in range(50)]
    direct, task = _writes(app, "direct"), _writes(app, "task")
    assert direct > 0, "live events never took the direct path"
    assert direct > task, f"direct {direct} / task {task}"


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    """The body of a chunked response so far, and whether its last chunk was seen; framing errors fail."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep and head.startswith(b"HTTP/1.1 200"), head[:200]
    body = b""
    while rest:
        size_line, sep, after = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line, 16)
        if size == 0:
            return body, True
        if len(after) < size + 2:
            break
        assert after[size : size + 2] == b"\r\n", "chunk not followed by CRLF"
        body += after[:size]
        rest = after[size + 2 :]
    return body, False


@async_test(timeout=90)
async def test_a_stalled_reader_gets_everything_in_order_once_it_reads_again() -> None:
    fake = FakeUpstream()
    app = create_app(fake, settings=CacheSettings(watcher_queue_size=100_000))
    manager = app.state.proxy.manager
    async with serve(app) as url:
        reader, writer = await open_raw_watch(url, "/api/v1/pods?watch=true&resourceVersion=0")
        await eventually(lambda: sum(len(c.watchers) for c in manager.caches.values()) == 1, what="watch open")
        blob = "x" * 20_000
        n = 300
        for i in range(n):
            fake.create(PODS, f"p{i:03d}", spec={"blob": blob})
            if i % 20 == 19:
                await asyncio.sleep(0)  # let the cache apply and flush (not synchronisation)
        # ~6 MB to a reader that has not read: the transport's buffer passed its high-water mark.
        await eventually(lambda: _writes(app, "task") > 0, what="the task path took over")
        data = b""
        body, done = b"", False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while body.count(b"\n") < n and loop.time() < deadline:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert chunk, "connection closed"
            data += chunk
            body, done = _dechunk(data)
        writer.close()
        await writer.wait_closed()
    events = [orjson.loads(line) for line in body.splitlines()]
    assert _names(events) == [f"p{i:03d}" for i in range(n)]
    assert not done
    assert _writes(app, "direct") > 0 and _writes(app, "task") > 0


@async_test(timeout=60)
async def test_bookmarks_never_go_back_behind_directly_written_events() -> None:
    fake = FakeUpstream()
    app = create_app(fake, settings=CacheSettings(bookmark_interval=0.005))
    manager = app.state.proxy.manager
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        params = {"watch": "1", "resourceVersion": "0", "allowWatchBookmarks": "true"}
        async with client.stream("GET", "/api/v1/pods", params=params) as resp:
            lines = resp.aiter_lines()
            await eventually(lambda: sum(len(c.watchers) for c in manager.caches.values()) == 1, what="watch open")
            for i in range(400):
                fake.create(PODS, f"p{i:03d}")
                if i % 7 == 0:
                    await asyncio.sleep(0.002)  # pacing, so bookmarks fall between bursts
            received: list[dict[str, Any]] = []
            while sum(1 for e in received if e["type"] == "ADDED") < 400:
                received += await read_events(lines, 1)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in received]
    assert rvs == sorted(rvs), "a resourceVersion went backwards"
    assert any(e["type"] == "BOOKMARK" for e in received), "no bookmark was sent"
    assert _names([e for e in received if e["type"] == "ADDED"]) == [f"p{i:03d}" for i in range(400)]


class _Sink:
    """An in-memory DirectSink (our own interface)."""

    def __init__(self) -> None:
        self.is_ready = True
        self.chunks: list[bytes] = []

    def ready(self) -> bool:
        return self.is_ready

    def write_chunk(self, parts: list[bytes], size: int) -> None:
        assert size == sum(len(p) for p in parts)
        self.chunks.append(b"".join(parts))


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # let call_soon callbacks and woken tasks run (not synchronisation)


@async_test()
async def test_watcher_output_path_transitions() -> None:
    cache = WatchCache(INFOS[PODS], FakeUpstream(), ProxyMetrics(), CacheSettings())
    w = cache.add_watcher(WatchFilter(), resume_from=0, bookmarks=False, initial_events_end=False, timeout=None)
    sink = _Sink()
    w.sink = sink
    via_task: list[bytes] = []
    release = asyncio.Event()

    async def consume() -> None:
        async for chunk in w.stream():
            via_task.append(chunk)
            await release.wait()  # the "send" of this chunk is in flight until released

    consumer = asyncio.create_task(consume())
    await _turns()
    # Direct: two offers in one turn become one write; the task is not involved.
    assert w.offer(b"a\n", 0.0) and w.offer(b"b\n", 0.0)
    await _turns()
    assert sink.chunks == [b"a\nb\n"] and via_task == []
    # Sink not ready: the task sends it (and stays "in flight" until released).
    sink.is_ready = False
    w.offer(b"c\n", 0.0)
    await _turns()
    assert via_task == [b"c\n"] and sink.chunks == [b"a\nb\n"]
    # Ready again, but the task's chunk is still in flight: no direct write may overtake it.
    sink.is_ready = True
    w.offer(b"d\n", 0.0)
    await _turns()
    assert sink.chunks == [b"a\nb\n"] and list(w.live) != []
    release.set()
    await _turns()
    assert via_task == [b"c\n", b"d\n"], "the task sent what was queued behind its chunk"
    # Back on the direct path.
    w.offer(b"e\n", 0.0)
    await _turns()
    assert sink.chunks == [b"a\nb\n", b"e\n"]
    # After the stream ended nothing is written directly any more.
    w.close("test")
    await asyncio.wait_for(consumer, 5)
    w.offer(b"f\n", 0.0)
    await _turns()
    assert sink.chunks == [b"a\nb\n", b"e\n"]
    assert cache.stats.direct_writes == 2 and cache.stats.queued_writes == 2


@async_test()
async def test_no_direct_write_after_a_watch_timed_out() -> None:
    """A watch that ends by its timeout (not closed) must not be written to after its last chunk."""
    cache = WatchCache(INFOS[PODS], FakeUpstream(), ProxyMetrics(), CacheSettings())
    w = cache.add_watcher(WatchFilter(), resume_from=0, bookmarks=False, initial_events_end=False, timeout=0.05)
    sink = _Sink()
    w.sink = sink
    chunks = [c async for c in w.stream()]
    assert chunks == [] and not w.closed
    w.offer(b"late\n", 0.0)
    await _turns()
    assert sink.chunks == []


@async_test()
async def test_a_failing_direct_write_cuts_that_watcher_only() -> None:
    cache = WatchCache(INFOS[PODS], FakeUpstream(), ProxyMetrics(), CacheSettings())

    class Broken(_Sink):
        def write_chunk(self, parts: list[bytes], size: int) -> None:
            raise RuntimeError("handler is closed")

    watchers = [
        cache.add_watcher(WatchFilter(), resume_from=0, bookmarks=False, initial_events_end=False, timeout=None)
        for _ in range(2)
    ]
    broken, healthy = Broken(), _Sink()
    watchers[0].sink, watchers[1].sink = broken, healthy
    consumers = [asyncio.create_task(_drain(w)) for w in watchers]
    await _turns()
    for w in watchers:
        w.offer(b"x\n", 0.0)
    await _turns()
    assert healthy.chunks == [b"x\n"]
    assert watchers[0].closed and watchers[0].close_reason == "write failed"
    assert list(cache.watchers.values()) == [watchers[1]]
    watchers[1].close("test")
    await asyncio.wait_for(asyncio.gather(*consumers), 5)


async def _drain(w: Any) -> None:
    async for _ in w.stream():
        pass
