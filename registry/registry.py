"""The instance registry: join, leave, lock/unlock, key moves and reads, all on etcd.

Purpose
    One record per controller instance at
    ``<prefix>/controllers/<controller-type>/<instance-id>`` bound to the
    instance's lease. Every membership change is one etcd transaction guarded
    by a compare, so concurrent writers never produce duplicate or overlapping
    keys.

Invariants
    * **Join** splits the largest range (ties: higher ``workloadNum``, then
      lower start). The transaction compares that no record of the type was
      created or modified after the snapshot it was computed from (a range
      compare ``mod_revision < snapshot + 1`` over the type's prefix), so two
      joiners can never pick the same key; the loser retries on a new snapshot.
    * A newcomer that takes keys from a live instance is written locked
      (``isLocked``, ``state=locked``, ``giver`` = the instance that may still
      be processing those keys). Only the giver unlocks it, or the receiver
      itself once the giver's record is gone (checked in the same
      transaction).
    * Record updates (heartbeats) are compare-and-swap on the record's
      ``mod_revision`` and never touch ``isLocked``/``giver`` unless asked,
      so a heartbeat cannot undo an unlock.
    * A key move (:meth:`Registry.set_key`) locks the receiving instance with
      the giving one as giver, in the same transaction that moves the key.
    * **Pins** (:mod:`registry.pins`): a join splits the largest unpinned
      range, and its transaction also guards the type's pins; a plan's move
      (``set_key(respect_pins=True)``) never moves a pinned range's bounds.

Concurrency model
    Stateless apart from the :class:`~rangeshard.core.etcd.EtcdClient`; methods may be
    called from any thread. Retries are bounded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from hashing import MAX_HASH, split_largest
from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import (
    AlreadyRegistered,
    CompareFailed,
    ConfigError,
    NoSplittableRange,
    NotRegistered,
    RangeshardError,
)
from rangeshard.core.etcd import KV, Compare, Delete, EtcdClient, Put, prefix_end
from registry import pins
from registry.layout import DEFAULT_PREFIX, Layout, parse_members
from registry.models import ChildInfo, InstanceRecord, MainResource, Member, Snapshot, State, check_name, now

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 100


def _published(versions: Mapping[str, int] | None) -> dict[str, str] | None:
    """``handoverResourceVersions`` as stored (decimal strings; ``None``: nothing to publish)."""
    kept = {label: str(rv) for label, rv in sorted((versions or {}).items()) if rv > 0}
    return kept or None


def _race_backoff() -> Backoff:
    """Pauses after lost races: short, longer with every attempt and jittered, so racing writers spread out."""
    return Backoff(0.01, 0.1, jitter=0.9)


def _newcomer(snap: Snapshot, fields: dict[str, Any]) -> InstanceRecord:
    """The record of an instance joining ``snap``'s type: it takes the lower half of the largest range.

    The first instance owns ``[0, MAX_HASH]`` and starts in ``init``; a later one
    starts ``locked`` with the instance that may still process its keys as
    ``giver`` (the split instance, or the giver that one still waits for).
    A parked range waits for its own instance and a pinned one stays as it is:
    neither is ever split (the largest unpinned range is).
    """
    controller_type = snap.controller_type
    base = {**fields, "controller_type": controller_type}
    owned = [(m, m.range) for m in snap.members if m.range is not None and not m.record.is_parked and not m.pinned]
    if not owned and any(m.record.is_parked or m.pinned for m in snap.members):
        raise pins.nothing_to_split(snap)
    if not owned:
        return InstanceRecord.model_validate({**base, "hash_key": MAX_HASH, "is_locked": False, "state": State.INIT})
    try:
        idx = split_largest([(rng, m.record.workload_num) for m, rng in owned])
    except ValueError as e:
        raise NoSplittableRange(f"{controller_type}: {e}") from e
    victim, victim_range = owned[idx]
    lower, _upper = victim_range.split()
    giver = victim.record.giver if victim.record.is_locked and victim.record.giver else victim.instance_id
    if giver == fields["instance_id"]:
        # The keys wait for an earlier incarnation of this very instance, whose
        # record is gone (lease expired: it fenced itself). Nobody can still be
        # processing them, and a self-lock could never be released.
        return InstanceRecord.model_validate({**base, "hash_key": lower.hi, "is_locked": False, "state": State.INIT})
    return InstanceRecord.model_validate(
        {**base, "hash_key": lower.hi, "is_locked": True, "state": State.LOCKED, "giver": giver}
    )


class Registry:
    """Operations on the registry of one etcd cluster (see module docstring)."""

    def __init__(self, client: EtcdClient, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.layout = Layout(prefix)

    # -- reads -------------------------------------------------------------
    def snapshot(self, controller_type: str) -> Snapshot:
        """All instances of one controller type (and which are pinned), read at one revision."""
        rev, kvs = self.client.get_prefix(self.layout.type_prefix(controller_type))
        items = parse_members(self.layout, kvs).get(controller_type, [])
        pinned = self._pins_at(self.layout.pin_prefix(controller_type), rev).get(controller_type, set())
        return Snapshot.build(controller_type, rev, items, pinned)

    def snapshots(self) -> tuple[int, dict[str, Snapshot]]:
        """Every controller type, read at one revision: ``(revision, {type: snapshot})``."""
        rev, kvs = self.client.get_prefix(self.layout.controllers)
        grouped = parse_members(self.layout, kvs)
        pinned = self._pins_at(self.layout.pins, rev)
        return rev, {t: Snapshot.build(t, rev, items, pinned.get(t, set())) for t, items in sorted(grouped.items())}

    def _pins_at(self, prefix: str, revision: int) -> dict[str, set[str]]:
        """The pins under ``prefix`` as of ``revision`` (the revision the records were read at)."""
        _rev, kvs, _more = self.client.get_range(prefix, prefix_end(prefix), revision=revision)
        return pins.parse_pins(kvs, self.layout.parse_pin_key)

    # -- pins (registry.pins) ----------------------------------------------
    def pin(self, controller_type: str, instance_id: str) -> bool:
        """Pin a registered instance (``rangeshard rebalance pin``); ``False`` when it already was."""
        check_name("controller type", controller_type)
        check_name("instance id", instance_id)
        key = self.layout.pin_key(controller_type, instance_id)
        return pins.pin(self.client, key, self.snapshot(controller_type), instance_id)

    def unpin(self, controller_type: str, instance_id: str) -> bool:
        """Remove a pin; ``False`` when there was none."""
        check_name("controller type", controller_type)
        check_name("instance id", instance_id)
        return pins.unpin(self.client, self.layout.pin_key(controller_type, instance_id))

    def raw(self) -> tuple[int, list[KV]]:
        """Every key under the registry prefix, as stored."""
        return self.client.get_prefix(self.layout.prefix + "/")

    # -- membership --------------------------------------------------------
    def join(
        self,
        controller_type: str,
        instance_id: str,
        lease_id: int,
        *,
        host: str | None = None,
        pid: int | None = None,
        workload_num: int = 0,
        main_resource: MainResource | None = None,
        stuck_after_seconds: float | None = None,
        proxy_url: str | None = None,
    ) -> Member:
        """Register an instance by splitting the largest range; retried on conflict.

        The first instance owns ``[0, MAX_HASH]`` and starts in ``init``; later
        ones start ``locked`` with the instance that may still process their
        keys as ``giver``. ``main_resource`` and ``stuck_after_seconds`` are
        published in the record for progress measurement (the proxy). Raises
        :class:`AlreadyRegistered`, :class:`NoSplittableRange`, or
        :class:`CompareFailed` after too many lost races.
        """
        check_name("controller type", controller_type)
        check_name("instance id", instance_id)
        published: dict[str, Any] = {
            "host": host,
            "pid": pid,
            "workload_num": workload_num,
            "main_resource": main_resource,
            "stuck_after_seconds": stuck_after_seconds,
            "proxy_url": proxy_url,
        }
        pause = _race_backoff()
        for attempt in range(_MAX_ATTEMPTS):
            snap = self.snapshot(controller_type)
            mine = snap.get(instance_id)
            if mine is not None and mine.record.is_parked:
                taken = self._unpark(mine, lease_id, published)
                if taken is not None:
                    return taken
                continue  # the record changed (or expired) between the read and the write: look again
            if mine is not None:
                rec = mine.record
                raise AlreadyRegistered(
                    f"{controller_type}/{instance_id} is already registered (state {rec.state.value}, host "
                    f"{rec.host or '?'}, pid {rec.pid or '?'}, lease {mine.lease_id:x})"
                )
            stamp = now()
            record = _newcomer(
                snap, {"instance_id": instance_id, "started_at": stamp, "heartbeat_at": stamp, **published}
            )
            put = Put(self.layout.record_key(controller_type, instance_id), record.to_json(), lease_id)
            if self._put_if_type_unchanged(snap, [put], f"joining {controller_type}/{instance_id}"):
                log.info(
                    "joined %s as %s with key %s (giver %s) after %s attempt(s)",
                    controller_type,
                    instance_id,
                    record.hash_key,
                    record.giver,
                    attempt + 1,
                )
                joined = self.snapshot(controller_type).get(instance_id)
                if joined is None:
                    raise NotRegistered(f"{controller_type}/{instance_id} vanished right after joining")
                return joined
            time.sleep(pause.next_delay())
        raise CompareFailed(f"joining {controller_type}/{instance_id}: lost {_MAX_ATTEMPTS} races in a row")

    def _put_if_type_unchanged(self, snap: Snapshot, puts: list[Put], what: str) -> bool:
        """Write ``puts`` in one transaction if no record (nor pin) of ``snap``'s type changed since it was read."""
        prefix = self.layout.type_prefix(snap.controller_type)
        pins = self.layout.pin_prefix(snap.controller_type)
        return self.client.transaction(
            compare=[
                Compare.mod(prefix, "<", snap.revision + 1, prefix=True),
                Compare.mod(pins, "<", snap.revision + 1, prefix=True),
            ],
            success=puts,
            what=what,
        ).succeeded

    def _unpark(self, member: Member, lease_id: int, published: dict[str, Any]) -> Member | None:
        """Take a parked record back: same ``hashKey``, the new lease, no split and no handover.

        ``None`` when the record changed between the read and the write (retry).
        The grace lease it was parked on is revoked afterwards (nothing else is on it).
        """
        rec = member.record
        stamp = now()
        new = rec.evolve(
            state=State.LOCKED if rec.is_locked else State.ACTIVE,
            parked_until=None,
            started_at=stamp,
            heartbeat_at=stamp,
            **published,
        )
        what = f"rejoining {rec.controller_type}/{rec.instance_id} (parked)"
        ok = self.client.transaction(
            compare=[Compare.mod(member.key, "==", member.mod_revision)],
            success=[Put(member.key, new.to_json(), lease_id)],
            what=what,
        ).succeeded
        if not ok:
            return None
        with contextlib.suppress(RangeshardError):
            self.client.revoke_lease(member.lease_id)
        log.info("%s: took key %s back (no split, no handover)", what, rec.hash_key)
        back = self.snapshot(rec.controller_type).get(rec.instance_id)
        if back is None:
            raise NotRegistered(f"{what}: the record vanished right after rejoining")
        return back

    def park(
        self,
        controller_type: str,
        instance_id: str,
        lease_id: int,
        grace_lease_id: int,
        grace: float,
        versions: Mapping[str, int] | None = None,
    ) -> None:
        """Park a drained instance: its record moves to ``grace_lease_id`` with state ``parked``.

        The record keeps its ``hashKey`` (so its range, owned by nobody until it
        rejoins) and vanishes with the grace lease. In the same transaction the
        receivers it still has to unlock are unlocked (the caller has drained:
        nothing of the range it gave away is in flight), so no receiver waits
        for a parked giver. Guarded by the whole type's revision (no record of
        the type changed since the read; retried), and the record must still be
        bound to ``lease_id`` (:class:`NotRegistered`). The caller then revokes
        ``lease_id``. ``versions``: the highest resourceVersions of its writes, published with it
        (``handoverResourceVersions``: its receivers list not older than them).
        """
        what = f"parking {controller_type}/{instance_id}"
        pause = _race_backoff()
        for _ in range(_MAX_ATTEMPTS):
            snap = self.snapshot(controller_type)
            me = snap.get(instance_id)
            if me is None or me.lease_id != lease_id:
                raise NotRegistered(f"{what}: the record is gone or belongs to another lease")
            stamp = now()
            parked = me.record.evolve(
                state=State.PARKED,
                parked_until=stamp + grace,
                heartbeat_at=stamp,
                handover_resource_versions=_published(versions) or me.record.handover_resource_versions,
            )
            puts = [Put(me.key, parked.to_json(), grace_lease_id)]
            receivers = snap.receivers_of(instance_id)
            for r in receivers:
                unlocked = r.record.evolve(is_locked=False, giver=None)
                puts.append(Put(r.key, unlocked.to_json(), r.lease_id))
            if self._put_if_type_unchanged(snap, puts, what):
                log.info(
                    "%s: key %s kept for %.0fs%s",
                    what,
                    parked.hash_key,
                    grace,
                    f"; unlocked {', '.join(r.instance_id for r in receivers)}" if receivers else "",
                )
                return
            time.sleep(pause.next_delay())
        raise CompareFailed(f"{what}: lost {_MAX_ATTEMPTS} races in a row")

    def release(self, controller_type: str, instance_id: str) -> Member:
        """End a parked record's grace now (e.g. after a scale-in): the neighbour absorbs its range at once.

        Only a parked record may be released (:class:`ConfigError` otherwise: a
        live instance leaves by a graceful stop); guarded by its mod revision.
        Returns the record as it was.
        """
        what = f"releasing {controller_type}/{instance_id}"
        member = self._read(controller_type, instance_id)
        if not member.record.is_parked:
            raise ConfigError(
                f"{controller_type}/{instance_id} is {member.record.state.value}, not parked: only a parked record "
                "is released (a running instance leaves the registry when it is stopped)"
            )
        ok = self.client.transaction(
            compare=[Compare.mod(member.key, "==", member.mod_revision)],
            success=[Delete(member.key)],
            what=what,
        ).succeeded
        if not ok:
            raise CompareFailed(f"{what}: the record changed concurrently (its instance rejoined?)")
        with contextlib.suppress(RangeshardError):
            self.client.revoke_lease(member.lease_id)
        log.info("%s: deleted; the neighbour absorbs %s", what, member.range)
        return member

    def leave(self, lease_id: int) -> None:
        """Revoke the instance's lease: etcd deletes its records, peers see it at once."""
        self.client.revoke_lease(lease_id)

    def remove(self, controller_type: str, instance_id: str) -> bool:
        """Delete a record by hand (for records without a lease); True if it existed."""
        return self.client.delete(self.layout.record_key(controller_type, instance_id))

    # -- guarded updates ---------------------------------------------------
    def _read(self, controller_type: str, instance_id: str) -> Member:
        snap = self.snapshot(controller_type)
        member = snap.get(instance_id)
        if member is None:
            raise NotRegistered(f"{controller_type}/{instance_id} is not registered")
        return member

    def _cas(
        self, member: Member, record: InstanceRecord, what: str, extra_compare: list[Compare] | None = None
    ) -> bool:
        return self.client.transaction(
            compare=[Compare.mod(member.key, "==", member.mod_revision), *(extra_compare or [])],
            success=[Put(member.key, record.to_json(), member.lease_id)],
            what=what,
        ).succeeded

    def update(
        self,
        controller_type: str,
        instance_id: str,
        mutate: Callable[[InstanceRecord], InstanceRecord],
        *,
        lease_id: int | None = None,
    ) -> InstanceRecord:
        """Read-modify-write one record with compare-and-swap, retried on conflict.

        ``mutate`` gets the latest record and returns the new one. With
        ``lease_id`` the record must still be bound to that lease
        (:class:`NotRegistered` otherwise: our registration is gone).
        """
        what = f"updating {controller_type}/{instance_id}"
        for _ in range(_MAX_ATTEMPTS):
            member = self._read(controller_type, instance_id)
            if lease_id is not None and member.lease_id != lease_id:
                raise NotRegistered(f"{what}: the record belongs to another lease")
            new = mutate(member.record)
            if new == member.record:
                return new
            if self._cas(member, new, what):
                return new
        raise CompareFailed(f"{what}: lost {_MAX_ATTEMPTS} races in a row")

    def heartbeat(
        self,
        controller_type: str,
        instance_id: str,
        lease_id: int,
        *,
        workload_num: int | None = None,
        state: State | None = None,
        histogram: dict[str, object] | None = None,
        child: ChildInfo | None = None,
        versions: Mapping[str, int] | None = None,
    ) -> InstanceRecord:
        """Refresh heartbeat time, workload, state (and an external child's info, the versions of its writes:
        ``handoverResourceVersions``); the last instance normalizes its key to MAX_HASH."""
        owned = [m for m in self.snapshot(controller_type).members if m.range is not None]
        is_last = bool(owned) and owned[-1].instance_id == instance_id
        given: dict[str, object] = {"workload_num": workload_num, "state": state, "histogram": histogram}
        given |= {"child": child, "handover_resource_versions": _published(versions)}

        def mutate(rec: InstanceRecord) -> InstanceRecord:
            changes: dict[str, object] = {"heartbeat_at": now(), **{k: v for k, v in given.items() if v is not None}}
            if is_last and rec.hash_key != MAX_HASH:
                changes["hash_key"] = MAX_HASH
            return rec.evolve(**changes)

        return self.update(controller_type, instance_id, mutate, lease_id=lease_id)

    def lock(
        self, controller_type: str, receiver: str, giver: str, *, expected_mod_revision: int | None = None
    ) -> None:
        """Mark ``receiver`` locked until ``giver`` unlocks it (guarded; :class:`CompareFailed` on races)."""
        member = self._read(controller_type, receiver)
        if expected_mod_revision is not None and member.mod_revision != expected_mod_revision:
            raise CompareFailed(f"locking {controller_type}/{receiver}: record changed since it was read")
        new = member.record.evolve(is_locked=True, state=State.LOCKED, giver=giver)
        if not self._cas(member, new, f"locking {controller_type}/{receiver}"):
            raise CompareFailed(f"locking {controller_type}/{receiver}: the record changed concurrently")

    def unlock(
        self,
        controller_type: str,
        receiver: str,
        giver: str,
        *,
        expected_mod_revision: int | None = None,
        versions: Mapping[str, int] | None = None,
    ) -> None:
        """``giver`` releases ``receiver`` (its drain is done).

        Guarded: the receiver must still be locked by ``giver`` and, if
        ``expected_mod_revision`` is given, unchanged since the caller read it.
        Raises :class:`CompareFailed` otherwise, :class:`NotRegistered` if the
        receiver is gone. ``versions`` (the highest resourceVersions of the
        giver's writes) go into the giver's record in the same transaction,
        guarded by its mod revision: the view that shows the receiver unlocked
        shows them (``handoverResourceVersions``).
        """
        what = f"unlocking {controller_type}/{receiver} by {giver}"
        snap = self.snapshot(controller_type)
        member = snap.get(receiver)
        if member is None:
            raise NotRegistered(f"{controller_type}/{receiver} is not registered")
        if expected_mod_revision is not None and member.mod_revision != expected_mod_revision:
            raise CompareFailed(
                f"{what}: record changed (mod revision {member.mod_revision}, expected {expected_mod_revision})"
            )
        if not member.record.is_locked or member.record.giver != giver:
            raise CompareFailed(
                f"{what}: not locked by {giver} (locked={member.record.is_locked}, giver={member.record.giver})"
            )
        new = member.record.evolve(is_locked=False, giver=None)
        extra_compare: list[Compare] = []
        extra_puts: list[Put] = []
        giving = snap.get(giver)
        published = _published(versions)
        if giving is not None and published and published != giving.record.handover_resource_versions:
            extra_compare.append(Compare.mod(giving.key, "==", giving.mod_revision))
            versioned = giving.record.evolve(handover_resource_versions=published)
            extra_puts.append(Put(giving.key, versioned.to_json(), giving.lease_id))
        ok = self.client.transaction(
            compare=[Compare.mod(member.key, "==", member.mod_revision), *extra_compare],
            success=[Put(member.key, new.to_json(), member.lease_id), *extra_puts],
            what=what,
        ).succeeded
        if not ok:
            raise CompareFailed(f"{what}: the record changed concurrently")
        log.info("%s: unlocked", what)

    def unlock_orphaned(self, controller_type: str, receiver: str) -> None:
        """A locked receiver whose giver's record is gone (or parked: drained) unlocks itself.

        The transaction checks both that the receiver is unchanged and that the
        giver's key does not exist, so a giver that is still registered can
        never be bypassed. :class:`CompareFailed` if either check fails.
        """
        what = f"self-unlocking {controller_type}/{receiver}"
        member = self._read(controller_type, receiver)
        giver = member.record.giver
        if not member.record.is_locked:
            return
        extra: list[Compare] = []
        if giver:
            giver_member = self.snapshot(controller_type).get(giver)
            if giver_member is not None and giver_member.record.is_parked:
                # A parked giver drained before parking: guard that it is still that parked record.
                extra.append(Compare.mod(giver_member.key, "==", giver_member.mod_revision))
            else:
                extra.append(Compare.version(self.layout.record_key(controller_type, giver), "==", 0))
        new = member.record.evolve(is_locked=False, giver=None)
        if not self._cas(member, new, what, extra):
            raise CompareFailed(f"{what}: giver {giver} is still registered or the record changed")
        log.info("%s: giver %s is gone, unlocked", what, giver)

    def set_key(
        self,
        controller_type: str,
        instance_id: str,
        new_key: int,
        *,
        dry_run: bool = False,
        respect_pins: bool = False,
    ) -> tuple[Member, Member | None]:
        """Move one boundary: ``instance_id``'s key becomes ``new_key``.

        The instance that receives keys is locked with the giving one as giver,
        in the same transaction (guarded by the whole type's mod revisions).
        Returns ``(moved member before, receiver before or None)``. Refuses
        (:class:`ConfigError`) a key outside ``[0, MAX_HASH]``, a collision, an
        empty range, the last instance (always ``MAX_HASH``), a locked party,
        or an unknown instance.
        """
        if not (0 <= new_key <= MAX_HASH):
            raise ConfigError(f"key {new_key} is outside [0, {MAX_HASH}]")
        snap = self.snapshot(controller_type)
        owned = [m for m in snap.members if m.range is not None]
        idx = next((i for i, m in enumerate(owned) if m.instance_id == instance_id), None)
        if idx is None:
            known = ", ".join(m.instance_id for m in snap.members) or "none"
            raise ConfigError(f"unknown instance {instance_id!r} of {controller_type} (known: {known})")
        me = owned[idx]
        if idx == len(owned) - 1:
            raise ConfigError(f"{instance_id} is the last instance: its key is always {MAX_HASH}; move its predecessor")
        lo = owned[idx - 1].record.hash_key + 1 if idx > 0 else 0
        succ = owned[idx + 1]
        if new_key == me.record.hash_key:
            raise ConfigError(f"{instance_id} already has key {new_key}")
        if not (lo <= new_key < succ.record.hash_key):
            raise ConfigError(
                f"key {new_key} would leave an instance an empty range or collide: "
                f"{instance_id}'s key must stay in [{lo}, {succ.record.hash_key - 1}]"
            )
        if new_key > me.record.hash_key:
            receiver, giver = me, succ
        else:
            receiver, giver = succ, me
        for party in (me, succ):
            if respect_pins and party.pinned:
                raise ConfigError(
                    f"{party.instance_id} is pinned: a rebalance never moves its range "
                    f"(rangeshard rebalance unpin --type {controller_type} --instance {party.instance_id})"
                )
            if party.record.is_parked:
                raise ConfigError(
                    f"{party.instance_id} is parked (waiting up to its rejoin grace for its instance): "
                    "its keys do not move; retry after it rejoined or its grace ran out"
                )
            if party.record.is_locked:
                raise CompareFailed(f"{party.instance_id} is locked (handover in progress); retry when it is active")
        if dry_run:
            return me, receiver
        lock: dict[str, object] = {"is_locked": True, "state": State.LOCKED, "giver": giver.instance_id}
        moved = me.record.evolve(hash_key=new_key, **(lock if receiver is me else {}))
        puts = [Put(me.key, moved.to_json(), me.lease_id)]
        if receiver is not me:
            puts.append(Put(receiver.key, receiver.record.evolve(**lock).to_json(), receiver.lease_id))
        if not self._put_if_type_unchanged(snap, puts, f"moving the key of {controller_type}/{instance_id}"):
            raise CompareFailed(f"moving the key of {controller_type}/{instance_id}: the registry changed concurrently")
        log.info(
            "moved %s/%s key %s -> %s; %s locked until %s drains",
            controller_type,
            instance_id,
            me.record.hash_key,
            new_key,
            receiver.instance_id,
            giver.instance_id,
        )
        return me, receiver
