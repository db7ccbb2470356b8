"""What a manager remembers of objects outside its store (issue 27): nothing of those in it, ints of the gone.

The runtime used to map every main key it had ever seen to the object's uid
string, for ever: the references kept every listed object's memory resident
after the range shrank (one manager that had listed 20,000 ReplicaSets stayed
at the RSS of 20,000 after handing half away). The map now holds only the key
hash of objects that left the store, until their key was processed, and
hashes uids through a copy (``hash_key``'s memo held every uid string too).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from controller_manager.controller import ControllerRuntime
from controller_manager.controllers.replicaset import ReplicaSetController
from hashing import hash_key
from rangeshard.core.etcd import EtcdConfig
from tests.helpers import offline_runtime


class _Uid(str):
    """A uid string a weak reference can follow."""

    __slots__ = ("__weakref__",)


def _runtime(etcd_config: EtcdConfig, key_prefix: str) -> ControllerRuntime:
    return offline_runtime(ReplicaSetController, etcd_config, key_prefix)


def _rs(i: int, uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"rs{i}", "uid": uid, "resourceVersion": "1"}}


def test_the_runtime_keeps_no_reference_to_stored_or_gone_objects(etcd_config: EtcdConfig, key_prefix: str) -> None:
    rt = _runtime(etcd_config, key_prefix)
    uids = [_Uid(f"uid-{i}") for i in range(50)]
    refs = [weakref.ref(u) for u in uids]
    for i, u in enumerate(uids):
        rt._on_main("ADDED", _rs(i, u))
    assert rt._gone == {}, "objects in the store need no remembered hash"
    for i, u in enumerate(uids[:10]):
        rt._on_main("DELETED", _rs(i, u))  # deleted, or left the range in a relist
    assert rt._gone == {f"ns/rs{i}": hash_key(f"uid-{i}") for i in range(10)}
    assert all(type(v) is int for v in rt._gone.values())
    # The store does not hold them (not started): key_hash answers from the remembered hashes.
    assert rt.key_hash("ns/rs3") == hash_key("uid-3")
    assert rt.key_hash("ns/rs30") is None
    del uids, u  # the loop variable too
    gc.collect()
    assert all(r() is None for r in refs), "the runtime still references a uid string of an object"
    # Once a gone key was processed (or dropped as out of range), it is forgotten ...
    h = rt._gone["ns/rs3"]
    rt._forget_gone("ns/rs3", h)
    assert "ns/rs3" not in rt._gone
    # ... unless the key went again, as another object, meanwhile.
    rt._on_main("DELETED", _rs(4, "other-uid"))
    rt._forget_gone("ns/rs4", hash_key("uid-4"))
    assert rt._gone["ns/rs4"] == hash_key("other-uid")
    # An object that comes back is in the store again: nothing remembered.
    rt._on_main("ADDED", _rs(5, "uid-5"))
    assert "ns/rs5" not in rt._gone
