"""A built-in controller that stops working without exiting is named, then restarted (issue 38, items 3 and 4).

Real processes: etcd, the local API server, a proxy with write fencing (so it
watches the registry and measures progress) and controller managers running
the built-in ReplicaSet controller. A manager's reconciles are made to hang
with the ``reconcileHoldFile`` fault injection (each held reconcile ends at
its deadline, so every reconcile of that manager times out while the file
exists); an informer is silenced by a TCP relay that holds every byte.

* Without a bound (``watchdog.exitAfterSeconds: 0``) the proxy's metrics name
  the held instance as stuck once its oldest unanswered change is older than
  ``stuckAfterSeconds``, count its unanswered objects exactly, and clear when
  the hold ends; the manager's ``/readyz`` names the stuck controller meanwhile.
* With a bound, the manager leaves the registry and exits 1; its neighbour
  takes the range and handles the objects.
* An informer whose open watch is silent makes the manager not ready, and
  ready again when bytes flow.

No stale owner writes through any of it (the API server's audit log), and no
two instances reconcile one key at once (the reconcile audit).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from hashing import hash_key
from tests.e2e.conftest import Cluster, Manager, dump_logs
from tests.e2e.kube import create_namespace, create_replicaset, replicasets, replicasets_converged, scale_replicaset
from tests.helpers import wait_until
from tests.relay import TcpRelay

STUCK_AFTER = 5
RS = {"replicaset": {"workers": 2}}


def _readyz(m: Manager) -> tuple[int, str]:
    try:
        resp = httpx.get(m.metrics_url() + "/readyz", timeout=5)
    except httpx.HTTPError as e:
        return 0, str(e)
    return resp.status_code, resp.text


def _answered(api: Any, ns: str) -> bool:
    """Every ReplicaSet's change answered: ``status.observedGeneration`` has reached ``metadata.generation``."""
    items = replicasets(api, ns)
    return bool(items) and all(
        (rs.get("status") or {}).get("observedGeneration") == rs["metadata"]["generation"] for rs in items
    )


def _create_until(cluster: Cluster, ns: str, instances: list[str], per: int = 3) -> dict[str, list[str]]:
    snap = cluster.snapshot("replicaset")
    owned: dict[str, list[str]] = {i: [] for i in instances}
    n = 0
    while min(len(v) for v in owned.values()) < per:
        name = f"rs{n}"
        create_replicaset(cluster.api, ns, name, 0)
        n += 1
        assert n < 200, "the ranges never held enough objects"
        uid = next(rs["metadata"]["uid"] for rs in replicasets(cluster.api, ns) if rs["metadata"]["name"] == name)
        owner = snap.owner_of(hash_key(uid))
        assert owner is not None
        owned[owner.instance_id].append(name)
    return owned


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("replicaset")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _no_stale_owner_writes(cluster: Cluster) -> None:
    cluster.assert_no_stale_owner_writes()


def test_a_hanging_reconcile_is_named_stuck_and_clears(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "stuck"
    create_namespace(api, ns)
    extra = {"stuckAfterSeconds": STUCK_AFTER, "watchdog": {"exitAfterSeconds": 0}}
    held = cluster.start_manager(RS, hold=True, config_extra=extra)
    wait_until(lambda: _active(cluster, 1), 60, "the first instance active")
    other = cluster.start_manager(RS, config_extra=extra)
    wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    held_id, other_id = f"{held.name}-replicaset", f"{other.name}-replicaset"
    owned = _create_until(cluster, ns, [held_id, other_id])
    wait_until(lambda: _answered(api, ns), 60, "every ReplicaSet answered")

    def progress() -> dict[str, Any]:
        return cluster.progress("replicaset")

    wait_until(
        lambda: all(p.measurable and p.unreconciled == 0 for p in progress().values()) and len(progress()) == 2,
        30,
        "both instances measured, nothing unanswered",
    )
    assert held.hold_file is not None
    held.hold_file.touch()
    changed = time.monotonic()
    for names in owned.values():
        for name in names:
            scale_replicaset(api, ns, name, 1)  # a spec change: generation 2

    stuck = wait_until(lambda: progress()[held_id].stuck, STUCK_AFTER + 30, "the held instance named stuck")
    took = time.monotonic() - changed
    assert stuck and STUCK_AFTER <= took < STUCK_AFTER + 15, took
    mine = progress()[held_id]
    assert mine.unreconciled == len(owned[held_id]), (mine, owned)
    assert mine.oldest_seconds is not None and mine.oldest_seconds > STUCK_AFTER
    # The neighbour answers its own objects: not stuck, nothing waiting.
    wait_until(lambda: progress()[other_id].unreconciled == 0, 30, "the neighbour's objects answered")
    assert not progress()[other_id].stuck
    # The held manager's own watchdog makes it not ready, naming the controller.
    _, text = wait_until(lambda: (r := _readyz(held))[0] == 503 and "replicaset: stuck:" in r[1] and r, 30, "503")
    assert "reconciles in a row outlived their timeout" in text, text
    assert held.metric("rangeshard_controller_stuck", controller="replicaset") == 1.0
    assert _readyz(other)[0] == 200
    assert held.alive, "exitAfterSeconds 0: the manager stays"

    held.hold_file.unlink()
    wait_until(
        lambda: progress()[held_id].unreconciled == 0 and not progress()[held_id].stuck,
        60,
        "the held instance's objects answered after the hold",
    )
    wait_until(lambda: _answered(api, ns), 30, "every ReplicaSet answered")
    wait_until(lambda: _readyz(held)[0] == 200, 30, "the held manager ready again")
    assert held.metric("rangeshard_controller_stuck", controller="replicaset") == 0.0
    assert cluster.overlaps() == []
    _no_stale_owner_writes(cluster)
    cluster.assert_no_tracebacks()


def test_a_manager_stuck_past_the_bound_leaves_and_exits(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "bound"
    create_namespace(api, ns)
    extra = {"watchdog": {"reconcileTimeouts": 2, "exitAfterSeconds": 4}}
    held = cluster.start_manager(RS, hold=True, config_extra=extra)
    wait_until(lambda: _active(cluster, 1), 60, "the first instance active")
    other = cluster.start_manager(RS, config_extra=extra)
    wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    held_id = f"{held.name}-replicaset"
    owned = _create_until(cluster, ns, [held_id, f"{other.name}-replicaset"])
    wait_until(lambda: _answered(api, ns), 60, "every ReplicaSet answered")

    assert held.hold_file is not None
    held.hold_file.touch()
    for name in owned[held_id]:
        scale_replicaset(api, ns, name, 1)
    wait_until(lambda: (r := _readyz(held))[0] == 503 and "replicaset: stuck:" in r[1], 30, "not ready, named")
    code = held.proc.wait(60)
    assert code == 1, dump_logs(cluster)
    log = held.log.read_text(errors="replace")
    assert "replicaset: stuck for" in log and "watchdog.exitAfterSeconds 4" in log, log[-3000:]
    assert "leaving the registry and exiting" in log
    # It left: its neighbour owns everything and handles the objects it had.
    other_id = f"{other.name}-replicaset"
    wait_until(lambda: [m.instance_id for m in cluster.snapshot("replicaset")] == [other_id], 30, "left")
    wait_until(lambda: _answered(api, ns) and replicasets_converged(api, ns), 60, "the neighbour handled them")
    assert other.alive and _readyz(other)[0] == 200
    held.hold_file.unlink()
    assert cluster.overlaps() == []
    _no_stale_owner_writes(cluster)
    cluster.assert_no_tracebacks()


def test_a_silent_informer_makes_the_manager_not_ready(cluster: Cluster) -> None:
    port = int(cluster.proxy.url.rsplit(":", 1)[1])
    relay = TcpRelay(port)
    try:
        extra = {"proxy": {"url": relay.url}, "watchdog": {"informerSilenceSeconds": 2, "exitAfterSeconds": 0}}
        m = cluster.start_manager(RS, config_extra=extra)
        wait_until(lambda: _active(cluster, 1), 60, "an active instance")
        wait_until(lambda: _readyz(m)[0] == 200, 30, "ready")
        relay.freeze()  # the watches stay open, nothing arrives: not even the proxy's bookmarks
        _, text = wait_until(lambda: (r := _readyz(m))[0] == 503 and r, 30, "not ready while the watch is silent")
        assert "replicaset: stuck: informer replicaset-replicasets: its open watch brought no event and no " in text
        relay.thaw()
        wait_until(lambda: _readyz(m)[0] == 200, 30, "ready again once the watch speaks")
        assert m.alive
        assert "replicaset: no longer stuck" in m.log.read_text(errors="replace")
    finally:
        relay.close()
