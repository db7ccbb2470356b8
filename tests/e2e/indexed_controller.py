"""A user's controller that reads through the informer indexes (the SDK of issue 49), for the test kit's test.

Each ConfigMap (the main resource) gets two annotations: how many Secrets it
controls (the ``owner`` index of the Secret store) and how many of those
carry ``tier: gold`` (its own index, declared in ``indexers``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from kubernetes import client as k8s

from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext
from controller_manager.indexer import IndexFunc
from controller_manager.resources import Resource

CONFIGMAPS = Resource("configmaps", "", "v1", "ConfigMap")
SECRETS = Resource("secrets", "", "v1", "Secret")


def tier(obj: dict[str, Any]) -> list[str]:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get("tier")
    return [value] if value else []


class SecretCounter(Controller):
    name: ClassVar[str] = "secretcount"
    main: ClassVar[Resource] = CONFIGMAPS
    dependents: ClassVar[tuple[Resource, ...]] = (SECRETS,)
    indexers: ClassVar[dict[Resource, dict[str, IndexFunc]]] = {SECRETS: {"tier": tier}}

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        self.core: Any = k8s.CoreV1Api(self.api)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        cm = self.rt.store(CONFIGMAPS).get(key)
        if cm is None:
            return
        uid = cm["metadata"]["uid"]
        secrets = self.rt.store(SECRETS)
        owned = secrets.by_owner(uid)
        gold = {s["metadata"]["name"] for s in secrets.by_index("tier", "gold")}
        want = {
            "owned-secrets": str(len(owned)),
            "gold-secrets": str(sum(s["metadata"]["name"] in gold for s in owned)),
        }
        have = cm["metadata"].get("annotations") or {}
        if all(have.get(k) == v for k, v in want.items()):
            return
        ns, name = key.split("/", 1)
        self.core.patch_namespaced_config_map(
            name,
            ns,
            {"metadata": {"annotations": want}},
            _content_type="application/merge-patch+json",
            _request_timeout=ctx.timeout(),
        )
