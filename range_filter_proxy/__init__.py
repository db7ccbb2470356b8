"""Range filter proxy: shard-filtered list/watch from one shared upstream watch per resource.

Purpose
    Speaks the Kubernetes REST API in front of an API server. Controllers list
    and watch through it with a KEP-5866 ``shardSelector`` (plus rangeshard's
    owner-aware path) and receive only their hash range, while the upstream
    sees one list+watch per resource however many instances run. Everything
    else is passed through. See docs/proxy.md.

Modules
    ``app`` (FastAPI: routing, list/watch handlers, pass-through), ``cache``
    (shared watch caches, history, watchers), ``upstream`` (our ``Upstream``
    interface and its httpx implementation), ``selectors`` (label/field
    selectors), ``resources`` (GVRs, discovery, paths), ``auth``
    (``--auth-mode none|static|delegate``: who may read), ``middleware``
    (request body limit), ``metrics``, ``errors``, ``cli`` (``rangeshard
    proxy``), ``process`` (child process). See docs/security.md.

Invariants
    Imports only ``hashing``, ``registry`` and ``rangeshard.core.errors`` of ours
    (import-linter contract).

Concurrency model
    asyncio, one event loop per proxy; see each module.
"""

from range_filter_proxy.app import create_app
from range_filter_proxy.cache import CacheSettings

__all__ = ["CacheSettings", "create_app"]
