"""rangeshard.core.serving: the shutdown signal runs its callbacks once, in order (streams end on it)."""

from __future__ import annotations

import asyncio

from rangeshard.core.serving import ShutdownSignal


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

    got = asyncio.run(go())
    assert got == ["a", "c", "late"]
