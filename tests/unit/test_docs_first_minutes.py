"""The docs a new user follows say what the first ten minutes need (issue 48, item 8).

Each line here was missing and cost a tester time: the KCM section's flags for
the cluster's own controller manager (and the garbage collector kept there),
probe examples on loopback, every ``X-Rangeshard-Shard-By`` value, the worked
client-go CRD -> Deployment example, the namespace step before a server-side
dry run, the rotated audit logs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _read(path: str) -> str:
    return (ROOT / path).read_text()


def test_kcm_section_says_what_to_turn_off_and_what_to_keep() -> None:
    text = _read("docs/external-controllers.md")
    section = text.split("## Kubernetes' own controllers", 1)[1].split("\n## ", 1)[0]
    assert "--controllers=*,-replicaset-controller,-deployment-controller" in section
    assert "garbage collector" in section and "garbage-collector-controller" in section


def test_probe_examples_bind_loopback() -> None:
    text = _read("docs/external-controllers.md")
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        if "livenessProbe" in block or "--liveness" in block or "probe-bind" in block:
            assert "0.0.0.0" not in block, block
    kcm = text.split("### kube-controller-manager", 1)[1].split("\n## ", 1)[0]
    assert "--bind-address=127.0.0.1" in kcm


def test_every_shard_by_value_is_listed() -> None:
    for path in ("docs/reliability.md", "docs/proxy.md"):
        assert "X-Rangeshard-Shard-By: uid|owner|namespace|root" in _read(path), path


def test_a_client_go_crd_to_deployment_example() -> None:
    text = _read("docs/external-controllers.md")
    section = text.split("## A client-go CRD controller that creates Deployments", 1)[1].split("\n## ", 1)[0]
    assert "{resource: deployments.apps, by: owner}" in section and "by: uid}" in section
    assert "What it can be measured by" in section and "What it cannot be measured by" in section
    assert "observedGeneration" in section


def test_the_deploy_table_has_the_namespace_step() -> None:
    text = _read("deploy/README.md")
    pick = text.split("## Pick a use", 1)[1].split("\n## ", 1)[0]
    step = pick.index("kubectl create namespace")
    assert step < pick.index("--dry-run=server") < pick.index("| you want |")


def test_the_readme_says_audit_takes_rotated_files() -> None:
    line = next(x for x in _read("README.md").splitlines() if "--apiserver-audit" in x)
    assert "audit-<timestamp>.log" in line and "time order" in line and "FILE..." in line
