"""Output that means what it says (issue 48, item 6): n/a without cost data, one metric per sentence,
``rebalance apply`` waits for the instances to republish (or says the figure is pending)."""

from __future__ import annotations

import json
import threading

from hashing import MAX_HASH
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry
from registry.apply import wait_republished
from tests.registry.test_cli_papercuts import _put, cli

CT = "gadget"


def test_show_says_n_a_without_cost_data(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    _put(etcd_client, key_prefix, CT, "a", MAX_HASH // 2, 10)
    _put(etcd_client, key_prefix, CT, "b", MAX_HASH, 30)
    common = ["--type", CT, "--etcd", etcd_server.url, "--prefix", key_prefix]
    shown = cli("rebalance", "show", *common)
    assert shown.returncode == 0, shown.stderr
    assert "n/a (no reconcile time published) (measured cost)" in shown.stdout, shown.stdout
    assert "1.00 (measured cost)" not in shown.stdout and "0.0%" not in shown.stdout.split("OBJECTS")[-1]
    rows = [line for line in shown.stdout.splitlines() if line.startswith("│")]
    assert rows and all(line.rstrip("│ ").endswith("n/a") for line in rows), shown.stdout
    doc = json.loads(cli("rebalance", "show", *common, "--json").stdout)
    assert doc["costMaxOverMean"] is None and {i["costShare"] for i in doc["instances"]} == {None}
    assert doc["maxOverMean"] == 1.5


def test_plan_by_range_says_one_metric_per_sentence(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str
) -> None:
    _put(etcd_client, key_prefix, CT, "a", MAX_HASH // 4, 50)
    _put(etcd_client, key_prefix, CT, "b", MAX_HASH, 50)
    plan = cli("rebalance", "plan", "--type", CT, "--by", "range", "--etcd", etcd_server.url, "--prefix", key_prefix)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    ranges = [line for line in lines if line.startswith("Key ranges:")]
    objects = [line for line in lines if line.startswith("Objects:")]
    assert ranges == ["Key ranges: max/mean 1.50 -> 1.00."], plan.stdout
    assert len(objects) == 1 and "Key ranges" not in objects[0], plan.stdout
    assert not any("Key ranges" in line and "Objects" in line for line in lines)


def test_apply_waits_for_the_instances_to_republish(etcd_client: EtcdClient, key_prefix: str) -> None:
    reg = Registry(etcd_client, key_prefix)
    lease = etcd_client.grant_lease(30)
    for iid in ("a", "b"):
        reg.join(CT, iid, lease)
    assert wait_republished(reg, CT, 0.3) is False, "nobody heartbeated: pending"

    def heartbeat() -> None:
        for iid in ("a", "b"):
            reg.heartbeat(CT, iid, lease, workload_num=7)

    beat = threading.Timer(0.2, heartbeat)
    beat.start()
    try:
        assert wait_republished(reg, CT, 10) is True
    finally:
        beat.cancel()
    assert {m.record.workload_num for m in reg.snapshot(CT).members} == {7}
