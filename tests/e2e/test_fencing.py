"""Write fencing end to end: managers paused (SIGSTOP) beyond their lease TTL while objects are scaled.

The API server writes an ``audit.k8s.io/v1`` audit log (``RequestResponse``);
the proxy fences writes (``--etcd``). Managers are SIGSTOPped for longer than
the lease TTL and SIGCONTed, repeatedly, while replicasets and deployments
are scaled. Then: every object converges, the write-level check over the API
server's audit log finds no stale-owner write, and the proxy's fenced-write
counter shows that writes were refused. Because a pause cannot be aimed at
the instant between a manager's last deadline check and its request, the test
finally replays the exact race: a write made with the owner token a paused
manager held before its pause (taken from the API server's audit log) is sent
after the pause, and must be fenced.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from rangeshard.core.ownertoken import FENCED_HEADER, OwnerToken
from tests.e2e.conftest import FENCED_LEASE_TTL, Cluster, Manager, dump_logs
from tests.e2e.kube import (
    create_deployment,
    create_namespace,
    create_replicaset,
    deployments_converged,
    replicasets_converged,
    scale_replicaset,
)
from tests.helpers import wait_until

LEASE_TTL = FENCED_LEASE_TTL
PAUSE = LEASE_TTL + 1.5


def _fenced_total(proxy_url: str) -> float:
    text = httpx.get(proxy_url + "/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "range_filter_proxy_fenced_writes_total"
    )


def _manager_fenced(m: Manager) -> float:
    found = re.search(r"metrics on (http://\S+)/metrics", m.log.read_text())
    assert found is not None, m.log.read_text()[-2000:]
    text = httpx.get(found.group(1) + "/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "rangeshard_fenced_writes_total"
    )


def _audit_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _pause(m: Manager) -> None:
    os.killpg(m.proc.pid, signal.SIGSTOP)


def _resume(m: Manager) -> None:
    os.killpg(m.proc.pid, signal.SIGCONT)


def test_paused_managers_never_write_as_stale_owners(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "fence"
    create_namespace(api, ns)
    rs_names = [f"rs{i}" for i in range(12)]
    deploy_names = [f"d{i}" for i in range(3)]
    for name in rs_names:
        create_replicaset(api, ns, name, 1)
    for name in deploy_names:
        create_deployment(api, ns, name, 1)
    managers = [cluster.start_manager() for _ in range(3)]
    wait_until(lambda: len(cluster.snapshot("replicaset")) == 3, 60, "three replicaset instances")
    wait_until(lambda: replicasets_converged(api, ns) and deployments_converged(api, ns), 60, "first convergence")

    rng = random.Random(14)
    apps = k8s.AppsV1Api(api)
    audit = cluster.workdir / "apiserver-audit.jsonl"
    paused_tokens: list[OwnerToken] = []
    for round_no in range(3):
        victim = managers[round_no % len(managers)]
        for name in rs_names:
            scale_replicaset(api, ns, name, rng.randint(1, 4))
        for name in deploy_names:
            apps.patch_namespaced_deployment_scale(
                name, ns, {"spec": {"replicas": rng.randint(1, 3)}}, _content_type="application/merge-patch+json"
            )
        time.sleep(0.05)  # the pause lands while the scale-up is being worked on (scenario, not synchronisation)
        _pause(victim)
        tokens_before = {
            t
            for t in (OwnerToken.parse(e.get("userAgent")) for e in _audit_events(audit))
            if t is not None and t.instance_id.startswith(f"{victim.name}-")
        }
        paused_tokens.extend(tokens_before)
        for name in rs_names[round_no::3]:
            scale_replicaset(api, ns, name, rng.randint(1, 4))
        time.sleep(PAUSE)  # the pause itself: beyond the lease TTL
        _resume(victim)
        wait_until(lambda: len(cluster.snapshot("replicaset")) == 3, 60, "the paused manager back in the registry")

    converged = wait_until(
        lambda: replicasets_converged(api, ns) and deployments_converged(api, ns), 90, "convergence after the pauses"
    )
    assert converged, dump_logs(cluster)
    assert all(m.alive for m in managers), dump_logs(cluster)
    natural = _fenced_total(cluster.proxy.url)
    # Reconciles count the 409s they see as fenced; fenced writes outside a reconcile (the controllers'
    # best-effort Event posts carry the token too) are counted by the proxy only, so only an upper bound holds.
    seen_by_managers = sum(_manager_fenced(m) for m in managers)
    assert seen_by_managers <= natural, (natural, seen_by_managers)

    # The exact race a pause can open: a write sent with the token held before the pause, after it.
    assert paused_tokens, "the paused managers wrote nothing before their pauses"
    stale = paused_tokens[0]
    pods = k8s.CoreV1Api(api).list_namespaced_pod(ns).items
    pod = pods[0]
    resp = httpx.patch(
        f"{cluster.proxy.url}/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
        content=b'{"metadata":{"labels":{"stale":"write"}}}',
        headers={"Content-Type": "application/merge-patch+json", "User-Agent": stale.user_agent()},
        timeout=10,
    )
    assert resp.status_code == 409, resp.text
    status = resp.json()
    assert status["kind"] == "Status" and status["reason"] == "Conflict" and "fenced" in status["message"]
    assert resp.headers[FENCED_HEADER] in ("NotRegistered", "LeaseMismatch", "StaleEpoch", "OutOfRange")
    assert _fenced_total(cluster.proxy.url) >= natural + 1

    # The write-level check over the API server's own audit log: no stale owner wrote.
    check = subprocess.run(
        [sys.executable, "-m", "controller_manager.audit", "--apiserver-audit", str(audit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert " 0 stale-owner write(s)" in check.stdout
    assert " 0 unattributed," in check.stdout, check.stdout  # the check looked at every write
    writes = int(check.stdout.strip().splitlines()[-1].split()[0])
    assert writes > 0
    fenced_cluster.assert_no_tracebacks()
    print(
        f"fenced writes during the pauses: {natural:g} (managers counted {seen_by_managers:g}); "
        f"token writes audited: {writes}; reconcile-level overlaps: {len(cluster.overlaps(may_be_idle=cluster.managers))}"
    )
