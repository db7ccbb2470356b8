"""The machine's latency floor for the throughput benchmark: a sender that only writes the lines.

Purpose
    Latency measured on this 2-core virtual machine includes what the
    machine adds anyway (scheduling, loopback, the clients' own wake-ups).
    ``python -m bench.floor --rate R --count C`` serves the same watch lines
    the feed produces (same ~1.2 KiB bytes, fresh send timestamps) as chunked
    HTTP/1.1 responses to 16 connections, round-robin, at ``R`` events/s, and
    does nothing else: no decoding, no cache, no filtering. Measured with the
    very same clients and core pinning as the proxy, its latency is the floor
    the proxy's added latency is compared with.

Invariants
    * It prints its port on stdout, waits at most 30 s for ``--watchers``
      connections, sends exactly ``--count`` events, ends every response and
      exits; every loop is bounded.
    * Pacing is the feed's: events go out when due, several per wake-up when
      behind.

Concurrency model
    One asyncio loop (uvloop when installed, like the proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from bench.feed import FeedUpstream, paced


async def _serve(rate: float, count: int, watchers: int) -> None:
    writers: list[asyncio.StreamWriter] = []
    connected = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        writers.append(writer)
        if len(writers) >= watchers:
            connected.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    sys.stdout.write(f"{server.sockets[0].getsockname()[1]}\n")
    sys.stdout.flush()
    async with asyncio.timeout(30):
        await connected.wait()
    feed = FeedUpstream(1024)
    i = 0
    async for due in paced(rate, count, 48):
        for _ in range(due):
            line = feed.next_line()
            writers[i % watchers].write(b"%x\r\n%s\r\n" % (len(line), line))
            i += 1
    for w in writers:
        w.write(b"0\r\n\r\n")
        await w.drain()
        w.close()
    server.close()


def main(argv: list[str] | None = None) -> int:
    """Serve one paced burst to ``--watchers`` connections, then exit."""
    p = argparse.ArgumentParser(prog="python -m bench.floor")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--watchers", type=int, default=16)
    args = p.parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415

        uvloop.run(_serve(args.rate, args.count, args.watchers))
    except ImportError:
        asyncio.run(_serve(args.rate, args.count, args.watchers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
