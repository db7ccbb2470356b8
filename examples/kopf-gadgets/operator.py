"""An ordinary kopf operator, with no rangeshard import: every Gadget owns a ConfigMap.

For each Gadget it keeps a ConfigMap ``<gadget>-gadget`` (owned by the Gadget, so
Kubernetes collects it) whose ``data.size`` is the Gadget's ``spec.size`` and
whose ``data.by`` names the instance that wrote it (``RANGESHARD_INSTANCE_ID``
when run by a rangeshard manager; the operator knows nothing else of
sharding). Having handled a Gadget, it writes ``status.observedGeneration``
(the generation it handled), as Kubernetes controllers do: that is how
anybody, the rangeshard proxy included, tells an answered change from one
still waiting. ``spec.work`` makes the handler burn that many milliseconds of CPU,
``spec.sleepMs`` wait that long (the bench's CPU- and I/O-bound handlers).

Run it unsharded with ``kopf run --standalone --all-namespaces operator.py``;
sharded, the manager runs that same command (see ``rangeshard.yaml``).
"""

import os
import time

import kopf
import kubernetes

ME = os.environ.get("RANGESHARD_INSTANCE_ID", "unsharded")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    settings.posting.enabled = False  # no k8s Events per handler run
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    settings.watching.server_timeout = 60
    kubernetes.config.load_kube_config()  # KUBECONFIG: the manager's endpoint when sharded


def _burn(ms: int) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


@kopf.on.create("bars.example.org", "v1", "gadgets", backoff=1)
@kopf.on.update("bars.example.org", "v1", "gadgets", field="spec", backoff=1)
@kopf.on.resume("bars.example.org", "v1", "gadgets", backoff=1)
def reconcile(
    spec: kopf.Spec, name: str, namespace: str, body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, **_: object
) -> None:
    _burn(int(spec.get("work", 0)))
    time.sleep(int(spec.get("sleepMs", 0)) / 1000)
    data = {"size": str(spec.get("size", 0)), "by": ME}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-gadget"}, "data": data}
    kopf.adopt(cm, owner=body)
    v1 = kubernetes.client.CoreV1Api()
    try:
        current = v1.read_namespaced_config_map(f"{name}-gadget", namespace)
    except kubernetes.client.ApiException as e:
        if e.status != 404:
            raise
        v1.create_namespaced_config_map(namespace, cm)
    else:
        if (current.data or {}).get("size") != data["size"]:
            v1.patch_namespaced_config_map(f"{name}-gadget", namespace, {"data": data})
    # Answered: kopf applies this patch once the handler succeeded (through /status: the CRD has it).
    patch.status["observedGeneration"] = meta.get("generation")
