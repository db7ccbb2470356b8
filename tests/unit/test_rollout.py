"""Rollout arithmetic: strategy bounds, rolling steps within them, Recreate, status conditions; event forms."""

from __future__ import annotations

from typing import Any

from controller_manager.controllers.deployment import comparable, template_hash
from controller_manager.controllers.rollout import (
    Strategy,
    deployment_status,
    new_rs_target,
    old_scale_downs,
    rs_replicas,
)
from rangeshard.core.events import event_body, from_events_v1, to_events_v1


def rs(name: str, replicas: int, available: int, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1, "creationTimestamp": created},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": available,
            "availableReplicas": available,
            "observedGeneration": 1,
        },
    }


def test_strategy_defaults_percentages_ints_and_recreate() -> None:
    assert Strategy.of({}, 4) == Strategy(False, 1, 1)  # 25% / 25%: surge rounds up, unavailable down
    assert Strategy.of({}, 10) == Strategy(False, 3, 2)
    rolling = {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": "50%"}}}
    assert Strategy.of(rolling, 5) == Strategy(False, 2, 2)
    zero = {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}
    assert Strategy.of(zero, 3) == Strategy(False, 0, 1)  # both 0: one may be unavailable
    assert Strategy.of({"strategy": {"type": "Recreate"}}, 3).recreate


def simulate(want: int, strategy: Strategy) -> tuple[int, int, int]:
    """Run the rollout with instantly available pods; return (steps, max asked for, min available)."""
    new, old = rs("new", 0, 0), rs("old", want, want)
    max_total, min_available, steps = want, want, 0
    while rs_replicas(old) or rs_replicas(new) != want:
        steps += 1
        assert steps < 50, "the rollout does not converge"
        target = new_rs_target(want, strategy, rs_replicas(new), rs_replicas(old))
        new = rs("new", target, rs_replicas(new))  # new pods are asked for, not yet available
        max_total = max(max_total, rs_replicas(new) + rs_replicas(old))
        for _, size in old_scale_downs(want, strategy, new, [old]):
            old = rs("old", size, size)
        min_available = min(min_available, (new["status"]["availableReplicas"]) + rs_replicas(old))
        new = rs("new", rs_replicas(new), rs_replicas(new))  # they become available
    return steps, max_total, min_available


def test_rolling_update_stays_within_surge_and_unavailable() -> None:
    for want, surge, unavailable in ((4, 1, 1), (10, 3, 2), (3, 0, 1), (5, 2, 0), (1, 1, 0)):
        strategy = Strategy(False, surge, unavailable)
        steps, max_total, min_available = simulate(want, strategy)
        assert max_total <= want + surge
        assert min_available >= want - unavailable
        assert steps > 1 or want == 1, "a rolling update takes several steps"


def test_old_pods_that_are_unavailable_go_first() -> None:
    strategy = Strategy(False, 1, 1)
    old = rs("old", 3, 1)  # two of its pods are not available
    # While the new pods are not available either, nothing may go (4 - 1 must stay available or coming).
    assert old_scale_downs(4, strategy, rs("new", 2, 0), [old]) == []
    # Once they are, the two unavailable old pods go; the available one stays (3 available = 4 - 1).
    assert old_scale_downs(4, strategy, rs("new", 2, 2), [old]) == [(old, 1)]


def test_status_conditions_and_completion() -> None:
    d = {"metadata": {"generation": 2}, "spec": {"replicas": 2}}
    new = {**rs("web-1", 2, 2), "metadata": {"name": "web-1", "generation": 1}}
    status = deployment_status(d, new, [new], Strategy(False, 1, 0), {})
    assert status["observedGeneration"] == 2
    assert (status["replicas"], status["updatedReplicas"], status["availableReplicas"]) == (2, 2, 2)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"
    again = deployment_status(d, new, [new], Strategy(False, 1, 0), status)
    assert again == status, "an unchanged status is not rewritten"
    old = rs("web-0", 1, 1)
    rolling = deployment_status(d, new, [new, old], Strategy(False, 1, 0), status)
    assert {c["type"]: c for c in rolling["conditions"]}["Progressing"]["reason"] == "ReplicaSetUpdated"


def test_template_comparison_ignores_hash_label_and_empty_fields() -> None:
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    round_tripped = {
        "metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}, "creationTimestamp": None},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]},
    }
    assert comparable(template) == comparable(round_tripped)
    assert template_hash(template) == template_hash(round_tripped)
    changed = {**template, "spec": {"containers": [{"name": "c", "image": "j"}]}}
    assert template_hash(changed) != template_hash(template)


def test_event_forms_round_trip() -> None:
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "n", "uid": "u"}}
    ev = event_body(pod, "Started", "Started container c", component="kubelet", host="node")
    assert ev["involvedObject"]["uid"] == "u" and ev["source"] == {"component": "kubelet", "host": "node"}
    v1 = to_events_v1(ev)
    assert v1["apiVersion"] == "events.k8s.io/v1" and v1["regarding"] == ev["involvedObject"]
    assert v1["note"] == "Started container c" and v1["reportingController"] == "kubelet"
    assert from_events_v1(v1) == ev
    later = event_body(pod, "Killing", "Stopping container c", component="kubelet")
    assert later["metadata"]["name"] > ev["metadata"]["name"], "event names sort by time"
