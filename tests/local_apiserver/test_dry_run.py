"""``dryRun=All``: validated, defaulted and checked like the real write, and nothing written (as kube-apiserver)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import httpx

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
DRY = {"dryRun": "All"}


def _cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_dry_run_writes_nothing(http: httpx.Client, namespace: str) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    rv_before = http.get(cms).json()["metadata"]["resourceVersion"]
    made = http.post(cms, json=_cm("a", k="v"), params=DRY)
    assert made.status_code == 201, made.text
    assert made.json()["metadata"]["uid"] and made.json()["data"] == {"k": "v"}
    assert http.get(f"{cms}/a").status_code == 404
    assert http.get(cms).json()["metadata"]["resourceVersion"] == rv_before, "no revision was written"
    # The guards still hold: an existing name is a 409, a missing namespace a 404, a bad object a 422.
    assert http.post(cms, json=_cm("b")).status_code == 201
    assert http.post(cms, json=_cm("b"), params=DRY).status_code == 409
    assert http.post("/api/v1/namespaces/nowhere-x/configmaps", json=_cm("c"), params=DRY).status_code == 404
    assert http.post(cms, json=_cm("Bad_Name"), params=DRY).status_code == 422
    current = http.get(f"{cms}/b").json()
    updated = http.put(f"{cms}/b", json={**current, "data": {"x": "1"}}, params=DRY)
    assert updated.status_code == 200 and updated.json()["data"] == {"x": "1"}
    patched = http.patch(
        f"{cms}/b", content=b'{"data":{"y":"2"}}', headers={"Content-Type": "application/merge-patch+json"}, params=DRY
    )
    assert patched.status_code == 200 and patched.json()["data"] == {"y": "2"}
    assert http.delete(f"{cms}/b", params=DRY).status_code == 200
    after = http.get(f"{cms}/b").json()
    assert after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    assert after.get("data") == current.get("data")
    stale = http.put(
        f"{cms}/b", json={**current, "metadata": {**current["metadata"], "resourceVersion": "1"}}, params=DRY
    )
    assert stale.status_code == 409


def test_bad_dry_run_values_are_400(http: httpx.Client, namespace: str) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    for params in ({"dryRun": "Some"}, {"dryRun": "all"}):
        answer = http.post(cms, json=_cm("z"), params=params)
        assert answer.status_code == 400 and answer.json()["kind"] == "Status", answer.text
    assert http.get(cms, params=DRY).status_code == 400  # a read has no dry run
    assert http.get(f"{cms}/z").status_code == 404


def test_kubectl_server_side_dry_run(kubectl: Kubectl, http: httpx.Client, namespace: str, tmp_path: Any) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps({**_cm("from-kubectl", a="b"), "metadata": {"name": "from-kubectl", "namespace": namespace}})
    )
    out = kubectl("apply", "--dry-run=server", "-f", str(manifest), check=False)
    assert out.returncode == 0, out.stderr
    assert "created (server dry run)" in out.stdout
    assert http.get(f"/api/v1/namespaces/{namespace}/configmaps/from-kubectl").status_code == 404
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_cm("x"), "metadata": {"name": "x", "namespace": namespace}, "datta": {}}))
    refused = kubectl("apply", "--dry-run=server", "-f", str(bad), check=False)
    assert refused.returncode != 0 and "datta" in refused.stderr
