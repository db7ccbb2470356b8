"""The local API server against an etcd with client TLS (mutual), and against an etcd with authentication.

Each test starts a private etcd (``EtcdServer`` with ``EtcdTLS`` /
``enable_auth``) and a real local API server process given the matching
``--etcd-*`` options; a create, a list and a watch event prove the
connection (watches use their own etcd client, so they need the same
credentials). The password goes through ``RANGESHARD_ETCD_PASSWORD``, never
argv, and must not appear in the server's log.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import orjson

from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer, EtcdTLS
from tests.helpers import wait_until
from tests.security.certs import Pki


def exercise(url: str) -> None:
    """Create a configmap, list it, and see it in a watch."""
    with httpx.Client(base_url=url, timeout=10.0) as client:
        resp = client.post(
            "/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "c"}, "data": {"a": "1"}}
        )
        assert resp.status_code == 201, resp.text
        items = client.get("/api/v1/namespaces/default/configmaps").json()["items"]
        assert [i["metadata"]["name"] for i in items] == ["c"]
        with client.stream(
            "GET", "/api/v1/namespaces/default/configmaps", params={"watch": "1", "timeoutSeconds": "5"}
        ) as watch:
            assert watch.status_code == 200
            first = next(line for line in watch.iter_lines() if line.strip())
            assert orjson.loads(first)["object"]["metadata"]["name"] == "c"


def test_local_apiserver_with_etcd_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    tls = EtcdTLS(
        cert_file=str(pki.server_cert),
        key_file=str(pki.server_key),
        trusted_ca_file=str(pki.ca_cert),
        client_cert_auth=True,
        client_cert_file=str(pki.client_cert),
        client_key_file=str(pki.client_key),
    )
    etcd = EtcdServer(tmp_path / "etcd", fast=True, log_file=tmp_path / "etcd.log", tls=tls)
    etcd.start()
    try:
        assert etcd.url.startswith("https://")
        # Without a client certificate etcd refuses us: the TLS options are what makes it work.
        try:
            with EtcdClient(EtcdConfig.from_urls(etcd.url, ca_cert=str(pki.ca_cert), timeout=1.0)) as bare:
                bare.revision()
            refused = False
        except Exception:
            refused = True
        assert refused
        args = [
            "--etcd-cacert",
            str(pki.ca_cert),
            "--etcd-cert",
            str(pki.client_cert),
            "--etcd-key",
            str(pki.client_key),
        ]
        with LocalApiServerProcess(etcd.url, log_file=tmp_path / "las.log", extra_args=args) as server:
            exercise(server.url)
    finally:
        etcd.stop()


def test_local_apiserver_with_etcd_authentication(tmp_path: Path) -> None:
    password = f"pw-{secrets.token_hex(12)}"
    etcd = EtcdServer(tmp_path / "etcd", fast=True, log_file=tmp_path / "etcd.log")
    etcd.start()
    try:
        etcd.enable_auth(password)
        log_file = tmp_path / "las.log"
        # A wrong password: a clean failure (no traceback of ours, no secret), the server stays unready.
        wrong = LocalApiServerProcess(
            etcd.url,
            log_file=tmp_path / "wrong.log",
            extra_args=["--etcd-user", "root", "--log-level", "debug"],
            env={"RANGESHARD_ETCD_PASSWORD": "not-" + password},
        )
        try:
            wrong.start(wait=False)
            # Poll the log (start-up takes seconds on a loaded machine); the server must never become ready.
            wait_until(
                lambda: "authentication failed" in (tmp_path / "wrong.log").read_text(),
                60,
                "the wrong password to be reported",
            )
            try:
                code: int | None = httpx.get(f"{wrong.url}/readyz", timeout=10).status_code
            except httpx.HTTPError:
                code = None  # still in its start-up retries: not serving at all
            assert code != 200
        finally:
            wrong.kill()
        wrong_log = (tmp_path / "wrong.log").read_text()
        assert "authentication failed" in wrong_log and "Traceback" not in wrong_log, wrong_log
        assert password not in wrong_log
        with LocalApiServerProcess(
            etcd.url,
            log_file=log_file,
            extra_args=["--etcd-user", "root", "--log-level", "debug"],
            env={"RANGESHARD_ETCD_PASSWORD": password},
        ) as server:
            exercise(server.url)
        assert password not in log_file.read_text()
    finally:
        etcd.stop()
