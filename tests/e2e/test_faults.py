"""Fault injection with real processes: kills mid-handover, proxy and upstream restarts, cut streams.

Each test asserts: zero audit overlaps, everything converges, and (where a
cache is involved) the proxy's cached view equals the upstream after recovery.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from tests.e2e.conftest import Cluster, Load, Manager
from tests.e2e.kube import create_namespace, create_replicaset, replicasets_converged, scale_replicaset
from tests.e2e.test_manager import RS_ONLY, all_active
from tests.helpers import wait_until
from tests.relay import TcpRelay

SLOW = {"replicaset": {"workers": 4}}


def reconciling(m: Manager) -> bool:
    """The manager has audited at least one reconcile."""
    return m.audit.exists() and m.audit.stat().st_size > 0


def cache_matches_upstream(proxy_url: str, upstream_url: str, path: str) -> bool:
    """The proxy's (consistent) list has exactly the upstream's objects at the same versions."""
    with httpx.Client(timeout=10) as c:
        try:
            via_proxy = c.get(proxy_url + path).json()["items"]
            direct = c.get(upstream_url + path).json()["items"]
        except (httpx.HTTPError, KeyError, ValueError):
            return False

    def ids(items: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in items}

    return ids(via_proxy) == ids(direct)


def locked_by(cluster: Cluster, giver: Manager) -> bool:
    """Some instance is registered, locked, and waiting for ``giver`` to unlock it."""
    return any(
        m.record.is_locked and m.record.giver == f"{giver.name}-replicaset" for m in cluster.snapshot("replicaset")
    )


def test_sigkill_giver_and_receiver_mid_handover(cluster: Cluster, etcd_server: EtcdServer) -> None:
    """The giver dies before it unlocks its receiver: the receiver must unlock itself once the giver's record is gone.

    The giver is frozen (SIGSTOP) with slow reconciles in flight before the
    receiver joins, so the receiver provably joins *locked* by it and the
    giver can never unlock it; then the giver is SIGKILLed. Each receiver
    starts with its etcd connection cut (a relay) and joins only when the test
    restores it, right after freezing the giver, so the giver's record is
    still there to split.
    """
    api = cluster.api
    ns = "midkill"
    create_namespace(api, ns)
    names = [f"rs{i}" for i in range(12)]
    for name in names:
        create_replicaset(api, ns, name, 1)
    relays = [TcpRelay(etcd_server.client_port), TcpRelay(etcd_server.client_port)]
    try:
        giver = cluster.start_manager(SLOW, reconcile_delay=0.5)
        wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "the first instance active")
        wait_until(lambda: replicasets_converged(api, ns), 30, "converged")
        receivers: list[Manager] = []
        for relay in relays:
            relay.cut()
            receiver = cluster.start_manager(SLOW, etcd_url=relay.url, reconcile_delay=0.5)
            wait_until(lambda r=receiver: "cannot join yet" in r.log.read_text(), 30, "the receiver up, not joined")
            with Load(cluster, ns, names):
                wait_until(lambda g=giver: reconciling(g), 20, "the giver reconciling")
                giver.freeze()
                relay.restore()
                wait_until(lambda g=giver: locked_by(cluster, g), 30, "the receiver's locked join")
                giver.kill()
                wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "the receiver takes everything")
                # Active is not yet audited: its first reconcile ends (and is recorded) only after the
                # 0.5 s delay, and the objects can look converged without it (the load may have put
                # every replica count back). Keep work coming until the receiver has recorded one, so
                # the audit checks below (and the next round's "giver reconciling") see its work.
                wait_until(lambda r=receiver: reconciling(r), 30, "the receiver's first audited reconcile")
            assert receiver.handover()["self_unlocks"] >= 1
            wait_until(lambda: replicasets_converged(api, ns), 30, "converged after the giver died")
            receivers.append(receiver)
            giver = receiver
        assert receivers[-1].alive
        cluster.assert_safe_handover()
        cluster.assert_no_tracebacks()
    finally:
        for relay in relays:
            relay.close()


def test_proxy_restart_during_watches(cluster: Cluster) -> None:
    api = cluster.api
    create_namespace(api, "proxyrestart")
    for i in range(8):
        create_replicaset(api, "proxyrestart", f"rs{i}", 1)
    cluster.start_manager(RS_ONLY)
    cluster.start_manager(RS_ONLY)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 30, "two active instances")
    wait_until(lambda: replicasets_converged(api, "proxyrestart"), 30, "converged")
    cluster.proxy.kill()
    # Changes while the proxy is gone: nobody can act, nothing may be lost.
    for i in range(8):
        scale_replicaset(api, "proxyrestart", f"rs{i}", 3)
    cluster.proxy.start()
    wait_until(lambda: replicasets_converged(api, "proxyrestart"), 40, "converged through the new proxy")
    wait_until(
        lambda: cache_matches_upstream(
            cluster.proxy.url, cluster.apiserver.url, "/api/v1/namespaces/proxyrestart/pods"
        ),
        20,
        "the proxy cache equal to the upstream",
    )
    assert cluster.overlaps(may_be_idle=cluster.without_objects("proxyrestart")) == []
    cluster.assert_no_tracebacks()


@pytest.fixture
def relayed_cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[tuple[Cluster, TcpRelay]]:
    """A cluster whose proxy reaches the API server through a relay the test can cut."""
    storage = f"/faults-{uuid.uuid4().hex[:8]}"
    api = LocalApiServerProcess(
        etcd_server.url, prefix=storage, log_file=tmp_path / "apiserver.log", bookmark_interval=0.2
    )
    api.start()
    relay = TcpRelay(api.port)
    proxy = ProxyProcess(relay.url, log_file=tmp_path / "proxy.log")
    try:
        proxy.start()
        cluster = Cluster(etcd_server.url, etcd_server.url, f"/rs-{uuid.uuid4().hex[:8]}", api, proxy, tmp_path)
        try:
            yield cluster, relay
        finally:
            cluster.stop()
    finally:
        proxy.stop()
        relay.close()
        api.stop()
        with EtcdClient(EtcdConfig.from_urls(etcd_server.url)) as c:
            c.delete_prefix(storage + "/")


def test_upstream_restart_and_cut_streams(relayed_cluster: tuple[Cluster, TcpRelay]) -> None:
    cluster, relay = relayed_cluster
    api = cluster.api
    create_namespace(api, "upstream")
    for i in range(8):
        create_replicaset(api, "upstream", f"rs{i}", 1)
    cluster.start_manager(RS_ONLY)
    cluster.start_manager(RS_ONLY)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 30, "two active instances")
    wait_until(lambda: replicasets_converged(api, "upstream"), 30, "converged")
    # Cut every proxy->upstream stream mid-flight, change things, let it back.
    relay.cut()
    for i in range(8):
        scale_replicaset(api, "upstream", f"rs{i}", 2)
    relay.restore()
    wait_until(lambda: replicasets_converged(api, "upstream"), 40, "converged after the cut")
    # Restart the upstream itself (same port, same etcd data).
    cluster.apiserver.stop()
    cluster.apiserver.start()
    for i in range(8):
        scale_replicaset(api, "upstream", f"rs{i}", 1)
    wait_until(lambda: replicasets_converged(api, "upstream"), 40, "converged after the upstream restart")
    wait_until(
        lambda: cache_matches_upstream(cluster.proxy.url, cluster.apiserver.url, "/api/v1/namespaces/upstream/pods"),
        20,
        "the proxy cache equal to the upstream",
    )
    assert cluster.overlaps(may_be_idle=cluster.without_objects("upstream")) == []
    cluster.assert_no_tracebacks()


def test_reconcile_timeouts_are_one_warning_line_each(cluster: Cluster) -> None:
    """Reconciles held past their deadline: a WARNING line each and a counter, no traceback, then convergence."""
    api = cluster.api
    ns = "timeouts"
    create_namespace(api, ns)
    for i in range(3):
        create_replicaset(api, ns, f"rs{i}", 1)
    hold = cluster.workdir / "held.hold"
    hold.touch()  # every reconcile holds its key until its deadline: each one times out
    m = cluster.start_manager(RS_ONLY, name="held", hold=True, log_level=None)  # run by hand: INFO by default
    assert m.hold_file == hold
    wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "the instance active")
    timeouts = 'rangeshard_reconcile_errors_total{controller="replicaset",reason="timeout"}'
    wait_until(
        lambda: m.metric("rangeshard_reconcile_errors_total", controller="replicaset", reason="timeout") >= 3,
        30,
        timeouts + " >= 3",
    )
    assert m.metric("rangeshard_reconciles_in_flight", controller="replicaset") >= 1
    lines = [line for line in m.log.read_text().splitlines() if " timed out after " in line]
    assert lines and all(" WARNING " in line for line in lines), lines[:3]
    first = lines[0]
    # key, the reconcile timeout, and what timed out
    assert f"reconcile {ns}/rs" in first and "reconcile timeout 1.00s" in first and "deadline" in first, first
    assert m.metric("rangeshard_reconciles_total", controller="replicaset", result="timeout") >= 3
    assert not replicasets_converged(api, ns)  # nothing was done while held
    hold.unlink()
    wait_until(lambda: replicasets_converged(api, ns), 30, "converged once released")
    wait_until(lambda: m.metric("rangeshard_reconciles_in_flight", controller="replicaset") == 0, 10, "nothing held")
    assert m.metric("rangeshard_reconcile_errors_total", controller="replicaset", reason="exception") == 0
    cluster.assert_no_tracebacks()
    # The manager's state changes are INFO lines without asking for them.
    text = m.log.read_text()
    assert " INFO " in text and "caches synced at epoch" in text, text[-2000:]
