"""rangeshard.core.serving: streams end at the shutdown signal; nothing is left unretrieved."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from rangeshard.core.serving import ShutdownSignal, until_shutdown


async def _source(items: list[bytes], then: asyncio.Event | None = None, fail: bool = False) -> AsyncIterator[bytes]:
    for item in items:
        yield item
    if then is not None:
        await then.wait()
    if fail:
        raise ConnectionError("upstream went away")


def _run(coro: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``coro`` on a fresh loop; return its result and what the loop's exception handler saw."""
    seen: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        return await coro

    return asyncio.run(main()), seen


def test_passes_everything_through_and_ends_with_the_source() -> None:
    async def go() -> list[bytes]:
        return [c async for c in until_shutdown(_source([b"a", b"b", b"c"]), ShutdownSignal())]

    got, seen = _run(go())
    assert got == [b"a", b"b", b"c"] and seen == []


def test_ends_when_the_shutdown_begins_mid_read() -> None:
    async def go() -> list[bytes]:
        signal = ShutdownSignal()
        never = asyncio.Event()
        out: list[bytes] = []
        async for chunk in until_shutdown(_source([b"x"], then=never), signal):
            out.append(chunk)
            asyncio.get_running_loop().call_later(0.01, signal.set)
        return out

    got, seen = _run(asyncio.wait_for(go(), 5))
    assert got == [b"x"] and seen == []


def test_a_consumer_that_leaves_mid_read_leaves_no_unretrieved_error() -> None:
    async def go() -> None:
        release = asyncio.Event()
        stream = until_shutdown(_source([b"x"], then=release, fail=True), ShutdownSignal())
        assert await anext(stream) == b"x"
        reading = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # let the read start
        reading.cancel()  # the consumer goes away while the read is pending
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await stream.aclose()
        release.set()  # the source would now fail: nobody must be left to log it
        for _ in range(5):
            await asyncio.sleep(0)

    _, seen = _run(go())
    assert seen == []


def test_callbacks_run_once_in_order_and_can_be_forgotten() -> None:
    async def go() -> list[str]:
        calls: list[str] = []
        signal = ShutdownSignal()
        signal.on_set(lambda: calls.append("a"))
        forget = signal.on_set(lambda: calls.append("b"))
        signal.on_set(lambda: 1 / 0)  # logged, does not stop the rest
        signal.on_set(lambda: calls.append("c"))
        forget()
        signal.set()
        signal.set()
        signal.on_set(lambda: calls.append("late"))  # already set: runs at once
        return calls

    got, _ = _run(go())
    assert got == ["a", "c", "late"]
