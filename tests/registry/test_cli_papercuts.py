"""CLI paper cuts (issue 15): --min-gain, unknown --type, invalid --etcd, uncut tables, help flags, hash --type."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from hashing import MAX_HASH, hash_key
from rangeshard.cli.main import app
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry
from tests.registry.test_cli import run

CT = "replicaset"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: dict[str, str] | None = None) -> Ran:
    """The CLI in this process (much faster than a child; the child form is covered by ``run``)."""
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def _put(client: EtcdClient, prefix: str, ctype: str, instance: str, key: int, workload: int) -> None:
    record = {"hashKey": key, "state": "active", "workloadNum": workload}
    client.put(f"{prefix}/controllers/{ctype}/{instance}", json.dumps(record))


def test_plan_below_min_gain_proposes_nothing_and_apply_says_so(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str
) -> None:
    # 52% / 48% of the space holding 520 / 480 objects: max/mean 1.04, an even split would gain 0.04.
    _put(etcd_client, key_prefix, CT, "a", (MAX_HASH // 100) * 52, 520)
    _put(etcd_client, key_prefix, CT, "b", MAX_HASH, 480)
    common = ["--type", CT, "--by", "range", "--etcd", etcd_server.url, "--prefix", key_prefix]
    plan = cli("rebalance", "plan", *common, "--json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert doc["moves"] == [] and doc["belowMinGain"] is True and doc["minGain"] == 0.05
    assert 0.03 < doc["predictedGain"] < 0.05
    text = cli("rebalance", "plan", *common)
    assert "nothing to move" in text.stdout and "--min-gain" in text.stdout
    applied = cli("rebalance", "apply", *common, "--yes")
    assert applied.returncode == 0, applied.stderr
    assert "nothing applied" in applied.stdout and "below --min-gain" in applied.stdout
    assert Registry(etcd_client, key_prefix).snapshot(CT).get("a").record.hash_key == (MAX_HASH // 100) * 52  # type: ignore[union-attr]
    # With a lower threshold the same registry gets a plan.
    eager = json.loads(cli("rebalance", "plan", *common, "--json", "--min-gain", "0.01").stdout)
    assert len(eager["moves"]) == 1 and eager["belowMinGain"] is False
    bad = cli("rebalance", "plan", *common, "--min-gain", "-1")
    assert bad.returncode == 2 and "--min-gain" in bad.stderr


def test_unknown_type_exits_2(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    _put(etcd_client, key_prefix, CT, "a", MAX_HASH, 0)
    where = ["--etcd", etcd_server.url, "--prefix", key_prefix]
    for args in (
        ["rebalance", "plan", "--type", "nosuch"],
        ["rebalance", "apply", "--type", "nosuch", "--yes"],
        ["rebalance", "show", "--type", "nosuch"],
        ["registry", "list", "--type", "nosuch"],
        ["hash", "--type", "nosuch", "x"],
    ):
        result = cli(*args, *where)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "nosuch" in result.stderr and f"known: {CT}" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["registry", "list"],
        ["rebalance", "plan", "--type", CT],
        ["hash", "--type", CT, "x"],
        ["dashboard"],
        ["local-apiserver"],
        ["controller-manager", "--config", "config/local.yaml"],
    ],
)
def test_invalid_etcd_url_exits_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--etcd", "foo"])
    assert result.exit_code == 2, result.output
    assert "foo" in result.output and ("not a valid URL" in result.output or "scheme" in result.output)


def test_hash_type_names_the_owning_instance(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    half = MAX_HASH // 2
    _put(etcd_client, key_prefix, CT, "low", half, 0)
    _put(etcd_client, key_prefix, CT, "high", MAX_HASH, 0)
    values = ["a", "foobar", "uid-1", "uid-2"]
    result = run("hash", "--type", CT, *values, "--etcd", etcd_server.url, "--prefix", key_prefix)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines == [[str(hash_key(v)), "low" if hash_key(v) <= half else "high"] for v in values]
    # without --type the output is unchanged: one key per line, no etcd needed
    plain = run("hash", "a")
    assert plain.stdout.split() == [str(hash_key("a"))]


def test_tables_keep_whole_ids_when_piped(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    long_id = "m1-deployment-" + "x" * 70
    _put(etcd_client, key_prefix, "deployment", long_id, MAX_HASH, 3)
    where = ["--etcd", etcd_server.url, "--prefix", key_prefix]
    table = run("registry", "list", *where, env={"COLUMNS": "80"})  # a real pipe
    assert table.returncode == 0 and long_id in table.stdout, table.stdout
    assert "…" not in table.stdout
    wide = cli("registry", "list", "-o", "wide", *where)
    assert long_id in wide.stdout and "HOST" in wide.stdout and "LEASE" in wide.stdout
    as_json = json.loads(cli("registry", "list", "-o", "json", *where).stdout)
    assert [r["instanceId"] for r in as_json] == [long_id]
    shown = cli("rebalance", "show", "--type", "deployment", *where, env={"COLUMNS": "80"})
    assert long_id in shown.stdout


@pytest.mark.parametrize(
    "args",
    [[], ["hash"], ["registry", "list"], ["rebalance", "plan"], ["rebalance", "apply"], ["up"], ["status"]],
)
def test_help_renders_flags_as_flags(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "<list[" not in result.output, result.output
    assert "--help" in result.output


def test_plan_by_cost_for_a_type_without_reconcile_times_says_so_in_one_line(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str
) -> None:
    """External controllers publish no cost histogram: ``--by cost`` says the type has none and suggests workload."""
    _put(etcd_client, key_prefix, "gadgets", "a", MAX_HASH // 2, 17)
    _put(etcd_client, key_prefix, "gadgets", "b", MAX_HASH, 6)
    result = cli(
        "rebalance", "plan", "--type", "gadgets", "--by", "cost", "--etcd", etcd_server.url, "--prefix", key_prefix
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    assert "gadgets: this controller type has no reconcile times" in result.stderr
    assert "use --by workload" in result.stderr and "older managers" not in result.stderr
