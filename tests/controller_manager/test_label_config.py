"""``by: label`` in the manager config: external ``shard[]`` and in-process ``shard`` entries, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller_manager.config import load_config
from hashing import ShardBy
from rangeshard.cli.main import app
from tests.controller_manager.test_config import problems_of, write


def test_an_in_process_controller_places_its_main_resource_by_a_label(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "controllers:\n  replicaset:\n    shard: [{resource: replicasets.apps, by: label, label: example.com/tenant}]\n",
    )
    cfg = load_config(path)
    (entry,) = cfg.controllers["replicaset"].shard
    assert (entry.resource, entry.rule, entry.label) == ("replicasets.apps", ShardBy.LABEL, "example.com/tenant")
    assert entry.path == "object.metadata.labels(example.com/tenant)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "replicaset: {shard: [{resource: replicasets.apps, by: label}]}",
            "controllers.replicaset.shard.0: label: required with by: label (the label key whose value places an "
            "object)",
        ),
        (
            "replicaset: {shard: [{resource: replicasets.apps, by: uid}]}",
            "controllers.replicaset.shard: [0].by: an in-process controller's rules are its own (main by uid, "
            "dependents by owner); only by: label may be set here, got by: uid",
        ),
        (
            "replicaset: {shard: [{resource: replicasets.apps, by: label, label: 'a b'}]}",
            "controllers.replicaset.shard.0.label: label key 'a b' is not a label key like tenant or "
            "tekton.dev/pipelineRun (optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.')",
        ),
        (
            "replicaset: {shard: [{resource: deployments.apps, by: label, label: tenant}]}",
            "controllers.replicaset: shard[0].resource: 'deployments.apps' is not read by ReplicaSetController "
            "(its main resource or dependents: pods, replicasets.apps)",
        ),
        (
            "g: {external: {command: [x], shard: [{resource: configmaps, by: uid, label: tenant}]}}",
            "controllers.g.external.shard.0: label: only for by: label (this entry is by: uid)",
        ),
        (
            "g: {external: {command: [x], shard: [{resource: configmaps}]}, shard: [{resource: c, by: label, label: t}]}",
            "controllers.g: shard: an external controller says it in external.shard",
        ),
    ],
)
def test_label_config_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, f"controllers:\n  {text}\n")
    found = problems_of(path)
    assert any(p.endswith(problem) for p in found), found


def test_a_bad_label_rule_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path, "controllers:\n  g: {external: {command: [x], shard: [{resource: configmaps, by: label}]}}\n"
    )
    result = CliRunner().invoke(app, ["controller-manager", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert "label: required with by: label" in result.output and "Traceback" not in result.output
