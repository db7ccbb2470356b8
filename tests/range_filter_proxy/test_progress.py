"""Progress measured from outside (issue 38, item 2): the proxy's bookkeeping of unanswered changes.

Objects are fed as the watch cache feeds its observers; the registry view is
built with the registry's own :class:`Snapshot` (ranges derived as everywhere
else). What ``/metrics`` says is read back with the Prometheus parser.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hashing import MAX_HASH, ShardBy, fnv1a_64
from range_filter_proxy.cached import CachedObject
from range_filter_proxy.progress import (
    ProgressCollector,
    ProgressSettings,
    ProgressTracker,
    ResourceProgress,
    attribute,
    read_generations,
)
from range_filter_proxy.resources import ResourceInfo
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.rest import GVR
from registry import InstanceRecord, MainResource, RegistryView, Snapshot
from tests.range_filter_proxy.fakes import uid_in_lower_half

RS = GVR("apps", "v1", "replicasets")
INFO = ResourceInfo(RS, "ReplicaSet", True, frozenset({"list", "watch"}))
MAIN = MainResource(group="apps", version="v1", resource="replicasets", by=ShardBy.UID)
HALF = MAX_HASH // 2


def _obj(name: str, uid: str, generation: int | None, observed: int | None, **meta: Any) -> CachedObject:
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1", **meta},
    }
    if generation is not None:
        body["metadata"]["generation"] = generation
    if observed is not None:
        body["status"] = {"observedGeneration": observed, "replicas": 1}
    return CachedObject.build(body, INFO)


def test_read_generations_reads_only_what_progress_needs() -> None:
    g = read_generations(_obj("a", "u", 3, 2).raw)
    assert (g.uid, g.generation, g.observed, g.deleting, g.unanswered) == ("u", 3, 2, False, True)
    assert not read_generations(_obj("a", "u", 3, 3).raw).unanswered
    assert read_generations(_obj("a", "u", 1, None).raw).unanswered  # never answered
    assert not read_generations(_obj("a", "u", None, None).raw).unanswered  # no generation: nothing to answer
    deleting = read_generations(_obj("a", "u", 4, 3, deletionTimestamp="2024-01-01T00:00:00Z").raw)
    assert deleting.deleting and not deleting.unanswered
    # Members of unexpected types read as absent (the lenient path), never an error.
    odd = orjson.dumps({"metadata": {"uid": "u", "generation": "7"}, "status": "broken"})
    assert read_generations(odd).generation is None and read_generations(odd).uid == "u"
    assert read_generations(b"not json").generation is None


def test_since_is_the_first_sight_of_each_unanswered_generation() -> None:
    p = ResourceProgress("replicasets.apps")
    p.replaced({})
    p.applied("ADDED", _obj("a", "u1", 1, None), 10.0)
    assert not p.measurable and p.pending[("ns", "a")].since() == 10.0
    p.applied("MODIFIED", _obj("a", "u1", 1, 1), 11.0)  # answered
    assert p.measurable and ("ns", "a") not in p.pending
    p.applied("MODIFIED", _obj("a", "u1", 2, 1), 20.0)
    p.applied("MODIFIED", _obj("a", "u1", 3, 1), 25.0)  # a newer change before the first was answered
    p.applied("MODIFIED", _obj("a", "u1", 3, 1), 30.0)  # the same generation again (a label change)
    assert p.pending[("ns", "a")].since() == 20.0
    p.applied("MODIFIED", _obj("a", "u1", 3, 2), 40.0)  # 2 answered: 3 has waited since it was first seen
    assert p.pending[("ns", "a")].since() == 25.0
    p.applied("MODIFIED", _obj("a", "u1", 3, 3), 41.0)
    assert p.pending == {}
    p.applied("ADDED", _obj("b", "u2", 5, 4), 50.0)
    p.applied("DELETED", _obj("b", "u2", 5, 4), 51.0)
    assert p.pending == {}
    p.applied("ADDED", _obj("c", "u3", 2, 1), 60.0)
    p.applied("MODIFIED", _obj("c", "u4", 1, None), 61.0)  # recreated under the same name: a new object
    assert p.pending[("ns", "c")].since() == 61.0 and p.pending[("ns", "c")].uid == "u4"


def test_a_relist_keeps_the_times_of_the_objects_it_finds_again() -> None:
    p = ResourceProgress("replicasets.apps")
    a, b = _obj("a", "u1", 2, 1), _obj("b", "u2", 2, 1)
    p.replaced({a.key: a, b.key: b})
    first = p.pending[a.key].since()
    p.replaced({a.key: a})  # b is gone
    assert p.pending[a.key].since() == first and b.key not in p.pending
    p.replaced({})
    assert p.pending == {} and p.synced


def _snap(ctype: str, *members: tuple[str, int, float | None], main: MainResource | None = MAIN) -> Snapshot:
    items = [
        (
            InstanceRecord.model_validate(
                {
                    "instance_id": iid,
                    "controller_type": ctype,
                    "hash_key": key,
                    "main_resource": main,
                    "stuck_after_seconds": after,
                }
            ),
            f"/k/{iid}",
            n + 1,
            n + 1,
            0,
        )
        for n, (iid, key, after) in enumerate(members)
    ]
    return Snapshot.build(ctype, 10, items)


def test_attribute_counts_per_owner_of_the_key() -> None:
    p = ResourceProgress("replicasets.apps")
    low, high = uid_in_lower_half(True, "p"), uid_in_lower_half(False, "p")
    p.applied("ADDED", _obj("l", low, 2, 1), 1.0)
    p.applied("ADDED", _obj("h", high, 2, 1), 3.0)
    p.applied("ADDED", _obj("h2", uid_in_lower_half(False, "q"), 2, 1), 5.0)
    snap = _snap("rs", ("lo", HALF, None), ("hi", MAX_HASH, None))
    assert attribute(snap, ShardBy.UID, p.pending, 10.0) == {"lo": (1, 9.0), "hi": (2, 7.0)}
    assert fnv1a_64(low) >> 1 <= HALF < fnv1a_64(high) >> 1
    # An orphan has no key under "owner": it is nobody's.
    assert attribute(snap, ShardBy.OWNER, p.pending, 10.0) == {}


def _tracker(view: RegistryView, progress: dict[str, ResourceProgress]) -> ProgressTracker:
    tracker = ProgressTracker(ProgressSettings(EtcdConfig.from_urls("http://127.0.0.1:1")), caches=None)  # type: ignore[arg-type]
    tracker.resources.update(progress)
    tracker._on_view(view)  # as the membership watch delivers it (no loop to wake)
    return tracker


def _scrape(tracker: ProgressTracker) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry()
    registry.register(ProgressCollector(tracker))
    text = generate_latest(registry).decode()
    return {
        (s.name, s.labels["type"], s.labels["instance"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_per_type_and_instance_stuck_and_not_measurable() -> None:
    p = ResourceProgress("replicasets.apps")
    p.replaced({})
    p.applied("ADDED", _obj("ok", uid_in_lower_half(True, "ok"), 1, 1), 0.0)  # the controller answers
    p.applied("ADDED", _obj("h", uid_in_lower_half(False, "h"), 4, 3), 100.0)
    view = RegistryView(
        10,
        {
            "rs": _snap("rs", ("lo", HALF, 5), ("hi", MAX_HASH, 5)),
            "old": _snap("old", ("x", MAX_HASH, None), main=None),  # a record without mainResource
        },
    )
    tracker = _tracker(view, {"replicasets.apps": p})
    got = {(i.controller_type, i.instance_id): i for i in tracker.instances(now=103.0)}
    assert got["rs", "hi"].count == 1 and got["rs", "hi"].oldest == 3.0 and not got["rs", "hi"].stuck
    got = {(i.controller_type, i.instance_id): i for i in tracker.instances(now=106.0)}
    assert got["rs", "hi"].stuck and got["rs", "hi"].stuck_after == 5.0
    assert (got["rs", "lo"].count, got["rs", "lo"].oldest, got["rs", "lo"].stuck) == (0, 0.0, False)
    assert not got["old", "x"].measurable and math.isnan(got["old", "x"].count)
    assert got["old", "x"].stuck_after == 120.0  # the default
    m = _scrape(tracker)
    assert m["rangeshard_unreconciled_objects", "rs", "hi"] == 1.0
    assert m["rangeshard_unreconciled_objects", "rs", "lo"] == 0.0
    assert m["rangeshard_unreconciled_oldest_seconds", "rs", "hi"] > 5
    assert m["rangeshard_unreconciled_stuck", "rs", "hi"] == 1.0
    assert m["rangeshard_unreconciled_stuck", "rs", "lo"] == 0.0
    assert m["rangeshard_unreconciled_measurable", "rs", "lo"] == 1.0
    assert m["rangeshard_stuck_after_seconds", "rs", "lo"] == 5.0
    assert m["rangeshard_unreconciled_measurable", "old", "x"] == 0.0
    assert math.isnan(m["rangeshard_unreconciled_objects", "old", "x"])
    assert math.isnan(m["rangeshard_unreconciled_oldest_seconds", "old", "x"])
    assert m["rangeshard_unreconciled_stuck", "old", "x"] == 0.0


@pytest.mark.parametrize("synced", [True, False])
def test_a_controller_that_never_writes_observed_generation_is_not_measurable(synced: bool) -> None:
    p = ResourceProgress("replicasets.apps")
    if synced:
        p.replaced({})
    p.applied("ADDED", _obj("a", uid_in_lower_half(True, "n"), 1, None), 0.0)
    p.applied("MODIFIED", _obj("a", uid_in_lower_half(True, "n"), 2, None), 1.0)
    tracker = _tracker(RegistryView(3, {"rs": _snap("rs", ("only", MAX_HASH, 1))}), {"replicasets.apps": p})
    (only,) = tracker.instances(now=1000.0)
    assert not only.measurable and not only.stuck and math.isnan(only.oldest)
