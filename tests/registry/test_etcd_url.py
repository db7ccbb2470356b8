"""Every entry reads ``--etcd`` with the one grammar: a bare ``HOST:PORT`` is http, garbage exits 2 naming it.

Issue 40: ``rangeshard proxy --etcd 127.0.0.1:2379`` worked while ``rangeshard
controller-manager --etcd 127.0.0.1:2379`` exited 2. The commands that read the
registry run here against the session etcd; the servers run in this process up to
the point where they would start serving, where the etcd config they built is
captured and used against the session etcd.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import local_apiserver.app
import range_filter_proxy.app
from controller_manager.manager import ControllerManager
from rangeshard import dashboard
from rangeshard.cli.main import app
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry

ROOT = Path(__file__).resolve().parents[2]
CT = "urltest"
SERVERS = {
    "dashboard": ["dashboard"],
    "proxy": ["proxy", "--upstream", "http://127.0.0.1:1"],
    "local-apiserver": ["local-apiserver"],
    "controller-manager": ["controller-manager", "--config", str(ROOT / "config" / "local.yaml")],
}
READERS = {
    "registry list": ["registry", "list"],
    "registry dump": ["registry", "dump"],
    "rebalance show": ["rebalance", "show", "--type", CT],
    "rebalance plan": ["rebalance", "plan", "--type", CT],
    "hash --type": ["hash", "--type", CT, "x"],
}


class Captured(Exception):
    """Raised where a server command would start serving, carrying the etcd config it built."""

    def __init__(self, config: EtcdConfig) -> None:
        super().__init__("captured")
        self.config = config


@pytest.fixture
def bare(etcd_server: EtcdServer) -> str:
    return etcd_server.url.removeprefix("http://")


@pytest.fixture
def stop_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(config: EtcdConfig) -> Any:
        raise Captured(config)

    monkeypatch.setattr(dashboard, "serve", lambda config, **_: stop(config))
    monkeypatch.setattr(range_filter_proxy.app, "create_app", lambda _upstream, settings: stop(settings.fencing.etcd))
    monkeypatch.setattr(local_apiserver.app, "create_app", lambda config, **_: stop(config))

    def manager_stop(manager: ControllerManager) -> int:
        if manager.status is not None:
            manager.status.server.server_close()  # bound in the constructor
        for client in manager.api_clients:
            client.close()
        raise Captured(manager.etcd_config)

    monkeypatch.setattr(ControllerManager, "run_until_signal", manager_stop)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def answers(config: EtcdConfig) -> bool:
    with EtcdClient(config) as client:
        return client.revision() > 0


@pytest.mark.parametrize("command", READERS)
def test_registry_commands_take_a_bare_host_port(
    command: str, bare: str, etcd_client: EtcdClient, key_prefix: str, leases: Callable[[int], int]
) -> None:
    Registry(etcd_client, key_prefix).join(CT, "a", leases(30))
    result = invoke(*READERS[command], "--etcd", bare, "--prefix", key_prefix)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", SERVERS)
@pytest.mark.usefixtures("stop_servers")
def test_server_commands_take_a_bare_host_port(command: str, bare: str) -> None:
    result = invoke(*SERVERS[command], "--etcd", bare)
    assert isinstance(result.exception, Captured), result.output
    assert result.exception.config.urls == f"http://{bare}"
    assert answers(result.exception.config)


@pytest.mark.usefixtures("stop_servers")
def test_the_manager_config_file_takes_a_bare_host_port(bare: str, tmp_path: Path) -> None:
    path = tmp_path / "manager.yaml"
    path.write_text(f'etcd: {{endpoints: ["{bare}"]}}\ncontrollers: {{replicaset: }}\n')
    result = invoke("controller-manager", "--config", str(path))
    assert isinstance(result.exception, Captured), result.output
    assert result.exception.config.urls == f"http://{bare}"
    assert answers(result.exception.config)


@pytest.mark.parametrize("garbage", ["foo", "ftp://h:2379"])
@pytest.mark.parametrize("command", [*READERS, *SERVERS, "config file"])
def test_a_bad_endpoint_exits_2_naming_it(command: str, garbage: str, tmp_path: Path) -> None:
    if command == "config file":
        path = tmp_path / "manager.yaml"
        path.write_text(f'etcd: {{endpoints: ["{garbage}"]}}\ncontrollers: {{replicaset: }}\n')
        result = invoke("controller-manager", "--config", str(path))
    else:
        result = invoke(*{**READERS, **SERVERS}[command], "--etcd", garbage)
    assert result.exit_code == 2, result.output
    assert f"etcd endpoint '{garbage}': " in result.output and "Traceback" not in result.output
