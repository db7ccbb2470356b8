"""``rangeshard deploy rbac --config FILE``: the proxy's read RBAC, generated from a manager config, is least privilege.

The output is parsed as YAML and checked for exactly the verbs (list, watch)
and resources (external entries' shard resources, in-process controllers'
main and dependent resources, ``--unsharded`` ones) grouped by API group, no
wildcards, a binding of exactly that role to the proxy's ServiceAccount; a
bad config exits 2 with ``FILE: field: problem``; the files checked in under
``deploy/`` are what the command prints today.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rangeshard.cli import deploy_cmds
from tests.deploy.test_manifests import DEPLOY, ROOT

HEADER = """\
etcd: {endpoints: ["http://rangeshard-etcd:2379"]}
proxy: {url: "http://rangeshard-proxy:8001"}
"""


def run(*args: str) -> Any:
    return CliRunner().invoke(deploy_cmds.app, ["rbac", *args])


def generate(tmp_path: Path, controllers: str, *args: str) -> list[dict[str, Any]]:
    config = tmp_path / "manager.yaml"
    config.write_text(HEADER + controllers)
    result = run("--config", str(config), *args)
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    out: set[tuple[str, str, str]] = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"only groups, resources, verbs: {rule}"
        assert len(rule["apiGroups"]) == 1, "one rule per API group"
        for field in ("apiGroups", "resources", "verbs"):
            assert not any("*" in x for x in rule[field]), f"wildcard in {rule}"
        assert not any("/" in r for r in rule["resources"]), f"no subresources: {rule}"
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def role_and_binding(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    assert [d["kind"] for d in docs] == ["ClusterRole", "ClusterRoleBinding"]
    role, binding = docs
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["metadata"]["name"] == role["metadata"]["name"]
    return role, binding


def reads(*resources: tuple[str, str]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r in resources for v in ("list", "watch")}


def test_builtin_controllers_read_their_main_and_dependent_resources(tmp_path: Path) -> None:
    docs = generate(tmp_path, "controllers: {replicaset: {workers: 2}, deployment: {}}\n")
    role, binding = role_and_binding(docs)
    assert granted(role) == reads(("", "pods"), ("apps", "replicasets"), ("apps", "deployments"))
    # Grouped by API group, core first, resources sorted.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["list", "watch"]},
    ]
    assert role["metadata"]["name"] == "rangeshard-proxy-deployment-replicaset"
    # No namespace on the subject: the kustomization's `namespace:` sets it.
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rangeshard-proxy"}]


def test_one_builtin_controller(tmp_path: Path) -> None:
    role, _ = role_and_binding(generate(tmp_path, "controllers: {replicaset: {}}\n"))
    assert granted(role) == reads(("", "pods"), ("apps", "replicasets"))


def test_external_crd_resource_gets_its_own_api_group(tmp_path: Path) -> None:
    docs = generate(
        tmp_path,
        """\
controllers:
  gadget:
    external:
      shard:
        - {resource: gadgets.bars.example.org, by: uid}
        - {resource: configmaps, by: owner}
        - {resource: deployments.v1.apps, by: namespace}
""",
    )
    role, _ = role_and_binding(docs)
    assert granted(role) == reads(("bars.example.org", "gadgets"), ("", "configmaps"), ("apps", "deployments"))
    crd_rules = [r for r in role["rules"] if "gadgets" in r["resources"]]
    assert crd_rules == [{"apiGroups": ["bars.example.org"], "resources": ["gadgets"], "verbs": ["list", "watch"]}]
    assert role["metadata"]["name"] == "rangeshard-proxy-gadget"


def test_a_user_controller_class_and_an_external_one(tmp_path: Path) -> None:
    pytest.importorskip("widgetctl", reason="examples/widgets is installed by scripts/test.sh")
    docs = generate(
        tmp_path,
        """\
controllers:
  widget: {class: "widgetctl:WidgetController"}
  gadget:
    external:
      shard: [{resource: gadgets.bars.example.org}]
""",
    )
    role, _ = role_and_binding(docs)
    assert granted(role) == reads(("example.com", "widgets"), ("", "configmaps"), ("bars.example.org", "gadgets"))
    assert role["metadata"]["name"] == "rangeshard-proxy-gadget-widget"


def test_options(tmp_path: Path) -> None:
    docs = generate(
        tmp_path,
        "controllers: {replicaset: {}}\n",
        "--namespace",
        "ops",
        "--name",
        "proxy-reads",
        "--service-account",
        "my-proxy",
        "--unsharded",
        "customresourcedefinitions.apiextensions.k8s.io,namespaces",
        "--unsharded",
        "pods",
    )
    role, binding = role_and_binding(docs)
    assert role["metadata"]["name"] == "proxy-reads"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "my-proxy", "namespace": "ops"}]
    assert granted(role) == reads(
        ("", "pods"),
        ("", "namespaces"),
        ("apps", "replicasets"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    )


@pytest.mark.parametrize(
    ("controllers", "problem"),
    [
        ("controllers: {gadget: {external: {shard: []}}}\n", ": controllers.gadget.external.shard: "),
        ("controllers: {gadget: {external: {shard: [{resource: Gadgets}]}}}\n", ".shard.0.resource: "),
        ("controllers: {nope: {}}\n", ": controllers.nope: unknown controller"),
        ("controllers: {}\n", ": controllers: at least one controller is required"),
        ("etcd: [\n", ": invalid YAML"),
    ],
)
def test_bad_config_exits_2_naming_file_and_field(tmp_path: Path, controllers: str, problem: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(HEADER + controllers)
    result = run("--config", str(config))
    assert result.exit_code == 2, result.output
    assert result.stdout == "", "nothing on stdout: a pipe into kubectl apply gets nothing"
    assert f"error: {config}" in result.stderr and problem in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_missing_file_and_bad_unsharded_exit_2(tmp_path: Path) -> None:
    result = run("--config", str(tmp_path / "none.yaml"))
    assert result.exit_code == 2 and f"error: {tmp_path / 'none.yaml'}: cannot read" in result.stderr
    config = tmp_path / "manager.yaml"
    config.write_text(HEADER + "controllers: {replicaset: {}}\n")
    result = run("--config", str(config), "--unsharded", "Pods,secrets")
    assert result.exit_code == 2 and "error: --unsharded: 'Pods': not a resource name" in result.stderr


def test_the_command_of_the_cli(tmp_path: Path) -> None:
    """Registered as ``rangeshard deploy rbac``; a bad config exits 2 there too."""
    exe = shutil.which("rangeshard", path=str(Path(sys.executable).parent))
    assert exe is not None
    config = tmp_path / "manager.yaml"
    config.write_text(HEADER + "controllers: {replicaset: {}, deployment: {}}\n")
    ok = subprocess.run([exe, "deploy", "rbac", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    role, _ = role_and_binding([d for d in yaml.safe_load_all(ok.stdout) if d])
    assert granted(role) == reads(("", "pods"), ("apps", "replicasets"), ("apps", "deployments"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEADER + "controllers: {replicaset: {workers: 0}}\n")
    r = subprocess.run([exe, "deploy", "rbac", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"error: {bad}: controllers.replicaset.workers: " in r.stderr, r.stderr


@pytest.mark.parametrize("path", ["builtin-controllers/proxy-rbac.yaml", "external-sidecar/proxy-rbac.yaml"])
def test_checked_in_files_are_the_commands_output(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each generated file names its command in its header; run from the repository root, it prints the file."""
    text = (DEPLOY / path).read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("# Generated by: ")]
    argv = shlex.split(line.removeprefix("# Generated by: "))
    assert argv[:3] == ["rangeshard", "deploy", "rbac"]
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(deploy_cmds.app, argv[2:])
    assert result.exit_code == 0, result.output
    assert result.stdout == text, f"{path} is stale: run `{line.removeprefix('# Generated by: ')} > deploy/{path}`"
    # ... from the manager config of its own directory (the one its component mounts).
    (config,) = [argv[i + 1] for i, a in enumerate(argv) if a == "--config"]
    assert Path(config) == Path("deploy") / Path(path).parent / "manager.yaml"


def test_a_kopf_command_without_crd_read_access_is_warned(tmp_path: Path) -> None:
    """kopf lists and watches the CRDs through the proxy: without --unsharded for them, a 403 loop."""
    config = tmp_path / "manager.yaml"
    config.write_text(
        HEADER
        + """\
controllers:
  gadget:
    external:
      command: ["/venv/bin/kopf", "run", "--standalone", "operator.py"]
      shard: [{resource: gadgets.bars.example.org, by: uid}]
  other:
    external:
      command: ["python", "-m", "kopf", "run", "other.py"]
      shard: [{resource: widgets.bars.example.org, by: uid}]
  plain:
    external:
      command: ["./controller"]
      shard: [{resource: configmaps, by: uid}]
"""
    )
    warned = run("--config", str(config))
    assert warned.exit_code == 0, warned.output
    assert "warning: gadget, other run kopf" in warned.stderr, warned.stderr
    assert "--unsharded customresourcedefinitions.apiextensions.k8s.io" in warned.stderr
    assert "warning" not in warned.stdout, "the YAML stays clean for a pipe"
    fine = run("--config", str(config), "--unsharded", "customresourcedefinitions.apiextensions.k8s.io")
    assert fine.exit_code == 0 and "warning" not in fine.stderr, fine.stderr
    assert not deploy_cmds.runs_kopf(["./controller", "--kopf-like-flag"])
    assert deploy_cmds.runs_kopf(["sh", "-c", "exec kopf run op.py"])


def test_the_deployment_controller_alone_reads_its_pods_two_levels_down(tmp_path: Path) -> None:
    # Its pods are chained (by their root through ReplicaSets): the proxy lists and watches them too.
    role, _ = role_and_binding(generate(tmp_path, "controllers: {deployment: {}}\n"))
    assert granted(role) == reads(("apps", "deployments"), ("apps", "replicasets"), ("", "pods"))


def test_the_via_kinds_of_a_root_rule_are_read(tmp_path: Path) -> None:
    # The proxy caches the via kinds to place the objects, and reads a write's owners by name when it fences it.
    docs = generate(
        tmp_path,
        """\
controllers:
  deploys:
    external:
      shard:
        - {resource: deployments.apps, by: uid}
        - {resource: pods, by: root, via: [replicasets.apps]}
""",
    )
    role, _ = role_and_binding(docs)
    assert granted(role) == reads(("apps", "deployments"), ("", "pods"), ("apps", "replicasets"))
    assert all(set(rule["verbs"]) == {"list", "watch"} for rule in role["rules"])
