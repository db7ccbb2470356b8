"""`rangeshard up` as a user runs it: everything starts, kubectl works, Ctrl-C stops every child.

Also: a port conflict fails fast naming the port and its holder; ``up --detach``
with ``rangeshard status`` / ``rangeshard down``; kubectl paging through the proxy.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

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
        text = out.read_text()
        # the demo line reports what the API server holds, then `ready` once every component is healthy
        assert "demo: namespace 'demo' with 4 deployment(s): api (2/2 pods), cache (1/1 pods)" in text, text
        assert "10 pod(s) in total" in text
        assert text.index("demo: namespace") < text.index("ready:")

        # kubectl pages through the proxy's cache (limit/continue), and sees every pod once
        paged = subprocess.run(
            [
                *("kubectl", "--kubeconfig", str(kubeconfig), "--server", f"http://127.0.0.1:{ports[2]}"),
                *("get", "pods", "-n", "demo", "--chunk-size=3", "-o", "name", "-v=6"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert paged.returncode == 0, paged.stderr[-2000:]
        assert len(set(paged.stdout.split())) == 10
        assert "limit=3" in paged.stderr and "continue=" in paged.stderr

        # `status` sees the foreground `up` too
        status = run_cli_sync(["status", "--state-dir", str(state), "-o", "json"])
        assert status.returncode == 0, status.stdout
        assert all(c["healthy"] for c in json.loads(status.stdout)["components"])

        # a second `up` on the same ports fails at once, naming the ports and who holds them
        second = run_cli_sync(
            [
                *("up", "--state-dir", str(tmp_path / "other")),
                *("--etcd-port", str(ports[0]), "--apiserver-port", str(ports[1]), "--proxy-port", str(ports[2])),
            ]
        )
        assert second.returncode == 1, second.stdout + second.stderr
        for p in ports:
            assert f"port {p} " in second.stderr, second.stderr
        assert "etcd" in second.stderr and "local_apiserver" in second.stderr and "pid " in second.stderr
        assert "ready" not in second.stdout
        assert not (tmp_path / "other").exists(), "nothing may be started before every port is checked"
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, out.read_text()[-2000:]
    text = out.read_text()
    assert "stopped" in text
    # stdout is not a terminal: one line per registry change, never the whole table again and again
    changes = [line for line in text.splitlines() if line.startswith("registry: ")]
    joined = [line for line in changes if " joined, " in line]
    assert {line.split()[1] for line in joined} == {"replicaset", "deployment"}, text[-3000:]
    assert len({line.split()[2] for line in joined}) == 4, changes  # two managers, two controller types each
    assert all(" range " in line and "(revision " in line for line in changes), changes
    assert "INSTANCE" not in text and "RANGE START" not in text  # no registry table
    assert len(changes) < 60, changes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(port_open(p) for p in ports):
        time.sleep(0.1)
    assert not any(port_open(p) for p in ports), "a child process survived `up`"
    assert (state / "etcd").is_dir(), "etcd data must be kept"
    assert not (state / "up.json").exists()


def run_cli_sync(args: list[str], timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a child, waited for, with stdout and stderr kept apart.

    With ``cwd`` it is run as a user runs it, by the console script, from that directory.
    """
    command = (
        [str(Path(sys.executable).parent / "rangeshard")] if cwd else [sys.executable, "-m", "rangeshard.cli.main"]
    )
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=cwd,
    )


def shadowing_directory(tmp_path: Path) -> Path:
    """A directory holding a clone-like ``rangeshard/`` (no ``__init__.py``), as the parent of a clone does."""
    parent = tmp_path / "work"
    (parent / "rangeshard").mkdir(parents=True)
    (parent / "rangeshard" / "README.md").write_text("a clone of rangeshard\n")
    return parent


def in_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    """A light command (status, down) run in this process by typer's CliRunner."""
    from rangeshard.cli.main import app  # noqa: PLC0415

    result = CliRunner().invoke(app, args)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_port_in_use_fails_fast_naming_the_port_and_holder(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        state = tmp_path / "state"
        result = run_cli_sync(
            ["up", "--state-dir", str(state), "--apiserver-port", str(port), "--etcd-port", "0", "--proxy-port", "0"]
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"port {port} (local API server, --apiserver-port) is in use by pid {os.getpid()}" in result.stderr
    assert "ready" not in result.stdout and not state.exists()


def test_up_detach_status_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # Started from the directory that holds the clone: the children must still import the installed packages.
    up = run_cli_sync(
        [
            *("up", "--detach", "--managers", "1", "--state-dir", str(state)),
            *("--config", str(REPO / "config" / "local.yaml")),
            *("--etcd-port", "0", "--apiserver-port", "0", "--proxy-port", "0"),
        ],
        timeout=150,
        cwd=shadowing_directory(tmp_path),
    )
    recorded = json.loads((state / "up.json").read_text()) if (state / "up.json").exists() else None
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ready:" in up.stdout
        assert recorded is not None and recorded["detached"] is True
        kinds = sorted(c["kind"] for c in recorded["components"])
        assert kinds == ["apiserver", "etcd", "manager", "proxy"]
        # The config for managers started by hand (examples/widgets/README.md): this up's etcd and proxy.
        from controller_manager.config import load_config  # noqa: PLC0415

        extra = load_config(state / "manager.yaml")
        proxy_url = next(c["url"] for c in recorded["components"] if c["kind"] == "proxy")
        etcd_url = next(c["url"] for c in recorded["components"] if c["kind"] == "etcd")
        assert extra.proxy.url == proxy_url and list(extra.etcd.endpoints) == [etcd_url]
        assert extra.metrics is not None and extra.metrics.port == 0
        assert "more managers" in up.stdout and "manager.yaml" in up.stdout
        ports = [c["port"] for c in recorded["components"]]
        assert all(port_open(p) for p in ports), "`up --detach` must leave everything running"

        status = in_process(["status", "--state-dir", str(state)])
        assert status.returncode == 0, status.stdout
        for name in ("etcd", "local API server", "proxy", "manager m0"):
            assert name in status.stdout
        # The README's next lines after `up --etcd-port 0`: etcd (and the proxy) from the state dir, no --etcd.
        listed = run_cli_sync(["registry", "list", "--state-dir", str(state), "-o", "wide"])
        assert listed.returncode == 0 and "m0-replicaset" in listed.stdout, listed.stdout + listed.stderr
        assert "progress: unknown" not in listed.stdout and "no proxy known" not in listed.stdout, listed.stdout
        shown = run_cli_sync(["rebalance", "show", "--state-dir", str(state), "--type", "replicaset"])
        assert shown.returncode == 0, shown.stderr

        proxy = next(c for c in recorded["components"] if c["kind"] == "proxy")
        os.kill(proxy["pid"], signal.SIGKILL)
        wait_until(lambda: not port_open(proxy["port"]), 10, "the killed proxy's port to close")
        broken = in_process(["status", "--state-dir", str(state), "-o", "json"])
        assert broken.returncode == 1
        health = {c["name"]: c["healthy"] for c in json.loads(broken.stdout)["components"]}
        assert health == {"etcd": True, "local API server": True, "proxy": False, "manager m0": True}
    finally:
        down = run_cli_sync(["down", "--state-dir", str(state)], timeout=90)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped manager m0" in down.stdout and "stopped etcd" in down.stdout
    if recorded is not None:
        assert not any(port_open(c["port"]) for c in recorded["components"])
    again = in_process(["down", "--state-dir", str(state)])
    assert again.returncode == 0 and "nothing to stop" in again.stdout
    assert in_process(["status", "--state-dir", str(state)]).returncode == 3
    assert (state / "etcd").is_dir(), "etcd data must be kept"


def test_a_child_that_cannot_start_fails_up_at_once(tmp_path: Path) -> None:
    """`kopf` not on PATH: up names the command and why within seconds, not after its 90 s wait."""
    state = tmp_path / "state"
    config = tmp_path / "op.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "etcd": {"endpoints": ["http://127.0.0.1:2379"]},
                "proxy": {"url": "http://127.0.0.1:8001"},
                "metrics": {"host": "127.0.0.1", "port": 0},
                "controllers": {
                    "gadget": {
                        "external": {
                            "command": ["kopf-not-on-path", "run", "operator.py"],
                            "shard": [{"resource": "configmaps", "by": "uid"}],
                        }
                    }
                },
            }
        )
    )
    t0 = time.monotonic()
    up = run_cli_sync(
        [
            *("up", "--managers", "1", "--state-dir", str(state), "--config", str(config)),
            *("--etcd-port", "0", "--apiserver-port", "0", "--proxy-port", "0"),
        ],
        timeout=120,
    )
    took = time.monotonic() - t0
    assert up.returncode == 1, up.stdout + up.stderr
    assert "cannot start 'kopf-not-on-path': not found" in up.stderr, up.stderr
    assert took < 60, f"up took {took:.0f}s to say it"
