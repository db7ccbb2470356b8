"""Membership watch: consistent registry snapshots, delivered on every change, across etcd restarts.

Purpose
    :class:`MembershipWatch` lists the registry once, then watches the prefix
    from the next revision and calls ``callback(view)`` with a fresh
    :class:`RegistryView` after every watch response. pyetcd does not
    re-establish watches by itself; this loop does:

    * stream error (etcd restarted, connection cut) -> re-watch from the last
      seen revision + 1 on a new connection, keeping the local state;
    * the revision was compacted meanwhile -> relist, then watch again;
    * every retry waits as :class:`~rangeshard.core.backoff.Backoff` says:
      ``retry_interval`` doubling to 5 s (jittered by 20 %), back to
      ``retry_interval`` once a watch stream is established;
    * no response for ``probe_interval`` seconds -> a cheap read on the
      watch's own member checks that it still answers (a silent partition or
      a hung member does not error the stream); if not, re-watch on another
      member of the cluster (:meth:`EtcdClient.watch_prefix` asks the
      healthiest first).

Invariants
    * Every delivered view reflects etcd at exactly one revision: all events of
      a watch response (one transaction) are applied before delivering.
    * Views are delivered in revision order, never twice for the same revision
      except right after a reconnect (``view.reconnected`` is then true).
    * With ``pins=True`` the watch covers the whole registry prefix, so the
      views also say which members are pinned (:attr:`Member.pinned`); the
      views are then those of ``controller_type`` only, when one is given.
    * ``on_revision(revision, kvs, relisted)``, if given, sees the registry
      after *every* revision, even when etcd batches several revisions in
      one watch response (the fencing epochs of :mod:`registry.epochs` need
      each change at its own revision); ``relisted`` marks a fresh list.

Concurrency model
    One named daemon thread per watch (``membership-watch-<name>``); pyetcd's
    own watcher thread only enqueues. The callback runs on the watch thread;
    exceptions in it are logged and do not stop the watch.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import RangeshardError, WatchCompacted
from rangeshard.core.etcd import KV, EtcdClient, EtcdConfig, WatchBatch
from rangeshard.core.loops import join_thread, start_thread
from registry.layout import DEFAULT_PREFIX, Layout, parse_members
from registry.models import Snapshot
from registry.pins import parse_pins

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryView:
    """The registry (optionally one controller type) at one etcd revision."""

    revision: int
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    reconnected: bool = False

    def get(self, controller_type: str) -> Snapshot:
        """The snapshot of one type (empty if it has no instance)."""
        return self.snapshots.get(controller_type) or Snapshot(controller_type, self.revision, ())


_WAKE = object()
"""Put on the stream queue by :meth:`MembershipWatch.stop` so the thread sees the stop at once."""


class _Resync(Exception):
    """Internal: the watch must relist (compaction)."""


class MembershipWatch:
    """Watch one controller type (or all) and deliver consistent views (see module docstring)."""

    def __init__(
        self,
        config: EtcdConfig,
        callback: Callable[[RegistryView], None],
        *,
        controller_type: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        name: str | None = None,
        probe_interval: float = 2.0,
        retry_interval: float = 0.5,
        on_revision: Callable[[int, Mapping[str, KV], bool], None] | None = None,
        pins: bool = False,
    ) -> None:
        self.config = replace(config, timeout=min(config.timeout, max(probe_interval, 0.5)))
        self.callback = callback
        self.layout = Layout(prefix)
        self.controller_type = controller_type
        self.pins = pins
        if pins:
            self.watch_prefix = self.layout.prefix + "/"  # the records and the pins (rangeshard rebalance pin)
        else:
            self.watch_prefix = self.layout.type_prefix(controller_type) if controller_type else self.layout.controllers
        self.name = name or (controller_type or "all")
        self.probe_interval = probe_interval
        self.backoff = Backoff(retry_interval, max(retry_interval, 5.0), jitter=0.2)
        self.on_revision = on_revision
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream_queue: queue.Queue[Any] | None = None
        self._kvs: dict[str, KV] = {}
        self._revision = 0
        self.synced = threading.Event()
        self.restarts = 0
        self.relists = 0

    def start(self) -> None:
        self._stop.clear()
        self._thread = start_thread(f"membership-watch-{self.name}", self._run, what=f"membership watch {self.name}")

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream_queue
        if stream is not None:
            stream.put(_WAKE)  # do not wait out the probe interval
        join_thread(self._thread, self.probe_interval + self.config.timeout + 2)

    # -- internals -----------------------------------------------------------
    def _view(self, reconnected: bool) -> RegistryView:
        kvs = sorted(self._kvs.values(), key=lambda kv: kv.key)
        grouped = parse_members(self.layout, kvs)
        if self.pins and self.controller_type:
            grouped = {t: items for t, items in grouped.items() if t == self.controller_type}
        pinned = parse_pins(kvs, self.layout.parse_pin_key) if self.pins else {}
        snaps = {
            t: Snapshot.build(t, self._revision, items, pinned.get(t, set())) for t, items in sorted(grouped.items())
        }
        return RegistryView(self._revision, snaps, reconnected)

    def _deliver(self, reconnected: bool = False) -> None:
        try:
            self.callback(self._view(reconnected))
        except Exception:
            log.exception("membership watch %s: callback failed", self.name)

    def _relist(self, client: EtcdClient) -> None:
        rev, kvs = client.get_prefix(self.watch_prefix)
        self._kvs = {kv.key: kv for kv in kvs}
        self._revision = rev
        self.relists += 1
        self._revision_applied(rev, relisted=True)

    def _revision_applied(self, revision: int, relisted: bool = False) -> None:
        if self.on_revision is None:
            return
        try:
            self.on_revision(revision, self._kvs, relisted)
        except Exception:
            log.exception("membership watch %s: on_revision failed", self.name)

    def _apply(self, batch: WatchBatch) -> None:
        current: int | None = None
        for ev in batch.events:
            rev = ev.kv.mod_revision
            if current is not None and rev != current:
                self._revision_applied(current)
            current = rev
            if ev.deleted:
                self._kvs.pop(ev.kv.key, None)
            else:
                self._kvs[ev.kv.key] = ev.kv
        if current is not None:
            self._revision_applied(current)
        self._revision = max(self._revision, batch.revision)

    def _run(self) -> None:
        need_list = True
        reconnected = False
        while not self._stop.is_set():
            client: EtcdClient | None = None
            try:
                client = EtcdClient(self.config)
                if need_list:
                    self._relist(client)
                    need_list = False
                    self._deliver(reconnected)
                    self.synced.set()
                elif reconnected:
                    self._deliver(reconnected=True)
                reconnected = False
                self._stream(client)
            except _Resync:
                log.info("membership watch %s: revision %s compacted, relisting", self.name, self._revision + 1)
                need_list = True
                reconnected = True
            except RangeshardError as e:
                log.warning("membership watch %s: %s; retrying", self.name, e)
                reconnected = True
                self.restarts += 1
                self._stop.wait(self.backoff.next_delay())
            finally:
                if client is not None:
                    client.close()

    def _stream(self, client: EtcdClient) -> None:
        q: queue.Queue[Any] = queue.Queue()
        self._stream_queue = q
        try:
            watch = client.watch_prefix(self.watch_prefix, q.put, start_revision=self._revision + 1)
        except WatchCompacted as e:
            raise _Resync from e
        self.backoff.succeeded()
        try:
            while not self._stop.is_set():
                try:
                    item = q.get(timeout=self.probe_interval)
                except queue.Empty:
                    watch.probe()  # the watch's own member still answers? raises RegistryUnavailable
                    continue
                if item is _WAKE:
                    continue
                if isinstance(item, WatchCompacted):
                    raise _Resync
                if isinstance(item, RangeshardError):
                    raise item
                self._apply(item)
                if item.events:
                    self._deliver()
        finally:
            watch.cancel()
