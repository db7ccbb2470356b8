"""An asynchronous event recorder for the built-in controllers (client-go's EventRecorder, reduced).

Purpose
    ``recorder.event(obj, reason, message)`` queues a core/v1 Event about
    ``obj`` (built by :func:`rangeshard.core.events.event_body`); one daemon
    thread posts queued events through the proxy, so reconciles never wait
    for them.

Invariants
    * Events are best effort: a full queue drops the event (logged at debug)
      and a failed write is logged, never raised into a reconcile.
    * Events are not sharded objects: nobody reconciles them, so an event
      written after the handover of its object's key is harmless.

Concurrency model
    ``event`` may be called from any worker thread; the posting thread is
    started on first use and is a daemon (queued events die with the process).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from kubernetes import client as k8s

from rangeshard.core.events import event_body
from rangeshard.core.loops import start_thread

log = logging.getLogger(__name__)

_QUEUE_SIZE = 1000
_TIMEOUT = 5.0


class EventRecorder:
    """Queues events and posts them from one thread (see module docstring)."""

    def __init__(self, api_client: Any, component: str) -> None:
        self.core: Any = k8s.CoreV1Api(api_client)
        self.component = component
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(_QUEUE_SIZE)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def event(self, obj: dict[str, Any], reason: str, message: str, event_type: str = "Normal") -> None:
        body = event_body(obj, reason, message, component=self.component, event_type=event_type)
        with self._lock:
            if self._thread is None:
                self._thread = start_thread(f"events-{self.component}", self._run)
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.debug("event queue full: dropped %s %s", reason, message)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            ns = body["metadata"].get("namespace") or "default"
            try:
                sent = self.core.create_namespaced_event(ns, body, _request_timeout=_TIMEOUT, _preload_content=False)
                sent.read()  # the answer is not decoded, but read: that gives its connection back to the pool
            except Exception as e:  # best effort (see module docstring)
                log.info("event %s for %s not recorded: %s", body.get("reason"), body["metadata"]["name"], e)
