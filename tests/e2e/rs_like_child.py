"""An unmodified ReplicaSet-like controller: the official Python client, no rangeshard import.

It does what kube's replicaset controller does, the way client-go does it:
two informers (ReplicaSets, pods: list, then watch from the list's
resourceVersion; relist on a watch's ERROR or end, replacing the store), a
controller that starts once both listed, and a sync per ReplicaSet that
creates pods while it sees fewer than ``spec.replicas`` live pods it controls
and deletes the surplus, with expectations (a creation or deletion it made
and has not seen yet holds further syncs of that ReplicaSet).

The pod list is slower than the ReplicaSet list (``--pod-list-delay``, the
seconds it waits before every pod list: a bigger list, client-side
throttling): when both informers are reset at once, the ReplicaSets that moved
in are synced against a pod cache that does not hold their pods yet, and pods
are created that are not needed. Every create and delete is printed as
``ACTION create|delete <rs> <pod>`` on stdout.

With ``--streaming`` the informers use streaming lists instead (client-go's
WatchList): a watch with ``sendInitialEvents=true``, whose initial state ends
with the ``k8s.io/initial-events-end`` bookmark, after which the store is
replaced; a watch that ends resumes with a new streaming list from the last
resourceVersion seen.

Usage: rs_like_child.py NAMESPACE [--pod-list-delay SECONDS] [--streaming]
"""

import json
import os
import queue
import sys
import threading
import time

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

config.load_kube_config()
api = client.ApiClient()
core = client.CoreV1Api(api)
apps = client.AppsV1Api(api)
ns = sys.argv[1]
pod_delay = float(sys.argv[sys.argv.index("--pod-list-delay") + 1]) if "--pod-list-delay" in sys.argv else 0.0
streaming = "--streaming" in sys.argv
me = os.environ.get("RANGESHARD_INSTANCE_ID", "?")
work: "queue.Queue[str]" = queue.Queue()
lock = threading.Lock()
expect: dict[str, tuple[int, float]] = {}  # rs uid -> (outstanding creates/deletes, since)
EXPECT_TTL = 30.0


def controller_uid(obj):
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("uid")
    return None


def observed(rs_uid):
    with lock:
        n, since = expect.get(rs_uid, (0, 0.0))
        if n > 0:
            expect[rs_uid] = (n - 1, since)


class Informer(threading.Thread):
    """List, then watch from the list's resourceVersion; relist on an ERROR event or a watch's end."""

    def __init__(self, name, list_call, delay, on_change):
        super().__init__(name=name, daemon=True)
        self.list_call = list_call
        self.delay = delay
        self.on_change = on_change
        self.store = {}
        self.synced = threading.Event()

    def run(self):
        while True:
            try:
                if streaming:
                    self.stream()
                else:
                    self.list_and_watch()
            except Exception as e:  # a reset, a fenced write, the endpoint restarting: relist
                print(f"{self.name}: relisting after {type(e).__name__}: {str(e)[:100]}", flush=True)
                time.sleep(0.2)

    def list_and_watch(self):
        if self.delay:
            time.sleep(self.delay)
        resp = self.list_call(ns, _preload_content=False)
        doc = json.loads(resp.data)
        self.replace({o["metadata"]["uid"]: o for o in doc.get("items") or ()})
        rv = doc["metadata"]["resourceVersion"]
        resp = self.list_call(
            ns, watch=True, resource_version=rv, timeout_seconds=300, allow_watch_bookmarks=True, _preload_content=False
        )
        for line in iter_resp_lines(resp):
            ev = json.loads(line)
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":
                return
            if kind == "BOOKMARK":
                continue
            self.apply(kind, obj)

    def apply(self, kind, obj):
        """One watch event into the store, then to the handler."""
        uid = obj["metadata"]["uid"]
        with lock:
            if kind == "DELETED":
                self.store.pop(uid, None)
            else:
                self.store[uid] = obj
        self.on_change(kind, obj)

    def replace(self, items):
        with lock:
            old, self.store = self.store, items
        for uid, o in old.items():
            if uid not in items:
                self.on_change("DELETED", o)
        for o in items.values():
            self.on_change("SYNC", o)
        self.synced.set()

    def stream(self):
        """A streaming list: initial events up to the initial-events-end bookmark, then the watch goes on."""
        if self.delay:
            time.sleep(self.delay)
        resp = self.list_call(
            ns,
            watch=True,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            resource_version=getattr(self, "rv", "") or "",
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _preload_content=False,
        )
        initial = {}
        live = False
        for line in iter_resp_lines(resp):
            ev = json.loads(line)
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":
                return
            self.rv = (obj.get("metadata") or {}).get("resourceVersion") or getattr(self, "rv", "")
            if kind == "BOOKMARK":
                if (
                    not live
                    and ((obj.get("metadata") or {}).get("annotations") or {}).get("k8s.io/initial-events-end")
                    == "true"
                ):
                    live = True
                    self.replace(initial)
                continue
            if not live:
                initial[obj["metadata"]["uid"]] = obj
                continue
            self.apply(kind, obj)


def rs_changed(kind, rs):
    work.put(rs["metadata"]["uid"])


def pod_changed(kind, pod):
    owner = controller_uid(pod)
    if owner is None:
        return
    if kind in ("ADDED", "DELETED"):  # a creation or deletion seen (ours or not, as kube counts them)
        observed(owner)
    work.put(owner)


rs_informer = Informer("replicasets", apps.list_namespaced_replica_set, 0.0, rs_changed)
pod_informer = Informer("pods", core.list_namespaced_pod, pod_delay, pod_changed)


def sync(rs_uid):
    with lock:
        rs = rs_informer.store.get(rs_uid)
        if rs is None:
            expect.pop(rs_uid, None)
            return
        n, since = expect.get(rs_uid, (0, 0.0))
        if n > 0 and time.monotonic() - since < EXPECT_TTL:
            return  # a creation or deletion of ours not seen yet
        pods = [
            p
            for p in pod_informer.store.values()
            if controller_uid(p) == rs_uid and not p["metadata"].get("deletionTimestamp")
        ]
    name = rs["metadata"]["name"]
    diff = int((rs.get("spec") or {}).get("replicas") or 0) - len(pods)
    if diff > 0:
        with lock:
            expect[rs_uid] = (diff, time.monotonic())
        for _ in range(diff):
            body = {
                "metadata": {
                    "generateName": f"{name}-",
                    "labels": dict(((rs.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}),
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": name,
                            "uid": rs_uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            try:
                made = core.create_namespaced_pod(ns, body, _preload_content=False)
                print(f"ACTION create {name} {json.loads(made.data)['metadata']['name']} by {me}", flush=True)
            except Exception as e:
                observed(rs_uid)
                print(f"create for {name} failed: {str(e)[:100]}", flush=True)
    elif diff < 0:
        surplus = sorted(pods, key=lambda p: p["metadata"]["name"])[:-diff]
        with lock:
            expect[rs_uid] = (len(surplus), time.monotonic())
        for p in surplus:
            try:
                core.delete_namespaced_pod(p["metadata"]["name"], ns, _preload_content=False)
                print(f"ACTION delete {name} {p['metadata']['name']} by {me}", flush=True)
            except Exception as e:
                observed(rs_uid)
                print(f"delete for {name} failed: {str(e)[:100]}", flush=True)


def worker():
    rs_informer.synced.wait()
    pod_informer.synced.wait()  # client-go's WaitForCacheSync: at start only
    while True:
        uid = work.get()
        try:
            sync(uid)
        except Exception as e:
            print(f"sync failed: {type(e).__name__}: {str(e)[:100]}", flush=True)


rs_informer.start()
pod_informer.start()
threading.Thread(target=worker, daemon=True).start()
while True:
    time.sleep(3600)
