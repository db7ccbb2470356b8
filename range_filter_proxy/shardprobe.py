"""Is the upstream a native KEP-5866 server? One probe list with a ``shardSelector`` tells.

Purpose
    :func:`probe_shard_selector` lists one object of a resource with a
    ``shardSelector`` covering the whole hash space: a server with
    ``ShardedListAndWatch`` answers with ``metadata.shardInfo``, any other
    ignores the parameter (or refuses it with 400/422). The answer is only
    reported (``/readyz?verbose``, metrics): the proxy filters from its own
    cache either way.

Invariants
    * The probe waits for the resource's cache to sync first, so the upstream
      is known to answer; transient errors are retried after the relist
      :class:`~rangeshard.core.backoff.Backoff`.
    * A 404 (the resource went away) ends the probe without an answer.

Concurrency model
    One coroutine, run as a named task by the
    :class:`~range_filter_proxy.cache.CacheManager` on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import logging

from hashing import HashRange, range_to_selector
from range_filter_proxy.cached import CacheSettings
from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.upstream import Upstream
from rangeshard.core.backoff import Backoff

log = logging.getLogger(__name__)


async def probe_shard_selector(
    upstream: Upstream, info: ResourceInfo, synced: asyncio.Event, settings: CacheSettings
) -> tuple[bool, str] | None:
    """``(supported, detail)`` once the upstream answered; ``None`` if the resource is gone (404)."""
    full = range_to_selector(HashRange.full())
    backoff = Backoff(settings.relist_backoff_initial, settings.relist_backoff_max)
    label = info.gvr.label
    while True:
        await synced.wait()
        try:
            listed = await upstream.list(info.gvr, {"limit": "1", "shardSelector": full})
        except UpstreamError as e:
            if e.code == 404:
                return None
            if e.code in (400, 422):
                return (
                    False,
                    f"not supported: the upstream refused a list of {label} with a shardSelector ({e.code}: {e})",
                )
            delay = backoff.next_delay()
            log.debug("probing the upstream for shardSelector support failed: %s; retrying in %.1fs", e, delay)
            await asyncio.sleep(delay)  # retry backoff, not synchronisation
            continue
        if listed.shard_info is not None:
            return True, f"supported: native KEP-5866 upstream (a list of {label} answered with metadata.shardInfo)"
        return False, f"not supported: the upstream answered a list of {label} without metadata.shardInfo"
