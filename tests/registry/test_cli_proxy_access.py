"""The CLI reaches a secured proxy and finds etcd and the proxy without flags (issue 48, items 2 and 3).

A stand-in proxy whose ``/metrics`` wants a bearer token (as ``--auth-mode
delegate`` does); the registry is real. ``registry list``, ``status`` and the
``ProxyAccess`` the dashboard uses send the token of ``--token-file`` or of
``--kubeconfig``'s current user; without one they say what to give. A manager
publishes its proxy in its record (``proxyUrl``), so instances started by hand
are measured without ``--proxy``. Every command that needs etcd reads it from
``--state-dir`` when ``--etcd`` is not given (after ``up --etcd-port 0``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rangeshard.cli.main import app
from rangeshard.cli.progress import ProgressUnavailable, ProxyAccess, fetch
from rangeshard.cli.statefile import Component, UpState, write_state
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import process_start_time
from registry import Registry
from tests.helpers import MetricsServer, progress_metrics
from tests.registry.test_cli_papercuts import Ran
from tests.registry.test_cli_papercuts import cli as run

CT = "gadget"
TOKEN = "sa-token-for-the-proxy"
METRICS = progress_metrics((CT, "a", 3, 4.0, 60.0))


def _cells(table: str) -> dict[str, str]:
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]
    return {row[0]: row[-1] for row in rows}


def _kubeconfig(path: Path, token: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://kube.example:6443"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def _state_with_etcd(state: Path, etcd_url: str) -> None:
    me = os.getpid()
    etcd = Component(
        name="etcd", kind="etcd", pid=me, startTime=process_start_time(me), port=None, url=etcd_url, healthUrl=None
    )
    write_state(state, UpState(upPid=me, detached=True, components=[etcd]))


def test_registry_list_and_status_send_the_proxy_token(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str, tmp_path: Path
) -> None:
    Registry(etcd_client, key_prefix).join(CT, "a", etcd_client.grant_lease(30))
    base = ("registry", "list", "--etcd", etcd_server.url, "--prefix", key_prefix, "--state-dir", str(tmp_path))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with MetricsServer(METRICS, token=TOKEN) as proxy:
        without = run(*base, "-o", "wide", "--proxy", proxy.url)
        assert without.returncode == 0, without.stderr
        assert "answered 401: give --token-file FILE or --kubeconfig FILE" in without.stdout, without.stdout

        with_token = run(*base, "-o", "wide", "--proxy", proxy.url, "--token-file", str(token_file))
        assert _cells(with_token.stdout)["a"] == "waiting: 3 unanswered, oldest 4s", with_token.stdout

        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", TOKEN)
        as_json = json.loads(run(*base, "-o", "json", "--proxy", proxy.url, "--kubeconfig", str(kubeconfig)).stdout)
        assert as_json[0]["progress"]["unreconciled"] == 3

        wrong = _kubeconfig(tmp_path / "wrong", "another-token")
        assert "answered 401" in run(*base, "-o", "wide", "--proxy", proxy.url, "--kubeconfig", str(wrong)).stdout

        both = run(*base, "-o", "wide", "--proxy", proxy.url, "--kubeconfig", str(kubeconfig), "--token-file", "x")
        assert both.returncode == 2 and "--token-file and --kubeconfig" in both.stderr

        # status, managers started by hand (no up): --proxy and a token file; or the proxy their files record.
        hand = tmp_path / "hand"
        (hand / "managers").mkdir(parents=True)
        me = os.getpid()
        record = {"name": "manager x (by hand)", "kind": "manager", "pid": me, "startTime": process_start_time(me)}
        (hand / "managers" / "x.json").write_text(json.dumps({**record, "port": None, "url": None}))
        status = run("status", "--state-dir", str(hand), "--proxy", proxy.url, "--token-file", str(token_file))
        assert status.returncode == 0 and "waiting: 3 unanswered, oldest 4s" in status.stdout, status.stdout
        (hand / "managers" / "x.json").write_text(
            json.dumps({**record, "port": None, "url": None, "proxyUrl": proxy.url})
        )
        status = run("status", "--state-dir", str(hand), "--token-file", str(token_file))
        assert status.returncode == 0 and "waiting: 3 unanswered, oldest 4s" in status.stdout, status.stdout


def test_fetch_reads_credentials_each_time(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    with MetricsServer(METRICS, token=TOKEN) as proxy:
        access = ProxyAccess(proxy.url, token_file=str(token_file))
        with pytest.raises(ProgressUnavailable, match="cannot read"):
            fetch(access)
        token_file.write_text("old")
        with pytest.raises(ProgressUnavailable, match="401"):
            fetch(access)
        token_file.write_text(TOKEN)  # rotated: the next read sends the new one
        assert fetch(access)[(CT, "a")].unreconciled == 3


def test_instances_publish_their_proxy(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str, tmp_path: Path
) -> None:
    with MetricsServer(METRICS) as proxy:
        Registry(etcd_client, key_prefix).join(CT, "a", etcd_client.grant_lease(30), proxy_url=proxy.url)
        wide = run(
            "registry",
            "list",
            "--etcd",
            etcd_server.url,
            "--prefix",
            key_prefix,
            "--state-dir",
            str(tmp_path),
            "-o",
            "wide",
        )
        assert _cells(wide.stdout)["a"] == "waiting: 3 unanswered, oldest 4s", wide.stdout


def test_commands_read_etcd_from_the_state_dir(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str, tmp_path: Path
) -> None:
    """After `up --etcd-port 0`: registry list, rebalance, hash --type find etcd in the state dir."""
    Registry(etcd_client, key_prefix).join(CT, "a", etcd_client.grant_lease(30))
    _state_with_etcd(tmp_path, etcd_server.url)

    def cli(*args: str, **env: str) -> Ran:
        """In this process, with neither RANGESHARD_ETCD nor RANGESHARD_STATE_DIR unless given."""
        unset: dict[str, str | None] = {"RANGESHARD_ETCD": None, "RANGESHARD_STATE_DIR": None}
        result = CliRunner().invoke(app, list(args), env={**unset, **env})
        return Ran(result.exit_code, result.stdout, result.stderr)

    here = ("--prefix", key_prefix, "--state-dir", str(tmp_path))
    listed = cli("registry", "list", *here)
    assert listed.returncode == 0 and "a" in _cells(listed.stdout), listed.stdout + listed.stderr
    shown = cli("rebalance", "show", *here, "--type", CT)
    assert shown.returncode == 0, shown.stderr
    hashed = cli("hash", "x", "--type", CT, *here)
    assert hashed.returncode == 0 and hashed.stdout.split()[-1] == "a", hashed.stdout + hashed.stderr
    # RANGESHARD_STATE_DIR works as --state-dir does.
    by_env = cli("registry", "list", "--prefix", key_prefix, RANGESHARD_STATE_DIR=str(tmp_path))
    assert by_env.returncode == 0 and "a" in _cells(by_env.stdout), by_env.stderr
    # --etcd still wins over the state dir.
    wrong = cli("registry", "list", *here, "--etcd", "http://127.0.0.1:9")
    assert wrong.returncode == 1 and "127.0.0.1:9" in wrong.stderr, wrong.stderr
