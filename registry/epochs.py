"""Ownership periods: for every instance, the revision at which its current lease, range and lock took effect.

Purpose
    Write fencing (``range_filter_proxy.fencing``) must tell a write of the
    *current* ownership period of an instance from a write of an earlier one
    (a process paused while its range moved away and back). An ownership
    period is a maximal run of registry revisions during which one instance
    has the same lease, the same derived range and the same ``isLocked``;
    its *epoch* is the revision that began it.

    :class:`EpochTracker` is fed by :class:`registry.watch.MembershipWatch`
    (``on_revision``) with the registry after every revision and keeps, per
    instance, an :class:`Ownership` with that epoch.

Invariants
    * Fed every revision in order, an epoch is exact: the revision of the
      registry change after which the instance's (lease, range, locked)
      became what it is.
    * After a (re)list the history before it is unknown; a period that began
      before is given the lower bound ``max(own create revision, predecessor's
      create revision)``, never more than the true epoch (so a current token
      is never refused for it; docs/reliability.md states what this weakens).
    * An owner token (whose epoch is the revision of a view in which the
      instance saw its current period) is current iff ``token.epoch >=
      epoch``: every view of an earlier period has a revision below the epoch.

Concurrency model
    ``observe`` runs on the watch thread; readers on any thread. One lock
    guards the state; readers get immutable values.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from hashing import HashRange
from rangeshard.core.etcd import KV
from registry.layout import DEFAULT_PREFIX, Layout, parse_members
from registry.models import Snapshot


@dataclass(frozen=True, slots=True)
class Ownership:
    """One instance's current ownership period."""

    controller_type: str
    instance_id: str
    lease_id: int
    range: HashRange | None
    locked: bool
    epoch: int
    #: False when ``epoch`` is the lower bound of a period that began before the last (re)list.
    exact: bool = True
    #: The record is parked (its process stopped for a restart within ``rejoinGraceSeconds``): nobody writes.
    parked: bool = False
    #: The range of the instance's previous period under the same lease (``None``: none seen): a key in it but
    #: not in ``range`` left the instance at ``epoch`` (a handover), so a write to it acted on an older view.
    previous_range: HashRange | None = None


class EpochTracker:
    """Per-instance ownership periods, fed one registry revision at a time (see module docstring)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.layout = Layout(prefix)
        self._lock = threading.Lock()
        self._owners: dict[tuple[str, str], Ownership] = {}
        self._kvs: dict[str, KV] = {}
        self._revision = 0
        self.observed = threading.Event()

    @property
    def revision(self) -> int:
        """The last revision observed."""
        with self._lock:
            return self._revision

    def observe(self, revision: int, kvs: Mapping[str, KV], relisted: bool = False) -> None:
        """The registry as of ``revision`` (called after every revision; ``relisted`` after a list)."""
        grouped = parse_members(self.layout, sorted(kvs.values(), key=lambda kv: kv.key))
        with self._lock:
            owners: dict[tuple[str, str], Ownership] = {}
            for ctype, items in grouped.items():
                members = Snapshot.build(ctype, revision, items).members
                for i, m in enumerate(members):
                    prev = self._owners.get((ctype, m.instance_id))
                    period = (m.lease_id, m.range, m.record.is_locked, m.record.is_parked)
                    if prev is not None and (prev.lease_id, prev.range, prev.locked, prev.parked) == period:
                        owners[(ctype, m.instance_id)] = prev
                        continue
                    if relisted or not self.observed.is_set():
                        pred = members[i - 1].create_revision if i > 0 else 0
                        epoch, exact = max(m.create_revision, pred), False
                    else:
                        epoch, exact = revision, True
                    previous = prev.range if prev is not None and prev.lease_id == m.lease_id else None
                    owners[(ctype, m.instance_id)] = Ownership(
                        ctype,
                        m.instance_id,
                        m.lease_id,
                        m.range,
                        m.record.is_locked,
                        epoch,
                        exact,
                        m.record.is_parked,
                        previous,
                    )
            self._owners = owners
            self._kvs = dict(kvs)
            self._revision = max(self._revision, revision)
        self.observed.set()

    def get(self, controller_type: str, instance_id: str) -> Ownership | None:
        with self._lock:
            return self._owners.get((controller_type, instance_id))

    def behind(self, revision: int, kvs: Mapping[str, KV]) -> str:
        """Why :meth:`covers` is false (for a log line): the records read that the view lacks or has older,
        and those the view still has that the read (at ``revision``) no longer holds."""
        with self._lock:
            older = [
                f"{k} (read at {kv.mod_revision}, here {self._kvs[k].mod_revision if k in self._kvs else 'absent'})"
                for k, kv in kvs.items()
                if k not in self._kvs or self._kvs[k].mod_revision < kv.mod_revision
            ]
            gone = [k for k, kv in self._kvs.items() if k not in kvs and kv.create_revision <= revision]
            return f"view at revision {self._revision}; behind: {older or 'none'}; deleted since: {gone or 'none'}"

    def covers(self, revision: int, kvs: Mapping[str, KV]) -> bool:
        """True if the tracked registry is at least as new as ``kvs``, read at ``revision``.

        Either the tracker saw ``revision`` itself, or every record read is
        known here at the same or a later modification, and every record
        known here but not read was created after the read (no deletion
        up to ``revision`` is still missing).
        """
        with self._lock:
            if not self.observed.is_set():
                return False
            if self._revision >= revision:
                return True
            for key, kv in kvs.items():
                mine = self._kvs.get(key)
                if mine is None or mine.mod_revision < kv.mod_revision:
                    return False
            return all(kv.create_revision > revision for key, kv in self._kvs.items() if key not in kvs)
