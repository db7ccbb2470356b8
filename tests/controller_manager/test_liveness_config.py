"""``external.livenessProbe`` in the manager config (issue 38, item 1): the kubelet's spelling and defaults.

Every problem is a ``FILE: field.path: problem`` line (exit 2 from the CLI);
a probe on a sidecar entry (no ``command``) is refused with a pointer to the
pod manifest, where the kubelet probes the sidecar.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller_manager.config import ExternalSection, ManagerConfig, load_config
from rangeshard.core.errors import ConfigError

HEAD = """
etcd: {endpoints: ["http://127.0.0.1:2379"]}
proxy: {url: "http://127.0.0.1:8001"}
controllers:
  g:
    external:
      shard: [{resource: configmaps}]
"""
COMMAND = '      command: ["kopf", "run", "--standalone", "op.py"]\n'


def _write(tmp_path: Path, probe: str, *, command: bool = True) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + (COMMAND if command else "") + "      livenessProbe:\n" + probe)
    return path


def _external(cfg: ManagerConfig) -> ExternalSection:
    ext = cfg.controllers["g"].external
    assert ext is not None
    return ext


def test_an_http_probe_spelled_as_in_a_pod_spec(tmp_path: Path) -> None:
    probe = """        httpGet: {path: /healthz, port: 8080, host: localhost, scheme: HTTPS,
                  httpHeaders: [{name: X-Probe, value: "1"}]}
        initialDelaySeconds: 5
        periodSeconds: 7
        timeoutSeconds: 2
        failureThreshold: 4
        successThreshold: 1
"""
    p = _external(load_config(_write(tmp_path, probe))).liveness_probe
    assert p is not None and p.exec_ is None and p.http_get is not None
    assert (p.http_get.path, p.http_get.port, p.http_get.host, p.http_get.scheme) == (
        "/healthz",
        8080,
        "localhost",
        "HTTPS",
    )
    assert [(h.name, h.value) for h in p.http_get.http_headers] == [("X-Probe", "1")]
    assert (p.initial_delay_seconds, p.period_seconds, p.timeout_seconds, p.failure_threshold) == (5, 7, 2, 4)


def test_the_kubelets_defaults(tmp_path: Path) -> None:
    p = _external(load_config(_write(tmp_path, "        httpGet: {port: 8080}\n"))).liveness_probe
    assert p is not None and p.http_get is not None
    assert (p.initial_delay_seconds, p.period_seconds, p.timeout_seconds, p.failure_threshold) == (0, 10, 1, 3)
    assert p.success_threshold == 1
    # host: the kubelet's default is the pod IP; the manager's controller shares its host, so loopback
    assert (p.http_get.path, p.http_get.host, p.http_get.scheme, p.http_get.http_headers) == (
        "/",
        "127.0.0.1",
        "HTTP",
        [],
    )


def test_an_exec_probe(tmp_path: Path) -> None:
    p = _external(load_config(_write(tmp_path, "        exec: {command: [cat, /tmp/healthy]}\n"))).liveness_probe
    assert p is not None and p.http_get is None and p.exec_ is not None
    assert p.exec_.command == ["cat", "/tmp/healthy"]


def test_without_a_probe_there_is_none(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + COMMAND)
    assert _external(load_config(path)).liveness_probe is None


P = "controllers.g.external.livenessProbe"


@pytest.mark.parametrize(
    ("probe", "problem"),
    [
        ("        periodSeconds: 5\n", f"{P}: give exactly one of httpGet and exec"),
        (
            "        httpGet: {port: 80}\n        exec: {command: [x]}\n",
            f"{P}: give exactly one of httpGet and exec",
        ),
        ("        httpGet: {path: /healthz}\n", f"{P}.httpGet.port: required field is missing"),
        ("        httpGet: {port: http}\n", f"{P}.httpGet.port: must be a port number 1..65535"),
        ("        httpGet: {port: 65536}\n", f"{P}.httpGet.port: must be a port number 1..65535"),
        ("        httpGet: {port: -1}\n", f"{P}.httpGet.port: must be a port number 1..65535"),
        ("        httpGet: {port: 80, path: healthz}\n", f"{P}.httpGet.path: must start with /"),
        ("        httpGet: {port: 80, scheme: http}\n", f"{P}.httpGet.scheme:"),
        ("        httpGet: {port: 80, host: 'http://x'}\n", f"{P}.httpGet.host: must be a host name or IP address"),
        ("        httpGet: {port: 80, host: 'x:80'}\n", f"{P}.httpGet.host: must be a host name or IP address"),
        ("        exec: {command: []}\n", f"{P}.exec.command:"),
        ("        exec: {command: ['']}\n", f"{P}.exec.command.0:"),
        ("        httpGet: {port: 80}\n        periodSeconds: 0\n", f"{P}.periodSeconds:"),
        ("        httpGet: {port: 80}\n        timeoutSeconds: 0\n", f"{P}.timeoutSeconds:"),
        ("        httpGet: {port: 80}\n        failureThreshold: 0\n", f"{P}.failureThreshold:"),
        ("        httpGet: {port: 80}\n        initialDelaySeconds: -1\n", f"{P}.initialDelaySeconds:"),
        ("        httpGet: {port: 80}\n        periodSeconds: '10'\n", f"{P}.periodSeconds:"),
        ("        httpGet: {port: 80}\n        periodSeconds: 1.5\n", f"{P}.periodSeconds:"),
        (
            "        httpGet: {port: 80}\n        successThreshold: 2\n",
            f"{P}.successThreshold: must be 1 for a liveness probe",
        ),
        (
            "        tcpSocket: {port: 80}\n",
            f"{P}.tcpSocket: unknown field; expected one of: exec, failureThreshold, httpGet, initialDelaySeconds",
        ),
        ("        httpGet: {port: 80, headers: {}}\n", f"{P}.httpGet.headers: unknown field; expected one of:"),
    ],
)
def test_bad_probes(tmp_path: Path, probe: str, problem: str) -> None:
    path = _write(tmp_path, probe)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = "\n".join(info.value.problems)
    assert f"{path}: {problem}" in text, text


def test_a_sidecar_probe_belongs_in_the_pod_manifest(tmp_path: Path) -> None:
    path = _write(tmp_path, "        httpGet: {path: /healthz, port: 8080}\n", command=False)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: {P}: needs command:"), problem
    assert "pod manifest" in problem


def test_the_cli_exits_2_on_a_bad_probe(tmp_path: Path) -> None:
    path = _write(tmp_path, "        httpGet: {port: metrics}\n")
    out = subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "controller-manager", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"{path}: {P}.httpGet.port: must be a port number 1..65535" in out.stderr
    assert "Traceback" not in out.stderr
