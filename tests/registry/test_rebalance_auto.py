"""`rangeshard rebalance auto` as a loop (not --once) against a real etcd: acts once, then holds still, stops on SIGTERM.

The managers are played by a thread of this test through our own Registry:
it unlocks every receiver (as a drained giver would), marks it active, and
republishes each instance's workload and histogram for its current range, so
the auto loop sees the effect of its own plan.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hashing import MAX_HASH
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import popen
from registry import Registry, State
from registry.histogram import gap_histogram
from registry.rebalance import max_over_mean, owned
from tests.helpers import wait_until

CT = "replicaset"


class PlayedManagers:
    """Unlock receivers, mark them active, publish workloads: what the real managers do, in one thread."""

    def __init__(self, registry: Registry, objects: list[int], leases: dict[str, int]) -> None:
        self.registry = registry
        self.objects = objects
        self.leases = leases
        self.unlocks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="played-managers", daemon=True)

    def publish(self) -> None:
        snap = self.registry.snapshot(CT)
        for m in owned(snap):
            if m.record.is_locked and m.record.giver:
                self.registry.unlock(CT, m.instance_id, m.record.giver)
                self.unlocks += 1
            assert m.range is not None
            hist = gap_histogram(self.objects, m.range)
            self.registry.heartbeat(
                CT,
                m.instance_id,
                self.leases[m.instance_id],
                workload_num=sum(hist["objects"]),
                state=State.ACTIVE,
                histogram=hist,
            )

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.publish()
            except RangeshardError:
                continue  # lost a race with the auto loop's move: look again

    def __enter__(self) -> PlayedManagers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def leases(etcd_client: EtcdClient) -> Iterator[Callable[[], int]]:
    granted: list[int] = []

    def grant() -> int:
        granted.append(etcd_client.grant_lease(300))
        return granted[-1]

    yield grant
    for lease in granted:
        etcd_client.revoke_lease(lease)


def test_auto_loop_applies_once_then_holds_and_stops_on_sigterm(
    etcd_server: EtcdServer,
    etcd_client: EtcdClient,
    key_prefix: str,
    leases: Callable[[], int],
    tmp_path: Path,
) -> None:
    registry = Registry(etcd_client, key_prefix)
    ids = {name: leases() for name in ("a", "b", "c")}
    for name, lease in ids.items():
        registry.join(CT, name, lease)
    # Skewed: almost every object in the first quarter of the space.
    objects = [MAX_HASH // 4 * i // 200 for i in range(1, 200)] + [MAX_HASH // 2 + i for i in range(10)]
    played = PlayedManagers(registry, objects, ids)
    played.publish()
    played.publish()  # second pass: everyone unlocked and active with a histogram
    before = max_over_mean([m.record.workload_num for m in owned(registry.snapshot(CT))])
    assert before > 1.5
    log = tmp_path / "auto.log"
    with played, open(log, "w") as out:
        proc = popen(
            [
                *(sys.executable, "-m", "rangeshard.cli.main", "rebalance", "auto", "--type", CT),
                *("--interval", "0.2", "--cooldown", "0", "--threshold", "1.2"),
                *("--etcd", etcd_server.url, "--prefix", key_prefix),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: "plan applied" in log.read_text(), 60, "the auto loop to apply a plan")
            # Then it keeps checking without acting again: balanced (or disarmed), never a second plan.
            wait_until(
                lambda: log.read_text().split("plan applied")[1].count(": balanced") >= 2,
                30,
                "two more checks finding the space balanced",
            )
            assert log.read_text().count("plan applied") == 1
            after = max_over_mean([m.record.workload_num for m in owned(registry.snapshot(CT))])
            assert after <= 1.2 < before
            assert played.unlocks >= 1  # the moves went through locked receivers
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
    assert rc == 0, log.read_text()
    assert "Traceback" not in log.read_text()
