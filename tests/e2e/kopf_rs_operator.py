"""An ordinary kopf operator shaped as kube's replicaset controller, with no rangeshard import.

A kopf index holds the pods by their controller owner's uid; every event of a
ReplicaSet (the listing's too) syncs it: while the index holds fewer live pods
than ``spec.replicas``, it creates the missing ones, and deletes a surplus,
with expectations (a creation or deletion it made and has not seen in the
index yet holds further syncs of that ReplicaSet). Every create and delete is
printed as ``ACTION create|delete <rs> <pod>``.

Run: ``kopf run --standalone --namespace NS kopf_rs_operator.py`` (the manager
runs it with ``KUBECONFIG`` pointing at its endpoint).
"""

import os
import threading
import time

import kopf
import kubernetes

ME = os.environ.get("RANGESHARD_INSTANCE_ID", "unsharded")
EXPECT_TTL = 30.0
_lock = threading.Lock()
_expect: dict[str, tuple[int, float]] = {}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    kubernetes.config.load_kube_config()


def _controller_uid(meta: kopf.Meta) -> str | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


@kopf.index("pods")
def pods_by_owner(meta: kopf.Meta, name: str, **_: object) -> dict[str, str] | None:
    if meta.get("deletionTimestamp"):
        return None
    owner = _controller_uid(meta)
    return {owner: name} if owner else None


@kopf.on.event("pods")
def pod_seen(event: kopf.RawEvent, meta: kopf.Meta, **_: object) -> None:
    owner = _controller_uid(meta)
    if owner is None or event.get("type") not in ("ADDED", "DELETED"):
        return
    with _lock:
        n, since = _expect.get(owner, (0, 0.0))
        if n > 0:
            _expect[owner] = (n - 1, since)


@kopf.on.event("apps", "v1", "replicasets")
def sync(
    event: kopf.RawEvent, name: str, namespace: str, uid: str, spec: kopf.Spec, pods_by_owner: kopf.Index, **_: object
) -> None:
    if event.get("type") == "DELETED":
        return
    with _lock:
        n, since = _expect.get(uid, (0, 0.0))
        if n > 0 and time.monotonic() - since < EXPECT_TTL:
            return
    pods = sorted(pods_by_owner.get(uid, ()))
    diff = int(spec.get("replicas", 0)) - len(pods)
    v1 = kubernetes.client.CoreV1Api()
    if diff > 0:
        with _lock:
            _expect[uid] = (diff, time.monotonic())
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": True}
        labels = dict((spec.get("selector") or {}).get("matchLabels") or {})
        for _ in range(diff):
            body = {
                "metadata": {"generateName": f"{name}-", "labels": labels, "ownerReferences": [owner]},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            made = v1.create_namespaced_pod(namespace, body)
            print(f"ACTION create {name} {made.metadata.name} by {ME}", flush=True)
    elif diff < 0:
        with _lock:
            _expect[uid] = (-diff, time.monotonic())
        for pod in pods[:-diff]:
            v1.delete_namespaced_pod(pod, namespace)
            print(f"ACTION delete {name} {pod} by {ME}", flush=True)
