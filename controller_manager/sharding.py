"""One registered instance of one controller type: the enforced lock -> wait -> active handover.

Purpose
    :class:`ShardInstance` joins the registry, keeps its lease alive, watches
    the membership, and decides — on one thread — which hash range this
    process may reconcile at each instant. Workers ask :meth:`try_begin`
    immediately before every reconcile and call :meth:`end` afterwards.

The invariant
    No two instances of one controller type reconcile the same object at the same time, by five rules:

    1. **Locked processes nothing.** A record with ``isLocked`` gets no keys.
       The giver unlocks it only after draining (rule 2). A locked instance
       whose giver's record is gone unlocks itself with a transaction that
       checks the giver's key does not exist (the giver fenced itself, rule 3).
    2. **Wait drains before unlocking.** When a snapshot shows our range
       shrank, we stop starting keys at once (``allowed = None``) and unlock
       the receivers naming us as giver only when no in-flight reconcile is
       outside our new range. The unlock compares the receiver's mod revision
       from that same snapshot.
    3. **Self-fencing.** Workers never start a reconcile that could run past
       the lease's fencing deadline (``LeaseKeeper.deadline``: send time of the
       last good keepalive + TTL - margin), and every reconcile carries that
       deadline for its API calls; so when etcd can expire our lease, nothing
       of ours is running. A lost lease means rejoin (a fresh, locked join).
    4. **Fresh caches.** After every range or lock change the epoch bumps and
       the informers relist, not older than the previous owner's last writes
       (published in its record, :mod:`controller_manager.freshness`);
       processing resumes only when all informers are synced at the current epoch.
    5. **Owner token.** Every request carries :attr:`token`
       (:class:`~rangeshard.core.ownertoken.OwnerToken`, published through
       ``on_token``): lease id plus the registry revision of the view in
       which the current range and lock state were first seen (the join
       revision after a join). A proxy with write fencing refuses writes
       whose token is no longer current (a process paused past its lease,
       docs/reliability.md); a stale epoch's refusal asks for a fresh one (:meth:`write_fenced`).

State machine
    ``init -> locked | active``, ``locked -> active``, ``active -> wait ->
    active``, ``fenced`` and back, ``parked`` on a graceful stop with
    ``rejoinGraceSeconds``: drawn and decided in :mod:`controller_manager.handover`
    (:func:`~controller_manager.handover.decide`); this module reads the views
    and carries the actions out. At start, an instance id that is parked
    takes its key back with no handover; one held by a live process is fatal
    (the manager exits 1).

Concurrency model
    One named thread per instance (``shard-<type>``) owns the state machine
    and every registry write; it is woken by membership views, lease events
    and a 100 ms tick. Workers and informers touch only the fields guarded by
    ``self._cond`` (``allowed``, ``inflight``, ``epoch``, ``range``).
    Fencing decisions (``try_begin``, the deadline check of the state machine)
    read time from the injected :class:`~rangeshard.core.clock.Clock`, the
    same one the :class:`LeaseKeeper` measures its deadline with; the graceful
    leave's drain wait and the heartbeat pacing use real time. The instance
    takes its plain values as one :class:`ShardSettings` and calls its runtime
    through one :class:`ShardHost`, from the state-machine thread (and, for the
    ``parked`` state only, from the thread calling :meth:`ShardInstance.stop`).

Observability
    ``counters`` (read by ``on_count`` subscribers and tests) count the paths
    taken: ``fences``, ``rejoins``, ``unlocks`` (receivers this giver
    unlocked), ``self_unlocks`` (this receiver unlocked itself: giver gone),
    ``drain_waits`` (evaluations that deferred unlocking a locked receiver
    because a reconcile outside our new range was still running) and ``epochs``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import replace

from controller_manager.freshness import PeerFloors
from controller_manager.handover import (
    Action,
    Allow,
    DrainWait,
    Fence,
    Phase,
    Receiver,
    Rejoin,
    SelfUnlock,
    SetState,
    TakeRange,
    Unfence,
    Unlock,
    View,
    allowed_transition,
    decide,
)
from controller_manager.shardhost import ShardHost, ShardSettings, held_elsewhere
from hashing import HashRange
from rangeshard.core.backoff import Backoff
from rangeshard.core.clock import MONOTONIC, Clock
from rangeshard.core.errors import AlreadyRegistered, CompareFailed, NotRegistered, RangeshardError
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.loops import join_thread, start_thread
from rangeshard.core.ownertoken import OwnerToken
from registry import LeaseKeeper, MembershipWatch, Registry, RegistryView, Snapshot, State

log = logging.getLogger(__name__)

FENCED = Phase.FENCED.value
COUNTERS = ("fences", "rejoins", "unlocks", "self_unlocks", "drain_waits", "epochs", "epoch_refreshes")


class ShardInstance:
    """The sharding runtime of one controller type in this process (see module docstring)."""

    def __init__(self, settings: ShardSettings, host: ShardHost, *, clock: Clock = MONOTONIC) -> None:
        self.settings = settings
        self.host = host
        self.clock = clock
        #: Set to 0 for a real leave (the range goes to the neighbours at once), else ``settings.rejoin_grace``.
        self.rejoin_grace = settings.rejoin_grace
        #: Set when this instance must not run at all (another live process has its id); the manager exits 1.
        self.fatal: str | None = None
        self._foreign_heartbeat: float | None = None
        # Registry calls must return well within one keepalive interval.
        etcd = settings.etcd_config
        self.client = EtcdClient(replace(etcd, timeout=min(etcd.timeout, max(1.0, settings.lease_ttl / 4))))
        self.registry = Registry(self.client, settings.registry_prefix)
        self.keeper: LeaseKeeper | None = None
        self.watch: MembershipWatch | None = None
        self._events: queue.Queue[object] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Guarded by _cond (read by workers and informers):
        self._cond = threading.Condition()
        self.allowed: HashRange | None = None
        self.range: HashRange | None = None
        self.epoch = 0
        self.inflight: dict[str, int] = {}
        self.leaving = False
        self.token: OwnerToken | None = None
        # Owned by the state-machine thread:
        self.state: str = State.INIT.value
        self.locked = False
        self.fenced = False
        self.snapshot: Snapshot | None = None
        self.join_revision = 0
        self.published_state: str | None = None
        self.next_heartbeat = 0.0
        self.retry_heartbeat_at = 0.0
        #: Waits after a failed registration or heartbeat (etcd away): the one Backoff, 1 s doubling to 4 s.
        self.etcd_retry = Backoff(1.0, 4.0, jitter=0.2)
        self.joined = threading.Event()
        self.counters = dict.fromkeys(COUNTERS, 0)
        #: What every peer published of its writes (:mod:`controller_manager.freshness`): lists are not older.
        self.floors = PeerFloors()

    def _count(self, what: str) -> None:
        self.counters[what] += 1
        self.host.on_count(what)

    # -- called by workers ---------------------------------------------------
    def try_begin(self, key: str, key_hash: int) -> float | None:
        """Claim ``key`` for one reconcile; return its deadline (monotonic), or ``None`` if refused."""
        keeper = self.keeper
        if keeper is None:
            return None
        with self._cond:
            if self.allowed is None or not self.allowed.contains(key_hash) or self.leaving:
                return None
            now = self.clock.monotonic()
            lease_deadline = keeper.deadline
            if now + self.settings.reconcile_timeout > lease_deadline:
                return None
            self.inflight[key] = key_hash
            return min(now + self.settings.reconcile_timeout, lease_deadline)

    def end(self, key: str) -> None:
        with self._cond:
            self.inflight.pop(key, None)
            self._cond.notify_all()
        self._events.put("end")

    def write_fenced(self, token: OwnerToken | None, stale_epoch: bool) -> bool:
        """A write made with ``token`` was fenced by the proxy; True the first time for this token.

        For a stale epoch of our current lease (the proxy saw a registry change
        our views folded away, e.g. a range that changed and changed back) the
        state machine takes a fresh epoch: relist, then a new token.
        """
        with self._cond:
            current = self.token
        if token is None or token != current:
            return False
        if stale_epoch:
            self._events.put(("refresh-epoch", token))
        return True

    def serving_target(self) -> tuple[int, HashRange | None, bool]:
        """``(epoch, range, locked)`` an external endpoint serves toward (no range while fenced or leaving)."""
        with self._cond:
            gone = self.leaving or self.fenced or self.keeper is None
            return self.epoch, (None if gone else self.range), self.locked

    def informer_range(self) -> tuple[int, HashRange | None]:
        """``(epoch, range)`` the informers should list (the range is ours even while locked)."""
        with self._cond:
            return self.epoch, self.range

    def floor(self, label: str) -> int:
        """The resourceVersion a list of ``label`` after a range change is not older than: what any peer
        (a giver) or this instance wrote of it (:mod:`controller_manager.freshness`)."""
        return max(self.floors.get(label), self.host.written_versions().get(label, 0))

    def in_range(self, key_hash: int) -> bool:
        with self._cond:
            return self.range is not None and self.range.contains(key_hash)

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(
            f"shard-{self.settings.controller_type}", self._run, what=f"{self.name}: state machine", on_death=self._died
        )

    def _died(self) -> None:
        """The state machine is gone: nothing may be processed any more."""
        with self._cond:
            self.allowed = None

    def stop(self, drain_timeout: float | None = None) -> None:
        """Graceful leave: stop taking keys, drain in-flight work, revoke the lease."""
        with self._cond:
            self.leaving = True
            self.allowed = None
            deadline = time.monotonic() + (
                drain_timeout if drain_timeout is not None else self.settings.reconcile_timeout + 2
            )
            while self.inflight and time.monotonic() < deadline:
                self._cond.wait(0.1)
            left = dict(self.inflight)
        if left:
            log.warning("%s: leaving with %s reconcile(s) still running: %s", self.name, len(left), sorted(left))
        self.host.on_leaving()
        while not self.host.drained() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the host's drain (views cut, writes done) with the stop's deadline
        self._stop.set()
        self._events.put("stop")
        join_thread(self._thread, self.settings.lease_ttl + 5)
        if self.watch is not None:
            self.watch.stop()
        parked = False
        if self.keeper is not None and not left and self.rejoin_grace > 0 and self.keeper.lease_id and not self.fenced:
            parked = self._park(self.keeper.lease_id)
        elif self.keeper is not None and not left and not self.fenced:
            # Published before the lease goes: the neighbours' next lists are not older than our last writes.
            with contextlib.suppress(RangeshardError):
                self.registry.heartbeat(*self._ids, self.keeper.lease_id, versions=self.host.written_versions())
        if self.keeper is not None:
            # Revoking only after the drain: the neighbour inherits without a lock. A parked
            # record lives on its grace lease: revoking this one no longer deletes it.
            self.keeper.stop(revoke=not left)
        self.client.close()
        if not parked:
            log.info("%s: left the registry", self.name)

    def _park(self, lease_id: int) -> bool:
        """Graceful stop with ``rejoinGraceSeconds``: keep the record (and range) for our successor process."""
        grace_lease: int | None = None
        try:
            grace_lease = self.client.grant_lease(max(1, math.ceil(self.rejoin_grace)))
            self.registry.park(*self._ids, lease_id, grace_lease, self.rejoin_grace, self.host.written_versions())
        except RangeshardError as e:
            log.warning("%s: cannot park (%s): leaving instead", self.name, e)
            if grace_lease is not None:
                with contextlib.suppress(RangeshardError):
                    self.client.revoke_lease(grace_lease)
            return False
        self._set_state(State.PARKED.value)
        log.info(
            "%s: parked: range %s kept for %gs (rejoinGraceSeconds) for a process with instance id %s",
            self.name,
            self.range,
            self.rejoin_grace,
            self.settings.instance_id,
        )
        return True

    @property
    def _ids(self) -> tuple[str, str]:
        return self.settings.controller_type, self.settings.instance_id

    @property
    def name(self) -> str:
        return f"{self.settings.controller_type}/{self.settings.instance_id}"

    # -- the state machine ---------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set() and not self._register():
            if self.fatal is not None:
                return
            self._stop.wait(self.etcd_retry.next_delay())
        while not self._stop.is_set():
            try:
                ev = self._events.get(timeout=self.settings.tick)
            except queue.Empty:
                ev = None
            if isinstance(ev, RegistryView):
                self.snapshot = ev.get(self.settings.controller_type)
            elif isinstance(ev, tuple) and ev[0] == "refresh-epoch":
                self._refresh_epoch(ev[1])
            if self._stop.is_set():
                break
            try:
                self._evaluate()
                self._heartbeat_if_due()
            except RangeshardError as e:
                log.warning("%s: %s", self.name, e)

    def _register(self) -> bool:
        """Grant a lease and join; False (retry later) if etcd is unreachable."""
        keeper = LeaseKeeper(
            self.settings.etcd_config,
            self.settings.lease_ttl,
            name=self.name,
            on_renewed=lambda _d: self._events.put("renewed"),
            on_failure=lambda _e, _d: self._events.put("renew-failed"),
            on_lost=lambda: self._events.put("lost"),
            clock=self.clock,
        )
        try:
            lease = keeper.grant()
            member = self.registry.join(
                self.settings.controller_type,
                self.settings.instance_id,
                lease,
                host=self.settings.hostname,
                pid=self.settings.pid,
                main_resource=self.settings.main_resource,
                stuck_after_seconds=self.settings.stuck_after_seconds,
                proxy_url=self.settings.proxy_url,
            )
        except RangeshardError as e:
            if isinstance(e, AlreadyRegistered) and self._registered_elsewhere():
                self.fatal = (
                    f"{self.name}: another live process is registered with this instance id ({e}); "
                    "two processes with one instance id must never run: give each its own --instance-prefix"
                )
                log.error("%s", self.fatal)
            else:
                log.warning("%s: cannot join yet: %s", self.name, e)
            keeper.stop(revoke=True)  # without a lease: closes its client
            return False
        self.etcd_retry.reset()
        keeper.start()
        self.keeper = keeper
        self.join_revision = member.mod_revision
        self.floors.seen([member.record.handover_resource_versions])  # a parked predecessor's, before any list
        self._set_token(member.mod_revision)
        self.locked = member.record.is_locked
        self._set_state(member.record.state.value)
        with self._cond:
            self.range = member.range
            self.allowed = None
            self.epoch += 1
        self._count("epochs")
        self.host.on_epoch()
        if self.watch is None:
            self.watch = MembershipWatch(
                self.settings.etcd_config,
                self._events.put,
                controller_type=self.settings.controller_type,
                prefix=self.settings.registry_prefix,
                name=self.name,
                probe_interval=max(0.5, self.settings.lease_ttl / 5),
            )
            self.watch.start()
        self.joined.set()
        log.info("%s: joined with range %s (locked=%s)", self.name, member.range, self.locked)
        return True

    def _registered_elsewhere(self) -> bool:
        """Whether the record holding our instance id belongs to a live process (:func:`held_elsewhere`)."""
        try:
            member = self.registry.snapshot(self.settings.controller_type).get(self.settings.instance_id)
        except RangeshardError:
            return False
        live, self._foreign_heartbeat = held_elsewhere(member, self.settings.hostname, self._foreign_heartbeat)
        return live

    def _set_state(self, state: str) -> None:
        if state != self.state:
            if allowed_transition(self.state, state):
                log.info("%s: state %s -> %s", self.name, self.state, state)
            else:
                log.warning("%s: state %s -> %s (not a handover transition)", self.name, self.state, state)
            self.state = state
            self.host.on_state(state)

    def _set_token(self, epoch: int) -> None:
        keeper = self.keeper
        if keeper is None:
            return
        token = OwnerToken(self.settings.controller_type, self.settings.instance_id, keeper.lease_id, epoch)
        with self._cond:
            if self.token == token:
                return
            self.token = token
        log.info("%s: owner token %s", self.name, token)
        self.host.on_token(token)

    def _refresh_epoch(self, token: OwnerToken) -> None:
        snap = self.snapshot
        with self._cond:
            current = self.token
        if snap is None or token != current or snap.revision <= token.epoch:
            return
        log.info(
            "%s: the proxy fenced epoch %s as stale: new epoch at revision %s", self.name, token.epoch, snap.revision
        )
        self._count("epoch_refreshes")
        self._set_token(snap.revision)
        self._new_epoch()

    def _fence(self, why: str) -> None:
        with self._cond:
            self.allowed = None
        if not self.fenced:
            self.fenced = True
            self._count("fences")
            log.warning("%s: fenced (%s): processing stopped", self.name, why)
            self._set_state(FENCED)
            self.host.on_fenced()

    def _new_epoch(self) -> None:
        with self._cond:
            self.epoch += 1
            self.allowed = None
        self._count("epochs")
        self.host.on_epoch()

    def _view(self) -> View | None:
        """What :func:`~controller_manager.handover.decide` sees now (``None``: not registered)."""
        keeper = self.keeper
        if keeper is None:
            return None
        local = View(fenced=self.fenced, held_range=self.range, held_locked=self.locked)
        if keeper.lost.is_set():
            return replace(local, lease_lost=True)
        if self.clock.monotonic() >= keeper.deadline:
            return replace(local, deadline_passed=True)
        snap = self.snapshot
        if snap is None or snap.revision < self.join_revision:
            return replace(local, current=False)
        self.floors.seen(m.record.handover_resource_versions for m in snap)  # before a TakeRange relists
        me = snap.get(self.settings.instance_id)
        if me is None or me.lease_id != keeper.lease_id:
            return replace(local, registered=False)
        rng = me.range
        giver = me.record.giver
        giver_member = snap.get(giver) if giver is not None else None
        receivers = tuple(Receiver(r.instance_id, r.mod_revision) for r in snap.receivers_of(self.settings.instance_id))
        with self._cond:
            outside = any(rng is None or not rng.contains(h) for h in self.inflight.values())
            allowed, leaving, epoch = self.allowed is not None, self.leaving, self.epoch
        return replace(
            local,
            range=rng,
            locked=me.record.is_locked,
            giver_present=giver_member is not None and not giver_member.record.is_parked,
            receivers=receivers,
            revision=snap.revision,
            allowed=allowed,
            leaving=leaving,
            inflight_outside=outside,
            drained=self.host.drained() if receivers else True,
            synced=not allowed and rng is not None and self.host.synced(epoch),
            epoch=epoch,
        )

    def _evaluate(self) -> None:
        """Read a view, carry out what :func:`~controller_manager.handover.decide` says; again while it acts.

        A new epoch and the processing it allows are never decided on one
        view, so a second pass follows an epoch at once (at most three passes).
        """
        done: set[type[Action]] = set()
        for _ in range(3):
            view = self._view()
            if view is None:
                return
            actions = decide(view)
            for action in actions:
                if isinstance(action, (DrainWait, SelfUnlock, Unlock)) and type(action) in done:
                    continue  # once per evaluation: the snapshot does not change within one
                done.add(type(action))
                self._act(action, view)
            if not any(isinstance(a, (TakeRange, Unfence, Allow)) for a in actions):
                return

    def _act(self, action: Action, view: View) -> None:
        """Carry out one action of :func:`~controller_manager.handover.decide` (the I/O)."""
        if isinstance(action, Fence):
            self._fence(action.why)
        elif isinstance(action, Rejoin):
            self._rejoin()
        elif isinstance(action, Unfence):
            log.info("%s: lease renewed and record intact: unfencing", self.name)
            self.fenced = False
            self.published_state = None
            self._new_epoch()
        elif isinstance(action, TakeRange):
            log.info(
                "%s: range %s -> %s, locked %s -> %s", self.name, self.range, action.range, self.locked, action.locked
            )
            with self._cond:
                self.range = action.range
            self.locked = action.locked
            self._set_token(action.revision)
            self._new_epoch()
        elif isinstance(action, SetState):
            self._set_state(action.phase.value)
        elif isinstance(action, SelfUnlock):
            try:
                self.registry.unlock_orphaned(self.settings.controller_type, self.settings.instance_id)
                self._count("self_unlocks")
            except CompareFailed as e:
                log.debug("%s: self-unlock refused: %s", self.name, e)
        elif isinstance(action, Unlock):
            for r in action.receivers:
                try:
                    self.registry.unlock(
                        self.settings.controller_type,
                        r.instance_id,
                        self.settings.instance_id,
                        expected_mod_revision=r.mod_revision,
                        versions=self.host.written_versions(),
                    )
                    self._count("unlocks")
                except (CompareFailed, NotRegistered) as e:
                    log.debug("%s: unlock of %s deferred: %s", self.name, r.instance_id, e)
        elif isinstance(action, DrainWait):
            self._count("drain_waits")
            log.debug("%s: draining (work in flight outside %s, or the host not drained)", self.name, view.range)
        elif isinstance(action, Allow):
            with self._cond:
                allowed_now = self.epoch == view.epoch and self.allowed is None and not self.leaving
                if allowed_now:
                    self.allowed = action.range
            if allowed_now:
                log.info("%s: caches synced at epoch %s: processing %s", self.name, self.epoch, action.range)
                # Keys seen while paused were skipped: look at everything in range again.
                self.host.on_allowed()

    def _rejoin(self) -> None:
        old = self.keeper
        with self._cond:
            busy = bool(self.inflight)
        if busy:
            return  # reconciles are bounded by the fencing deadline; retry on the next tick
        if old is not None:
            old.stop(revoke=True)
        self.keeper = None
        self._count("rejoins")
        self.fenced = False
        self.published_state = None
        self.snapshot = None
        if not self._register():
            self._fence("rejoin pending: etcd unreachable")

    def _heartbeat_if_due(self) -> None:
        keeper = self.keeper
        if keeper is None or self.fenced:
            return
        now = time.monotonic()
        if now < self.retry_heartbeat_at:
            return
        if now < self.next_heartbeat and self.published_state == self.state:
            return
        rng = self.range
        count, histogram = self.host.workload(rng) if rng is not None else (0, None)
        state = State(self.state) if self.state in State.__members__.values() else None
        self.retry_heartbeat_at = now + self.etcd_retry.next_delay()  # no busy loop while etcd is away
        try:
            self.registry.heartbeat(
                self.settings.controller_type,
                self.settings.instance_id,
                keeper.lease_id,
                workload_num=count,
                state=state,
                histogram=histogram,
                child=self.host.child_info(),
                versions=self.host.written_versions(),
            )
        except NotRegistered as e:
            log.info("%s: heartbeat found no record: %s", self.name, e)
            return
        self.retry_heartbeat_at = 0.0
        self.etcd_retry.reset()
        self.published_state = self.state
        self.next_heartbeat = now + max(1.0, self.settings.lease_ttl / 3)
