"""EpochTracker on hand-built registry revisions (pure: KV values as the watch delivers them).

The tracker's epochs decide which owner tokens the write fence accepts, so
each rule is pinned here exactly: the epoch of an instance moves to the
revision of the change, and only when its lease, derived range or lock
changes (never for a heartbeat, its own or a neighbour's); after a (re)list
it is the lower bound ``max(own create revision, predecessor's create
revision)``; ``covers`` says whether the tracked view is as new as a read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from hashing import MAX_HASH, HashRange
from rangeshard.core.etcd import KV
from registry.epochs import EpochTracker

PREFIX = "/t"
CT = "replicaset"


@dataclass
class FakeEtcd:
    """An in-memory registry keyspace with etcd's revision rules (our own test double, not etcd's API)."""

    revision: int = 1
    kvs: dict[str, KV] = field(default_factory=dict)

    def key(self, instance: str, ctype: str = CT) -> str:
        return f"{PREFIX}/controllers/{ctype}/{instance}"

    def put(
        self, instance: str, hash_key: int, lease: int, *, locked: bool = False, beat: int = 0, ctype: str = CT
    ) -> int:
        self.revision += 1
        key = self.key(instance, ctype)
        old = self.kvs.get(key)
        value = orjson.dumps(
            {"hashKey": hash_key, "isLocked": locked, "state": "locked" if locked else "active", "heartbeatAt": beat}
        )
        self.kvs[key] = KV(
            key,
            value,
            self.revision,
            old.create_revision if old is not None else self.revision,
            (old.version + 1) if old is not None else 1,
            lease,
        )
        return self.revision

    def delete(self, instance: str, ctype: str = CT) -> int:
        self.revision += 1
        del self.kvs[self.key(instance, ctype)]
        return self.revision

    def bump(self) -> int:
        """A revision outside the registry (API objects share etcd's revision)."""
        self.revision += 1
        return self.revision

    def feed(self, tracker: EpochTracker, relisted: bool = False) -> None:
        tracker.observe(self.revision, dict(self.kvs), relisted)


HALF = MAX_HASH // 2


def test_epoch_is_the_revision_of_the_change_and_ignores_heartbeats() -> None:
    etcd, t = FakeEtcd(), EtcdTracker()
    etcd.put("a", MAX_HASH, lease=1)
    etcd.feed(t, relisted=True)
    a0 = t.get(CT, "a")
    assert a0 is not None and a0.range == HashRange(0, MAX_HASH) and a0.exact is False
    joined = etcd.put("b", HALF, lease=2, locked=True)  # b splits a: a's range shrinks at this revision
    t.observe(etcd.revision, dict(etcd.kvs))  # the watch's call: not a relist unless it says so
    a1, b1 = t.get(CT, "a"), t.get(CT, "b")
    assert a1 is not None and a1.epoch == joined and a1.exact is True and a1.range == HashRange(HALF + 1, MAX_HASH)
    assert (a1.controller_type, a1.instance_id, a1.lease_id, a1.locked) == (CT, "a", 1, False)
    assert b1 is not None and b1.epoch == joined and b1.locked and b1.exact is True
    assert (b1.controller_type, b1.instance_id, b1.lease_id, b1.range) == (CT, "b", 2, HashRange(0, HALF))
    for beat in range(1, 4):  # heartbeats of both: same lease, range and lock: same periods
        etcd.put("a", MAX_HASH, lease=1, beat=beat)
        etcd.feed(t)
        etcd.put("b", HALF, lease=2, locked=True, beat=beat)
        etcd.feed(t)
        etcd.bump()
        etcd.feed(t)
        assert t.get(CT, "a") == a1 and t.get(CT, "b") == b1
    unlocked = etcd.put("b", HALF, lease=2, locked=False)
    etcd.feed(t)
    b2 = t.get(CT, "b")
    assert b2 is not None and b2.epoch == unlocked and not b2.locked
    assert t.get(CT, "a") == a1  # a neighbour's unlock is not a change of a's period
    rejoined = etcd.put("a", MAX_HASH, lease=9)  # same key, new lease (a rejoined): a new period
    etcd.feed(t)
    a2 = t.get(CT, "a")
    assert a2 is not None and a2.epoch == rejoined and a2.lease_id == 9
    gone = etcd.delete("b")  # b left: a's range grows back
    etcd.feed(t)
    a3 = t.get(CT, "a")
    assert a3 is not None and a3.epoch == gone and a3.range == HashRange(0, MAX_HASH)
    assert t.get(CT, "b") is None
    assert t.revision == gone


def test_a_relist_gives_lower_bounds_from_create_revisions() -> None:
    etcd = FakeEtcd()
    # Created out of key order (b, then c, then a) so each bound has one right answer.
    c_b = etcd.put("b", HALF, lease=2)
    c_c = etcd.put("c", HALF // 2, lease=3)
    c_a = etcd.put("a", MAX_HASH, lease=1)
    for beat in range(3):
        etcd.put("b", HALF, lease=2, beat=beat)
    t = EtcdTracker()
    assert not t.observed.is_set()
    etcd.feed(t, relisted=True)
    assert t.observed.is_set()
    by_key = {o: t.get(CT, o) for o in "abc"}
    # Key order c < b < a: each one's bound is max(own create revision, predecessor's create revision).
    assert c_b < c_c < c_a
    assert by_key["c"] is not None and by_key["c"].epoch == c_c and not by_key["c"].exact  # first: own create only
    assert by_key["b"] is not None and by_key["b"].epoch == c_c  # max(own c_b, predecessor c's c_c)
    assert by_key["a"] is not None and by_key["a"].epoch == c_a  # max(own c_a, predecessor b's c_b)
    for name, o in by_key.items():
        assert o is not None and (o.controller_type, o.instance_id) == (CT, name) and o.exact is False
    # Nothing changed: a later relist keeps the periods (and their bounds) as they are.
    etcd.put("c", HALF // 2, lease=3, beat=9)
    etcd.feed(t, relisted=True)
    assert {o: t.get(CT, o) for o in "abc"} == by_key


def test_first_observation_without_the_relist_flag_still_gives_lower_bounds() -> None:
    etcd = FakeEtcd()
    created = etcd.put("a", MAX_HASH, lease=1)
    etcd.put("a", MAX_HASH, lease=1, beat=1)
    t = EtcdTracker()
    etcd.feed(t)  # the very first view: the history before it is unknown
    a = t.get(CT, "a")
    assert a is not None and a.epoch == created and not a.exact


def test_a_change_seen_first_in_a_relist_gets_a_lower_bound_not_the_relist_revision() -> None:
    etcd, t = FakeEtcd(), EtcdTracker()
    etcd.put("a", MAX_HASH, lease=1)
    etcd.feed(t, relisted=True)
    created_b = etcd.put("b", HALF, lease=2)  # missed by the watch: seen only in the next relist
    etcd.bump()
    etcd.feed(t, relisted=True)
    a = t.get(CT, "a")
    assert a is not None and a.epoch == created_b and not a.exact  # max(a's create, b's create)
    assert a.epoch < etcd.revision


def test_types_are_tracked_apart() -> None:
    etcd, t = FakeEtcd(), EtcdTracker()
    etcd.put("a", MAX_HASH, lease=1)
    etcd.put("a", MAX_HASH, lease=1, ctype="deployment")
    etcd.feed(t, relisted=True)
    rs, dep = t.get(CT, "a"), t.get("deployment", "a")
    assert rs is not None and dep is not None
    split = etcd.put("b", HALF, lease=2, ctype="deployment")
    etcd.feed(t)
    assert t.get(CT, "a") == rs  # a deployment join is not a replicaset change
    dep2 = t.get("deployment", "a")
    assert dep2 is not None and dep2.epoch == split


def test_covers() -> None:
    etcd, t = FakeEtcd(), EtcdTracker()
    etcd.put("a", MAX_HASH, lease=1)
    assert not t.covers(etcd.revision, dict(etcd.kvs))  # nothing observed yet
    etcd.feed(t, relisted=True)
    seen = etcd.revision
    assert t.covers(seen, dict(etcd.kvs))  # exactly this revision
    assert t.covers(seen - 1, {})  # an older read
    # etcd moved on without registry changes: the same records, read at a later revision, are covered.
    later = etcd.bump()
    assert t.covers(later, dict(etcd.kvs))
    # A record changed after the tracked view: not covered until observed.
    etcd.put("a", MAX_HASH, lease=1, beat=1)
    read = dict(etcd.kvs)
    assert not t.covers(etcd.revision, read)
    etcd.feed(t)
    assert t.covers(etcd.revision, read)
    # A record the read has that the view lacks: not covered.
    etcd.put("b", HALF, lease=2)
    assert not t.covers(etcd.revision, dict(etcd.kvs))
    etcd.feed(t)
    tracked = etcd.revision
    # A deletion the view has not seen: the read lacks a record the view still has, created before the read.
    etcd.delete("b")
    assert not t.covers(etcd.revision, dict(etcd.kvs))
    etcd.feed(t)
    assert t.covers(etcd.revision, dict(etcd.kvs))
    # A record created after the read is in the view but not in the read: that is newer, so covered.
    read_rev, read = etcd.revision, dict(etcd.kvs)
    etcd.put("c", HALF, lease=3)
    etcd.feed(t)
    assert t.covers(read_rev, read)
    # ... but one created exactly at the read's revision must be in the read.
    t2 = EtcdTracker()
    etcd.feed(t2, relisted=True)
    assert not t2.covers(etcd.revision + 1, {k: v for k, v in etcd.kvs.items() if not k.endswith("/c")})
    assert tracked < etcd.revision


def test_behind_names_what_the_view_lacks_when_it_does_not_cover() -> None:
    """The slow-decision log line of write fencing says which records hold the view back."""
    etcd, t = FakeEtcd(), EtcdTracker()
    etcd.put("a", MAX_HASH, lease=1)
    etcd.feed(t, relisted=True)
    assert "behind: none; deleted since: none" in t.behind(etcd.revision, dict(etcd.kvs))
    etcd.put("b", HALF, lease=2)  # not fed: the view lacks it
    why = t.behind(etcd.revision, dict(etcd.kvs))
    assert not t.covers(etcd.revision, dict(etcd.kvs))
    assert "/b (read at" in why and "here absent" in why and "deleted since: none" in why
    etcd.feed(t)
    etcd.delete("b")  # not fed: the view still has it
    why = t.behind(etcd.revision, dict(etcd.kvs))
    assert "behind: none" in why and "/b" in why.split("deleted since:")[1]


def EtcdTracker() -> EpochTracker:
    return EpochTracker(PREFIX)
