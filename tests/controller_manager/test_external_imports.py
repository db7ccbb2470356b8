"""An external-only manager loads only what it uses (issue 39): no official client, no in-process framework.

A manager with one ``external`` entry runs as the CLI runs it (in a subprocess,
``modules_child.py``) until it is ready; its ``sys.modules`` must hold none of
the ``kubernetes`` package, the controller framework (informers, workqueues,
controller classes), the other servers (FastAPI, uvicorn, the proxy, the
local API server) or the CLI's tables (rich). The same manager with an
in-process controller does load the official client: the check sees what it
looks for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import free_port

CHILD = Path(__file__).with_name("modules_child.py")
#: Modules (and their submodules) an external-only manager never loads.
NEVER = (
    "kubernetes",
    "urllib3",
    "controller_manager.controller",
    "controller_manager.controllers",
    "controller_manager.informer",
    "controller_manager.workqueue",
    "controller_manager.fencing",
    "range_filter_proxy",
    "local_apiserver",
    "fastapi",
    "starlette",
    "uvicorn",
    "rich",
)


def _modules(
    tmp_path: Path, etcd: EtcdServer, key_prefix: str, controllers: dict[str, Any], wait: float = 20.0
) -> dict[str, Any]:
    port = free_port("127.0.0.1")
    config = tmp_path / "manager.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "etcd": {"endpoints": [etcd.url]},
                "proxy": {"url": "http://127.0.0.1:9"},
                "registryPrefix": key_prefix,
                "metrics": {"host": "127.0.0.1", "port": port},
                "controllers": controllers,
            }
        )
    )
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-P", str(CHILD), str(config), str(port), str(out), str(wait)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.exists(), done.stdout + done.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _loaded(modules: list[str], prefix: str) -> list[str]:
    return [m for m in modules if m == prefix or m.startswith(prefix + ".")]


def test_an_external_only_manager_imports_no_kubernetes_client(
    tmp_path: Path, etcd_server: EtcdServer, key_prefix: str
) -> None:
    external = {"external": {"listen": "127.0.0.1:0", "shard": [{"resource": "configmaps", "by": "uid"}]}}
    result = _modules(tmp_path, etcd_server, key_prefix, {"gadget": external})
    assert result["ready"], "the manager became ready (its endpoint and registry ran)"
    loaded = {name: _loaded(result["modules"], name) for name in NEVER}
    assert {k: v for k, v in loaded.items() if v} == {}
    assert "controller_manager.external.endpoint" in result["modules"]


def test_a_manager_with_an_in_process_controller_still_loads_the_client(
    tmp_path: Path, etcd_server: EtcdServer, key_prefix: str
) -> None:
    # No proxy answers: it never gets ready, but the client is loaded when the manager is built.
    result = _modules(tmp_path, etcd_server, key_prefix, {"replicaset": {"workers": 1}}, wait=8.0)
    assert _loaded(result["modules"], "kubernetes"), "the check sees the client when it is there"
    assert "controller_manager.controller" in result["modules"]
