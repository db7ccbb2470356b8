"""``python -m bench.hop LISTEN_PORT TARGET_PORT``: a byte-for-byte TCP relay on loopback, as its own process.

Purpose
    The floor under the external endpoint's added latency: any relay in
    another process costs one more hop (two socket copies, one more process
    to wake). The ``sidecar`` section measures requests and watch events
    through this relay beside the endpoint, in the same minute.

Invariants
    * Bytes pass unchanged both ways; each side closing ends the other.

Concurrency model
    One asyncio loop; two pump coroutines per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listen: int, target: int) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

    server = await asyncio.start_server(connection, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen, target))


if __name__ == "__main__":
    main()
