"""The garbage collector deletes custom resources with a uid precondition (local_apiserver/gc.py).

An object the collector read, then somebody deleted and recreated under the
same name (a new uid) before the collector's delete, is a different object:
the delete is refused (409, precondition failed) and the new object is not
deleted through the API. The race is placed between the collector's read
(``Store.iter_all``) and its delete, on a real store on the session etcd;
``Store.delete`` is wrapped only to record what the collector asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from local_apiserver.crd import specs_for
from local_apiserver.errors import ApiError
from local_apiserver.gc import GarbageCollector
from local_apiserver.resources import ResourceSpec, core_spec
from local_apiserver.store import Obj, Store
from rangeshard.core.etcd import EtcdClient
from tests.local_apiserver.conftest import wait_for

GROUP = "gc-race.example.org"
CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gadgets.{GROUP}", "uid": "crd-uid"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


@pytest.fixture
def store(etcd_client: EtcdClient, key_prefix: str) -> Store:
    """A store under this test's prefix, serving the Gadget CRD, with the ``default`` namespace."""
    store = Store(etcd_client, key_prefix)
    store.table.set_crd(CRD["metadata"]["name"], specs_for(CRD))
    store.ensure_namespaces(("default",))
    return store


def _gadget_spec(store: Store) -> ResourceSpec:
    return next(s for s in store.table.storage_specs() if s.group == GROUP)


def _gadget(name: str, owner: Obj | None = None) -> Obj:
    meta: Obj = {"name": name}
    if owner is not None:
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"]}
        meta["ownerReferences"] = [{**ref, "uid": owner["metadata"]["uid"]}]
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": meta}


class _Race:
    """Recreate ``name`` (a new uid, no owner) right after the first read of the gadgets; record deletes."""

    def __init__(self, store: Store, spec: ResourceSpec, name: str) -> None:
        self.store, self.spec, self.name = store, spec, name
        self.new_uid: str | None = None
        self.deletes: list[tuple[str, str | None, int | None]] = []  # (name, precondition uid, error code)
        self._iter_all = store.iter_all
        self._delete = store.delete

    def iter_all(self, spec: ResourceSpec, namespace: str | None = None) -> Iterator[Obj]:
        items = list(self._iter_all(spec, namespace))
        if spec == self.spec and self.new_uid is None and any(o["metadata"]["name"] == self.name for o in items):
            self._delete(spec, "default", self.name)
            self.new_uid = self.store.create(spec, "default", _gadget(self.name))["metadata"]["uid"]
        return iter(items)

    def delete(self, spec: ResourceSpec, namespace: str | None, name: str, **options: Any) -> tuple[Obj, bool]:
        try:
            result = self._delete(spec, namespace, name, **options)
        except ApiError as e:
            self.deletes.append((name, options.get("precondition_uid"), e.code))
            raise
        self.deletes.append((name, options.get("precondition_uid"), None))
        return result

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(self.store, "iter_all", self.iter_all)
        monkeypatch.setattr(self.store, "delete", self.delete)


def test_a_dependent_recreated_before_the_collectors_delete_is_not_deleted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _gadget_spec(store)
    configmaps = core_spec("configmaps")
    owner = store.create(configmaps, "default", {"metadata": {"name": "owner"}})
    old_uid = store.create(spec, "default", _gadget("dep", owner))["metadata"]["uid"]
    race = _Race(store, spec, "dep")
    race.install(monkeypatch)
    gc = GarbageCollector(store)
    gc.start()
    try:
        store.delete(configmaps, "default", "owner")  # the owner leaves etcd: its dependents are collected
        wait_for(lambda: ("dep", old_uid, 409) in race.deletes, timeout=10, what="the collector's delete of dep")
    finally:
        gc.stop()
    assert race.new_uid is not None and race.new_uid != old_uid
    assert store.get(spec, "default", "dep")["metadata"]["uid"] == race.new_uid
    assert [d for d in race.deletes if d[0] == "dep"] == [("dep", old_uid, 409)]


def test_deleting_the_crd_deletes_its_objects_each_with_its_uid(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The objects of a deleted CRD go through ``Store.delete`` with their uid; a recreated one is refused there.

    Nothing of the CRD stays in etcd: what is left (the recreated object, objects held by finalizers) goes with
    its storage prefix, and the CRD is no longer served.
    """
    spec = _gadget_spec(store)
    uids = {name: store.create(spec, "default", _gadget(name))["metadata"]["uid"] for name in ("a", "b")}
    race = _Race(store, spec, "a")
    race.install(monkeypatch)
    GarbageCollector(store).remove_custom_objects(CRD)
    assert race.new_uid is not None
    assert sorted(race.deletes) == [("a", uids["a"], 409), ("b", uids["b"], None)]
    assert store.client.get_prefix(store.resource_prefix(spec))[1] == []
    assert all(s.group != GROUP for s in store.table.specs())
