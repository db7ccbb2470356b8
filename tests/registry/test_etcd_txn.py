"""Our transaction type and typed errors against a real etcd (the session server, a random key prefix).

A transaction is guards (``Compare.mod/create/version``, one key or every key under a
prefix) and operations (``Put``, ``Delete``); it answers a ``TxnResult`` whose
``revision`` is the mod revision of what it wrote. Failures come back as one type each.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rangeshard.core.errors import EtcdRequestTooLarge, FutureRevision, RevisionCompacted
from rangeshard.core.etcd import Compare, Delete, EtcdClient, EtcdConfig, Put, TxnResult, prefix_end
from rangeshard.core.etcdserver import EtcdServer


def test_a_guarded_create_writes_once_and_names_its_revision(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = f"{key_prefix}/a"
    created = etcd_client.transaction([Compare.create(key, "==", 0)], [Put(key, b"one")])
    _, kv = etcd_client.get(key)
    assert kv is not None and kv.value == b"one"
    assert created == TxnResult(succeeded=True, revision=kv.mod_revision)
    again = etcd_client.transaction(
        [Compare.version(key, "==", 0)], [Put(key, "two")], [Put(f"{key_prefix}/lost", "x")]
    )
    assert not again.succeeded and again.revision == kv.mod_revision + 1  # the failure branch wrote
    assert etcd_client.get(key)[1] == kv
    assert etcd_client.get(f"{key_prefix}/lost")[1] is not None


def test_mod_guards_update_and_delete(etcd_client: EtcdClient, key_prefix: str, leases: Callable[[int], int]) -> None:
    key = f"{key_prefix}/b"
    rev = etcd_client.put(key, "v1")
    lease = leases(30)
    stale = etcd_client.transaction([Compare.mod(key, "==", rev - 1)], [Put(key, "v2", lease)])
    assert not stale.succeeded
    updated = etcd_client.transaction([Compare.mod(key, "==", rev)], [Put(key, "v2", lease)])
    _, kv = etcd_client.get(key)
    assert updated.succeeded and kv is not None and (kv.value, kv.lease_id) == (b"v2", lease)
    deleted = etcd_client.transaction([Compare.mod(key, "==", kv.mod_revision)], [Delete(key)])
    assert deleted == TxnResult(True, kv.mod_revision + 1) and etcd_client.get(key)[1] is None


def test_a_prefix_guard_fails_after_any_change_under_the_prefix(etcd_client: EtcdClient, key_prefix: str) -> None:
    prefix = f"{key_prefix}/type/"
    etcd_client.put(prefix + "x", "1")
    read_at, _ = etcd_client.get_prefix(prefix)
    unchanged = [Compare.mod(prefix, "<", read_at + 1, prefix=True)]
    etcd_client.put(f"{key_prefix}/elsewhere", "1")  # outside the prefix: the guard still holds
    assert etcd_client.transaction(unchanged, [Put(prefix + "y", "1"), Put(prefix + "z", "1")]).succeeded
    assert not etcd_client.transaction(unchanged, [Put(prefix + "w", "1")]).succeeded
    _, kvs = etcd_client.get_prefix(prefix)
    assert [kv.key[len(prefix) :] for kv in kvs] == ["x", "y", "z"]
    assert kvs[1].mod_revision == kvs[2].mod_revision  # one transaction, one revision


def test_reads_at_revisions_etcd_does_not_have_are_typed(etcd_server_factory: Callable[[], EtcdServer]) -> None:
    server = etcd_server_factory()
    server.start()
    with EtcdClient(EtcdConfig.from_urls(server.url)) as client:
        first = client.put("/k", "1")
        current = client.put("/k", "2")
        client.compact(current)
        with pytest.raises(RevisionCompacted):
            client.get_range("/", prefix_end("/"), revision=first)
        with pytest.raises(FutureRevision):
            client.get_range("/", prefix_end("/"), revision=current + 100)


@pytest.mark.parametrize("size", [1_600_000, 2_600_000])  # over etcd's 1.5 MiB; over gRPC's 2 MiB message limit
def test_a_request_over_etcds_limit_is_typed(etcd_client: EtcdClient, key_prefix: str, size: int) -> None:
    key = f"{key_prefix}/big"
    with pytest.raises(EtcdRequestTooLarge):
        etcd_client.transaction([Compare.create(key, "==", 0)], [Put(key, b"x" * size)])
    with pytest.raises(EtcdRequestTooLarge):
        etcd_client.put(key, b"x" * size)
