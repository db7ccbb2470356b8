"""Controller managers end to end: real processes, real etcd, local API server, proxy.

The safety invariant (no key reconciled by two instances at once) is checked
with the audit logs of every manager after each scenario.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller_manager.audit import now as audit_now
from controller_manager.audit import read_records
from hashing import MAX_HASH
from rangeshard.core.etcdserver import EtcdServer
from registry import State
from tests.e2e.conftest import LEASE_TTL, Cluster, Load, Manager, dump_logs
from tests.e2e.kube import (
    create_deployment,
    create_namespace,
    create_replicaset,
    create_replicasets_in_both_halves,
    deployments_converged,
    pods_by_owner,
    replicasets,
    replicasets_converged,
    scale_replicaset,
)
from tests.helpers import wait_until
from tests.relay import TcpRelay

RS_ONLY = {"replicaset": {"workers": 2}}


def all_active(cluster: Cluster, controller: str, n: int) -> bool:
    snap = cluster.snapshot(controller)
    return len(snap) == n and all(m.record.state is State.ACTIVE and not m.record.is_locked for m in snap)


def test_three_joins_give_the_design_keys_and_converge(cluster: Cluster) -> None:
    api = cluster.api
    create_namespace(api, "three")
    for _ in range(3):
        cluster.start_manager(RS_ONLY)
        # One at a time, with no workload yet, so ties between equal ranges go to the lower start.
        n = len(cluster.managers)
        wait_until(lambda n=n: all_active(cluster, "replicaset", n), 30, f"{n} active instances")
    keys = sorted(m.record.hash_key for m in cluster.snapshot("replicaset"))
    assert keys == [2305843009213693951, 4611686018427387903, 9223372036854775807]
    for i in range(6):
        create_replicaset(api, "three", f"rs{i}", 2)
    wait_until(lambda: replicasets_converged(api, "three"), 30, "replicasets converged")
    # Objects came after the joins: nothing changed hands, but every instance owning one audited it.
    assert cluster.overlaps(may_be_idle=cluster.without_objects("three")) == []
    # workloadNum is published: the instances together own every replicaset.
    wait_until(lambda: sum(m.record.workload_num for m in cluster.snapshot("replicaset")) == 6, 15, "workloads")
    # Each manager exports its state on /metrics and answers /healthz and /readyz.
    for m in cluster.managers:
        url = re.search(r"metrics on (http://\S+)/metrics", m.log.read_text()).group(1)  # type: ignore[union-attr]
        with httpx.Client(timeout=5) as c:
            assert c.get(url + "/healthz").status_code == 200
            assert c.get(url + "/readyz").status_code == 200
            text = c.get(url + "/metrics").text
        assert (
            f'rangeshard_instance_state{{controller="replicaset",instance="{m.name}-replicaset",state="active"}} 1.0'
            in text
        )
        assert "# TYPE rangeshard_reconciles_total counter" in text


def test_twenty_deployments_converge_never_more_pods(cluster: Cluster) -> None:
    api = cluster.api
    create_namespace(api, "twenty")
    cluster.start_manager()
    cluster.start_manager()
    wants = {f"d{i}": 1 + i % 3 for i in range(20)}
    for name, n in wants.items():
        create_deployment(api, "twenty", name, n)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        per_rs = pods_by_owner(api, "twenty")
        for rs in replicasets(api, "twenty"):
            owner = rs["metadata"]["ownerReferences"][0]["name"]
            assert per_rs.get(rs["metadata"]["name"], 0) <= wants[owner], "more pods than asked for"
        if deployments_converged(api, "twenty"):
            break
        time.sleep(0.2)
    else:
        pytest.fail("deployments did not converge:\n" + dump_logs(cluster))
    assert cluster.overlaps() == []


def test_sigkill_takeover_within_ttl(cluster: Cluster) -> None:
    api = cluster.api
    create_namespace(api, "kill")
    a = cluster.start_manager(RS_ONLY)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "first instance active")
    cluster.start_manager(RS_ONLY)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 30, "second instance active")
    names = create_replicasets_in_both_halves(api, "kill", 10)  # the killed instance's half holds some to move
    wait_until(lambda: replicasets_converged(api, "kill"), 30, "converged before the kill")
    idle = cluster.without_objects("kill")
    assert idle == []
    a.kill()
    killed_at = time.monotonic()
    wait_until(lambda: len(cluster.snapshot("replicaset")) == 1, LEASE_TTL + 2, "the dead instance's record to expire")
    survivor = cluster.snapshot("replicaset").members[0]
    assert survivor.range is not None and survivor.range.lo == 0 and survivor.range.hi == MAX_HASH
    assert time.monotonic() - killed_at <= LEASE_TTL + 2
    for name in names:
        scale_replicaset(api, "kill", name, 2)
    wait_until(lambda: replicasets_converged(api, "kill"), 30, "the survivor reconciles everything")
    cluster.assert_safe_handover(may_be_idle=idle)


def test_churn_no_overlap(cluster: Cluster) -> None:
    """>= 30 joins, graceful leaves and SIGKILLs while objects are created and scaled."""
    api = cluster.api
    rng = random.Random(7)
    create_namespace(api, "churn")
    for i in range(12):
        create_replicaset(api, "churn", f"rs{i}", 1)
    live = [cluster.start_manager(RS_ONLY), cluster.start_manager(RS_ONLY)]
    joins = 2
    scale_round = 0
    while joins < 30:
        action = rng.random()
        if len(live) < 2 or action < 0.55:
            live.append(cluster.start_manager(RS_ONLY))
            joins += 1
        elif action < 0.8:
            victim = live.pop(rng.randrange(len(live)))
            victim.terminate()
        else:
            victim = live.pop(rng.randrange(len(live)))
            victim.kill()
        scale_round += 1
        scale_replicaset(api, "churn", f"rs{scale_round % 12}", 1 + scale_round % 3)
        time.sleep(rng.uniform(0.1, 0.6))  # churn pacing, not synchronisation
        while len(live) > 4:
            live.pop(0).terminate()
    wait_until(lambda: all_active(cluster, "replicaset", len(live)), 40, "the survivors to settle")
    wait_until(lambda: replicasets_converged(api, "churn"), 60, "every replicaset converged")
    # Short-lived managers may have owned nothing; a survivor owning an object must have audited it.
    gone = [m for m in cluster.managers if m not in live]
    idle = gone + cluster.without_objects("churn")
    # The newest survivor is active before its informer has relisted: wait for its first audit record.
    busy = [m for m in live if m not in idle]
    wait_until(
        lambda: all(m.audit.exists() and read_records([m.audit]) for m in busy), 30, "every busy survivor audited"
    )
    cluster.assert_safe_handover(may_be_idle=idle)


def fenced_in_log(m: Manager) -> bool:
    return "fenced" in m.log.read_text(errors="replace")


def test_etcd_outage_fences_everyone(private_registry_cluster: Cluster) -> None:
    """etcd goes away for 10 s while slow reconciles run and work keeps arriving: everyone fences in time.

    Every lease was last renewed before etcd stopped, so no reconcile may
    *end* after ``stop + TTL`` (the latest possible expiry) nor start after
    ``down + TTL`` until etcd is back; the load keeps changing objects during
    the whole fencing window, so there is work that a broken fence would take.
    """
    cluster = private_registry_cluster
    server = cluster.registry_server
    assert server is not None
    api = cluster.api
    ns = "outage"
    create_namespace(api, ns)
    # Both halves of the hash space need objects, or the joiner has nothing to reconcile (and the
    # final non-vacuous check fails: with 6 replicasets that happens in 1 run of 64).
    names = create_replicasets_in_both_halves(api, ns, 6)
    managers = [cluster.start_manager(RS_ONLY, reconcile_delay=0.5)]
    wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "the first instance active")
    wait_until(lambda: replicasets_converged(api, ns), 30, "converged with one instance")
    managers.append(cluster.start_manager(RS_ONLY, reconcile_delay=0.5))
    wait_until(lambda: all_active(cluster, "replicaset", 2), 30, "two active instances")
    with Load(cluster, ns, names, pause=0.1) as load:
        wait_until(lambda: load.patches >= 5, 20, "load running")
        down_at = audit_now()
        server.stop()
        stopped_at = audit_now()
        wait_until(lambda: all(fenced_in_log(m) for m in managers), LEASE_TTL + 5, "every manager to fence")
        fenced_patches = load.patches
        # A 10 s outage: well past every lease's expiry, with work arriving all along.
        wait_until(lambda: audit_now() > down_at + max(10.0, LEASE_TTL + 1), 15, "a 10 s outage")
        assert load.patches > fenced_patches, "no work arrived during the fencing window"
        up_at = audit_now()
        server.start()
        records = read_records([m.audit for m in managers])
        late_start = [r for r in records if down_at + LEASE_TTL <= r.start <= up_at]
        assert late_start == [], f"reconciles started while every lease could have expired: {late_start[:3]}"
        late_end = [r for r in records if r.start < up_at and r.end > stopped_at + LEASE_TTL]
        assert late_end == [], f"reconciles still running after every lease could have expired: {late_end[:3]}"
        assert any(r.start < stopped_at < r.end for r in records) or any(
            stopped_at - 1.0 <= r.end <= stopped_at + LEASE_TTL for r in records
        ), "no reconcile was running when etcd went away"
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "both instances active again")
    wait_until(lambda: replicasets_converged(api, ns), 40, "converged after the outage")
    cluster.assert_safe_handover()
    cluster.assert_no_tracebacks()


def test_partitioned_instance_is_taken_over(cluster: Cluster, etcd_server: EtcdServer) -> None:
    """One manager loses etcd (its connection goes through a relay we cut) while the other works on."""
    api = cluster.api
    create_namespace(api, "part")
    names = create_replicasets_in_both_halves(api, "part", 8)  # the islanded half holds some to move
    relay = TcpRelay(etcd_server.client_port)
    try:
        cluster.start_manager(RS_ONLY, name="steady")
        wait_until(lambda: all_active(cluster, "replicaset", 1), 30, "first instance active")
        cut_off = cluster.start_manager(RS_ONLY, etcd_url=relay.url, name="islanded")
        wait_until(lambda: all_active(cluster, "replicaset", 2), 30, "two active instances")
        wait_until(lambda: replicasets_converged(api, "part"), 30, "converged before the partition")
        relay.cut()
        wait_until(lambda: len(cluster.snapshot("replicaset")) == 1, LEASE_TTL + 5, "the islanded lease to expire")
        wait_until(lambda: all_active(cluster, "replicaset", 1), 15, "the steady instance to own everything")
        for name in names:
            scale_replicaset(api, "part", name, 2)
        wait_until(lambda: replicasets_converged(api, "part"), 30, "the steady instance converges everything")
        assert fenced_in_log(cut_off)
        relay.restore()
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "the islanded manager rejoined")
        for name in names:
            scale_replicaset(api, "part", name, 1)
        wait_until(lambda: replicasets_converged(api, "part"), 30, "converged after the rejoin")
        cluster.assert_safe_handover()
        cluster.assert_no_tracebacks()
    finally:
        relay.close()


@pytest.mark.parametrize("controllers", [RS_ONLY])
def test_bad_config_exits_2(tmp_path: Path, controllers: dict[str, object]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("leaseTTLSeconds: -1\ncontrollers:\n  nonsense: {workers: 0}\n")
    result = subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "controller-manager", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{cfg}: leaseTTLSeconds:" in result.stderr
    assert "Traceback" not in result.stderr


def test_readyz_and_up_name_the_informer_that_keeps_a_manager_not_ready(cluster: Cluster, etcd_server: Any) -> None:
    """A manager whose controller's resource is not served says why on /readyz (and `up` repeats it)."""
    from rangeshard.cli.statefile import Component  # noqa: PLC0415
    from rangeshard.cli.updown import NotReadyError, wait_healthy  # noqa: PLC0415

    m = cluster.start_manager({"certificate": {"class": "tests.e2e.unserved_controller:CertificateController"}})

    def body() -> str:
        try:
            resp = httpx.get(m.metrics_url() + "/readyz", timeout=5)
        except (httpx.HTTPError, AssertionError):
            return ""
        return f"{resp.status_code} {resp.text}"

    wait_until(lambda: "informer certificate-gizmos: 404" in body(), 40, "the informer's error on /readyz")
    text = body()
    assert text.startswith("503 not ready: informer certificate-gizmos: 404 "), text
    component = Component.model_validate(
        {"name": "manager m9", "kind": "manager", "pid": m.proc.pid, "port": 0, "url": m.metrics_url(),
         "healthUrl": m.metrics_url() + "/readyz"}
    )  # fmt: skip
    with pytest.raises(NotReadyError) as caught:
        wait_healthy([component], [], etcd_server.url, ["certificate"], 1, threading.Event(), timeout=1)
    assert "manager m9: informer certificate-gizmos: 404 " in str(caught.value), str(caught.value)
