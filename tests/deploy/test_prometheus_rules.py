"""deploy/prometheus-rules: the alert rules of docs/operations.md as a PrometheusRule component.

Rendered with ``kubectl kustomize`` beside the base (another namespace); its
rules are exactly those of docs/operations.md; ``kubectl apply
--dry-run=server`` then a real apply against a local API server that serves
the Prometheus Operator's PrometheusRule CRD (tests/fixtures/crds, its
published rule fields) with strict field validation, as the overlays are
(tests/deploy/test_server_apply.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from local_apiserver.process import LocalApiServerProcess
from tests.deploy.conftest import Kubectl
from tests.deploy.test_manifests import DEPLOY, kustomize
from tests.deploy.test_server_apply import apply

REPO = DEPLOY.parent
CRD = REPO / "tests" / "fixtures" / "crds" / "prometheusrules.yaml"


def _rendered(tmp: Path) -> list[dict[str, Any]]:
    up = Path(os.path.relpath(DEPLOY, tmp))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "monitoring-test",
        "resources": [str(up / "base")],
        "components": [str(up / "prometheus-rules")],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return [d for d in yaml.safe_load_all(kustomize(tmp)) if d]


def _documented_groups() -> list[dict[str, Any]]:
    text = (REPO / "docs" / "operations.md").read_text()
    block = re.search(r"Prometheus alert rules.*?```yaml\n(.*?)```", text, re.S)
    assert block is not None, "docs/operations.md lost its alert rules"
    return list(yaml.safe_load(block.group(1))["groups"])


def test_the_component_holds_the_documented_rules(tmp_path: Path) -> None:
    docs = _rendered(tmp_path)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring-test"
    assert rule["spec"]["groups"] == _documented_groups()
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert "RangeshardInstanceStuck" in alerts and len(alerts) == len(set(alerts)) == 4


def test_the_component_is_accepted_by_an_api_server(
    tmp_path: Path, kubectl: Kubectl, server: LocalApiServerProcess
) -> None:
    crd = kubectl("apply", "-f", str(CRD))
    assert crd.returncode == 0, crd.stderr
    kubectl("wait", "--for=condition=Established", "crd/prometheusrules.monitoring.coreos.com", "--timeout=30s")
    out = apply(kubectl, server.url, _rendered(tmp_path))
    assert "prometheusrule.monitoring.coreos.com/rangeshard" in out
    # The check has teeth: a misspelt rule field is refused.
    bad = _rendered(tmp_path)
    for d in bad:
        if d["kind"] == "PrometheusRule":
            d["spec"]["groups"][0]["rules"][0]["fore"] = "1m"
    refused = kubectl("apply", "--dry-run=server", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in bad))
    assert refused.returncode != 0 and "fore" in refused.stderr, (refused.stdout, refused.stderr)
