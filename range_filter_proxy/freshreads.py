"""Reads of a watch cache that must be as fresh as the upstream: consistent snapshots, "not older than N".

Purpose
    A list without a resourceVersion is a consistent read in Kubernetes: at
    least as fresh as the upstream's current resourceVersion.
    :func:`consistent_snapshot` asks the upstream for it (a quorum read),
    waits briefly for the cache to get there and lists upstream when it does
    not; :func:`wait_not_older_than` waits for a resourceVersion a client
    names (504 ``Timeout`` when it does not come); :func:`list_upstream`
    answers what the cache cannot (an exact resourceVersion), filtered here
    (and placed by the cache's owner chain, when it has one).

Invariants
    * What is returned is never older than the upstream's resourceVersion at
      the call (a snapshot) or than the one asked for.

Concurrency model
    Coroutines on the proxy's event loop; they read the cache between awaits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from range_filter_proxy.cached import CachedObject, WatchFilter, parse_rv
from range_filter_proxy.errors import ApiError, UpstreamError
from range_filter_proxy.reflector import list_pages
from rangeshard.core.reflector import ReflectorError

if TYPE_CHECKING:
    from range_filter_proxy.watchcache import WatchCache


async def upstream_current_rv(cache: WatchCache) -> int:
    """The upstream's current resourceVersion (a quorum read there)."""
    try:
        return parse_rv(await cache.upstream.current_resource_version(cache.info.gvr))
    except ValueError as e:
        raise UpstreamError(f"{cache.info.gvr}: upstream resourceVersion is not an integer") from e


async def consistent_snapshot(cache: WatchCache, filt: WatchFilter) -> tuple[list[CachedObject], int]:
    """Objects and RV at least as fresh as the upstream's current RV (a consistent read).

    Waits up to ``consistent_read_timeout`` for the cache; if it has not
    caught up (no event or bookmark of this resource since), lists upstream.
    """
    await cache.wait_synced()
    current = await upstream_current_rv(cache)
    if await cache.wait_for_rv(current, cache.settings.consistent_read_timeout):
        return cache.select(filt), cache.rv
    cache.metrics.consistent_read_fallbacks.labels(cache.info.gvr.label).inc()
    chosen, rv = await list_upstream(cache, filt)
    chosen.sort(key=lambda o: o.key)
    return chosen, rv


async def list_upstream(
    cache: WatchCache, filt: WatchFilter, params: dict[str, str] | None = None
) -> tuple[list[CachedObject], int]:
    """The objects of an upstream list (``params``: its query) that pass ``filt``, in its order, and its RV.

    Listed in the reflector's pages, as the cache lists: only one page is
    decoded at a time, and only what passes ``filt`` is kept of it.
    """
    chain = cache.chain

    def keep(o: CachedObject) -> CachedObject | None:
        placed = chain.resolved(o) if chain is not None else o
        return placed if filt.matches(placed) else None

    try:
        objects, listed_rv = await list_pages(cache.upstream, cache.info, first=params, keep=keep)
        rv = parse_rv(listed_rv)
    except ReflectorError as e:
        raise UpstreamError(f"{cache.info.gvr}: upstream list: {e}") from e
    except ValueError as e:
        raise UpstreamError(f"{cache.info.gvr}: upstream list resourceVersion is not an integer") from e
    return list(objects.values()), rv


async def wait_not_older_than(cache: WatchCache, rv: int) -> None:
    """Wait until the cache reaches ``rv``; 504 ``Timeout`` (too large resource version) if not in time."""
    await cache.wait_synced()
    if not await cache.wait_for_rv(rv, cache.settings.rv_wait_timeout):
        raise ApiError(
            504,
            "Timeout",
            f"Too large resource version: {rv}, current: {cache.rv}",
            {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )
