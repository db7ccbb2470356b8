"""The external controller's child process as the manager starts and stops it, without a cluster (issue 22).

* ``KUBECONFIG`` names a kubeconfig that points at the endpoint and holds no
  credentials (no token, client certificate or key, username/password, exec
  or auth-provider plugin), as written and as the official client loads it.
* The child's environment has ``RANGESHARD_INSTANCE_ID`` and
  ``RANGESHARD_CONTROLLER_TYPE``; its output reaches the manager's log
  prefixed with ``[<name>]``.
* A child that ignores SIGTERM is SIGKILLed once the grace has passed.

The children are tiny ``python -c`` programs; each test waits for what it
needs with a deadline (a file the child writes), never a fixed sleep.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from controller_manager.external import Child
from tests.helpers import wait_until

ENDPOINT = "http://127.0.0.1:40123"
#: kubeconfig ``user`` fields that carry or produce credentials.
CREDENTIALS = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "username",
    "password",
    "exec",
    "auth-provider",
    "as",
    "as-groups",
}


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


def _child(command: list[str]) -> Child:
    return Child("gadget", command, ENDPOINT, controller_type="gadget", instance_id="m-7")


def test_the_childs_kubeconfig_points_at_the_endpoint_and_holds_no_credentials(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    code = (
        "import json, os, sys; "
        "k = os.environ['KUBECONFIG']; "
        "json.dump({'path': k, 'text': open(k).read()}, open(sys.argv[1] + '.tmp', 'w')); "
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1])"
    )
    child = _child([sys.executable, "-c", code, str(out)])
    child.start()
    try:
        wait_until(out.exists, 10, "the child to report its KUBECONFIG")
    finally:
        child.stop(grace=2)
    seen = json.loads(out.read_text())
    assert seen["path"] == str(child.kubeconfig)
    doc = yaml.safe_load(seen["text"])
    assert not CREDENTIALS & set(_keys(doc)), doc
    assert [u["user"] for u in doc["users"]] == [{}]
    (context,) = [c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"]]
    (cluster,) = [c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"]]
    assert cluster["server"] == ENDPOINT
    assert not {"certificate-authority", "certificate-authority-data"} & set(cluster)
    # As the official client sees it: the endpoint, and nothing to authenticate with.
    assert not Path(seen["path"]).exists(), "removed when the child stopped"
    copy = tmp_path / "kubeconfig"
    copy.write_text(seen["text"])
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(copy), client_configuration=cfg)
    assert cfg.host == ENDPOINT
    assert not cfg.api_key and not cfg.username and not cfg.password
    assert cfg.cert_file is None and cfg.key_file is None
    assert not cfg.auth_settings(), cfg.auth_settings()


def test_the_child_gets_its_instance_id_and_controller_type_and_its_output_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "env.json"
    code = (
        "import json, os, sys, time; "
        "keys = ('RANGESHARD_INSTANCE_ID', 'RANGESHARD_CONTROLLER_TYPE', 'KUBECONFIG'); "
        "json.dump({k: os.environ.get(k) for k in keys}, open(sys.argv[1] + '.tmp', 'w')); "
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
        "print('hello from the child', flush=True); "
        "time.sleep(60)"
    )
    child = _child([sys.executable, "-c", code, str(out)])
    with caplog.at_level(logging.INFO, logger="controller_manager.external"):
        child.start()
        try:
            wait_until(out.exists, 10, "the child to report its environment")
            wait_until(
                lambda: any(r.getMessage() == "[gadget] hello from the child" for r in caplog.records),
                10,
                "the child's output in the manager's log",
            )
        finally:
            child.stop(grace=2)
    env = json.loads(out.read_text())
    assert env == {
        "RANGESHARD_INSTANCE_ID": "m-7",
        "RANGESHARD_CONTROLLER_TYPE": "gadget",
        "KUBECONFIG": str(child.kubeconfig),
    }


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    armed, got_term = tmp_path / "armed", tmp_path / "got-term"
    code = (
        "import pathlib, signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *_: pathlib.Path(sys.argv[2]).touch()); "
        "pathlib.Path(sys.argv[1]).touch(); "
        "[time.sleep(0.05) for _ in range(1200)]"
    )
    child = _child([sys.executable, "-c", code, str(armed), str(got_term)])
    child.start()
    try:
        wait_until(armed.exists, 10, "the child to install its SIGTERM handler")
        proc = child.proc
        assert proc is not None
        grace = 0.5
        t0 = time.monotonic()
        child.stop(grace=grace)
        took = time.monotonic() - t0
    finally:
        child.stop(grace=0.1)
    assert got_term.exists(), "SIGTERM comes first"
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    assert grace <= took < grace + 5, took
    assert not child.running and child.proc is proc, "a stopped child is not restarted"
