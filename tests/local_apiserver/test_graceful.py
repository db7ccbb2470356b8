"""Graceful pod deletion and the two Event APIs, as kube-apiserver has them."""

from __future__ import annotations

import httpx


def _pod(name: str, node: str | None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_bound_pod_terminates_gracefully_until_a_grace_zero_delete(http: httpx.Client, namespace: str) -> None:
    base = f"/api/v1/namespaces/{namespace}/pods"
    assert http.post(base, json=_pod("bound", "elsewhere")).status_code == 201
    first = http.delete(f"{base}/bound", params={"gracePeriodSeconds": "20"})
    assert first.status_code == 200
    meta = first.json()["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 20
    # Still there (Terminating), and an update does not remove it.
    assert http.get(f"{base}/bound").json()["metadata"]["deletionGracePeriodSeconds"] == 20
    patched = http.patch(
        f"{base}/bound",
        json={"metadata": {"labels": {"x": "y"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200 and http.get(f"{base}/bound").status_code == 200
    # A longer grace period does not extend it; a delete with grace 0 ends it.
    assert (
        http.request("DELETE", f"{base}/bound", json={"gracePeriodSeconds": 60}).json()["metadata"][
            "deletionGracePeriodSeconds"
        ]
        == 20
    )
    assert http.request("DELETE", f"{base}/bound", json={"gracePeriodSeconds": 0}).status_code == 200
    assert http.get(f"{base}/bound").status_code == 404
    # A pod no node runs is removed at once.
    assert http.post(base, json=_pod("unbound", None)).status_code == 201
    assert http.delete(f"{base}/unbound").status_code == 200
    assert http.get(f"{base}/unbound").status_code == 404


def test_events_are_served_by_both_apis(http: httpx.Client, namespace: str) -> None:
    created = http.post(
        f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
        json={
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "e1"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "example.com/ctl",
            "reportingInstance": "ctl-1",
            "action": "Sync",
            "reason": "Synced",
            "note": "all good",
            "type": "Normal",
            "regarding": {"kind": "Pod", "name": "p", "namespace": namespace},
        },
    )
    assert created.status_code == 201, created.text
    core = http.get(f"/api/v1/namespaces/{namespace}/events/e1").json()
    assert core["apiVersion"] == "v1" and core["message"] == "all good"
    assert core["involvedObject"]["name"] == "p" and core["reportingComponent"] == "example.com/ctl"
    listed = http.get(
        f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", params={"fieldSelector": "regarding.name=p"}
    ).json()
    assert [(e["metadata"]["name"], e["note"]) for e in listed["items"]] == [("e1", "all good")]
    by_core = http.get(
        f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": "involvedObject.name=p"}
    ).json()
    assert [e["metadata"]["name"] for e in by_core["items"]] == ["e1"]
