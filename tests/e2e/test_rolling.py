"""Rolling restarts with ``rejoinGraceSeconds``: stable instance ids take their ranges back, nothing moves.

Managers run with write fencing and a ``RequestResponse`` API audit log (the
``fenced_cluster`` of test_fencing). Each is stopped gracefully (SIGTERM: it
drains and *parks* its records) and a new process with the same
``--instance-prefix`` is started: it must take the same ``hashKey`` back with
no split and no handover. A reader thread checks every registry read during
the restart; the reconcile audit must show no overlap (also between the two
incarnations of one id) and the API server's audit log no stale-owner write.
The grace running out, a crash (never parked) and a duplicate id are covered too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from controller_manager.audit import read_records
from hashing import MAX_HASH, HashRange
from rangeshard.testing import assert_no_stale_writes
from registry import State
from tests.e2e.conftest import Cluster, Load, Manager, dump_logs
from tests.e2e.kube import create_namespace, create_replicaset, pods_by_owner, replicasets, replicasets_converged
from tests.e2e.test_manager import RS_ONLY, all_active
from tests.helpers import wait_until

GRACE = {"rejoinGraceSeconds": 30}
#: The four-manager restart runs under load with a steady write stream: reconciles get a budget a loaded
#: 2-core machine can meet (a write through the fencing proxy took 1-1.6 s at load average ~12), and the
#: lease a TTL that keeps ``reconcileTimeoutSeconds < leaseTTLSeconds / 2``. Nothing here waits for a lease
#: to expire (a graceful stop parks), so the longer TTL costs no time.
LOADED = {"lease_ttl": 6, "reconcile_timeout": 2.5}


def layout(cluster: Cluster) -> dict[str, tuple[int, str]]:
    return {m.instance_id: (m.record.hash_key, m.record.state.value) for m in cluster.snapshot("replicaset")}


def keys(cluster: Cluster) -> dict[str, int]:
    return {i: k for i, (k, _s) in layout(cluster).items()}


@contextmanager
def watching_keys(cluster: Cluster, expected: dict[str, int]) -> Iterator[list[str]]:
    """Read the registry every 50 ms; collect every read whose ids or hashKeys differ from ``expected``."""
    bad: list[str] = []
    reads = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.05):
            seen = keys(cluster)
            reads[0] += 1
            if seen != expected:
                bad.append(repr(seen))

    t = threading.Thread(target=run, name="e2e-registry-reader", daemon=True)
    t.start()
    try:
        yield bad
    finally:
        stop.set()
        t.join(10)
        assert reads[0] > 10, "the registry reader hardly ran"


def start(
    cluster: Cluster,
    name: str,
    incarnation: int = 0,
    *,
    lease_ttl: int = 0,
    reconcile_timeout: float = 0.0,
    **extra: object,
) -> Manager:
    return cluster.start_manager(
        RS_ONLY,
        name=name,
        files=f"{name}.{incarnation}",
        config_extra={**GRACE, **extra},
        lease_ttl=lease_ttl,
        reconcile_timeout=reconcile_timeout,
    )


def busy_upstream_connections(cluster: Cluster) -> float:
    """The proxy's pooled upstream connections still busy (``range_filter_proxy_upstream_connections_busy``)."""
    text = httpx.get(f"{cluster.proxy.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("range_filter_proxy_upstream_connections_busy "):
            return float(line.split()[1])
    raise AssertionError("the proxy's /metrics has no range_filter_proxy_upstream_connections_busy")


def _unconverged(api: Any, ns: str) -> str:
    """The ReplicaSets not converged yet: name, wanted replicas, live pods, status.replicas (for a failure)."""
    pods = pods_by_owner(api, ns)
    rows = []
    for rs in replicasets(api, ns):
        name, want = rs["metadata"]["name"], rs["spec"].get("replicas", 1)
        have = (pods.get(name, 0), (rs.get("status") or {}).get("replicas", 0))
        if have != (want, want):
            rows.append(f"{name}: want {want}, pods {have[0]}, status.replicas {have[1]}")
    return "not converged: " + ("; ".join(rows) or "none")


def test_rolling_restart_of_four_managers_moves_no_key(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "rolling"
    create_namespace(api, ns)
    names = [f"rs{i}" for i in range(16)]
    for n in names:
        create_replicaset(api, ns, n, 1)
    managers = {}
    for i in range(4):
        managers[f"r{i}"] = start(cluster, f"r{i}", **LOADED)
        wait_until(lambda i=i: all_active(cluster, "replicaset", i + 1), 40, f"{i + 1} active")
    wait_until(lambda: replicasets_converged(api, ns), 40, "converged")
    before = keys(cluster)
    assert sorted(before) == [f"r{i}-replicaset" for i in range(4)]
    with Load(cluster, ns, names) as load, watching_keys(cluster, before) as bad:
        wait_until(lambda: load.patches >= 5, 20, "load running")
        for i in range(4):
            name = f"r{i}"
            old = managers[name]
            assert old.terminate() == 0
            assert "parked: range" in old.log.read_text()
            assert layout(cluster)[f"{name}-replicaset"][1] == State.PARKED.value
            new = start(cluster, name, incarnation=1, **LOADED)
            managers[name] = new
            wait_until(lambda: all_active(cluster, "replicaset", 4), 40, f"{name} back and active")
            # Same key back, no split and no handover: nobody was locked, nobody drained or unlocked.
            counts = new.handover("replicaset")
            assert counts.get("self_unlocks", 0) == 0 and counts.get("unlocks", 0) == 0, counts
    assert bad == [], f"{len(bad)} registry read(s) showed other ids or keys, first: {bad[:2]}"
    assert keys(cluster) == before
    for m in managers.values():
        c = m.handover("replicaset")
        assert c.get("drain_waits", 0) == 0 and c.get("unlocks", 0) == 0, (m.name, c)
    try:
        wait_until(lambda: replicasets_converged(api, ns), 40, "converged after the rolling restart")
    except AssertionError as e:  # what did not converge, and the managers' logs (reconciles timing out?)
        raise AssertionError(f"{e}\n{_unconverged(api, ns)}\n{dump_logs(cluster)}") from None
    # A restarted id is active as soon as it takes its record back, before its caches sync: wait until
    # every incarnation whose range holds replicasets has audited its first reconcile.
    idle = cluster.without_objects(ns)
    busy = [m for m in cluster.managers if m.name not in {i.name for i in idle}]
    wait_until(
        lambda: all(m.audit.exists() and read_records([m.audit]) for m in busy),
        40,
        "every manager holding replicasets to audit a reconcile",
    )
    # No overlap: between instances (the audit check) and between the two incarnations of one id.
    assert cluster.overlaps(may_be_idle=idle) == []
    for i in range(4):
        first = read_records([cluster.workdir / f"r{i}.0.audit.jsonl"])
        second = read_records([cluster.workdir / f"r{i}.1.audit.jsonl"])
        if first and second:
            assert max(r.end for r in first) <= min(r.start for r in second), f"r{i}: incarnations overlapped"
    assert assert_no_stale_writes(cluster.workdir / "apiserver-audit.jsonl") > 0
    # Every pass-through answer was closed, also those whose manager went away mid-answer (stopped or
    # timed out): a close cut short left its upstream connection busy for good, and at 200 the proxy hung.
    wait_until(lambda: busy_upstream_connections(cluster) == 0, 30, "the proxy's upstream connections released")
    cluster.assert_no_tracebacks()


def test_the_grace_runs_out_and_a_crash_is_not_parked(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "graceout"
    create_namespace(api, ns)
    for i in range(8):
        create_replicaset(api, ns, f"rs{i}", 1)
    a = start(cluster, "a", rejoinGraceSeconds=3)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "a active")
    b = start(cluster, "b", rejoinGraceSeconds=3)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "b active")
    c = start(cluster, "c", rejoinGraceSeconds=3)
    wait_until(lambda: all_active(cluster, "replicaset", 3), 40, "c active")
    # A graceful stop parks; nobody rejoins: after the grace the record is gone and the range absorbed.
    assert b.terminate() == 0
    assert layout(cluster)["b-replicaset"][1] == "parked"
    t0 = time.monotonic()
    wait_until(lambda: "b-replicaset" not in layout(cluster), 20, "the parked record to expire")
    assert time.monotonic() - t0 < 10
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "two left, active")
    # A crash is not parked: the record stays active until its lease expires, then it is taken over.
    c.kill()
    snap = layout(cluster)
    if "c-replicaset" in snap:
        assert snap["c-replicaset"][1] != "parked"
    wait_until(lambda: "c-replicaset" not in layout(cluster), 20, "the crashed record to expire")
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "a alone")
    only = cluster.snapshot("replicaset").members[0]
    assert only.instance_id == "a-replicaset" and only.range == HashRange(0, MAX_HASH)
    wait_until(lambda: replicasets_converged(api, ns), 40, "converged by the survivor")
    assert a.alive


def test_a_second_process_with_a_live_instance_id_exits_1(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    a = start(cluster, "dup")
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "dup active")
    twin = start(cluster, "dup", incarnation=1)
    assert twin.proc.wait(30) == 1
    text = twin.log.read_text()
    assert "another live process is registered with this instance id" in text, text[-2000:]
    assert a.alive and all_active(cluster, "replicaset", 1)
