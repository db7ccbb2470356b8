"""A synthetic upstream for the proxy: events at a controlled rate through the proxy's own ``Upstream`` interface.

Purpose
    The local API server creates only ~100 pods/s, far below what the proxy
    can absorb, so throughput and latency are measured by feeding the proxy
    from :class:`FeedUpstream`, an in-memory implementation of
    :class:`range_filter_proxy.upstream.Upstream`. It lists ``objects`` pods
    (~1.2 KiB of JSON each) and then, on request, emits ``MODIFIED`` events
    cycling over them at a given rate. Each event is assembled as the bytes of
    a watch line (with the wall-clock send time in an annotation) and decoded
    by :func:`~range_filter_proxy.watchstream.decode_watch_line`, exactly as
    :class:`~range_filter_proxy.upstream.HttpUpstream` decodes a line off the
    wire; only the socket read and the line split are missing.

    Run as ``python -m bench.feed --port P --objects K`` it serves the real
    proxy app (``range_filter_proxy.create_app``) under uvicorn on loopback,
    plus a control endpoint ``/bench/feed`` (``POST ?rate=R&count=C`` starts
    a burst, ``GET`` reports progress) handled before the app sees the request.

Invariants
    * The resourceVersion strictly increases; every event modifies an object
      the initial list returned, so each event reaches exactly one watcher of
      a partition of the hash space.
    * Between two ``await`` points at most :data:`CHUNK` events are yielded,
      as if they had arrived in one 64 KiB read: the event loop is never
      starved by the feed itself, only by the proxy's own work.
    * One burst at a time; a new POST while one runs answers 409.

Concurrency model
    Everything runs on the proxy's event loop; the watch generator waits on an
    ``asyncio.Event`` between bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import orjson

from bench.common import real_pod, stored_pod
from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.upstream import ListResult, Upstream
from range_filter_proxy.watchstream import WatchEvent, decode_watch_line
from rangeshard.core.logs import configure_logging
from rangeshard.core.rest import GVR

log = logging.getLogger(__name__)

PODS = GVR("", "v1", "pods")
POD_INFO = ResourceInfo(PODS, "Pod", True, frozenset({"get", "list", "watch"}))
NAMESPACE = "bench-feed"
#: The watch stream waits for bursts at most this many times, each at most IDLE_WAIT_S, then ends cleanly.
MAX_WAITS = 10_000
IDLE_WAIT_S = 30.0
#: Events yielded between two awaits (about one 64 KiB socket read of ~1.2 KiB lines).
CHUNK = 48
SENT_ANNOTATION = "bench.rangeshard.io/sent"
_RV_MARK = b"@@RV@@"
_TS_MARK = b"@@TS@@"


def _template(pod: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
    """The watch line of ``pod`` split around its resourceVersion and send-time placeholders."""
    pod = orjson.loads(orjson.dumps(pod))
    meta = pod["metadata"]
    annotations = meta.pop("annotations")  # re-inserted after the RV, so the RV mark comes first
    meta.pop("resourceVersion", None)
    meta["resourceVersion"] = _RV_MARK.decode()
    meta["annotations"] = {**annotations, SENT_ANNOTATION: _TS_MARK.decode()}
    line = b'{"type":"MODIFIED","object":' + orjson.dumps(pod) + b"}"
    head, rest = line.split(b'"' + _RV_MARK + b'"')
    mid, tail = rest.split(b'"' + _TS_MARK + b'"')
    return head + b'"', b'"' + mid + b'"', b'"' + tail + b"\n"


async def paced(rate: float, count: int, batch: int) -> AsyncIterator[int]:
    """Pace ``count`` events at ``rate`` per second: at each wake-up, yield how many are due.

    Sleeps until the next event is due; when behind, up to ``batch`` due events
    go out per wake-up (as if they had arrived in one socket read); yields to
    the event loop between wake-ups, so the emitter never starves it.
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    i = 0
    while i < count:
        ahead = t0 + i / rate - loop.time()
        if ahead > 0.0005:
            await asyncio.sleep(ahead)
        limit = loop.time() + 0.0005
        n = 0
        while n < batch and i + n < count and t0 + (i + n) / rate <= limit:
            n += 1
        if n:
            i += n
            yield n
        await asyncio.sleep(0)


class PodsUpstream(Upstream):
    """The discovery half of an in-memory :class:`~range_filter_proxy.upstream.Upstream` of pods at ``rv``."""

    rv: int

    async def discover(self, group: str, version: str) -> dict[str, ResourceInfo]:
        if group == "" and version == "v1":
            return {"pods": POD_INFO}
        raise UpstreamError(f"no group/version {group}/{version}", 404)

    async def preferred_version(self, group: str) -> str:
        return "v1"

    async def current_resource_version(self, gvr: GVR) -> str:
        return str(self.rv)


class FeedUpstream(PodsUpstream):
    """In-memory :class:`~range_filter_proxy.upstream.Upstream` of pods with rate-controlled bursts."""

    def __init__(self, objects: int, shape: str = "synthetic") -> None:
        """``objects`` pods: ``synthetic`` (~1.2 KiB, :func:`stored_pod`) or ``real`` (~5.8 KiB, :func:`real_pod`:
        managedFields, a full status, labels and annotations as a real API server stores them)."""
        self.rv = 1000
        make = real_pod if shape == "real" else stored_pod
        self.pods = [make(f"pod-{i}", NAMESPACE, self.rv) for i in range(objects)]
        for p in self.pods:
            p["metadata"]["annotations"][SENT_ANNOTATION] = "0"
        self.templates = [_template(p) for p in self.pods]
        self.uids = [p["metadata"]["uid"] for p in self.pods]
        self.emitted = 0
        self.burst_id = 0
        self.burst: dict[str, Any] = {"id": 0, "rate": 0.0, "count": 0, "emitted": 0, "done": True}
        self._go = asyncio.Event()

    # ---- Upstream interface ---------------------------------------------------------------

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        return ListResult([orjson.loads(orjson.dumps(p)) for p in self.pods], str(self.rv))

    async def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        loop = asyncio.get_running_loop()
        for _ in range(MAX_WAITS):
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
                async with asyncio.timeout(IDLE_WAIT_S):
                    await self._go.wait()
            except TimeoutError:
                continue  # idle: keep the stream open (bounded by MAX_WAITS x IDLE_WAIT_S)
            self._go.clear()
            burst = self.burst
            rate = float(burst["rate"])
            count = int(burst["count"])
            t0 = loop.time()
            burst["started"] = time.time()
            i = 0
            async for due in paced(rate, count, CHUNK):
                for _ in range(due):
                    event = decode_watch_line(self.next_line(), "feed")
                    i += 1
                    burst["emitted"] = i
                    yield event
            burst["elapsed"] = loop.time() - t0
            burst["done"] = True

    def next_line(self) -> bytes:
        """The next watch line: the next pod in turn, the next resourceVersion, sent now.

        The newline is included, as the HTTP upstream's reader passes lines on.
        """
        self.rv += 1
        head, mid, tail = self.templates[self.emitted % len(self.templates)]
        self.emitted += 1
        return head + str(self.rv).encode() + mid + repr(time.time()).encode() + tail

    # ---- control ----------------------------------------------------------------------------

    def start_burst(self, rate: float, count: int) -> dict[str, Any]:
        """Schedule ``count`` events at ``rate`` per second (one burst at a time)."""
        self.burst_id += 1
        self.burst = {"id": self.burst_id, "rate": rate, "count": count, "emitted": 0, "done": False}
        self._go.set()
        return self.burst


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def with_control(app: ASGIApp, feed: FeedUpstream) -> ASGIApp:
    """Wrap the proxy app: ``/bench/feed`` is answered here, everything else by the proxy."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/bench/feed":
            await app(scope, receive, send)
            return
        status = 200
        body: dict[str, Any]
        if scope["method"] == "POST":
            q = parse_qs(scope.get("query_string", b"").decode())
            if not feed.burst.get("done", True):
                status, body = 409, {"error": "a burst is running"}
            else:
                body = feed.start_burst(float(q["rate"][0]), int(q["count"][0]))
        else:
            body = {**feed.burst, "totalEmitted": feed.emitted, "rv": feed.rv}
        data = orjson.dumps(body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return wrapped


def main(argv: list[str] | None = None) -> int:
    """Serve the proxy app over a :class:`FeedUpstream` on loopback until SIGTERM (or ``--max-seconds``)."""
    import uvicorn  # noqa: PLC0415

    from range_filter_proxy import CacheSettings, create_app  # noqa: PLC0415
    from range_filter_proxy.heap import HeapSettings  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m bench.feed")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--objects", type=int, default=1024)
    p.add_argument("--max-seconds", type=float, default=900.0)
    args = p.parse_args(argv)
    configure_logging("warning")

    async def serve() -> None:
        feed = FeedUpstream(args.objects)
        # The heap keeper on, as `rangeshard proxy` runs it by default.
        app = create_app(feed, resources=["pods"], settings=CacheSettings(), heap=HeapSettings())
        config = uvicorn.Config(
            with_control(app, feed),
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
            log_config=None,  # keep the handler configure_logging installed
            lifespan="on",
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=args.max_seconds)
        except TimeoutError:
            server.should_exit = True
            await task

    # Same event loop as `rangeshard proxy` (uvicorn.run picks uvloop when installed).
    try:
        import uvloop  # noqa: PLC0415

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
