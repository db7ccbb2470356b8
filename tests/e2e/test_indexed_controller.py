"""The SDK's indexes from a user's controller, run by the test kit (issue 49).

``tests.e2e.indexed_controller.SecretCounter`` annotates each ConfigMap with
how many Secrets it controls (the ``owner`` index) and how many of them are
``tier: gold`` (its own index, declared in ``indexers``). Two real manager
processes share the ConfigMaps; the counts follow creations, relabelling and
deletions of the Secrets, i.e. the indexes are kept with every watch event.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from rangeshard.testing import Managers, TestCluster, wait_until

CONFIGMAPS = 6


def _secret(name: str, cm: Any, tier: str | None) -> dict[str, Any]:
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": cm.metadata.name, "uid": cm.metadata.uid}
    labels = {"tier": tier} if tier else {}
    return {"metadata": {"name": name, "labels": labels, "ownerReferences": [{**owner, "controller": True}]}}


def test_a_users_controller_counts_through_the_owner_index_and_its_own(
    rangeshard_cluster: TestCluster, rangeshard_namespace: str, rangeshard_managers: Any
) -> None:
    ns = rangeshard_namespace
    managers: Managers = rangeshard_managers("tests.e2e.indexed_controller:SecretCounter", n=2, workers=2)
    with rangeshard_cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        cms = [core.create_namespaced_config_map(ns, {"metadata": {"name": f"c{i}"}}) for i in range(CONFIGMAPS)]
        # ConfigMap i controls i Secrets; the even-numbered ones are gold.
        for i, cm in enumerate(cms):
            for j in range(i):
                core.create_namespaced_secret(ns, _secret(f"s{i}-{j}", cm, "gold" if j % 2 == 0 else None))

        def counts() -> dict[str, tuple[str | None, str | None]]:
            out = {}
            for c in core.list_namespaced_config_map(ns).items:
                a = c.metadata.annotations or {}
                out[c.metadata.name] = (a.get("owned-secrets"), a.get("gold-secrets"))
            return out

        want = {f"c{i}": (str(i), str((i + 1) // 2)) for i in range(CONFIGMAPS)}
        wait_until(lambda: {k: v for k, v in counts().items() if k in want} == want, 60, "every count")
        # Relabel one Secret gold, delete another: both indexes follow the watch events.
        core.patch_namespaced_secret("s5-1", ns, {"metadata": {"labels": {"tier": "gold"}}})
        core.delete_namespaced_secret("s4-0", ns)
        want |= {"c5": ("5", "4"), "c4": ("3", "1")}
        wait_until(lambda: {k: v for k, v in counts().items() if k in want} == want, 60, "the counts after changes")
    assert managers.assert_no_overlap() >= CONFIGMAPS
