"""`rangeshard up` as a user runs it: everything starts, kubectl works, Ctrl-C stops every child."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from rangeshard.core.process import free_port
from tests.helpers import run_cli, wait_until

REPO = Path(__file__).resolve().parents[2]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_up_demo_kubectl_and_clean_stop(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    state = tmp_path / "state"
    out = tmp_path / "up.out"
    proc = run_cli(
        [
            *("up", "--demo", "--managers", "2", "--state-dir", str(state)),
            *("--config", str(REPO / "config" / "local.yaml")),
            *("--etcd-port", str(ports[0]), "--apiserver-port", str(ports[1]), "--proxy-port", str(ports[2])),
        ],
        out,
        env={"COLUMNS": "200"},
    )
    try:
        wait_until(lambda: "demo: namespace" in out.read_text(), 120, "up to be ready and create the demo")
        kubeconfig = state / "kubeconfig"

        def demo_pods() -> int:
            result = subprocess.run(
                ["kubectl", "--kubeconfig", str(kubeconfig), "get", "pods", "-n", "demo", "-o", "json"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if result.returncode != 0:
                return -1
            # Ready pods: up runs the local API server with a simulated node.
            return sum(
                1
                for pod in json.loads(result.stdout)["items"]
                if pod["status"].get("phase") == "Running"
                and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
            )

        wait_until(lambda: demo_pods() == 10, 60, "the demo deployments' 10 pods Running and Ready")
        assert all(port_open(p) for p in ports)
        # Write fencing is on and the API server's audit log attributes the managers' writes.
        events = [json.loads(x) for x in (state / "apiserver-audit.jsonl").read_text().splitlines() if x.endswith("}")]
        agents = {e["userAgent"] for e in events if e["verb"] == "create" and e["responseStatus"]["code"] == 201}
        assert any(a.startswith("rangeshard-controller-manager/") and "; epoch " in a for a in agents), agents
        metrics = httpx.get(f"http://127.0.0.1:{ports[2]}/metrics", timeout=10).text
        checks = [line for line in metrics.splitlines() if line.startswith("range_filter_proxy_fencing_checks_total")]
        assert checks and float(checks[0].split()[-1]) > 0, metrics[-2000:]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, out.read_text()[-2000:]
    assert "stopped" in out.read_text()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(port_open(p) for p in ports):
        time.sleep(0.1)
    assert not any(port_open(p) for p in ports), "a child process survived `up`"
    assert (state / "etcd").is_dir(), "etcd data must be kept"
