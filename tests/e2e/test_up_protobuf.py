"""kubectl's ``create`` generators (protobuf bodies) against ``rangeshard up``, as a tutorial's first commands run.

``kubectl create namespace|configmap|secret generic|deployment`` with ``up``'s kubeconfig (the local API server),
and one through the proxy (its write fence reads the protobuf envelope and forwards the bytes); the Deployment
created from protobuf is reconciled by up's controllers to Ready pods.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from rangeshard.core.process import free_port
from tests.helpers import missing_prerequisite, run_cli, wait_until
from tests.local_apiserver.conftest import KUBECTL

REPO = Path(__file__).resolve().parents[2]


def test_kubectl_create_generators_against_up(tmp_path: Path) -> None:
    if KUBECTL is None:
        missing_prerequisite("kubectl is not installed")
    ports = [free_port() for _ in range(3)]
    state = tmp_path / "state"
    out = tmp_path / "up.out"
    proc = run_cli(
        [
            *("up", "--managers", "1", "--state-dir", str(state), "--config", str(REPO / "config" / "local.yaml")),
            *("--etcd-port", str(ports[0]), "--apiserver-port", str(ports[1]), "--proxy-port", str(ports[2])),
        ],
        out,
        env={"COLUMNS": "200"},
    )
    home = tmp_path / "home"
    home.mkdir()

    def kubectl(*args: str, server: str | None = None) -> subprocess.CompletedProcess[str]:
        target = ("--server", server) if server else ()
        result = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(state / "kubeconfig"), *target, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result

    def get(*args: str) -> Any:
        return json.loads(kubectl("get", *args, "-o", "json").stdout)

    try:
        wait_until(lambda: "ready:" in out.read_text(), 120, "up to be ready")
        assert "namespace/tutorial created" in kubectl("create", "namespace", "tutorial").stdout
        kubectl("create", "configmap", "settings", "-n", "tutorial", "--from-literal=mode=fast")
        kubectl("create", "secret", "generic", "creds", "-n", "tutorial", "--from-literal=password=s3cr3t")
        kubectl("create", "deployment", "web", "-n", "tutorial", "--image=nginx:1.27", "--replicas=2", "--port=80")
        proxy = f"http://127.0.0.1:{ports[2]}"
        kubectl("create", "configmap", "via-proxy", "-n", "tutorial", "--from-literal=a=b", server=proxy)

        assert get("namespace", "tutorial")["status"]["phase"] == "Active"
        assert get("configmap", "settings", "-n", "tutorial")["data"] == {"mode": "fast"}
        assert get("configmap", "via-proxy", "-n", "tutorial")["data"] == {"a": "b"}
        secret = get("secret", "creds", "-n", "tutorial")
        assert base64.b64decode(secret["data"]["password"]) == b"s3cr3t"
        deployment = get("deployment", "web", "-n", "tutorial")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"] == [
            {"containerPort": 80, "protocol": "TCP"}
        ]

        def ready_pods() -> int:
            pods = get("pods", "-n", "tutorial", "-l", "app=web")["items"]
            return sum(
                1
                for p in pods
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            )

        wait_until(lambda: ready_pods() == 2, 60, "the protobuf-created deployment's 2 pods Ready")
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, out.read_text()[-2000:]
