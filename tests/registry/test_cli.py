"""The `rangeshard` CLI as a user runs it (real processes, real etcd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hashing import MAX_HASH, hash_key
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import free_port, popen
from registry import Registry

CT = "deployment"


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def test_hash_command() -> None:
    result = run("hash", "a", "foobar")
    assert result.returncode == 0
    assert result.stdout.split() == [str(hash_key("a")), str(hash_key("foobar"))]
    assert result.stdout.split() == [str(0xAF63DC4C8601EC8C >> 1), str(0x85944171F73967E8 >> 1)]


def test_registry_list_json_and_table(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    reg = Registry(etcd_client, key_prefix)
    lease = etcd_client.grant_lease(30)
    reg.join(CT, "alpha", lease)
    reg.join(CT, "beta", lease)
    # A record written by hand (as with etcdctl): no lease, no timestamps.
    etcd_client.put(f"{key_prefix}/controllers/other/manual", json.dumps({"hashKey": 5, "state": "active"}))
    result = run("registry", "list", "--json", "--etcd", etcd_server.url, "--prefix", key_prefix)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    by_id = {d["instanceId"]: d for d in data}
    assert set(by_id) == {"alpha", "beta", "manual"}
    for d in data:
        assert {
            "controllerType",
            "instanceId",
            "state",
            "isLocked",
            "hashKey",
            "rangeStart",
            "rangeEnd",
            "workloadNum",
            "ttlSeconds",
        } <= set(d)
    assert by_id["beta"]["rangeStart"] == 0 and by_id["beta"]["rangeEnd"] == 4611686018427387903
    assert by_id["alpha"]["rangeStart"] == 4611686018427387904 and by_id["alpha"]["rangeEnd"] == MAX_HASH
    assert by_id["beta"]["isLocked"] is True and by_id["beta"]["state"] == "locked"
    assert 0 < by_id["alpha"]["ttlSeconds"] <= 30
    assert by_id["manual"]["ttlSeconds"] is None and by_id["manual"]["rangeEnd"] == MAX_HASH
    only = run("registry", "list", "--json", "--type", "other", "--etcd", etcd_server.url, "--prefix", key_prefix)
    assert [d["instanceId"] for d in json.loads(only.stdout)] == ["manual"]

    table = run("registry", "list", "--etcd", etcd_server.url, "--prefix", key_prefix, env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    for text in ("alpha", "beta", "manual", "50.00%", "locked", "4611686018427387904"):
        assert text in table.stdout

    dump = run("registry", "dump", "--etcd", etcd_server.url, "--prefix", key_prefix)
    assert dump.returncode == 0
    assert f"{key_prefix}/controllers/{CT}/alpha" in dump.stdout and "lease none" in dump.stdout


def test_registry_list_watch_redraws(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    with popen(
        [
            sys.executable,
            "-m",
            "rangeshard.cli.main",
            "registry",
            "list",
            "--watch",
            "--json",
            "--etcd",
            etcd_server.url,
            "--prefix",
            key_prefix,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        _watch_until_join(proc, etcd_client, key_prefix)


def _watch_until_join(proc: subprocess.Popen[str], etcd_client: EtcdClient, key_prefix: str) -> None:
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["instances"] == []
        lease = etcd_client.grant_lease(30)
        Registry(etcd_client, key_prefix).join(CT, "watched", lease)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            update = json.loads(proc.stdout.readline())
            if update["instances"]:
                assert update["instances"][0]["instanceId"] == "watched"
                break
        else:
            pytest.fail("no redraw after a join")
    finally:
        proc.terminate()
        proc.wait(10)


def test_unreachable_etcd_is_a_clear_error() -> None:
    port = free_port()
    result = run("registry", "list", "--etcd", f"http://127.0.0.1:{port}")
    assert result.returncode == 1
    assert "etcd unreachable" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["registry", "list", "--etcd", "ftp://x:1"], "scheme must be http or https"),
        (["registry", "list", "--etcd", "http://127.0.0.1:99999"], "etcd endpoint"),
        (["registry", "list", "--type", "Bad/Type"], "--type"),
        (["--log-level", "loud", "hash", "x"], "unknown level"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_env_var_endpoint(etcd_server: EtcdServer, key_prefix: str) -> None:
    result = run("registry", "list", "--json", "--prefix", key_prefix, env={"RANGESHARD_ETCD": etcd_server.url})
    assert result.returncode == 0 and json.loads(result.stdout) == []
