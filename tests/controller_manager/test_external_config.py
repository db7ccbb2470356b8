"""The ``external:`` controller entry: its config errors (exit 2, ``FILE: field.path: problem``) and path parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller_manager.config import ExternalSection, load_config
from hashing import NAMESPACE_PATH, OWNER_PATH, UID_PATH, ShardBy
from rangeshard.core.errors import ConfigError
from rangeshard.core.relay import json_accept as _json_accept
from rangeshard.core.rest import parse_rest_path

HEAD = """
etcd: {endpoints: ["http://127.0.0.1:2379"]}
proxy: {url: "http://127.0.0.1:8001"}
controllers:
"""


def _load(tmp_path: Path, controllers: str) -> object:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + controllers)
    return load_config(path)


def test_a_valid_external_entry(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        """
  gadget:
    external:
      command: ["kopf", "run", "--standalone", "op.py"]
      listen: 127.0.0.1:0
      shard:
      - {resource: gadgets.bars.example.org, by: uid}
      - {resource: configmaps, by: owner}
      drainSeconds: 2
  replicaset: {}
""",
    )
    ext = cfg.controllers["gadget"].external  # type: ignore[attr-defined]
    assert ext is not None and ext.command[0] == "kopf" and ext.drain_seconds == 2.0
    assert [(s.resource, s.by) for s in ext.shard] == [("gadgets.bars.example.org", "uid"), ("configmaps", "owner")]
    assert cfg.controllers["replicaset"].external is None  # type: ignore[attr-defined]


def test_a_sidecar_has_no_command(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "  g:\n    external:\n      shard: [{resource: configmaps}]\n")
    ext = cfg.controllers["g"].external  # type: ignore[attr-defined]
    assert ext.command is None and ext.listen == "127.0.0.1:0" and ext.shard[0].by == "uid"


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        (
            "  g:\n    workers: 2\n    external: {shard: [{resource: configmaps}]}\n",
            "controllers.g: external excludes workers",
        ),
        (
            '  g:\n    class: "a:B"\n    external: {shard: [{resource: configmaps}]}\n',
            "controllers.g: external excludes class",
        ),
        ("  g:\n    external: {shard: []}\n", "controllers.g.external.shard:"),
        ("  g:\n    external: {}\n", "controllers.g.external.shard:"),
        ("  g:\n    external: {listen: nope, shard: [{resource: configmaps}]}\n", "controllers.g.external.listen:"),
        ("  g:\n    external: {listen: '1.2.3.4:70000', shard: [{resource: configmaps}]}\n", "external.listen:"),
        ("  g:\n    external: {shard: [{resource: ConfigMaps}]}\n", "controllers.g.external.shard.0.resource:"),
        ("  g:\n    external: {shard: [{resource: configmaps, by: name}]}\n", "controllers.g.external.shard.0.by:"),
        (
            "  g:\n    external: {shard: [{resource: configmaps}, {resource: configmaps}]}\n",
            "listed twice",
        ),
        ("  g:\n    external: {command: [], shard: [{resource: configmaps}]}\n", "controllers.g.external.command:"),
        ("  g:\n    external: {drainSeconds: -1, shard: [{resource: configmaps}]}\n", "external.drainSeconds:"),
        ("  g:\n    external: {shard: [{resource: configmaps}], extra: 1}\n", "external.extra: unknown field"),
    ],
)
def test_bad_external_entries(tmp_path: Path, entry: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, entry)
    text = "\n".join(info.value.problems)
    assert needle in text, text
    assert str(tmp_path / "m.yaml") in text


def test_the_cli_exits_2_with_file_field_problem(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + "  g:\n    workers: 3\n    external: {shard: [{resource: configmaps}]}\n")
    out = subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "controller-manager", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"{path}: controllers.g: external excludes workers" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/namespaces/a/configmaps", ("configmaps", True)),
        ("/api/v1/configmaps", ("configmaps", True)),
        ("/api/v1/namespaces/a/configmaps/x", ("configmaps", False)),
        ("/api/v1/namespaces/a/pods/x/status", ("pods", False)),
        ("/api/v1/namespaces", ("namespaces", True)),
        ("/api/v1/namespaces/a", ("namespaces", False)),
        ("/apis/bars.example.org/v1/namespaces/a/gadgets", ("gadgets.bars.example.org", True)),
        ("/apis/apps/v1/deployments", ("deployments.apps", True)),
        ("/apis/apps/v1/namespaces/a/deployments/d/scale", ("deployments.apps", False)),
        ("/api", None),
        ("/apis/apps/v1", None),
        ("/version", None),
        ("/healthz", None),
    ],
)
def test_resource_of(path: str, expected: tuple[str, bool] | None) -> None:
    parsed = parse_rest_path(path)  # what the endpoint classifies a request by
    assert (None if parsed is None else (parsed.gvr.label, parsed.collection)) == expected


def test_paths_and_accept() -> None:
    assert {r.value: r.path for r in ShardBy if r is not ShardBy.LABEL} == {
        "uid": UID_PATH,
        "owner": OWNER_PATH,
        "namespace": NAMESPACE_PATH,
        "root": "object.metadata.ownerReferences.root.uid",
    }
    client_go = "application/vnd.kubernetes.protobuf, application/json"
    assert _json_accept(client_go) == "application/json"
    assert _json_accept("application/vnd.kubernetes.protobuf") == "application/json"


def test_by_root_through_via_kinds() -> None:
    """``{resource: pods, by: root, via: [replicasets.apps]}``: the root path names the via kinds."""
    section = ExternalSection.model_validate(
        {
            "shard": [
                {"resource": "deployments.apps", "main": True},
                {"resource": "pods", "by": "root", "via": ["replicasets.v1.apps"]},
                {"resource": "jobs.batch", "by": "root"},
            ]
        }
    )
    pods, jobs = section.shard[1], section.shard[2]
    assert pods.rule is ShardBy.ROOT and pods.via == ["replicasets.apps"]
    assert pods.path == "object.metadata.ownerReferences.root(replicasets.apps).uid"
    assert jobs.path == "object.metadata.ownerReferences.root.uid"  # no via: the controller owner, else itself
    assert section.shard[0].path == UID_PATH
    for bad, message in (
        ({"resource": "pods", "by": "owner", "via": ["replicasets.apps"]}, "only for by: root"),
        ({"resource": "pods", "by": "root", "via": ["ReplicaSets"]}, "lowercase"),
        ({"resource": "pods", "by": "root", "via": ["replicasets.apps", "replicasets.v1.apps"]}, "listed twice"),
        ({"resource": "pods", "by": "root", "via": ["pods"]}, "cannot pass through itself"),
    ):
        with pytest.raises(ValueError, match=message):
            ExternalSection.model_validate({"shard": [bad]})
