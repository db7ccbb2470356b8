"""``limit``/``continue`` paging of cached lists, consistent at the first page's resourceVersion.

Purpose
    client-go reflectors and ``kubectl get --chunk-size`` list in pages
    (``limit=500``, then ``continue=TOKEN`` until no token comes back). The
    proxy serves those pages from its watch cache, the way kube-apiserver's
    cacher serves them from its store snapshots: the first page freezes the
    filtered, sorted result at the list's resourceVersion (RV) in a
    :class:`PageSnapshots` entry, and every later page is cut from that same
    snapshot, so the pages together are exactly the list at that RV even
    while objects change.

    Continue tokens are opaque to clients (URL-safe base64 of a small JSON
    document: format version, RV, the key the next page starts after, and a
    digest of the selectors). A token whose snapshot is gone (older than
    ``PagingSettings.snapshot_seconds``, or evicted by newer ones) is
    answered 410 ``Expired``, as kube-apiserver answers a continue token whose
    RV was compacted; the client then starts a new list.

Invariants
    * Pages never overlap and never skip: page N+1 starts strictly after the
      last key of page N, in the (namespace, name) order every list uses.
    * A snapshot is keyed by (RV, selectors): a continue with other selectors
      than the first page's does not read a snapshot made for different ones.
    * Bad tokens are 400 ``BadRequest`` ("continue key is not valid"), never
      a 500.

Concurrency model
    Owned by the proxy's event loop; no awaits inside, so no locking.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from range_filter_proxy.cached import CachedObject
from rangeshard.core.kubeapi import EXPIRED_CONTINUE_MESSAGE, bad_request, gone

TOKEN_VERSION = "rangeshard.io/proxy-v1"  # noqa: S105 (a format tag, not a secret)


@dataclass(frozen=True)
class PagingSettings:
    """How long and how many list snapshots each cache keeps for continue tokens."""

    #: A continue token older than this is 410 Expired (kube-apiserver's default compaction interval is 5 min).
    snapshot_seconds: float = 300.0
    #: Snapshots kept per resource (the oldest is dropped first).
    max_snapshots: int = 16


@dataclass(frozen=True)
class ContinueToken:
    """What a continue token says: the list's RV, the last key served and the selectors' digest."""

    rv: int
    after: tuple[str, str]
    selectors: str

    def encode(self) -> str:
        doc = {"v": TOKEN_VERSION, "rv": self.rv, "after": list(self.after), "sel": self.selectors}
        return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> ContinueToken:
        """Parse a token (400 ``continue key is not valid: ...`` when it is not one of ours)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            doc = orjson.loads(raw)
        except (binascii.Error, ValueError) as e:
            raise bad_request(f"continue key is not valid: {type(e).__name__}") from e
        if not isinstance(doc, dict) or doc.get("v") != TOKEN_VERSION:
            raise bad_request("continue key is not valid: unknown format")
        rv, after, sel = doc.get("rv"), doc.get("after"), doc.get("sel")
        if (
            not isinstance(rv, int)
            or isinstance(rv, bool)
            or rv < 0
            or not isinstance(after, list)
            or len(after) != 2
            or not all(isinstance(a, str) for a in after)
            or not isinstance(sel, str)
        ):
            raise bad_request("continue key is not valid: malformed")
        return cls(rv, (after[0], after[1]), sel)


def selectors_digest(namespace: str | None, *selectors: str | None) -> str:
    """A short digest of what filters a list (namespace, label/field/shard selectors)."""
    text = "\x00".join(s or "" for s in (namespace, *selectors))
    return hashlib.blake2s(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class _Snapshot:
    created: float
    items: Sequence[CachedObject]
    keys: Sequence[tuple[str, str]]


class PageSnapshots:
    """Recent (RV, selectors) -> sorted list results of one cache, for continue tokens."""

    def __init__(self, settings: PagingSettings | None = None) -> None:
        self.settings = settings or PagingSettings()
        self._snaps: OrderedDict[tuple[int, str], _Snapshot] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._snaps:
            key, snap = next(iter(self._snaps.items()))
            if now - snap.created <= self.settings.snapshot_seconds and len(self._snaps) <= self.settings.max_snapshots:
                return
            del self._snaps[key]

    def put(self, rv: int, selectors: str, items: Sequence[CachedObject]) -> None:
        """Remember ``items`` (sorted by key) as the list at ``rv`` for ``selectors``."""
        now = time.monotonic()
        self._snaps[(rv, selectors)] = _Snapshot(now, items, [o.key for o in items])
        self._snaps.move_to_end((rv, selectors))
        self._expire(now)

    def get(self, rv: int, selectors: str) -> _Snapshot | None:
        self._expire(time.monotonic())
        return self._snaps.get((rv, selectors))

    def first_page(
        self, rv: int, selectors: str, items: Sequence[CachedObject], limit: int
    ) -> tuple[Sequence[CachedObject], str | None, int]:
        """The first ``limit`` items, the continue token (None when done) and how many remain."""
        if len(items) <= limit:
            return items, None, 0
        self.put(rv, selectors, items)
        page = items[:limit]
        return page, ContinueToken(rv, page[-1].key, selectors).encode(), len(items) - limit

    def next_page(self, token: ContinueToken, limit: int | None) -> tuple[Sequence[CachedObject], str | None, int]:
        """The page after ``token`` (410 Expired when its snapshot is gone)."""
        snap = self.get(token.rv, token.selectors)
        if snap is None:
            raise gone(EXPIRED_CONTINUE_MESSAGE)
        start = bisect.bisect_right(snap.keys, token.after)
        end = len(snap.items) if limit is None else min(len(snap.items), start + limit)
        page = snap.items[start:end]
        if end >= len(snap.items):
            return page, None, 0
        return page, ContinueToken(token.rv, page[-1].key, token.selectors).encode(), len(snap.items) - end
