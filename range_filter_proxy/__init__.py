"""Range filter proxy: shard-filtered list/watch from one shared upstream watch per resource.

Purpose
    Speaks the Kubernetes REST API in front of an API server. Controllers list
    and watch through it with a KEP-5866 ``shardSelector`` (plus rangeshard's
    owner-aware path) and receive only their hash range, while the upstream
    sees one list+watch per resource however many instances run. Everything
    else is passed through. See docs/proxy.md.

Modules
    ``app`` (FastAPI: the settings root ``ProxySettings``, routing, the app
    factory), ``listing`` (list/watch of cached collections: list options,
    paging, Table answers), ``passthrough`` (everything else, forwarded
    upstream; write fencing), ``cache`` (``CacheManager``: every watch
    cache of the proxy, discovery), ``watchcache`` (one resource's shared
    cache: store, history, dispatch), ``freshreads`` (its reads as fresh
    as the upstream: consistent snapshots, "not older than N"), ``rootchain`` (placement by owner
    chain, ``by: root``: each object's root through the via caches, and the
    moves when an intermediate is re-parented), ``reflector`` (its upstream loop: the
    async driver of :mod:`rangeshard.core.reflector`), ``shardprobe`` (is the upstream a native KEP-5866
    server?), ``cached`` (cached objects and
    events, watch filters, settings), ``storeindex`` (the store's keys by shard
    hash bucket, so a range LIST visits its slice), ``dispatch`` (which watchers an event
    can concern, by shard range), ``watcher`` (one downstream watch and its
    bounded queue), ``watchresponse`` (its HTTP body; the app class),
    ``wire`` (fast decoding of upstream watch lines), ``paging``
    (``limit``/``continue`` of cached lists), ``tables`` (Table answers),
    ``fencing`` (write fencing by owner token), ``progress`` (each
    controller instance's unanswered changes of its main resource, on
    ``/metrics``), ``upstream`` (our
    ``Upstream`` interface, every capability of the upstream, and its HTTP
    implementation), ``watchstream`` (the upstream watch read with an asyncio
    protocol + httptools), ``resources`` (discovery information around the
    foundation's ``GVR``), ``auth`` (``--auth-mode none|static|delegate``:
    who may read), ``heap`` (the heap keeper), ``metrics``, ``errors``,
    ``cli`` (``rangeshard proxy``), ``process`` (child process). Resource
    identity and REST paths come from :mod:`rangeshard.core.rest`,
    label/field selectors from :mod:`rangeshard.core.selectors`. See
    docs/security.md.

May import
    ``rangeshard.core`` (foundation), ``registry`` and ``hashing``. Never the
    controller manager, the local API server or the CLI (import-linter
    contracts).

Concurrency model
    asyncio, one event loop per proxy; see each module.
"""

from rangeshard.core.entrypoint import reexec_if_shadowed

# ``python -m range_filter_proxy`` runs this first: from a directory shadowing our packages, the imports below break.
reexec_if_shadowed("range_filter_proxy")

from range_filter_proxy.app import create_app  # noqa: E402
from range_filter_proxy.cached import CacheSettings  # noqa: E402

__all__ = ["CacheSettings", "create_app"]
