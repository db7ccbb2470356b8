"""Write fencing: a write carrying an owner token is forwarded only while its writer still owns the object.

Purpose
    A controller manager's requests carry an owner token in their User-Agent
    (:class:`rangeshard.core.ownertoken.OwnerToken`: instance, lease, epoch).
    :class:`WriteFence` decides, for one mutating request with a token,
    whether it may pass: the instance must still be registered with that
    lease, be neither parked nor locked, be in the same ownership period (``token.epoch`` not
    older than the period's epoch, :mod:`registry.epochs`) and, when the
    write's shard hash is known, own it. Otherwise the proxy answers ``409
    Conflict`` with :func:`rangeshard.core.ownertoken.fenced_status`.

    The registry view: a :class:`registry.watch.MembershipWatch` feeds an
    :class:`registry.epochs.EpochTracker` with every revision. A decision
    rests on a view at least as new as etcd's revision when the write
    arrived: each write waits for one linearizable read of the registry
    that *started after it arrived* (:class:`BatchedRead`: writes arriving
    while a read is running share the next one), then for the tracker to
    cover what that read saw (:meth:`EpochTracker.covers`). No other
    per-write wait.

    How a write's shard keys are found (:func:`write_keys`): the writer
    declares the shard rule it places the resource by
    (``X-Rangeshard-Shard-By``, else the ``rangeshard-shard-by/<rule>``
    product token of its User-Agent; the external endpoint always does,
    managers for their main and dependent resources), and the key of the
    object under that rule (:class:`hashing.ShardBy`, the one shard rule the
    informers and the endpoint read with) is taken from the request body
    (JSON, YAML apply patches, and protobuf: :mod:`rangeshard.core.protobuf`
    reads ``ObjectMeta`` of every built-in kind; the body is forwarded
    unchanged) and from the proxy's cached object (deletes, JSON patches,
    and the object as it was before an update). Every key found must lie in
    the writer's range: a write may neither touch an object of another range
    nor move one in from there. Under ``root`` the chain above the object is
    read from the upstream once the registry view is fresh
    (:meth:`range_filter_proxy.rootchain.RootChain.fresh_key_of_object`), not
    from the proxy's caches of the ``via`` kinds: they may not have applied a
    re-parenting yet, and the old root's owner would pass. A key is absent
    when the rule's value is (a create under ``uid``, an orphan under
    ``owner``, which every range sees): absent keys constrain nothing.

    The writer may also declare the shard hash of the key it reconciles
    (``X-Rangeshard-Shard-Hash``; managers always do); a declaration must be
    one of the keys found, else the write is fenced (``ShardHashMismatch``),
    and stands in for them when none is found. A write that declares no
    rule keeps the rule of older managers (:func:`hashing.object_hash_key`:
    the controller owner's uid, else the object's own; :func:`shard_hash_of`).
    A write whose key cannot be found (a create without owner, an uncached
    object) is checked for lease, lock and epoch only.

Invariants
    * A write without an owner token is never touched (it passes as before).
    * Fencing never guesses: etcd unreachable, or the view not caught up
      within ``catch_up_timeout``, answers ``503`` (the write is not
      forwarded), never an unchecked pass.

Concurrency model
    The decision runs on the proxy's event loop; the etcd read runs on the
    ``fencing-read`` thread (one at a time) and the membership watch on its
    own; both wake waiting writes through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio.to_thread

from hashing import ShardBy, hash_key, object_hash_key
from rangeshard.core.errors import RangeshardError, RegistryUnavailable
from rangeshard.core.etcd import KV, EtcdClient, EtcdConfig
from rangeshard.core.kubeapi import ApiError
from rangeshard.core.loops import start_thread
from rangeshard.core.ownertoken import OwnerToken
from registry import DEFAULT_PREFIX, Layout, MembershipWatch
from registry.epochs import EpochTracker, Ownership

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class FenceSettings:
    """Write fencing configuration (``rangeshard proxy --etcd ... --registry-prefix ...``)."""

    etcd: EtcdConfig = field(repr=False)
    prefix: str = DEFAULT_PREFIX
    catch_up_timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a write was fenced: a ``reason`` (see ``FENCE_REASONS``) and a sentence."""

    reason: str
    why: str


def decide(token: OwnerToken, owner: Ownership | None, shard_hash: int | tuple[int, ...] | None) -> Verdict | None:
    """The fencing decision on one registry view: ``None`` lets the write pass.

    ``shard_hash``: the key the write must own, or several (each must be owned).
    """
    if owner is None:
        return Verdict("NotRegistered", f"{token.owner} has no registry record (its lease expired or it left)")
    if owner.lease_id != token.lease_id:
        return Verdict(
            "LeaseMismatch",
            f"{token.owner} now holds lease {owner.lease_id:x}, not {token.lease_id:x} (it rejoined or was parked)",
        )
    if owner.parked:
        return Verdict("Parked", f"{token.owner} is parked (stopped for a restart): nobody writes its range")
    if owner.locked:
        return Verdict("Locked", f"{token.owner} is locked (a handover to it is not finished)")
    if token.epoch < owner.epoch:
        return Verdict(
            "StaleEpoch",
            f"epoch {token.epoch} is over: the current ownership period of {token.owner} began at revision "
            f"{owner.epoch}",
        )
    keys = (shard_hash,) if isinstance(shard_hash, int) else shard_hash or ()
    for key in keys:
        if owner.range is None or not owner.range.contains(key):
            if owner.previous_range is not None and owner.previous_range.contains(key):
                # The expected race of a handover (the giver's new token, what it listed before): said apart.
                return Verdict(
                    "OutOfRange",
                    f"shard hash {key:#x} is outside the range {owner.range} of {token.owner}: it left in a "
                    f"handover at revision {owner.epoch} (was {owner.previous_range}); the write acted on an "
                    "older view",
                )
            return Verdict("OutOfRange", f"shard hash {key:#x} is outside the range {owner.range} of {token.owner}")
    return None


def _object(obj: Any) -> Mapping[str, Any] | None:
    return obj if isinstance(obj, Mapping) and isinstance(obj.get("metadata"), Mapping) else None


def shard_hash_of(declared: int | None, body: Any, cached: Any) -> tuple[int | None, Verdict | None]:
    """The shard hash of a write that declares no rule (see module docstring), or a ``ShardHashMismatch``."""
    sources = [o for o in (_object(body), _object(cached)) if o is not None]
    candidates: list[int] = []
    for obj in sources:
        own = obj["metadata"].get("uid")
        for h in (object_hash_key(obj), hash_key(own) if isinstance(own, str) and own else None):
            if h is not None:
                candidates.append(h)
    if declared is not None:
        if candidates and declared not in candidates:
            return None, Verdict(
                "ShardHashMismatch",
                f"declared shard hash {declared:#x} is neither the object's uid hash nor its controller's",
            )
        return declared, None
    return (candidates[0] if candidates else None), None


def write_keys(
    rule: ShardBy | None,
    declared: int | None,
    body: Any,
    cached: Any,
    namespace: str | None = None,
    root_key: Callable[[Any], int | None] | None = None,
    label: str | None = None,
) -> tuple[tuple[int, ...], Verdict | None]:
    """The shard keys a write must own (see module docstring), or a ``ShardHashMismatch`` verdict.

    ``namespace`` is the request path's (a body may leave its own out).
    ``root_key`` resolves the ``root`` key of an object through the owner
    chain of the resource (:mod:`range_filter_proxy.rootchain`, read
    upstream); without one, ``root`` is the chain of one step
    (:meth:`hashing.ShardBy.key`).
    ``label`` is the label key of a ``label`` rule: the body's label value
    (its uid without one) and the cached object's must both lie in the range,
    so a label change that moves an object out of the range is refused.
    """
    if rule is None:
        key, verdict = shard_hash_of(declared, body, cached)
        return ((key,) if key is not None else ()), verdict
    keys: list[int] = []
    for obj in (_object(body), _object(cached)):
        if obj is None:
            continue
        key = root_key(obj) if root_key is not None and rule is ShardBy.ROOT else rule.key(obj, namespace, label)
        if key is not None and key not in keys:
            keys.append(key)
    if declared is not None:
        if keys and declared not in keys:
            found = ", ".join(f"{k:#x}" for k in keys)
            return (), Verdict(
                "ShardHashMismatch",
                f"declared shard hash {declared:#x} is not the object's key by {rule.value} ({found})",
            )
        return (tuple(keys) or (declared,)), None
    return tuple(keys), None


#: A write whose fencing decision waits longer than this is logged at WARNING (once per write, with why).
SLOW_DECISION_SECONDS = 1.0


class BatchedRead(Generic[T]):
    """One read shared by every caller that arrived before it started (see module docstring).

    A caller never gets the result of a read that started before it called:
    callers arriving while a read runs wait for the next one, which starts as
    soon as the running one ends and serves all of them.

    The (blocking) read runs on a thread of its own, started with the first
    caller, and hands its result back to the waiting callers with one
    ``call_soon_threadsafe``: a write waits two turns of the event loop plus
    the read, where a pooled worker thread cost about four more (each turn
    lasts long on a busy, CPU-starved proxy: issue 25's loaded runs).

    States of the reader thread: not started -> idle (no caller waits) ->
    reading (the batch taken at the read's start) -> idle ... -> closed (every
    waiting caller fails with :class:`RegistryUnavailable`).
    """

    def __init__(self, read: Callable[[], T], *, name: str = "fencing-read") -> None:
        self._read = read
        self._name = name
        self._cond = threading.Condition()
        self._waiting: list[asyncio.Future[T]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.reads = 0

    async def get(self) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._cond:
            if self._closed:
                raise self._stopped()
            self._waiting.append(fut)
            if self._thread is None:
                self._thread = start_thread(self._name, self._run, what="fencing registry reads")
            self._cond.notify()
        return await fut

    def close(self, timeout: float = 0.0) -> None:
        """Stop the reader thread (a read in progress finishes first, waited for up to ``timeout``).

        Callers still waiting, and any later caller, fail with :class:`RegistryUnavailable`.
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and timeout > 0:
            thread.join(timeout)

    def _stopped(self) -> RegistryUnavailable:
        return RegistryUnavailable(f"{self._name}: stopped (the proxy is shutting down)")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                batch, self._waiting = self._waiting, []
                closed = self._closed
            if closed:
                _settle_threadsafe(batch, None, self._stopped())
                return
            self.reads += 1
            try:
                result = self._read()
            except Exception as e:  # every waiter of this batch sees the failure
                _settle_threadsafe(batch, None, e)
            else:
                _settle_threadsafe(batch, result, None)


def _settle_threadsafe(batch: list[asyncio.Future[T]], result: T | None, error: BaseException | None) -> None:
    """Resolve ``batch`` from another thread, with one wake-up of each loop its futures belong to."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[T]]] = {}
    for fut in batch:
        by_loop.setdefault(fut.get_loop(), []).append(fut)
    for loop, futures in by_loop.items():
        _settle_on(loop, futures, result, error)


def _settle_on(
    loop: asyncio.AbstractEventLoop, futures: list[asyncio.Future[T]], result: T | None, error: BaseException | None
) -> None:
    def settle() -> None:
        for fut in futures:
            if fut.done():  # the caller gave up (cancelled)
                continue
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle)


class WriteFence:
    """Registry view + batched linearizable reads + the decision (see module docstring)."""

    def __init__(self, settings: FenceSettings, on_read: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.layout = Layout(settings.prefix)
        self.tracker = EpochTracker(settings.prefix)
        self.on_read = on_read
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._client: EtcdClient | None = None
        self.watch = MembershipWatch(
            settings.etcd,
            lambda _view: None,
            prefix=settings.prefix,
            name="proxy-fencing",
            on_revision=self._observe,
        )
        self.reads: BatchedRead[tuple[int, dict[str, KV]]] = BatchedRead(self._read_registry)
        #: How long the last registry read's etcd call took (seconds; in the slow-decision warning).
        self.last_read_seconds = 0.0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self.watch.start()

    async def stop(self) -> None:
        def stop_threads() -> None:
            self.reads.close(timeout=self.settings.etcd.timeout)
            self.watch.stop()

        await anyio.to_thread.run_sync(stop_threads, abandon_on_cancel=True)
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- the registry view ------------------------------------------------------------
    def _observe(self, revision: int, kvs: Mapping[str, KV], relisted: bool) -> None:
        self.tracker.observe(revision, kvs, relisted)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        changed = self._changed
        self._changed = asyncio.Event()
        if changed is not None:
            changed.set()

    def _read_registry(self) -> tuple[int, dict[str, KV]]:
        """One linearizable read of the controllers' records (on the batcher's thread)."""
        if self.on_read is not None:
            self.on_read()
        t0 = time.monotonic()
        if self._client is None:
            self._client = EtcdClient(self.settings.etcd)
        rev, kvs = self._client.get_prefix(self.layout.controllers)
        self.last_read_seconds = time.monotonic() - t0
        return rev, {kv.key: kv for kv in kvs}

    async def fresh_view(self) -> int:
        """Wait until the tracked view is at least as new as etcd when this was called; its read revision."""
        arrived = time.monotonic()
        try:
            revision, kvs = await self.reads.get()
        except RangeshardError as e:
            raise ApiError(503, "ServiceUnavailable", f"write fencing: cannot read the registry: {e}") from e
        if time.monotonic() - arrived > SLOW_DECISION_SECONDS:
            log.warning(
                "write fencing: the registry read took %.1fs (its etcd call %.3fs; reads so far: %d)",
                time.monotonic() - arrived,
                self.last_read_seconds,
                self.reads.reads,
            )
        deadline = time.monotonic() + self.settings.catch_up_timeout
        warned = False
        while True:
            changed = self._changed
            if self.tracker.covers(revision, kvs):
                return revision
            left = deadline - time.monotonic()
            if not warned and self.settings.catch_up_timeout - left > SLOW_DECISION_SECONDS:
                warned = True
                log.warning(
                    "write fencing: the registry view is behind the read at revision %s after %.1fs: %s",
                    revision,
                    self.settings.catch_up_timeout - left,
                    self.tracker.behind(revision, kvs),
                )
            if changed is None or left <= 0:
                raise ApiError(
                    503,
                    "ServiceUnavailable",
                    f"write fencing: the registry view did not reach revision {revision} within "
                    f"{self.settings.catch_up_timeout:g}s; retry",
                )
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                continue

    async def check(self, token: OwnerToken, shard_hash: int | tuple[int, ...] | None) -> Verdict | None:
        """Fence or pass one write (``None``: pass); 503 ``ApiError`` when it cannot be decided."""
        await self.fresh_view()
        return self.decide_now(token, shard_hash)

    def decide_now(self, token: OwnerToken, shard_hash: int | tuple[int, ...] | None) -> Verdict | None:
        """:func:`decide` on the view as it is: after :meth:`fresh_view`, for keys found once the view was fresh."""
        return decide(token, self.tracker.get(token.controller_type, token.instance_id), shard_hash)
