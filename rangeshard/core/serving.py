"""Serving an ASGI app with uvicorn so that long-lived streams end when shutdown begins.

Purpose
    Our HTTP servers (the local API server, the range filter proxy, the
    dashboard) answer watches and event streams that never end by themselves.
    Plain ``uvicorn.run`` waits for them up to its graceful-shutdown timeout,
    then cancels their tasks, and uvicorn logs each cancellation as
    ``Exception in ASGI application`` with a traceback. :func:`serve` runs the
    app with a :class:`ShutdownSignal`: the first SIGINT/SIGTERM sets it (on
    the event loop) *before* uvicorn starts waiting, so every stream ends
    cleanly (a watch client sees an ordinary end of stream and re-watches
    elsewhere) and the process exits 0.

    A stream registers a callback that ends it (:meth:`ShutdownSignal.on_set`).

Invariants
    * Callbacks run once, on the event loop, in registration order; one that
      raises is logged and does not stop the others or the shutdown.
    * A signal that asked for the shutdown is not re-raised afterwards: a
      server stopped by SIGTERM exits 0, as kube-apiserver does.
    * A second SIGINT forces the exit (uvicorn's own behaviour).

Concurrency model
    uvicorn installs ``signal.signal`` handlers, which run on the main thread
    between bytecodes; :meth:`_Server.handle_exit` therefore only schedules
    the callbacks with ``call_soon_threadsafe`` on the loop captured when
    serving began.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


class ShutdownSignal:
    """Set once when the server begins to shut down; callbacks run on the loop at that moment."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def is_set(self) -> bool:
        return self.event.is_set()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` (on the loop) when the signal is set, at once if it already is.

        Returns a function that unregisters it (for a stream that ended first).
        """
        if self.event.is_set():
            self._run(callback)
            return lambda: None
        key = self._next
        self._next += 1
        self._callbacks[key] = callback
        return lambda: self._callbacks.pop(key, None) and None

    def set(self) -> None:
        """Set the signal and run the callbacks (loop only; idempotent)."""
        if self.event.is_set():
            return
        self.event.set()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            self._run(callback)

    @staticmethod
    def _run(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("shutdown callback %r failed", callback)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, shutdown: ShutdownSignal) -> None:
        super().__init__(config)
        self.shutdown_signal = shutdown
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None and not self.should_exit:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self.shutdown_signal.set)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # The signal asked for the shutdown that just completed: exit 0 instead of
            # re-raising it (which would end the process by SIGTERM or print "Aborted!").
            self._captured_signals.clear()


def serve(app: Any, shutdown: ShutdownSignal, **options: Any) -> None:
    """Run ``app`` in the foreground until SIGINT/SIGTERM (``options`` as for ``uvicorn.Config``)."""
    options.setdefault("log_config", None)  # keep the handler rangeshard.core.logs installed
    _Server(uvicorn.Config(app, **options), shutdown).run()
