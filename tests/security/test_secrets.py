"""Secrets never reach logs or error messages.

The local API server (``--token-file``, debug logging) and the proxy
(``--auth-mode delegate``, its own token in a kubeconfig, debug logging) are
driven with good, unknown, forbidden and malformed credentials; afterwards no
token appears in either log, and no error response carries one. Malformed
token files and a wrong etcd password (test_etcd_security) fail with
messages that do not contain the secret either.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from tests.security.certs import Pki
from tests.security.conftest import Tokens


def test_tokens_stay_out_of_logs_and_errors(
    secure_apiserver: LocalApiServerProcess, delegate_proxy: ProxyProcess, pki: Pki, tokens: Tokens
) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    bodies: list[str] = []
    for base in (secure_apiserver.url, delegate_proxy.url):
        with httpx.Client(base_url=base, verify=ctx, timeout=10.0) as client:
            for token in tokens.all():
                for scheme in ("Bearer", "bearer", "Basic"):
                    headers = {"Authorization": f"{scheme} {token}"}
                    for method, path in (
                        ("GET", "/api/v1/pods"),
                        ("GET", "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1&labelSelector=%3D%3D"),
                        ("POST", "/api/v1/namespaces/default/configmaps"),
                        ("GET", "/metrics"),
                        ("DELETE", "/api/v1/namespaces/default/pods/nope"),
                    ):
                        resp = client.request(method, path, headers=headers, json={"metadata": {"name": token[:8]}})
                        if resp.status_code >= 400:
                            bodies.append(resp.text)
            # A TokenReview about a token that is not in the file: the error says so without the token.
            review = client.post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                json={"spec": {"token": tokens.unknown}},
                headers={"Authorization": f"Bearer {tokens.admin}"},
            )
            if review.status_code == 201:
                assert tokens.unknown not in str(review.json()["status"])
    assert bodies, "expected some refusals"
    logs = secure_apiserver.log_path.read_text() + (delegate_proxy.log_file or Path("/dev/null")).read_text()
    assert "Unauthorized" in "".join(bodies)
    for token in tokens.all():
        assert token not in logs
        assert all(token not in body for body in bodies)


@pytest.mark.parametrize("component", ["local_apiserver", "range_filter_proxy"])
def test_malformed_token_file_error_hides_the_token(component: str, tmp_path: Path) -> None:
    secret = "sekrit-0123456789abcdef"
    bad = tmp_path / "tokens.csv"
    bad.write_text(f"ok-token,user,uid\n{secret},only-two-fields\n{secret},dup,uid\n")
    args = ["--token-file", str(bad)]
    args += ["--auth-mode", "static", "--upstream", "http://127.0.0.1:1"] if component == "range_filter_proxy" else []
    result = subprocess.run(
        [sys.executable, "-m", component, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "tokens.csv:2" in result.stderr
    assert secret not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
