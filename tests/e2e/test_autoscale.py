"""Scale from load: the sequence a HorizontalPodAutoscaler drives on the managers' StatefulSet, under load.

deploy/autoscaling scales the StatefulSet on the proxy's per-instance
unanswered-changes metric. What the HPA does to rangeshard is only this: it
adds the next ordinal (a join: the largest range is split, handed over) and
removes the highest one (SIGTERM: a graceful stop that parks for
``rejoinGraceSeconds``, then the neighbour absorbs the range). Here the same
sequence runs by hand, with write fencing on and ReplicaSets scaled all the
time: 2 -> 3 -> 4 managers, then 4 -> 3 -> 2. Nothing is lost (every
ReplicaSet converges), nothing is handled twice (the reconcile audit shows no
overlap and some key moved; the API server's audit log no stale-owner write),
and the proxy's metric follows the membership (the series the HPA reads).
"""

from __future__ import annotations

from controller_manager.audit import read_records
from rangeshard.testing import assert_no_stale_writes
from tests.e2e.conftest import Cluster, Load, dump_logs
from tests.e2e.kube import create_namespace, create_replicaset, replicasets_converged
from tests.e2e.test_manager import all_active
from tests.e2e.test_rolling import LOADED, layout, start
from tests.helpers import wait_until

#: Short: a scaled-in pod parks this long before its neighbour absorbs its range (deploy/autoscaling says why).
GRACE = 3


def _instances(cluster: Cluster) -> set[str]:
    return set(layout(cluster))


def test_scale_up_and_down_as_an_hpa_would_under_load(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    ns = "autoscale"
    create_namespace(api, ns)
    names = [f"rs{i}" for i in range(16)]
    for n in names:
        create_replicaset(api, ns, n, 1)
    pods = [start(cluster, f"pod-{i}", rejoinGraceSeconds=GRACE, **LOADED) for i in range(2)]
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "2 active")
    wait_until(lambda: replicasets_converged(api, ns), 40, "converged")
    with Load(cluster, ns, names) as load:
        wait_until(lambda: load.patches >= 5, 20, "load running")
        for i in (2, 3):  # scale up: the next ordinal joins
            pods.append(start(cluster, f"pod-{i}", rejoinGraceSeconds=GRACE, **LOADED))
            wait_until(lambda i=i: all_active(cluster, "replicaset", i + 1), 60, f"{i + 1} active")
        for i in (3, 2):  # scale down: the highest ordinal leaves gracefully (it parks, then its range goes)
            victim = pods.pop()
            assert victim.terminate() == 0
            assert "parked: range" in victim.log.read_text()
            gone = f"pod-{i}-replicaset"
            wait_until(lambda gone=gone: gone not in _instances(cluster), 30, f"{gone} released after its grace")
            wait_until(lambda i=i: all_active(cluster, "replicaset", i), 60, f"{i} active")
    try:
        wait_until(lambda: replicasets_converged(api, ns), 60, "converged after scaling up and down")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump_logs(cluster)}") from None
    # The metric the HPA reads follows the membership: one series per registered instance.
    wait_until(
        lambda: set(cluster.progress("replicaset")) == {"pod-0-replicaset", "pod-1-replicaset"},
        20,
        "the proxy's per-instance series follow the membership",
    )
    busy = [m for m in cluster.managers if m.name in {"pod-0", "pod-1"}]
    wait_until(lambda: all(m.audit.exists() and read_records([m.audit]) for m in busy), 40, "audited reconciles")
    idle = cluster.without_objects(ns) + [m for m in cluster.managers if m.name in {"pod-2", "pod-3"}]
    cluster.assert_safe_handover(may_be_idle=idle)
    assert assert_no_stale_writes(cluster.workdir / "apiserver-audit.jsonl") > 0
    cluster.assert_no_tracebacks()
