"""A controller from a module that is not installed, loaded only through the manager config, run by the test kit.

The module is written to a temporary directory (outside the repository and
every installed distribution); the kit's managers find it through
``class: "module:Class"`` and the test process's ``sys.path``. It stamps
ConfigMaps, a built-in resource, which the informers list and watch over the
generic REST path with ``shardSelector``. And when a manager does not become
ready (its controller watches a resource nobody serves), the kit says why.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hashing import hash_key
from rangeshard.testing import Managers, TestCluster, wait_until

STAMPER = """
from typing import Any, ClassVar

from kubernetes import client as k8s

from controller_manager.controller import Controller, ReconcileContext
from controller_manager.resources import Resource

CONFIGMAPS = Resource("configmaps", "", "v1", "ConfigMap")


class ConfigMapStamper(Controller):
    name: ClassVar[str] = "cmstamper"
    main: ClassVar[Resource] = CONFIGMAPS

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        self.core: Any = k8s.CoreV1Api(self.api)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        cm = self.rt.store(CONFIGMAPS).get(key)
        if cm is None or (cm.get("metadata", {}).get("annotations") or {}).get("stamped") == "yes":
            return
        ns, name = key.split("/", 1)
        self.core.patch_namespaced_config_map(
            name, ns, {"metadata": {"annotations": {"stamped": "yes"}}},
            _content_type="application/merge-patch+json", _request_timeout=ctx.timeout(),
        )
"""


@pytest.fixture
def stamper_module(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "cmstamper_e2e.py").write_text(STAMPER)
    sys.path.insert(0, str(tmp_path))
    yield "cmstamper_e2e:ConfigMapStamper"
    sys.path.remove(str(tmp_path))


def test_uninstalled_controller_shards_configmaps(
    rangeshard_cluster: TestCluster, rangeshard_namespace: str, rangeshard_managers: Any, stamper_module: str
) -> None:
    managers: Managers = rangeshard_managers(stamper_module, n=2, workers=2)
    assert sorted(m.record.hash_key for m in managers.snapshot()) == [2**62 - 1, 2**63 - 1]
    with rangeshard_cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        for i in range(12):
            core.create_namespaced_config_map(rangeshard_namespace, {"metadata": {"name": f"c{i}"}})

        def stamped() -> bool:
            items = core.list_namespaced_config_map(rangeshard_namespace).items
            return len(items) == 12 and all((c.metadata.annotations or {}).get("stamped") == "yes" for c in items)

        wait_until(stamped, 60, "every ConfigMap stamped")
        uids = [c.metadata.uid for c in core.list_namespaced_config_map(rangeshard_namespace).items]
    assert managers.assert_no_overlap() >= 12
    # Each instance whose half holds a ConfigMap reconciled (one half holds none of 12 once in 2,048 runs).
    snapshot = managers.snapshot()
    owners = {m.instance_id for m in (snapshot.owner_of(hash_key(uid)) for uid in uids) if m is not None}
    assert owners <= {r.instance_id for r in managers.audit_records()} <= set(managers.states())
    assert owners


def test_wait_active_names_the_informer_that_keeps_a_manager_not_ready(rangeshard_managers: Any) -> None:
    """The kit's timeout says why first (as `rangeshard up` does): the informer and its error, then the log tails."""
    managers: Managers = rangeshard_managers("tests.e2e.unserved_controller:CertificateController", wait=False)
    (m,) = managers.processes
    reason = f"manager {m.name}: informer certificate-gizmos: 404 "
    wait_until(lambda: any(r.startswith(reason) for r in managers.not_ready()), 30, "the informer's error on /readyz")
    with pytest.raises(AssertionError) as caught:
        managers.wait_active(timeout=0.5)
    message = str(caught.value)
    assert message.startswith(reason), message
    assert "1 active certificate instance(s) not ready after 0.5s" in message
    assert message.index(reason) < message.index(f"--- {m.name} ---"), message  # the log tail follows the reason
