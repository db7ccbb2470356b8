"""All watch caches of one proxy: started on first use or from the configuration, resolved by discovery.

Purpose
    A :class:`CacheManager` holds the proxy's
    :class:`~range_filter_proxy.watchcache.WatchCache` per resource (one
    upstream list+watch each, :mod:`range_filter_proxy.reflector`), starts
    one on the first request for its resource or eagerly for the configured
    ones, answers discovery from a short-lived cache of the upstream's, and
    reports whether the upstream filters by ``shardSelector`` itself
    (:mod:`range_filter_proxy.shardprobe`). ``WatchCache`` is importable from
    here too.

Invariants
    * At most one cache per resource; a cache started on demand whose
      resource went away upstream (404) is forgotten with the discovery answer
      of its group/version, so the collection is passed through again.
    * A discovery miss is asked again at most every 5 s (always, with
      ``fresh_miss``); the configured resources are resolved with the relist
      :class:`~rangeshard.core.backoff.Backoff` until the upstream answers.

Concurrency model
    Single event loop. Discovery lookups are serialised by one lock; the
    configuration resolver and the shardSelector probe are named background
    tasks, ended by :meth:`CacheManager.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from range_filter_proxy.cached import CacheSettings
from range_filter_proxy.errors import ApiError, UpstreamError
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.rootchain import RootChain
from range_filter_proxy.shardprobe import probe_shard_selector
from range_filter_proxy.upstream import Upstream
from range_filter_proxy.watchcache import WatchCache
from rangeshard.core.backoff import Backoff
from rangeshard.core.loops import start_task
from rangeshard.core.rest import GVR, group_version

__all__ = ["CacheManager", "WatchCache"]

log = logging.getLogger(__name__)


class CacheManager:
    """All watch caches of one proxy, plus discovery of the resources they serve."""

    def __init__(self, upstream: Upstream, metrics: ProxyMetrics, settings: CacheSettings | None = None) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.settings = settings or CacheSettings()
        self.caches: dict[GVR, WatchCache] = {}
        self._discovery: dict[tuple[str, str], tuple[float, dict[str, ResourceInfo]]] = {}
        self._discovery_lock = asyncio.Lock()
        self.configured: list[GVR] = []
        self._configure_task: asyncio.Task[None] | None = None
        self._configured_done = asyncio.Event()
        #: Whether the upstream filters lists by ``shardSelector`` itself (KEP-5866), as the probe
        #: saw it (:meth:`_probe_shard_selector`), for ``/readyz?verbose``.
        self.upstream_shard_selector_detail = "not probed yet (no watch cache has synced)"
        self._probe_task: asyncio.Task[None] | None = None
        self._chain_lock = asyncio.Lock()

    async def resource_info(
        self, group: str, version: str, resource: str, *, fresh_miss: bool = False
    ) -> ResourceInfo | None:
        """Discovery information for a resource (cached; refreshed on a miss at most every 5 s).

        ``fresh_miss``: a miss is always checked with the upstream, never answered
        from a remembered "not found" (a shard-filtered request must not be passed
        through unfiltered just because a CRD appeared within the last 5 s).
        """
        key = (group, version)
        now = time.monotonic()
        window = 0.0 if fresh_miss else 5.0
        entry = self._discovery.get(key)
        if entry is not None and (resource in entry[1] or now - entry[0] < window):
            return entry[1].get(resource)
        async with self._discovery_lock:
            entry = self._discovery.get(key)
            if entry is None or (resource not in entry[1] and now - entry[0] >= window):
                try:
                    found = await self.upstream.discover(group, version)
                except UpstreamError as e:
                    if e.code != 404:
                        raise
                    found = {}
                entry = (time.monotonic(), found)
                self._discovery[key] = entry
        return entry[1].get(resource)

    def cache_for(self, info: ResourceInfo, *, configured: bool = False) -> WatchCache:
        """The cache of a resource, started on first use.

        A cache started on demand is forgotten (with the discovery answer of
        its group/version) when the upstream stops serving its resource, so a
        deleted CRD's collection is passed through again (404 from the
        upstream) instead of answered empty from a dead cache; a configured
        one keeps relisting until the resource is back.
        """
        cache = self.caches.get(info.gvr)
        if cache is None:
            cache = WatchCache(
                info, self.upstream, self.metrics, self.settings, on_gone=None if configured else self._forget
            )
            self.caches[info.gvr] = cache
            cache.start()
            if self._probe_task is None:
                self._probe_task = start_task(
                    self._probe_shard_selector(cache),
                    "watch-cache:probe-shard-selector",
                    what="probing the upstream for shardSelector support",
                )
        elif configured:
            cache.on_gone = None  # first started by a request, then configured: keep it
        return cache

    async def _probe_shard_selector(self, cache: WatchCache) -> None:
        """Ask the upstream once whether it is a native KEP-5866 server (:mod:`range_filter_proxy.shardprobe`)."""
        answer = await probe_shard_selector(self.upstream, cache.info, cache.synced, self.settings)
        if answer is None:  # the resource went away (deleted CRD): the next cache started probes again
            self._probe_task = None
            return
        supported, detail = answer
        self.upstream_shard_selector_detail = detail
        self.metrics.upstream_shard_selector_supported.set(1 if supported else 0)
        log.info("upstream shardSelector %s", detail)

    async def ensure_chain(self, cache: WatchCache, via: tuple[str, ...]) -> None:
        """Place ``cache``'s objects by their root through ``via`` (``by: root``), starting the via caches.

        One chain per resource: a request for another ``via`` than the one in
        place is refused (400), as the cache holds one root per object.
        """
        chain = cache.chain
        if chain is None:
            async with self._chain_lock:
                if cache.chain is None:
                    via_caches = []
                    for name in via:
                        resource, _, group = name.partition(".")
                        try:
                            info = await self.resolve_spec(resource, None, group)
                        except UpstreamError as e:
                            raise ApiError(
                                400 if e.code in (404, 422) else 503,
                                "BadRequest" if e.code in (404, 422) else "ServiceUnavailable",
                                f"shardSelector root path: via {name}: {e}",
                            ) from e
                        if info.gvr != cache.info.gvr:
                            via_caches.append(self.cache_for(info))
                    for c in via_caches:
                        await c.wait_synced()
                    await cache.wait_synced()
                    cache.set_chain(RootChain(cache, via, via_caches))
                    log.info("%s placed by root through [%s]", cache.info.gvr.label, ", ".join(via))
            chain = cache.chain
        if chain is not None and chain.via != via:
            raise ApiError(
                400,
                "BadRequest",
                f"{cache.info.gvr.label} are placed by root through [{', '.join(chain.via)}] on this proxy; "
                f"a second chain (through [{', '.join(via)}]) is not supported",
            )

    def _forget(self, cache: WatchCache) -> None:
        gvr = cache.info.gvr
        if self.caches.get(gvr) is cache:
            del self.caches[gvr]
        self._discovery.pop((gvr.group, gvr.version), None)

    async def resolve_spec(self, resource: str, version: str | None, group: str) -> ResourceInfo:
        """Resolve ``pods`` / ``replicasets.apps`` / ``deployments.v1.apps`` via discovery."""
        if version is None:
            version = await self.upstream.preferred_version(group)
        info = await self.resource_info(group, version, resource)
        if info is None:
            raise UpstreamError(f"the upstream has no resource {resource!r} in {group_version(group, version)}", 404)
        if not info.cacheable:
            raise UpstreamError(f"resource {info.gvr} does not support list and watch", 422)
        return info

    def start_configured(self, specs: list[tuple[str, str | None, str]]) -> None:
        """Resolve and start the configured caches in the background (retrying until the upstream answers)."""
        if not specs:
            self._configured_done.set()
            return

        async def run() -> None:
            pending = list(specs)
            backoff = Backoff(self.settings.relist_backoff_initial, self.settings.relist_backoff_max)
            while pending:
                spec = pending[0]
                try:
                    info = await self.resolve_spec(*spec)
                except UpstreamError as e:
                    if e.code in (404, 422):
                        log.error("configured resource %s cannot be cached: %s", spec, e)
                        pending.pop(0)
                        continue
                    delay = backoff.next_delay()
                    log.warning("cannot resolve %s yet: %s; retrying in %.1fs", spec, e, delay)
                    await asyncio.sleep(delay)  # retry backoff, not synchronisation
                    continue
                self.configured.append(info.gvr)
                self.cache_for(info, configured=True)
                pending.pop(0)
            self._configured_done.set()

        self._configure_task = start_task(run(), "watch-cache:configure", what="resolving the configured resources")

    def ready(self) -> tuple[bool, list[str]]:
        """Whether every configured cache has synced, and what is still missing."""
        missing: list[str] = []
        if not self._configured_done.is_set():
            missing.append("configured resources not resolved yet")
        for gvr in self.configured:
            cache = self.caches.get(gvr)
            if cache is None or not cache.synced.is_set():
                missing.append(f"{gvr.label} not synced")
        return not missing, missing

    async def stop(self) -> None:
        """Stop every cache and background task."""
        for task in (self._probe_task, self._configure_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for cache in list(self.caches.values()):
            await cache.stop()
