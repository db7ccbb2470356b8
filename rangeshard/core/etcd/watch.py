"""Prefix watches: etcd's watch stream as our own :class:`WatchBatch` values.

Purpose
    :class:`PrefixWatch` watches every key under a prefix on one member (opened by
    ``EtcdClient.watch_prefix``); its callback gets every batch, then at most one
    :class:`~rangeshard.core.errors.RegistryError` that ends the watch.

Invariants
    A watch never resumes by itself: its owner opens a new one from the last revision it applied, on
    a new client. A cancellation pyetcd would drop, or a stream that ended, ends the watch
    (:class:`RegistryUnavailable`) instead of leaving it silent.

Concurrency model
    The callback runs on pyetcd's watch thread; one watch per client (progress notifications are per
    stream, and a broken stream must not disturb other work).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pyetcd.events as etcd_events
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc

from rangeshard.core.errors import RegistryError, RegistryUnavailable
from rangeshard.core.etcd.errors import translate
from rangeshard.core.etcd.kv import KV, kv_from
from rangeshard.core.etcd.members import PROBE_KEY, Member

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch: the key's new state (for a delete, its key and revision)."""

    deleted: bool
    kv: KV
    #: The value before the change (only when the watch asked for ``prev_kv`` and there was one).
    prev_value: bytes | None = None


@dataclass(frozen=True)
class WatchBatch:
    """One watch response: its events (all of one or more whole revisions), or none (a progress notification)."""

    revision: int
    events: tuple[WatchEvent, ...]


#: What a watch callback receives: a batch, or the error that ended the watch (then nothing more).
WatchCallback = Callable[[WatchBatch | RegistryError], None]


class PrefixWatch:
    """One etcd prefix watch on one member (see module docstring)."""

    def __init__(self, member: Member, prefix: str, callback: WatchCallback) -> None:
        self.member = member
        self.prefix = prefix
        self._callback = callback
        self._watch_id: int | None = None
        self._ended = False
        self._lock = threading.Lock()

    def open(self, start_revision: int, prev_kv: bool) -> None:
        """Start watching (pyetcd errors propagate: the client fails over and translates them)."""
        watcher = self.member.raw.watcher
        original = watcher._handle_response

        def handle(rs: Any) -> None:
            # A progress notification asked for by request_progress has watch id -1 (pyetcd drops it);
            # this stream carries this watch only (one watch per client), so it is ours.
            if rs.watch_id == -1 and not rs.events and not rs.created and not rs.canceled:
                self._deliver(rs)
                return
            if rs.canceled and not rs.compact_revision and rs.watch_id == self._watch_id:
                # pyetcd drops cancellations other than compaction; end the watch instead of hanging.
                reason = rs.cancel_reason or "no reason given"
                self._end(RegistryUnavailable(f"watching {self.prefix}: etcd canceled the watch: {reason}"))
                return
            original(rs)

        watcher._handle_response = handle
        self._watch_id = self.member.raw.add_watch_prefix_callback(
            self.prefix, self._deliver, start_revision=start_revision, prev_kv=prev_kv
        )

    def _deliver(self, response: Any) -> None:
        """Runs on pyetcd's watch thread."""
        if self._ended:
            return
        if response is None:
            self._end(RegistryUnavailable(f"watching {self.prefix}: etcd ended the watch stream"))
            return
        if isinstance(response, BaseException):
            error = translate(response, f"watching {self.prefix}")
            if isinstance(error, RegistryUnavailable):
                self.member.failed(response)
            self._end(error)
            return
        self._callback(WatchBatch(int(response.header.revision), tuple(_watch_event(ev) for ev in response.events)))

    def _end(self, error: RegistryError) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._callback(error)

    def request_progress(self) -> None:
        """Ask etcd for a progress notification (an empty batch at the current revision); best effort."""
        if self._ended:
            return
        try:
            watcher = self.member.raw.watcher
            watcher._request_queue.put_nowait(etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest()))
        except Exception:  # no notification this time
            log.debug("progress request failed for %s", self.prefix, exc_info=True)

    def probe(self) -> int:
        """Read the revision from the watch's own member: raises if *that* member stopped answering.

        A hung member keeps its watch stream open and silent; asking any other
        member would not notice.
        """
        try:
            return int(self.member.raw.get_response(PROBE_KEY).header.revision)
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
            self.member.failed(e)
            raise translate(e, f"probing {self.member.endpoint.url} for the watch on {self.prefix}") from e

    def cancel(self) -> None:
        """Stop the watch (idempotent; no callback after it returns, except one already running)."""
        self._ended = True
        if self._watch_id is not None:
            with contextlib.suppress(Exception):
                self.member.raw.cancel_watch(self._watch_id)


def _watch_event(ev: Any) -> WatchEvent:
    raw = ev._event
    has_prev = raw.HasField("prev_kv") and raw.prev_kv.version > 0
    prev_value = bytes(raw.prev_kv.value) if has_prev else None
    return WatchEvent(deleted=isinstance(ev, etcd_events.DeleteEvent), kv=kv_from(raw.kv), prev_value=prev_value)
