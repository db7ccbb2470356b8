"""A fast fake API server for the throughput benchmark: the proxy's real HTTP upstream path under load.

Purpose
    The local API server writes ~100 objects/s, far below what the proxy
    absorbs, and :mod:`bench.feed` skips the proxy's HTTP upstream read. This
    server speaks just enough of the Kubernetes API over HTTP/1.1 for an
    unmodified ``rangeshard proxy --upstream http://...`` to cache pods from
    it (``--shape real``: pods as a real API server stores them, ~5.8 KiB with
    ``managedFields`` and a full status): ``/api/v1`` discovery, the pod list (also with ``limit=1`` for the
    current resourceVersion, and in pages with ``limit``/``continue``) and chunked watch streams. Watch events are the
    feed's ~1.2 KiB ``MODIFIED`` lines (same bytes, fresh send timestamps),
    emitted in bursts at a controlled rate; the events due at one wake-up go
    out as one chunk, as kube-apiserver flushes a watch only when its queue
    is empty.

    ``python -m bench.upstream_server`` prints its port on stdout. Control:
    ``POST /bench/feed?rate=R&count=C`` starts a burst (409 while one runs),
    ``GET /bench/feed`` reports progress, like :mod:`bench.feed`.

Invariants
    * resourceVersions strictly increase; every event modifies a listed pod,
      so each one reaches exactly one watcher of a hash-space partition.
    * Every loop is bounded (requests per connection, waits per watch,
      events per burst); the process exits after ``--max-seconds``.
    * Requests it does not serve are answered 404 with a ``Status``.

Concurrency model
    One asyncio loop (uvloop when installed). One coroutine per connection;
    watch streams wait on an ``asyncio.Event`` between bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from bench.feed import FeedUpstream, paced

_MAX_REQUESTS_PER_CONNECTION = 1_000_000
_MAX_WAITS = 10_000
_IDLE_WAIT_S = 30.0


class FakeApiServer:
    """The state and handlers of the fake API server (see module docstring)."""

    def __init__(self, objects: int, shape: str = "synthetic") -> None:
        self.feed = FeedUpstream(objects, shape)
        self.watches = 0
        self._go = asyncio.Event()
        self._burst_id = 0

    # ---- HTTP plumbing ---------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one keep-alive connection until the client closes it."""
        try:
            for _ in range(_MAX_REQUESTS_PER_CONNECTION):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                length = 0
                for h in header_lines:
                    name, _, value = h.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip() or 0)
                if length:
                    await reader.readexactly(length)
                url = urlsplit(target)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/api/v1/pods" and query.get("watch") in ("true", "1"):
                    await self._watch(writer)
                    return
                status, body = self._answer(method, url.path, query)
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (status, len(body), body)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    def _answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        feed = self.feed
        if path == "/bench/feed":
            if method == "POST":
                if not feed.burst.get("done", True):
                    return 409, b'{"error":"a burst is running"}'
                self._burst_id += 1
                feed.start_burst(float(query["rate"]), int(query["count"]))
                self._go.set()
                return 200, orjson.dumps(feed.burst)
            return 200, orjson.dumps({**feed.burst, "totalEmitted": feed.emitted, "rv": feed.rv})
        if path == "/api/v1":
            resource = {"name": "pods", "namespaced": True, "kind": "Pod", "verbs": ["get", "list", "watch"]}
            return 200, orjson.dumps({"kind": "APIResourceList", "groupVersion": "v1", "resources": [resource]})
        if path == "/api/v1/pods":
            meta: dict[str, Any] = {"resourceVersion": str(feed.rv)}
            items: list[dict[str, Any]] = feed.pods
            limit = int(query.get("limit") or 0)
            if limit == 1:
                items = []  # the current resourceVersion only
            elif limit > 1:
                # Pages by offset (the token); no event is emitted while the proxy lists, so one snapshot.
                start = int(query.get("continue") or 0)
                items = feed.pods[start : start + limit]
                if start + limit < len(feed.pods):
                    meta["continue"] = str(start + limit)
            return 200, orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
        return 404, orjson.dumps({**status, "message": f"{method} {path} is not served by the bench upstream"})

    # ---- watch -----------------------------------------------------------------------------

    async def _watch(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        self.watches += 1
        feed = self.feed
        loop = asyncio.get_running_loop()
        try:
            for _ in range(_MAX_WAITS):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_IDLE_WAIT_S):
                        await self._go.wait()
                if not self._go.is_set():
                    continue
                self._go.clear()
                burst = feed.burst
                rate = float(burst["rate"])
                count = int(burst["count"])
                t0 = loop.time()
                i = 0
                async for due in paced(rate, count, 256):
                    data = b"".join(feed.next_line() for _ in range(due))
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    i += due
                    burst["emitted"] = i
                    await writer.drain()
                burst["elapsed"] = loop.time() - t0
                burst["done"] = True
        finally:
            self.watches -= 1


async def _serve(objects: int, max_seconds: float, shape: str = "synthetic") -> None:
    api = FakeApiServer(objects, shape)
    server = await asyncio.start_server(api.handle, "127.0.0.1", 0)
    sys.stdout.write(f"{server.sockets[0].getsockname()[1]}\n")
    sys.stdout.flush()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max_seconds):
            await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Serve until ``--max-seconds`` (or SIGTERM)."""
    p = argparse.ArgumentParser(prog="python -m bench.upstream_server")
    p.add_argument("--objects", type=int, default=1024)
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument(
        "--shape",
        choices=("synthetic", "real"),
        default="synthetic",
        help="pods of ~1.2 KiB, or ~5.8 KiB as a real API server stores them (managedFields, status)",
    )
    args = p.parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415

        uvloop.run(_serve(args.objects, args.max_seconds, args.shape))
    except ImportError:
        asyncio.run(_serve(args.objects, args.max_seconds, args.shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
