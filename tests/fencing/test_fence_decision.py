"""Write fencing decisions on a real etcd registry: locked, wrong lease, old epoch, out of range, view behind etcd.

The registry is changed with the real guarded transactions (``registry.Registry``);
the fence reads it through the real membership watch and linearizable reads.
The only stand-in is a gate on the fence's own watch hook (our interface), to
hold its view behind etcd on purpose.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from hashing import MAX_HASH, HashRange, hash_key
from range_filter_proxy.fencing import BatchedRead, FenceSettings, Verdict, WriteFence, decide, shard_hash_of
from rangeshard.core.etcd import KV, EtcdClient, EtcdConfig
from rangeshard.core.ownertoken import OwnerToken, fence_reason, fenced_status
from registry import Registry
from registry.epochs import Ownership

CTYPE = "replicaset"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def registry(etcd_client: EtcdClient, key_prefix: str) -> Registry:
    return Registry(etcd_client, key_prefix)


async def _started(settings: FenceSettings) -> WriteFence:
    fence = WriteFence(settings)
    await fence.start()
    await asyncio.to_thread(fence.tracker.observed.wait, 10)
    return fence


def _token(fence: WriteFence, instance: str, lease: int | None = None, epoch: int | None = None) -> OwnerToken:
    owner = fence.tracker.get(CTYPE, instance)
    assert owner is not None
    return OwnerToken(
        CTYPE, instance, owner.lease_id if lease is None else lease, owner.epoch if epoch is None else epoch
    )


def test_current_owner_passes_and_stale_writers_are_fenced(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    lease_a = etcd_client.grant_lease(30)
    a = registry.join(CTYPE, "a", lease_a)
    assert a.range == HashRange(0, MAX_HASH)

    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix))
        try:
            token_a = _token(fence, "a")
            assert token_a.epoch == a.mod_revision  # the join began the period
            assert await fence.check(token_a, 12345) is None
            assert await fence.check(token_a, None) is None

            wrong = await fence.check(OwnerToken(CTYPE, "a", lease_a + 1, token_a.epoch), 1)
            assert wrong is not None and wrong.reason == "LeaseMismatch"
            ghost = await fence.check(OwnerToken(CTYPE, "ghost", lease_a, token_a.epoch), 1)
            assert ghost is not None and ghost.reason == "NotRegistered"

            # b joins: it takes the lower half, locked until a (its giver) unlocks it.
            lease_b = await asyncio.to_thread(etcd_client.grant_lease, 30)
            b = await asyncio.to_thread(registry.join, CTYPE, "b", lease_b)
            assert b.record.is_locked and b.range is not None
            token_b = OwnerToken(CTYPE, "b", lease_b, b.mod_revision)
            locked = await fence.check(token_b, b.range.lo)
            assert locked is not None and locked.reason == "Locked"

            # a's range shrank with b's join: its old token is from an ended period.
            stale = await fence.check(token_a, b.range.lo)
            assert stale is not None and stale.reason == "StaleEpoch"
            assert str(b.mod_revision) in stale.why
            new_a = _token(fence, "a")
            assert new_a.epoch == b.mod_revision
            out = await fence.check(new_a, b.range.lo)
            assert out is not None and out.reason == "OutOfRange"
            assert await fence.check(new_a, MAX_HASH) is None

            # a unlocks b: b's unlocked period begins at the unlock revision.
            await asyncio.to_thread(registry.unlock, CTYPE, "b", "a")
            still_locked_token = await fence.check(token_b, b.range.lo)
            assert still_locked_token is not None and still_locked_token.reason == "StaleEpoch"
            unlocked = _token(fence, "b")
            assert unlocked.epoch > b.mod_revision
            assert await fence.check(unlocked, b.range.lo) is None

            # b's lease ends (a pause beyond the TTL): its record is gone, its writes are fenced.
            await asyncio.to_thread(etcd_client.revoke_lease, lease_b)
            gone = await fence.check(unlocked, b.range.lo)
            assert gone is not None and gone.reason == "NotRegistered"
            # ... and a's range grew back: a new period, the previous token of a is over too.
            regrown = await fence.check(new_a, b.range.lo)
            assert regrown is not None and regrown.reason == "StaleEpoch"
            assert await fence.check(_token(fence, "a"), b.range.lo) is None
        finally:
            await fence.stop()

    run(scenario())


def test_decision_waits_for_a_view_as_new_as_etcd_at_arrival(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """The watch is held behind etcd: a write arriving after a registry change waits for it, then is fenced."""
    lease = etcd_client.grant_lease(30)
    registry.join(CTYPE, "a", lease)
    gate = threading.Event()
    gate.set()

    class GatedFence(WriteFence):
        def _observe(self, revision: int, kvs: Mapping[str, KV], relisted: bool) -> None:
            gate.wait(30)
            super()._observe(revision, kvs, relisted)

    async def scenario() -> None:
        fence = GatedFence(FenceSettings(etcd_config, key_prefix))
        await fence.start()
        await asyncio.to_thread(fence.tracker.observed.wait, 10)
        try:
            token = _token(fence, "a")
            assert await fence.check(token, 7) is None
            gate.clear()  # the fence's view stops here
            await asyncio.to_thread(etcd_client.revoke_lease, lease)  # etcd moves on: a is gone
            pending = asyncio.create_task(fence.check(token, 7))
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            assert not done, "decided on a view older than etcd at arrival"
            gate.set()
            verdict = await asyncio.wait_for(pending, 10)
            assert verdict is not None and verdict.reason == "NotRegistered"
        finally:
            gate.set()
            await fence.stop()

    run(scenario())


def test_unrelated_etcd_writes_do_not_stall_the_decision(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """etcd's revision moves on (API objects share it) without registry events: no wait for the watch."""
    registry.join(CTYPE, "a", etcd_client.grant_lease(30))

    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix, catch_up_timeout=2.0))
        try:
            token = _token(fence, "a")
            for i in range(5):
                await asyncio.to_thread(etcd_client.put, f"{key_prefix}/other/{i}", b"x")
                assert await asyncio.wait_for(fence.check(token, 1), 1.5) is None
        finally:
            await fence.stop()

    run(scenario())


def test_concurrent_writes_share_one_read_per_batch(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    registry.join(CTYPE, "a", etcd_client.grant_lease(30))

    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix))
        try:
            token = _token(fence, "a")
            before = fence.reads.reads
            verdicts = await asyncio.gather(*(fence.check(token, i) for i in range(200)))
            assert verdicts == [None] * 200
            assert 1 <= fence.reads.reads - before <= 2  # the first batch, and everybody who came during it
        finally:
            await fence.stop()

    run(scenario())


def test_batched_read_never_serves_a_read_started_before_the_caller() -> None:
    async def scenario() -> None:
        started: list[int] = []
        release: list[asyncio.Event] = []

        async def read() -> int:
            started.append(len(started))
            ev = asyncio.Event()
            release.append(ev)
            await ev.wait()
            return len(started)

        batched: BatchedRead[int] = BatchedRead(read)
        first = asyncio.create_task(batched.get())
        await asyncio.sleep(0)
        while not release:
            await asyncio.sleep(0)
        late = [asyncio.create_task(batched.get()) for _ in range(3)]  # arrive while read 1 runs
        await asyncio.sleep(0)
        release[0].set()
        assert await first == 1
        while len(release) < 2:
            await asyncio.sleep(0)
        release[1].set()
        assert await asyncio.gather(*late) == [2, 2, 2]
        assert batched.reads == 2

    run(scenario())


RANGE = HashRange(0, 100)


def _owner(lease: int = 5, rng: HashRange | None = RANGE, locked: bool = False, epoch: int = 10) -> Ownership:
    return Ownership(CTYPE, "a", lease, rng, locked, epoch)


@pytest.mark.parametrize(
    ("token", "owner", "shard_hash", "reason"),
    [
        (OwnerToken(CTYPE, "a", 5, 10), _owner(), 50, None),
        (OwnerToken(CTYPE, "a", 5, 12), _owner(), 50, None),
        (OwnerToken(CTYPE, "a", 5, 10), None, 50, "NotRegistered"),
        (OwnerToken(CTYPE, "a", 6, 10), _owner(), 50, "LeaseMismatch"),
        (OwnerToken(CTYPE, "a", 5, 10), _owner(locked=True), 50, "Locked"),
        (OwnerToken(CTYPE, "a", 5, 9), _owner(), 50, "StaleEpoch"),
        (OwnerToken(CTYPE, "a", 5, 10), _owner(), 101, "OutOfRange"),
        (OwnerToken(CTYPE, "a", 5, 10), _owner(rng=None), 1, "OutOfRange"),
        (OwnerToken(CTYPE, "a", 5, 10), _owner(rng=None), None, None),
    ],
)
def test_decide(token: OwnerToken, owner: Ownership | None, shard_hash: int | None, reason: str | None) -> None:
    verdict = decide(token, owner, shard_hash)
    assert (verdict.reason if verdict else None) == reason


def test_shard_hash_of_body_cache_and_declaration() -> None:
    owned = {"metadata": {"uid": "pod-1", "ownerReferences": [{"uid": "rs-1", "controller": True}]}}
    orphan = {"metadata": {"uid": "rs-2"}}
    assert shard_hash_of(None, owned, None) == (hash_key("rs-1"), None)
    assert shard_hash_of(None, orphan, None) == (hash_key("rs-2"), None)
    assert shard_hash_of(None, None, owned) == (hash_key("rs-1"), None)  # delete: from the cached object
    assert shard_hash_of(None, {"metadata": {"generateName": "x-"}}, None) == (None, None)
    # A declaration must be one of the object's hashes.
    assert shard_hash_of(hash_key("pod-1"), owned, None) == (hash_key("pod-1"), None)
    h, verdict = shard_hash_of(hash_key("other"), owned, None)
    assert h is None and isinstance(verdict, Verdict) and verdict.reason == "ShardHashMismatch"
    assert shard_hash_of(42, None, None) == (42, None)


def test_fenced_status_is_told_apart_from_an_ordinary_conflict() -> None:
    token = OwnerToken(CTYPE, "a", 0xABC, 7)
    status = fenced_status(token, "StaleEpoch", "epoch 7 is over")
    assert status["code"] == 409 and status["reason"] == "Conflict"
    assert "fenced" in str(status["message"]) and "epoch 7 is over" in str(status["message"])
    assert fence_reason(status) == "StaleEpoch"
    ordinary = {"kind": "Status", "code": 409, "reason": "Conflict", "details": {"name": "x", "kind": "pods"}}
    assert fence_reason(ordinary) is None
    assert OwnerToken.parse(token.user_agent()) == token
    assert token.user_agent().startswith("rangeshard-controller-manager/")
    assert token.user_agent().endswith("(replicaset/a; lease abc; epoch 7)")
    assert OwnerToken.parse("kubectl/v1.32.0 (linux/amd64)") is None
