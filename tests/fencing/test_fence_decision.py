"""Write fencing decisions on a real etcd registry: locked, wrong lease, old epoch, out of range, parked, stale view.

The registry is changed with the real guarded transactions (``registry.Registry``);
the fence reads it through the real membership watch and linearizable reads.
The only stand-in is a gate on the fence's own watch hook (our interface), to
hold its view behind etcd on purpose.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from hashing import MAX_HASH, HashRange, ShardBy, hash_key
from range_filter_proxy.fencing import (
    BatchedRead,
    FenceSettings,
    Verdict,
    WriteFence,
    decide,
    shard_hash_of,
    write_keys,
)
from rangeshard.core.errors import RegistryUnavailable
from rangeshard.core.etcd import KV, EtcdClient, EtcdConfig
from rangeshard.core.kubeapi import ApiError
from rangeshard.core.ownertoken import OwnerToken, fence_reason, fenced_status
from rangeshard.core.process import free_port
from registry import Registry
from registry.epochs import Ownership
from tests.fencing.test_epochs import PREFIX, FakeEtcd

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


class GatedFence(WriteFence):
    """A fence whose own watch hook waits for ``gate`` (our interface): its view is held behind etcd on purpose."""

    def __init__(self, gate: threading.Event, settings: FenceSettings) -> None:
        super().__init__(settings)
        self.gate = gate

    def _observe(self, revision: int, kvs: Mapping[str, KV], relisted: bool) -> None:
        self.gate.wait(60)
        super()._observe(revision, kvs, relisted)


def _token(fence: WriteFence, instance: str, lease: int | None = None, epoch: int | None = None) -> OwnerToken:
    owner = fence.tracker.get(CTYPE, instance)
    assert owner is not None
    return OwnerToken(
        CTYPE, instance, owner.lease_id if lease is None else lease, owner.epoch if epoch is None else epoch
    )


async def _current_token(fence: WriteFence, instance: str) -> OwnerToken:
    """``instance``'s token as of a registry view at least as new as etcd now.

    Any decision waits for such a view (here one for an unregistered writer), so the token is not read
    from a view that predates the last registry change, as a manager's token never is.
    """
    await fence.check(OwnerToken(CTYPE, "nobody", 1, 0), None)
    return _token(fence, instance)


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


def test_a_parked_range_is_written_by_nobody(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """b parks as ``ShardInstance.stop`` does with ``rejoinGraceSeconds``: its range is owned by nobody (issue 24).

    A write for a key of the parked range is refused from another instance (``OutOfRange``: the parked
    range is nobody's, not even the neighbour's or a newcomer's) and from b's own last token
    (``LeaseMismatch``: the record lives on the grace lease now), and a token on the grace lease itself is
    ``Parked``; b's successor, rejoining with the same instance id, writes there again.
    """
    lease_a = etcd_client.grant_lease(30)
    registry.join(CTYPE, "a", lease_a)
    lease_b = etcd_client.grant_lease(30)
    b = registry.join(CTYPE, "b", lease_b)
    registry.unlock(CTYPE, "b", "a")
    assert b.range is not None
    key = b.range.lo  # a shard hash in b's range

    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix))
        try:
            token_a, token_b = _token(fence, "a"), _token(fence, "b")
            assert await fence.check(token_b, key) is None

            # ShardInstance.stop with a grace: a grace lease, park on it, then revoke the instance's lease.
            grace = await asyncio.to_thread(etcd_client.grant_lease, 30)
            await asyncio.to_thread(registry.park, CTYPE, "b", lease_b, grace, 30.0)
            await asyncio.to_thread(etcd_client.revoke_lease, lease_b)

            neighbour = await fence.check(token_a, key)
            assert neighbour is not None and neighbour.reason == "OutOfRange", neighbour
            assert await fence.check(token_a, MAX_HASH) is None  # a's own range is unchanged
            stale = await fence.check(token_b, key)
            assert stale is not None and stale.reason == "LeaseMismatch", stale
            assert (await fence.check(token_b, None)) == stale  # with no shard hash too
            # Even a token naming the parked record's own (grace) lease and current epoch is refused:
            # no process holds that lease, and the record says nobody writes.
            parked = await fence.check(_token(fence, "b"), key)
            assert parked is not None and parked.reason == "Parked", parked
            assert "parked" in parked.why

            # A newcomer splits a's range, never the parked one: the parked key is not its either.
            lease_c = await asyncio.to_thread(etcd_client.grant_lease, 30)
            c = await asyncio.to_thread(registry.join, CTYPE, "c", lease_c)
            await asyncio.to_thread(registry.unlock, CTYPE, "c", "a")
            assert c.range is not None and not c.range.contains(key)
            newcomer = await fence.check(await _current_token(fence, "c"), key)
            assert newcomer is not None and newcomer.reason == "OutOfRange", newcomer
            later = await fence.check(await _current_token(fence, "a"), key)
            assert later is not None and later.reason == "OutOfRange", later

            # b's successor (same instance id, new lease) takes the range back; b's old token stays refused.
            lease_b2 = await asyncio.to_thread(etcd_client.grant_lease, 30)
            back = await asyncio.to_thread(registry.join, CTYPE, "b", lease_b2)
            assert back.range == b.range
            successor = await _current_token(fence, "b")
            assert successor.lease_id == lease_b2
            assert await fence.check(successor, key) is None
            old = await fence.check(token_b, key)
            assert old is not None and old.reason == "LeaseMismatch", old
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

    async def scenario() -> None:
        fence = GatedFence(gate, FenceSettings(etcd_config, key_prefix))
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


class _HandDrivenRead:
    """A blocking read driven by hand: read ``n`` starts, waits for ``release(n)``, returns ``n`` (1-based)."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self.most_running = 0
        self.threads: set[str] = set()
        self._cond = threading.Condition()
        self._released: set[int] = set()

    def __call__(self) -> int:
        with self._cond:
            self.started += 1
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.threads.add(threading.current_thread().name)
            n = self.started
            self._cond.notify_all()
            # Bounded: a test that never releases fails its own wait, and this thread ends.
            self._cond.wait_for(lambda: n in self._released, timeout=10)
            self.running -= 1
        return n

    async def until_started(self, n: int) -> None:
        """Wait (at most 2 s: a broken batcher fails here, never hangs) until read ``n`` has started."""

        def wait() -> bool:
            with self._cond:
                return self._cond.wait_for(lambda: self.started >= n, timeout=2)

        if not await asyncio.to_thread(wait):
            raise AssertionError(f"read {n} never started ({self.started} started)")

    def release(self, n: int) -> None:
        with self._cond:
            self._released.add(n)
            self._cond.notify_all()


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # let ready tasks run (event-loop turns, not time)


async def _first_read_running() -> tuple[_HandDrivenRead, BatchedRead[int], asyncio.Task[int]]:
    """A batcher over a hand-driven read, and a first caller whose read has started (and waits for release)."""
    read = _HandDrivenRead()
    batched: BatchedRead[int] = BatchedRead(read)
    first = asyncio.create_task(batched.get())
    await read.until_started(1)
    return read, batched, first


async def _settled(*tasks: asyncio.Task[Any]) -> None:
    """Wait (at most 2 s) until ``tasks`` are done."""
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)


def test_batched_read_never_serves_a_read_started_before_the_caller() -> None:
    """Each caller gets a read that started after it called; callers arriving together share one read."""

    async def scenario() -> None:
        read, batched, first = await _first_read_running()
        try:
            late = [asyncio.create_task(batched.get()) for _ in range(3)]  # arrive while read 1 runs
            await _turns()
            read.release(1)
            assert await asyncio.wait_for(first, 2) == 1
            await read.until_started(2)  # started for the late callers as soon as read 1 ended
            served_early = [t.result() for t in late if t.done() and not t.exception()]
            assert served_early == [], f"callers that arrived during read 1 got its result: {served_early}"
            later = asyncio.create_task(batched.get())  # arrives while read 2 runs: read 3, not 2
            await _turns()
            assert read.started == 2, "a read started while another one runs"
            read.release(2)
            assert await asyncio.wait_for(asyncio.gather(*late), 2) == [2, 2, 2]
            await read.until_started(3)
            assert not later.done(), "a caller that arrived during read 2 got its result"
            read.release(3)
            assert await asyncio.wait_for(later, 2) == 3
            assert batched.reads == 3 and read.started == 3 and read.most_running == 1
            # Every read ran on the batcher's own thread, never on the event loop's.
            assert read.threads == {"fencing-read"}
        finally:
            batched.close(timeout=2)

    run(scenario())


def test_batched_read_failure_reaches_its_batch_only() -> None:
    async def scenario() -> None:
        calls = 0
        gate = threading.Event()

        def read() -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                gate.wait(10)
                raise ConnectionError("etcd down")
            return calls

        batched: BatchedRead[int] = BatchedRead(read)
        try:
            first = asyncio.create_task(batched.get())
            while calls == 0:
                await asyncio.sleep(0.001)
            late = asyncio.create_task(batched.get())
            await _turns()
            gate.set()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(first, 2)
            assert await asyncio.wait_for(late, 2) == 2  # the next read, not the failed one
        finally:
            batched.close(timeout=2)

    run(scenario())


def test_a_cancelled_caller_does_not_disturb_its_batch() -> None:
    """A write that gives up (its client went away) leaves the others of its batch their answer."""

    async def scenario() -> None:
        read, batched, first = await _first_read_running()
        try:
            quitter = asyncio.create_task(batched.get())
            stayer = asyncio.create_task(batched.get())
            await _turns()
            quitter.cancel()
            read.release(1)
            assert await asyncio.wait_for(first, 2) == 1
            await read.until_started(2)
            read.release(2)
            assert await asyncio.wait_for(stayer, 2) == 2
            await _settled(quitter)
            assert quitter.cancelled()
        finally:
            batched.close(timeout=2)

    run(scenario())


def test_closing_the_batcher_fails_waiting_and_later_callers_with_503_material() -> None:
    """After ``close`` (proxy shutdown) nobody waits forever: waiting and later callers get ``RegistryUnavailable``."""

    async def scenario() -> None:
        read, batched, first = await _first_read_running()
        waiting = asyncio.create_task(batched.get())
        await _turns()
        batched.close()  # while read 1 runs: it is delivered, nothing more is read
        read.release(1)
        await asyncio.wait_for(asyncio.to_thread(batched.close, 2), 3)
        assert await asyncio.wait_for(first, 2) == 1  # the read in progress finished and was delivered
        with pytest.raises(RegistryUnavailable, match="shutting down"):
            await asyncio.wait_for(waiting, 2)
        with pytest.raises(RegistryUnavailable):
            await batched.get()
        assert read.started == 1

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
    if verdict is not None:
        # The sentence names the writer and what is wrong (it reaches the client in the 409 Status).
        assert isinstance(verdict.why, str) and token.owner in verdict.why
        expected = {
            "NotRegistered": "has no registry record",
            "LeaseMismatch": f"now holds lease {owner.lease_id:x}, not {token.lease_id:x}" if owner else "",
            "Locked": "is locked",
            "StaleEpoch": f"epoch {token.epoch} is over",
            "OutOfRange": "is outside the range",
        }[verdict.reason]
        assert expected in verdict.why, verdict.why


def test_only_a_controller_owner_reference_with_a_string_uid_counts() -> None:
    own = "11111111-0000-4000-8000-000000000000"
    other = "44444444-0000-4000-8000-000000000000"

    def pod(refs: list[object], uid: object = own) -> dict[str, Any]:
        return {"metadata": {"uid": uid, "ownerReferences": refs}}

    not_controller = {"apiVersion": "v1", "kind": "X", "name": "x", "uid": other}
    assert shard_hash_of(None, pod([not_controller]), None) == (hash_key(own), None)
    assert shard_hash_of(None, pod([{**not_controller, "controller": False}]), None) == (hash_key(own), None)
    assert shard_hash_of(None, pod([{**not_controller, "controller": True, "uid": 7}]), None) == (hash_key(own), None)
    assert shard_hash_of(None, pod(["not a mapping", {**not_controller, "controller": True}]), None) == (
        hash_key(other),
        None,
    )
    # A uid that is not a non-empty string is no uid.
    assert shard_hash_of(None, pod([], uid=12345), None) == (None, None)
    assert shard_hash_of(None, pod([], uid=""), None) == (None, None)


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


def _uid_in(rng: HashRange, tag: str) -> str:
    """A uid whose hash falls in ``rng``."""
    for i in range(10_000):
        uid = f"{tag}-{i:04d}-0000-4000-8000-000000000000"
        if rng.contains(hash_key(uid)):
            return uid
    raise AssertionError(f"no uid hashes into {rng}")


def _pod(uid: str, owner_uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": uid}
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": True}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def test_undeclared_shard_hash_prefers_the_request_body_over_the_cache(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """Writes without ``X-Rangeshard-Shard-Hash`` (external controllers, kubectl adoption): body first, then cache.

    Two instances split the space; every object below has its own uid in
    ``a``'s half and its (old or new) controller in ``b``'s, so the verdict
    says which hash was checked.
    """
    registry.join(CTYPE, "a", etcd_client.grant_lease(30))
    registry.join(CTYPE, "b", etcd_client.grant_lease(30))
    registry.unlock(CTYPE, "b", "a")  # the handover is over: both own their halves
    snap = registry.snapshot(CTYPE)
    ranges = {m.instance_id: m.range for m in snap}
    assert ranges["a"] is not None and ranges["b"] is not None
    own = _uid_in(ranges["a"], "pod")
    owner = _uid_in(ranges["b"], "rs")
    orphan_before, adopted, owned_before, orphaned = _pod(own), _pod(own, owner), _pod(own, owner), _pod(own)
    cases = [
        # (what, declared, body, cached, hash that must be checked, instance it belongs to)
        ("adoption: the update sets a controller ownerReference", adopted, orphan_before, hash_key(owner), "b"),
        ("orphaning: the update removes it", orphaned, owned_before, hash_key(own), "a"),
        ("create of an owned object (nothing cached)", adopted, None, hash_key(owner), "b"),
        ("create of an unowned object (nothing cached)", orphaned, None, hash_key(own), "a"),
        ("delete (no body): the cached object's controller", None, owned_before, hash_key(owner), "b"),
        ("delete (no body) of an unowned cached object", None, orphan_before, hash_key(own), "a"),
        (
            "a patch body naming no uid: the cache decides",
            {"metadata": {"labels": {"x": "y"}}},
            owned_before,
            hash_key(owner),
            "b",
        ),
    ]

    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix))
        try:
            for what, body, cached, expected_hash, holder in cases:
                shard_hash, mismatch = shard_hash_of(None, body, cached)
                assert mismatch is None, what
                assert shard_hash == expected_hash, f"{what}: checked {shard_hash:#x}, expected {expected_hash:#x}"
                other = "a" if holder == "b" else "b"
                assert await fence.check(_token(fence, holder), shard_hash) is None, what
                refused = await fence.check(_token(fence, other), shard_hash)
                assert refused is not None and refused.reason == "OutOfRange", what
        finally:
            await fence.stop()

    run(scenario())


def test_declared_shard_hash_must_be_one_of_the_body_or_cache_hashes() -> None:
    own = "11111111-0000-4000-8000-000000000000"
    owner = "22222222-0000-4000-8000-000000000000"
    stranger = "33333333-0000-4000-8000-000000000000"
    body, cached = _pod(own, owner), _pod(own)
    assert shard_hash_of(hash_key(owner), body, cached) == (hash_key(owner), None)
    assert shard_hash_of(hash_key(own), body, cached) == (hash_key(own), None)  # the object's own uid
    h, verdict = shard_hash_of(hash_key(stranger), body, cached)
    assert h is None and verdict is not None and verdict.reason == "ShardHashMismatch"
    assert verdict.why == (
        f"declared shard hash {hash_key(stranger):#x} is neither the object's uid hash nor its controller's"
    )
    assert shard_hash_of(hash_key(stranger), None, None) == (hash_key(stranger), None)  # nothing to compare with
    assert shard_hash_of(None, None, None) == (None, None)


def test_a_registry_read_failure_is_a_503_naming_write_fencing() -> None:
    """etcd unreachable: the write is neither passed nor fenced but answered 503 ServiceUnavailable."""
    dead = EtcdConfig.from_urls(f"http://127.0.0.1:{free_port()}", timeout=0.5)

    async def scenario() -> None:
        fence = WriteFence(FenceSettings(dead, "/nowhere"))
        await fence.start()
        try:
            with pytest.raises(ApiError) as caught:
                await asyncio.wait_for(fence.check(OwnerToken(CTYPE, "a", 1, 1), 5), 20)
            e = caught.value
            assert (e.code, e.reason) == (503, "ServiceUnavailable")
            assert e.message.startswith("write fencing: cannot read the registry: ")
        finally:
            await fence.stop()

    run(scenario())


def test_a_view_that_does_not_catch_up_is_a_503_after_the_catch_up_timeout(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    lease = etcd_client.grant_lease(30)
    registry.join(CTYPE, "a", lease)
    gate = threading.Event()
    gate.set()

    async def scenario() -> None:
        fence = GatedFence(gate, FenceSettings(etcd_config, key_prefix, catch_up_timeout=1.5))
        await fence.start()
        await asyncio.to_thread(fence.tracker.observed.wait, 10)
        try:
            token = _token(fence, "a")
            gate.clear()
            await asyncio.to_thread(etcd_client.revoke_lease, lease)
            t0 = time.monotonic()
            with pytest.raises(ApiError) as caught:
                await asyncio.wait_for(fence.check(token, 7), 10)
            took = time.monotonic() - t0
            e = caught.value
            assert (e.code, e.reason) == (503, "ServiceUnavailable")
            assert "did not reach revision" in e.message and "within 1.5s; retry" in e.message
            assert 1.4 <= took < 4.0, took  # the catch-up timeout, not more, not less
        finally:
            gate.set()
            await fence.stop()

    run(scenario())


def test_a_waiting_decision_is_woken_by_the_view_not_by_its_timeout(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """The watch catching up wakes the waiting decision at once (a long catch-up timeout never elapses)."""
    lease = etcd_client.grant_lease(30)
    registry.join(CTYPE, "a", lease)
    gate = threading.Event()
    gate.set()

    async def scenario() -> None:
        fence = GatedFence(gate, FenceSettings(etcd_config, key_prefix, catch_up_timeout=30.0))
        await fence.start()
        await asyncio.to_thread(fence.tracker.observed.wait, 10)
        try:
            token = _token(fence, "a")
            gate.clear()
            await asyncio.to_thread(etcd_client.revoke_lease, lease)
            pending = asyncio.create_task(fence.check(token, 7))
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            assert not done
            gate.set()
            t0 = time.monotonic()
            verdict = await asyncio.wait_for(pending, 10)
            assert time.monotonic() - t0 < 3.0, "the decision waited for its timeout instead of the view"
            assert verdict is not None and verdict.reason == "NotRegistered"
        finally:
            gate.set()
            await fence.stop()

    run(scenario())


def test_every_batched_registry_read_is_reported_to_on_read(etcd_config: EtcdConfig, key_prefix: str) -> None:
    """``on_read`` (the proxy's ``range_filter_proxy_fencing_registry_reads_total``) counts each read."""
    reads: list[int] = []

    async def scenario() -> None:
        fence = WriteFence(FenceSettings(etcd_config, key_prefix), on_read=lambda: reads.append(1))
        await fence.start()
        await asyncio.to_thread(fence.tracker.observed.wait, 10)
        try:
            await fence.fresh_view()
            await fence.fresh_view()
            assert len(reads) == fence.reads.reads == 2
        finally:
            await fence.stop()

    run(scenario())


def test_the_fence_passes_relists_on_to_its_tracker() -> None:
    """A relist seen by the fence's watch gives lower-bound epochs (not the relist's revision)."""
    etcd = FakeEtcd()
    created = etcd.put("a", MAX_HASH, lease=1)
    fence = WriteFence(FenceSettings(EtcdConfig.from_urls("http://127.0.0.1:1"), PREFIX))
    fence._observe(etcd.revision, dict(etcd.kvs), True)
    etcd.put("b", MAX_HASH // 2, lease=2)  # missed by the watch
    etcd.bump()
    fence._observe(etcd.revision, dict(etcd.kvs), True)
    a = fence.tracker.get("replicaset", "a")
    assert a is not None and a.exact is False and a.epoch < etcd.revision and a.epoch >= created


def test_a_decision_before_the_first_registry_view_waits_for_it(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    """A write arriving right after start, before the watch delivered anything, waits (no instant 503)."""
    registry.join(CTYPE, "a", etcd_client.grant_lease(30))
    gate = threading.Event()  # closed: the first view is held back

    async def scenario() -> None:
        fence = GatedFence(gate, FenceSettings(etcd_config, key_prefix, catch_up_timeout=20.0))
        await fence.start()
        try:
            member = await asyncio.to_thread(registry.snapshot(CTYPE).get, "a")
            assert member is not None
            token = OwnerToken(CTYPE, "a", member.lease_id, member.mod_revision)
            pending = asyncio.create_task(fence.check(token, 7))
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            assert not done, "decided (or refused) before the registry view existed"
            gate.set()
            assert await asyncio.wait_for(pending, 10) is None
        finally:
            gate.set()
            await fence.stop()

    run(scenario())


def _meta(uid: str | None = None, owner: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if uid:
        meta["uid"] = uid
    if namespace:
        meta["namespace"] = namespace
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    return {"metadata": meta}


def test_write_keys_follow_the_declared_rule() -> None:
    owned = _meta("rs-1", "dep-1", "ns-a")
    # by uid: an owned object by its own uid (the fix for kube-controller-manager's ReplicaSet status writes)
    assert write_keys(ShardBy.UID, None, owned, None) == ((hash_key("rs-1"),), None)
    assert write_keys(ShardBy.OWNER, None, owned, None) == ((hash_key("dep-1"),), None)
    assert write_keys(ShardBy.NAMESPACE, None, owned, None) == ((hash_key("ns-a"),), None)
    # by namespace: a body without one takes the request path's
    assert write_keys(ShardBy.NAMESPACE, None, _meta(), None, "from-url") == ((hash_key("from-url"),), None)
    # by owner, an orphan is every range's: no key; by uid, a create has none yet
    assert write_keys(ShardBy.OWNER, None, _meta("p1"), None) == ((), None)
    assert write_keys(ShardBy.UID, None, {"metadata": {"generateName": "x-"}}, None) == ((), None)
    # the body and the cached object: both keys must be owned (no moving an object in from another range)
    moved = write_keys(ShardBy.OWNER, None, _meta("p1", "rs-new"), _meta("p1", "rs-old"))
    assert moved == ((hash_key("rs-new"), hash_key("rs-old")), None)
    # adoption of an orphan and release by its owner: one key each
    assert write_keys(ShardBy.OWNER, None, _meta("p1", "rs-new"), _meta("p1")) == ((hash_key("rs-new"),), None)
    assert write_keys(ShardBy.OWNER, None, _meta("p1"), _meta("p1", "rs-old")) == ((hash_key("rs-old"),), None)
    # a delete or JSON patch: the cached object alone; a JSON patch body (a list) says nothing
    assert write_keys(ShardBy.UID, None, [{"op": "add"}], owned) == ((hash_key("rs-1"),), None)
    # a declaration must be the object's key by the rule, not any of its hashes
    assert write_keys(ShardBy.UID, hash_key("rs-1"), owned, None) == ((hash_key("rs-1"),), None)
    keys, verdict = write_keys(ShardBy.UID, hash_key("dep-1"), owned, None)
    assert keys == () and verdict is not None and verdict.reason == "ShardHashMismatch"
    assert "by uid" in verdict.why
    assert write_keys(ShardBy.UID, 42, None, None) == ((42,), None)  # nothing to compare with: the declaration
    # no rule declared: the rule of older managers (controller owner, else own uid), unchanged
    assert write_keys(None, None, owned, None) == ((hash_key("dep-1"),), None)
    assert write_keys(None, hash_key("rs-1"), owned, None) == ((hash_key("rs-1"),), None)


def test_decide_checks_every_key() -> None:
    token = OwnerToken(CTYPE, "a", 1, 5)
    owner = Ownership(CTYPE, "a", lease_id=1, range=HashRange(0, MAX_HASH // 2), locked=False, epoch=5)
    assert decide(token, owner, (1, 2)) is None
    verdict = decide(token, owner, (1, MAX_HASH))
    assert verdict is not None and verdict.reason == "OutOfRange"
    assert decide(token, owner, ()) is None and decide(token, owner, None) is None


def test_a_key_that_left_in_a_handover_is_said_to_have_left() -> None:
    """The giver's new token, a write of what it listed before its range shrank: told apart in the message."""
    token = OwnerToken(CTYPE, "a", 1, 9)
    half = MAX_HASH // 2
    now = Ownership(CTYPE, "a", 1, HashRange(half + 1, MAX_HASH), False, 9, previous_range=HashRange(0, MAX_HASH))
    moved = decide(token, now, 5)
    assert moved is not None and moved.reason == "OutOfRange" and "left in a handover at revision 9" in moved.why
    assert decide(token, now, MAX_HASH) is None
    never = Ownership(CTYPE, "a", 1, HashRange(half + 1, MAX_HASH), False, 9)
    verdict = decide(token, never, 5)
    assert verdict is not None and verdict.reason == "OutOfRange" and "handover" not in verdict.why


def test_the_tracker_remembers_the_previous_range_of_the_same_lease(
    registry: Registry, etcd_client: EtcdClient, etcd_config: EtcdConfig, key_prefix: str
) -> None:
    async def scenario() -> None:
        fence = await _started(FenceSettings(etcd_config, key_prefix))
        try:
            lease_a = etcd_client.grant_lease(30)
            registry.join(CTYPE, "a", lease_a)
            await fence.check(OwnerToken(CTYPE, "nobody", 1, 0), None)
            first = fence.tracker.get(CTYPE, "a")
            assert first is not None and first.range == HashRange(0, MAX_HASH)
            registry.join(CTYPE, "b", etcd_client.grant_lease(30))  # takes the lower half
            await fence.check(OwnerToken(CTYPE, "nobody", 1, 0), None)
            after = fence.tracker.get(CTYPE, "a")
            assert after is not None and after.previous_range == HashRange(0, MAX_HASH)
            assert after.range is not None and after.range.lo > 0
            verdict = decide(OwnerToken(CTYPE, "a", lease_a, after.epoch), after, 0)
            assert verdict is not None and "left in a handover" in verdict.why
        finally:
            await fence.stop()

    run(scenario())
