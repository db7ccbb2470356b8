"""The informer's indexes against a plain scan of its store, over random watch events and relists.

Differential: after every step of a random history (ADDED / MODIFIED /
DELETED events through the informer's own event path, relists through its
own relist path), every index lookup must give exactly what a scan of
``items()`` gives: by namespace, by controller-owner uid, orphans by
namespace, a user's index, and ``by_root`` down a chain of owners through a
``via`` informer (pods -> ReplicaSets -> Deployments), judged against
walking each pod's chain up. Plus the contracts around them: a failing index
function is a clear error, an index added late files what is cached, an
unknown index name is named.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_manager.indexer import Indexer
from controller_manager.informer import Informer
from controller_manager.resources import PODS, REPLICASETS, controller_ref
from hashing import MAX_CHAIN, HashRange
from rangeshard.core.errors import ControllerError

NAMESPACES = ("a", "b", "")
POD_NAMES = tuple(f"p{i}" for i in range(6))
RS_NAMES = tuple(f"r{i}" for i in range(4))
DEPLOYMENTS = ("d0", "d1")


def _uid(kind: str, ns: str, name: str) -> str:
    return f"uid-{kind}-{ns}-{name}"


def _informer(resource: Any, events: list[tuple[str, str]] | None = None) -> Informer:
    def on_event(kind: str, obj: dict[str, Any]) -> None:
        if events is not None:
            events.append((kind, obj["metadata"]["name"]))

    inf = Informer(
        None,
        resource,
        path="object.metadata.uid",
        range_source=lambda: (0, HashRange.full()),
        on_event=on_event,
        name=f"test-{resource.name}",
        indexers={"app": lambda o: [v] if (v := ((o["metadata"].get("labels") or {}).get("app"))) else []},
    )
    return inf


def _obj(kind: str, ns: str, name: str, owner: tuple[str, str] | None, app: str | None, rv: int) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": _uid(kind, ns, name), "resourceVersion": str(rv)}
    if ns:
        meta["namespace"] = ns
    if app is not None:
        meta["labels"] = {"app": app}
    if owner is not None:
        owner_kind, owner_uid = owner
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "not-the-controller"},
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": "n", "uid": owner_uid, "controller": True},
        ]
    return {"metadata": meta}


# An owner of a pod: a ReplicaSet (maybe not cached), a Deployment, or none (an orphan).
pod_owners = st.one_of(
    st.none(),
    st.builds(lambda ns, n: ("ReplicaSet", _uid("rs", ns, n)), st.sampled_from(NAMESPACES), st.sampled_from(RS_NAMES)),
    st.builds(lambda d: ("Deployment", _uid("d", "a", d)), st.sampled_from(DEPLOYMENTS)),
)
rs_owners = st.one_of(
    st.none(),
    st.builds(lambda d: ("Deployment", _uid("d", "a", d)), st.sampled_from(DEPLOYMENTS)),
    # A chain through another ReplicaSet (and cycles: r0 -> r1 -> r0).
    st.builds(lambda ns, n: ("ReplicaSet", _uid("rs", ns, n)), st.sampled_from(NAMESPACES), st.sampled_from(RS_NAMES)),
)
apps = st.one_of(st.none(), st.sampled_from(("web", "db")))


def _object_ops(kind: str, names: tuple[str, ...], owners: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    put = st.tuples(st.just(kind), st.just("put"), st.sampled_from(NAMESPACES), st.sampled_from(names), owners, apps)
    delete = st.tuples(st.just(kind), st.just("delete"), st.sampled_from(NAMESPACES), st.sampled_from(names))
    relist = st.tuples(
        st.just(kind),
        st.just("relist"),
        st.lists(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(names), owners, apps), max_size=8),
    )
    return st.one_of(put, put, put, delete, relist)


ops = st.lists(
    st.one_of(_object_ops("pod", POD_NAMES, pod_owners), _object_ops("rs", RS_NAMES, rs_owners)), max_size=40
)


def _key(ns: str, name: str) -> str:
    return f"{ns}/{name}" if ns else name


def _scan(items: Iterable[dict[str, Any]], pred: Any) -> list[str]:
    return sorted(_key(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in items if pred(o))


def _keys(objs: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(_key(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs)


def _owner(o: dict[str, Any]) -> str | None:
    ref = controller_ref(o)
    return ref["uid"] if ref is not None else None


def _passes_through(pod: dict[str, Any], uid: str, rs_items: list[dict[str, Any]]) -> bool:
    """Walk the pod's chain of controller owners up through the cached ReplicaSets: does it pass ``uid``?"""
    by_uid = {o["metadata"]["uid"]: o for o in rs_items}
    current = _owner(pod)
    seen: set[str] = set()
    for _ in range(MAX_CHAIN):
        if current is None or current in seen:
            return False
        if current == uid:
            return True
        seen.add(current)
        above = by_uid.get(current)
        current = _owner(above) if above is not None else None
    return False


def _check(inf: Informer) -> None:
    items = inf.items()
    assert len(inf) == len(items)
    for ns in NAMESPACES:
        assert _keys(inf.by_namespace(ns)) == _scan(items, lambda o, ns=ns: o["metadata"].get("namespace", "") == ns)
        assert _keys(inf.orphans(ns)) == _scan(
            items, lambda o, ns=ns: _owner(o) is None and o["metadata"].get("namespace", "") == ns
        )
    owners = {u for o in items if (u := _owner(o))} | {"uid-nobody"}
    for uid in owners:
        assert _keys(inf.by_owner(uid)) == _scan(items, lambda o, uid=uid: _owner(o) == uid)
        assert sorted(inf.index_keys("owner", uid)) == _keys(inf.by_owner(uid))
    assert sorted(inf.indexer.index_values("owner")) == sorted(owners - {"uid-nobody"})
    for app in ("web", "db", "none"):
        assert _keys(inf.by_index("app", app)) == _scan(
            items, lambda o, app=app: (o["metadata"].get("labels") or {}).get("app") == app
        )


@settings(max_examples=150, deadline=None)
@given(ops)
def test_indexes_equal_a_plain_scan_over_random_events_and_relists(history: list[Any]) -> None:
    pods, rs = _informer(PODS), _informer(REPLICASETS)
    pods.via = (rs,)
    informers = {"pod": pods, "rs": rs}
    for rv, op in enumerate(history, start=1):
        kind, what = op[0], op[1]
        inf = informers[kind]
        if what == "put":
            _, _, ns, name, owner, app = op
            etype = "MODIFIED" if inf.get(_key(ns, name)) is not None else "ADDED"
            inf._apply(etype, _obj(kind, ns, name, owner, app, rv))
        elif what == "delete":
            _, _, ns, name = op
            old = inf.get(_key(ns, name))
            if old is not None:
                inf._apply("DELETED", old)
        else:
            objs = [_obj(kind, ns, name, owner, app, rv) for ns, name, owner, app in op[2]]
            inf._replace({_key(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}, rv)
        _check(pods)
        _check(rs)
        rs_items = rs.items()
        roots = {_uid("d", "a", d) for d in DEPLOYMENTS} | {o["metadata"]["uid"] for o in rs_items}
        roots |= {u for o in pods.items() if (u := _owner(o))}
        for uid in roots:
            want = _scan(pods.items(), lambda o, uid=uid, rs_items=rs_items: _passes_through(o, uid, rs_items))
            assert _keys(pods.by_root(uid)) == want, uid


def test_relist_reports_changes_and_reindexes() -> None:
    events: list[tuple[str, str]] = []
    pods = _informer(PODS, events)
    rs_uid = _uid("rs", "a", "r0")
    pods._apply("ADDED", _obj("pod", "a", "p0", ("ReplicaSet", rs_uid), "web", 1))
    pods._apply("ADDED", _obj("pod", "a", "p1", None, "web", 2))
    assert _keys(pods.by_owner(rs_uid)) == ["a/p0"] and _keys(pods.orphans("a")) == ["a/p1"]
    # The relist: p0 adopted by another owner, p1 gone, p2 new (unchanged objects are not re-emitted).
    other = _uid("rs", "a", "r1")
    pods._replace(
        {
            "a/p0": _obj("pod", "a", "p0", ("ReplicaSet", other), "db", 3),
            "b/p2": _obj("pod", "b", "p2", None, None, 3),
        },
        7,
    )
    assert pods.synced_epoch == 7
    assert sorted(events[2:]) == [("ADDED", "p2"), ("DELETED", "p1"), ("MODIFIED", "p0")]
    assert pods.by_owner(rs_uid) == [] and _keys(pods.by_owner(other)) == ["a/p0"]
    assert pods.orphans("a") == [] and _keys(pods.orphans("b")) == ["b/p2"]
    assert _keys(pods.by_index("app", "db")) == ["a/p0"] and pods.by_index("app", "web") == []
    # Empty value sets are dropped: the index holds nothing for owners no object has any more.
    assert rs_uid not in pods.indexer.index_values("owner")


def test_by_root_walks_down_through_the_via_informer() -> None:
    pods, rs = _informer(PODS), _informer(REPLICASETS)
    pods.via = (rs,)
    d = _uid("d", "a", "d0")
    rs._apply("ADDED", _obj("rs", "a", "r0", ("Deployment", d), None, 1))
    rs._apply("ADDED", _obj("rs", "a", "r1", ("Deployment", d), None, 2))
    rs._apply("ADDED", _obj("rs", "a", "r2", None, None, 3))  # an orphan ReplicaSet: its pods' root is itself
    for i, r in enumerate(("r0", "r0", "r1", "r2")):
        pods._apply("ADDED", _obj("pod", "a", f"p{i}", ("ReplicaSet", _uid("rs", "a", r)), None, 10 + i))
    assert _keys(pods.by_root(d)) == ["a/p0", "a/p1", "a/p2"]
    assert _keys(pods.by_root(_uid("rs", "a", "r2"))) == ["a/p3"]
    # Re-parenting an intermediate moves its pods with it, with no pod event.
    rs._apply("MODIFIED", _obj("rs", "a", "r1", ("Deployment", _uid("d", "a", "d1")), None, 20))
    assert _keys(pods.by_root(d)) == ["a/p0", "a/p1"]
    assert _keys(pods.by_root(_uid("d", "a", "d1"))) == ["a/p2"]
    # Without via informers by_root is by_owner (a chain of one step).
    pods.via = ()
    assert pods.by_root(d) == []
    assert _keys(pods.by_root(_uid("rs", "a", "r0"))) == ["a/p0", "a/p1"]


def test_index_errors_are_clear() -> None:
    store = Indexer()
    store.put("a/x", {"metadata": {"name": "x", "namespace": "a"}})
    with pytest.raises(ControllerError, match="no index 'colour'; this store has: namespace, owner, orphans"):
        store.by_index("colour", "red")
    with pytest.raises(ControllerError, match="index 'owner' exists already"):
        store.add_indexers({"owner": lambda o: []})
    with pytest.raises(ControllerError, match=r"index 'colour' failed on 'x': KeyError"):
        store.add_indexers({"colour": lambda o: [o["spec"]["colour"]]})
    assert store.indexers() == ["namespace", "owner", "orphans"]  # the failed one was not added
    store.add_indexers({"colour": lambda o: [o.get("spec", {}).get("colour", "none")]})
    assert [o["metadata"]["name"] for o in store.by_index("colour", "none")] == ["x"]
    # A write whose index function fails changes nothing.
    store.add_indexers({"strict": lambda o: [o["spec"]["size"]] if o.get("spec") else []})
    with pytest.raises(ControllerError, match="index 'strict' failed on 'y'"):
        store.put("a/y", {"metadata": {"name": "y", "namespace": "a"}, "spec": {"colour": "red"}})
    assert store.get("a/y") is None and store.by_index("colour", "red") == []
    assert store.keys() == ["a/x"]
