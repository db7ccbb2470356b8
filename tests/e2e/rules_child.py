"""Unmodified controllers for the shard-rule tests: official Python client, no rangeshard import.

Each is level-triggered (list everything it may see, reconcile, repeat), as a
controller with informers and periodic resyncs behaves; a failed call (a
fenced write, a reset, a conflict) is printed and the loop goes on. The
instance id comes from ``RANGESHARD_INSTANCE_ID`` (set by the manager) and is
written into what the controller writes, so a test can see which instance wrote.

Modes (argv[1]), namespace or label in argv[2]:

``deploy NS``
    Deployment-like: for every Deployment in NS, one ReplicaSet ``<name>-rs``
    with a controller ownerReference to it and ``spec.replicas`` of the
    Deployment; the Deployment's ``status`` copies the ReplicaSet's
    ``status.replicas`` and its ``observedGeneration``; the annotation
    ``rules.test/by`` of the ReplicaSet names the writer, ``rules.test/version``
    its version (``RULES_VERSION``, default ``v1``: a canary runs ``v2``).
``replicaset NS``
    ReplicaSet-like: for every ReplicaSet in NS, pods with a controller
    ownerReference to it (adopting orphan pods whose labels match its selector
    first, deleting extra ones), and ``status.replicas`` /
    ``observedGeneration`` by a PUT of its status (a ReplicaSet of a
    Deployment: the write the fence used to refuse).
``tree LABEL``
    Reads two levels down (``deployments.apps`` by ``uid``,
    ``replicasets.apps`` by ``owner``, ``pods`` by ``root`` through
    ``replicasets.apps``): for every Deployment labelled ``tree=LABEL`` (any
    namespace), writes the number of pods it sees under it (through the
    ReplicaSets it sees) into the annotation ``rules.test/pods``, and marks
    each such pod with the annotation ``rules.test/tree`` (a pod write the
    fence judges by the Deployment's key). A ConfigMap ``tree-<instance>`` in
    LABEL's namespace counts the pods it sees and the *foreign* ones (whose
    chain does not lead to a Deployment it sees): always 0 if the proxy places
    pods with their Deployment.
``namespace LABEL``
    Namespace-sharded: for every ConfigMap labelled ``app=LABEL`` in any
    namespace, sets ``data.done`` to ``data.want`` and creates (once) a
    ConfigMap ``<name>-out`` beside it naming the writer.
"""

import os
import sys
import time

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

config.load_kube_config()
api = client.ApiClient()
apps = client.AppsV1Api(api)
core = client.CoreV1Api(api)
mode, arg = sys.argv[1], sys.argv[2]
me = os.environ.get("RANGESHARD_INSTANCE_ID", "?")
BY = "rules.test/by"
#: The "version" of this controller (``RULES_VERSION``, default v1): a canary runs another one.
VERSION = "rules.test/version"
version = os.environ.get("RULES_VERSION", "v1")


def controller_uid(obj):
    for ref in obj.metadata.owner_references or []:
        if ref.controller:
            return ref.uid
    return None


def owner_ref(kind, obj):
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def deploy_pass(ns):
    deployments = apps.list_namespaced_deployment(ns).items
    replicasets = apps.list_namespaced_replica_set(ns).items
    by_owner = {controller_uid(rs): rs for rs in replicasets}
    for d in deployments:
        rs = by_owner.get(d.metadata.uid)
        want = d.spec.replicas
        if rs is None:
            body = {
                "metadata": {
                    "name": f"{d.metadata.name}-rs",
                    "labels": {"app": d.metadata.name},
                    "annotations": {BY: me, VERSION: version},
                    "ownerReferences": [owner_ref("Deployment", d)],
                },
                "spec": {
                    "replicas": want,
                    "selector": {"matchLabels": {"app": d.metadata.name}},
                    "template": {
                        "metadata": {"labels": {"app": d.metadata.name}},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                    },
                },
            }
            apps.create_namespaced_replica_set(ns, body)
            continue
        if rs.spec.replicas != want:
            patch = {"metadata": {"annotations": {BY: me, VERSION: version}}, "spec": {"replicas": want}}
            apps.patch_namespaced_replica_set(rs.metadata.name, ns, patch)
        have = (rs.status.replicas or 0) if rs.status else 0
        status = d.status
        if status is None or status.observed_generation != d.metadata.generation or (status.replicas or 0) != have:
            body = {"status": {"observedGeneration": d.metadata.generation, "replicas": have}}
            apps.patch_namespaced_deployment_status(d.metadata.name, ns, body)


def replicaset_pass(ns):
    replicasets = apps.list_namespaced_replica_set(ns).items
    pods = core.list_namespaced_pod(ns).items
    for rs in replicasets:
        labels = rs.spec.selector.match_labels or {}
        mine = [p for p in pods if controller_uid(p) == rs.metadata.uid and p.metadata.deletion_timestamp is None]
        orphans = [
            p
            for p in pods
            if controller_uid(p) is None
            and p.metadata.deletion_timestamp is None
            and all((p.metadata.labels or {}).get(k) == v for k, v in labels.items())
        ]
        want = rs.spec.replicas or 0
        for p in orphans[: max(0, want - len(mine))]:  # adopt before creating
            refs = [*(p.metadata.owner_references or []), owner_ref("ReplicaSet", rs)]
            body = {"metadata": {"ownerReferences": refs, "resourceVersion": p.metadata.resource_version}}
            core.patch_namespaced_pod(p.metadata.name, ns, body)
            mine.append(p)
        created = deleted = 0
        for _ in range(want - len(mine)):
            body = {
                "metadata": {
                    "generateName": f"{rs.metadata.name}-",
                    "labels": dict(labels),
                    "ownerReferences": [owner_ref("ReplicaSet", rs)],
                },
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            core.create_namespaced_pod(ns, body)
            created += 1
        for p in mine[want:]:
            core.delete_namespaced_pod(p.metadata.name, ns)
            deleted += 1
        have = len(mine) + created - deleted
        status = rs.status
        if status is None or (status.replicas or 0) != have or status.observed_generation != rs.metadata.generation:
            # A full update of the status subresource (PUT), as client-go's UpdateStatus sends it.
            rs.status = client.V1ReplicaSetStatus(replicas=have, observed_generation=rs.metadata.generation)
            apps.replace_namespaced_replica_set_status(rs.metadata.name, ns, rs)


def namespace_pass(label):
    for cm in core.list_config_map_for_all_namespaces(label_selector=f"app={label}").items:
        ns, name, data = cm.metadata.namespace, cm.metadata.name, cm.data or {}
        if data.get("want") is not None and data.get("done") != data.get("want"):
            core.patch_namespaced_config_map(name, ns, {"data": {"done": data["want"], "by": me}})
        try:
            core.create_namespaced_config_map(
                ns, {"metadata": {"name": f"{name}-out", "labels": {"out": label}}, "data": {"by": me}}
            )
        except ApiException as e:
            if e.status != 409 or "already exists" not in str(e.body):
                raise


def tree_pass(label):
    deployments = apps.list_deployment_for_all_namespaces(label_selector=f"tree={label}").items
    replicasets = apps.list_replica_set_for_all_namespaces().items
    pods = core.list_pod_for_all_namespaces().items
    rs_owner = {rs.metadata.uid: controller_uid(rs) for rs in replicasets}
    mine = {d.metadata.uid: d for d in deployments}
    count = {uid: 0 for uid in mine}
    foreign = 0
    for p in pods:
        owner = controller_uid(p)
        top = rs_owner.get(owner) if owner is not None else None
        if top in mine:
            count[top] += 1
            if (p.metadata.annotations or {}).get("rules.test/tree") != me:
                body = {"metadata": {"annotations": {"rules.test/tree": me}}}
                core.patch_namespaced_pod(p.metadata.name, p.metadata.namespace, body)
        elif owner is not None and owner in rs_owner and rs_owner[owner] is None:
            pass  # a pod of an orphan ReplicaSet: its root is the ReplicaSet, none of our Deployments
        else:
            foreign += 1
    for uid, d in mine.items():
        if (d.metadata.annotations or {}).get("rules.test/pods") != str(count[uid]):
            body = {"metadata": {"annotations": {"rules.test/pods": str(count[uid]), BY: me}}}
            apps.patch_namespaced_deployment(d.metadata.name, d.metadata.namespace, body)
    seen = {"pods": str(sum(count.values())), "foreign": str(foreign)}
    name = f"tree-{me}"
    try:
        cm = core.read_namespaced_config_map(name, label)
        if cm.data != seen:
            core.patch_namespaced_config_map(name, label, {"data": seen})
    except ApiException as e:
        if e.status != 404:
            raise
        core.create_namespaced_config_map(label, {"metadata": {"name": name, "labels": {"tree": "seen"}}, "data": seen})


PASSES = {"deploy": deploy_pass, "replicaset": replicaset_pass, "namespace": namespace_pass, "tree": tree_pass}

while True:
    try:
        PASSES[mode](arg)
    except Exception as e:  # a fenced write (409), a reset, a conflict: the next pass tries again
        print(f"pass failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    time.sleep(0.3)
