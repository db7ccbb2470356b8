"""In-process handovers served from the proxy's cache on a kube-like upstream, never older than the giver (issue 46).

The upstream bookmarks once a minute and makes no progress on request, as
kube-apiserver does: a consistent read (a list without a resourceVersion) of
a quiet resource cannot be proven fresh from the proxy's cache, and falls
back to an upstream LIST (``range_filter_proxy_consistent_read_fallbacks_total``).
The built-in ReplicaSet controller, in process, goes through a join, a
rebalance (``rangeshard rebalance set-key``) and a SIGKILL; its informers relist after every range change "not
older than" the highest resourceVersion known of the resource (their own and
what the givers published: ``handoverResourceVersions``), which the proxy
serves from its cache:

* the fallback counter stays 0 from the first manager's start to the end;
* the taker's first list after its unlock is at a resourceVersion not older
  than the giver's last successful write (taken from the API server's audit
  log, ``RequestResponse``), and not older than what the giver published.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from hashing import HashRange, hash_key
from tests.e2e.conftest import Cluster, Load
from tests.e2e.kube import create_namespace, create_replicaset, replicasets_converged
from tests.helpers import wait_until

NS = "fresh"
RS = 8
CONTROLLERS = {"replicaset": {"workers": 2}}


def _fallbacks(cluster: Cluster) -> float:
    text = httpx.get(f"{cluster.proxy.url}/metrics", timeout=10).text
    found = re.findall(r"^range_filter_proxy_consistent_read_fallbacks_total(?:{.*})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("replicaset")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _shard_key(obj: dict[str, Any]) -> int | None:
    """The hash a ReplicaSet (its uid) or a pod (its controller owner's uid) is placed by."""
    meta = obj.get("metadata") or {}
    owner = next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)
    uid = owner.get("uid") if owner is not None else meta.get("uid")
    return hash_key(uid) if isinstance(uid, str) else None


def _writes_by(audit: Path, instance_id: str, moved: HashRange) -> list[int]:
    """The resourceVersions of the successful writes of ``instance_id``'s tokens to pods and ReplicaSets placed in
    ``moved`` (its Events are written by a recorder thread, placed by nothing)."""
    out = []
    for line in audit.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:  # a line being written
            continue
        code = (e.get("responseStatus") or {}).get("code", 0)
        obj = e.get("responseObject") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        key = _shard_key(obj)
        if (
            e.get("stage") == "ResponseComplete"
            and (e.get("objectRef") or {}).get("resource") in ("pods", "replicasets")
            and e.get("verb") in ("create", "update", "patch", "delete")
            and f"/{instance_id};" in (e.get("userAgent") or "")
            and 200 <= code < 300
            and isinstance(rv, str)
            and rv.isdigit()
            and key is not None
            and moved.contains(key)
        ):
            out.append(int(rv))
    return out


def _first_list_after(log: Path, marker: str) -> int:
    """The resourceVersion of the taker's first ReplicaSet list logged after the line containing ``marker``."""
    text = log.read_text(errors="replace")
    at = text.find(marker)
    assert at >= 0, f"{marker!r} not in {log}"
    found = re.search(r"informer replicaset-replicasets: listed \d+ objects at rv (\d+)", text[at:])
    assert found, text[at : at + 3000]
    return int(found.group(1))


def _rebalance(cluster: Cluster, *args: str) -> str:
    where = ["--type", "replicaset", "--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix]
    command = [sys.executable, "-m", "rangeshard.cli.main", "rebalance", *args, *where]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_inprocess_handovers_list_nothing_upstream_and_not_older_than_the_giver(kube_like_cluster: Cluster) -> None:
    cluster = kube_like_cluster
    api = cluster.api
    create_namespace(api, NS)
    first = cluster.start_manager(CONTROLLERS, log_level="debug")
    wait_until(lambda: _active(cluster, 1), 60, "one active instance")
    names = [f"rs{i}" for i in range(RS)]
    for name in names:
        create_replicaset(api, NS, name, 2)
    wait_until(lambda: replicasets_converged(api, NS), 60, "the ReplicaSets converged")
    giver = cluster.snapshot("replicaset").members[0].instance_id
    print(f"fallbacks after the first convergence: {_fallbacks(cluster)}")

    with Load(cluster, NS, names, pause=0.1):  # the giver writes up to its drain
        second = cluster.start_manager(CONTROLLERS, log_level="debug")
        wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    print(f"fallbacks after the join: {_fallbacks(cluster)}")
    taker = next(m for m in cluster.snapshot("replicaset").members if m.instance_id != giver)
    assert taker.range is not None
    audit = cluster.workdir / "apiserver-audit.jsonl"
    giver_writes = _writes_by(audit, giver, taker.range)  # of the keys that moved: all before the unlock
    assert giver_writes, "the giver wrote the keys that moved during the join"
    listed = _first_list_after(second.log, "locked True -> False")
    published = cluster.snapshot("replicaset").get(giver)
    assert published is not None and published.record.handover_resource_versions, "the giver published its writes"
    versions = {label: int(rv) for label, rv in published.record.handover_resource_versions.items()}
    print(
        f"giver's last write of a moved key at rv {max(giver_writes)}; published {versions}; the taker's first "
        f"list after the unlock at rv {listed}"
    )
    late = [
        line
        for line in audit.read_text().splitlines()
        if f"/{giver};" in line and any(f'"resourceVersion":"{rv}"' in line for rv in giver_writes if rv > listed)
    ]
    assert listed >= max(giver_writes), f"the taker listed older than the giver's last write: {late[:3]}"

    # A rebalance: one boundary moved back (the giver's range grows), through the same lock -> drain -> unlock.
    _rebalance(cluster, "set-key", "--instance", taker.instance_id, "--key", str(taker.range.hi // 4))
    wait_until(lambda: _active(cluster, 2), 60, "two active instances after the rebalance")
    wait_until(lambda: replicasets_converged(api, NS), 60, "the ReplicaSets still converged")
    print(f"fallbacks after the rebalance: {_fallbacks(cluster)}")
    os.killpg(first.proc.pid, signal.SIGKILL)  # its range is absorbed once its lease expired
    first.proc.wait(10)
    wait_until(lambda: _active(cluster, 1), 60, "one instance after the SIGKILL")
    wait_until(lambda: replicasets_converged(api, NS), 60, "the ReplicaSets still converged")
    fallbacks = _fallbacks(cluster)
    print(f"consistent-read fallbacks: {fallbacks}")
    assert fallbacks == 0, f"{fallbacks} consistent reads fell back to an upstream list"
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()
