"""Protobuf request bodies against the local API server: kubectl's generators, controllers' writes, refusals.

kubectl 1.32's ``create`` generators and Kubernetes' own controllers send ``application/vnd.kubernetes.protobuf``;
the server decodes the built-in kinds (rangeshard.core.protobuf_decode) and answers exactly as for JSON. Each
comparison runs the same request both ways and compares the answers, leaving out only what the server makes
fresh for every object (uid, resourceVersion, creationTimestamp, generated names, cluster IPs).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_apiserver.resources import RESOURCES
from tests import protobuf_wire as pw

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protobuf"
PB = {"content-type": pw.PROTOBUF, "accept": f"{pw.PROTOBUF}, application/json"}

#: kubectl generator commands; {name} is replaced (a -p and a -j object per command).
GENERATORS = {
    "namespace": ["create", "namespace", "{name}"],
    "configmap": ["create", "configmap", "{name}", "--from-literal=a=b", "--from-file=k=/etc/hostname"],
    "secret-generic": ["create", "secret", "generic", "{name}", "--from-literal=x=y", "--type=Opaque"],
    "secret-docker-registry": [
        "create",
        "secret",
        "docker-registry",
        "{name}",
        "--docker-server=r.example",
        "--docker-username=u",
        "--docker-password=p",
    ],
    "deployment": ["create", "deployment", "{name}", "--image=nginx", "--replicas=2", "--port=80"],
    "cronjob": ["create", "cronjob", "{name}", "--image=busybox", "--schedule=*/5 * * * *", "--", "date"],
    "job": ["create", "job", "{name}", "--image=busybox", "--", "echo", "hi"],
    "service-clusterip": ["create", "service", "clusterip", "{name}", "--tcp=80:8080"],
    "service-externalname": ["create", "service", "externalname", "{name}", "--external-name=example.com"],
    "serviceaccount": ["create", "serviceaccount", "{name}"],
    "role": ["create", "role", "{name}", "--verb=get,list", "--resource=pods,deployments.apps"],
    "rolebinding": ["create", "rolebinding", "{name}", "--role=r", "--user=alice", "--serviceaccount=default:sa"],
    "clusterrole": ["create", "clusterrole", "{name}", "--verb=get", "--resource=nodes"],
    "clusterrole-aggregation": ["create", "clusterrole", "{name}", "--aggregation-rule=example.com/agg=true"],
    "clusterrolebinding": ["create", "clusterrolebinding", "{name}", "--clusterrole=view", "--group=g"],
    "quota": ["create", "quota", "{name}", "--hard=cpu=1,memory=1G,pods=2", "--scopes=BestEffort"],
    "priorityclass": ["create", "priorityclass", "{name}", "--value=1000", "--description=high"],
    "pdb": ["create", "pdb", "{name}", "--selector=app=x", "--max-unavailable=50%"],
    "ingress": ["create", "ingress", "{name}", "--class=default", "--rule=foo.com/bar=svc:8080,tls=cert"],
}
#: What ``kubectl get KIND NAME -o json`` names each generator's object by.
GET_KIND = {
    "secret-generic": "secret",
    "secret-docker-registry": "secret",
    "service-clusterip": "service",
    "service-externalname": "service",
    "clusterrole-aggregation": "clusterrole",
    "quota": "resourcequota",
    "pdb": "poddisruptionbudget",
}


def _comparable(obj: Any, name: str = "") -> Any:
    """``obj`` without what the server makes fresh per object; ``name`` (if given) replaced by ``NAME``."""
    uid = (obj.get("metadata") or {}).get("uid")
    obj = json.loads(json.dumps(obj).replace(uid, "UID")) if uid else copy.deepcopy(obj)  # a Job's labels hold it
    meta = obj.get("metadata") or {}
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink"):
        meta.pop(key, None)
    if "generateName" in meta:
        meta.pop("name", None)
    for ref in meta.get("ownerReferences") or []:
        ref.pop("uid", None)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        for key in ("clusterIP", "clusterIPs"):
            spec.pop(key, None)
    text = json.dumps(obj, sort_keys=True)
    return json.loads(text.replace(name, "NAME") if name else text)


@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_kubectl_generators_create_what_json_creates(kubectl: Any, namespace: str, generator: str) -> None:
    """``kubectl create <generator>`` (protobuf) and the same object sent as JSON read back the same."""
    args = GENERATORS[generator]
    suffix = namespace.removeprefix("t-")
    by_protobuf, by_json = f"pb-{suffix}", f"js-{suffix}"
    ns = [] if generator in ("namespace", "priorityclass") or generator.startswith("clusterrole") else ["-n", namespace]

    def command(name: str) -> list[str]:
        return [*ns, *(a.replace("{name}", name) for a in args)]

    sent = kubectl("-v=8", *command(by_protobuf))  # logs the request headers
    assert "created" in sent.stdout, sent.stdout
    assert f"Content-Type: {pw.PROTOBUF}" in sent.stderr, "kubectl no longer sends protobuf here"
    generated = kubectl(*_with_dry_run(command(by_json))).stdout
    kubectl(*ns, "create", "-f", "-", input=generated)
    kind = GET_KIND.get(generator, generator)
    got = {n: json.loads(kubectl(*ns, "get", kind, n, "-o", "json").stdout) for n in (by_protobuf, by_json)}
    assert _comparable(got[by_protobuf], by_protobuf) == _comparable(got[by_json], by_json)


def _with_dry_run(command: list[str]) -> list[str]:
    """``command`` printing its object as JSON instead of sending it (flags before a ``--``)."""
    flags = ["--dry-run=client", "-o", "json"]
    if "--" in command:
        at = command.index("--")
        return [*command[:at], *flags, *command[at:]]
    return [*command, *flags]


def test_kubectl_create_job_from_a_cronjob(kubectl: Any, namespace: str) -> None:
    kubectl("-n", namespace, "create", "cronjob", "cj", "--image=busybox", "--schedule=0 * * * *")
    sent = kubectl("-n", namespace, "create", "job", "j1", "--from=cronjob/cj", "-v=8")
    assert "job.batch/j1 created" in sent.stdout and f"Content-Type: {pw.PROTOBUF}" in sent.stderr
    generated = kubectl("-n", namespace, "create", "job", "j2", "--from=cronjob/cj", "--dry-run=client", "-o", "json")
    kubectl("-n", namespace, "create", "-f", "-", input=generated.stdout)
    jobs = {n: json.loads(kubectl("-n", namespace, "get", "job", n, "-o", "json").stdout) for n in ("j1", "j2")}
    assert jobs["j1"]["metadata"]["ownerReferences"][0]["name"] == "cj"
    assert jobs["j1"]["metadata"]["annotations"] == {"cronjob.kubernetes.io/instantiate": "manual"}
    assert _comparable(jobs["j1"], "j1") == _comparable(jobs["j2"], "j2")


# ---- captured and encoded bodies: the same answers as JSON ---------------------------------------------------


def _path(api_version: str, kind: str, namespace: str | None) -> str:
    group, _, version = api_version.rpartition("/")
    spec = next(s for s in RESOURCES if (s.group, s.version, s.kind) == (group, version, kind))
    base = f"/apis/{group}/{version}" if group else "/api/v1"
    return f"{base}/namespaces/{namespace}/{spec.resource}" if spec.namespaced else f"{base}/{spec.resource}"


CREATED = sorted(
    p
    for p in [*(FIXTURES / "kubectl").glob("*.pb"), *(FIXTURES / "encoded").glob("*.pb")]
    if not p.stem.startswith(("deleteoptions", "scale", "token"))  # subresource bodies: tested on their own
)


@pytest.fixture(scope="module")
def fixture_namespaces(apiserver: Any) -> None:
    with httpx.Client(base_url=apiserver.url, timeout=10.0) as client:
        for name in ("demo", "kube-system", "default"):
            response = client.post("/api/v1/namespaces", json={"metadata": {"name": name}})
            assert response.status_code in (201, 409), response.text


@pytest.mark.usefixtures("fixture_namespaces")
@pytest.mark.parametrize("body", CREATED, ids=[f"{p.parent.name}-{p.stem}" for p in CREATED])
def test_captured_bodies_are_answered_as_their_json(http: httpx.Client, body: Path) -> None:
    """POST of a real protobuf body and of the JSON of the same object (renamed): the same code and object."""
    doc = json.loads(body.with_suffix(".json").read_text())
    namespace = doc["metadata"].get("namespace") or "default"
    path = _path(doc["apiVersion"], doc["kind"], namespace)
    name = doc["metadata"].get("name")
    as_json = copy.deepcopy(doc)
    if name:
        as_json["metadata"]["name"] = f"{name}-json"
    answers = [http.post(path, content=body.read_bytes(), headers=PB)]
    if doc["kind"] == "Service" and answers[0].status_code == 201:
        http.delete(f"{path}/{name}")  # its nodePort is allocated cluster-wide
    answers.append(http.post(path, json=as_json))
    assert answers[0].status_code == answers[1].status_code, (answers[0].text, answers[1].text)
    assert answers[0].headers["content-type"].startswith("application/json")
    names = (name, f"{name}-json") if name else ("", "")
    if answers[0].status_code != 201:
        messages = [a.json()["message"] for a in answers]
        assert messages[0].replace(names[0], "NAME") == messages[1].replace(names[1], "NAME")
        return
    # What the server derives from the name (a Job's job-name label, a Namespace's name label) follows it back.
    created = [_comparable(json.loads(a.text.replace(f"{name}-json", name) if name else a.text)) for a in answers]
    assert created[0] == created[1]


def test_kubectl_create_token_body_is_answered(http: httpx.Client) -> None:
    """``kubectl create token``'s protobuf TokenRequest, POSTed to ``serviceaccounts/NAME/token``: a token."""
    http.post("/api/v1/namespaces", json={"metadata": {"name": "demo"}})
    created = http.post("/api/v1/namespaces/demo/serviceaccounts", json={"metadata": {"name": "op"}})
    assert created.status_code in (201, 409), created.text
    body = (FIXTURES / "kubectl" / "token.pb").read_bytes()
    answer = http.post("/api/v1/namespaces/demo/serviceaccounts/op/token", content=body, headers=PB)
    assert answer.status_code == 201, answer.text
    doc = answer.json()
    assert doc["kind"] == "TokenRequest" and doc["spec"]["audiences"] == ["aud1"]
    assert doc["spec"]["expirationSeconds"] == 1200 and doc["status"]["token"].count(".") == 2


# ---- status, scale and delete, as controllers send them ------------------------------------------------------


def _deployment(http: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    }
    response = http.post(f"/apis/apps/v1/namespaces/{namespace}/deployments", json=manifest)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_scale_and_status_updates_in_protobuf(http: httpx.Client, namespace: str) -> None:
    base = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    for name in ("pb", "js"):
        _deployment(http, namespace, name)
    # autoscaling/v1 Scale: spec.replicas = 4 (the HPA's and kubectl scale's body).
    scale = pw.body("autoscaling/v1", "Scale", pw.meta("pb") + pw.field(2, pw.field(1, 4)))
    answers = [
        http.put(f"{base}/pb/scale", content=scale, headers=PB),
        http.put(
            f"{base}/js/scale",
            json={"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "js"}, "spec": {"replicas": 4}},
        ),
    ]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert _comparable(answers[0].json(), "pb") == _comparable(answers[1].json(), "js")
    assert http.get(f"{base}/pb").json()["spec"]["replicas"] == 4
    # Deployment status as the deployment controller writes it: observedGeneration 2, replicas 4, readyReplicas 3.
    status = pw.field(1, 2) + pw.field(2, 4) + pw.field(3, 4) + pw.field(7, 3)
    condition = pw.field(1, b"Available") + pw.field(2, b"True") + pw.field(7, pw.field(1, 1_764_039_845))
    update = pw.body("apps/v1", "Deployment", pw.meta("pb") + pw.field(3, status + pw.field(6, condition)))
    answers = [http.put(f"{base}/pb/status", content=update, headers=PB)]
    as_json = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "js"},
        "status": {
            "observedGeneration": 2,
            "replicas": 4,
            "updatedReplicas": 4,
            "readyReplicas": 3,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "lastUpdateTime": None,
                    "lastTransitionTime": "2025-11-25T03:04:05Z",
                }
            ],
        },
    }
    answers.append(http.put(f"{base}/js/status", json=as_json))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert answers[0].json()["status"] == answers[1].json()["status"]
    assert answers[0].json()["status"]["readyReplicas"] == 3


def test_protobuf_delete_options(http: httpx.Client, namespace: str) -> None:
    """kube-controller-manager's deletes carry protobuf DeleteOptions: preconditions and propagation hold."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    uid = http.post(path, json={"metadata": {"name": "cm"}}).json()["metadata"]["uid"]
    wrong = pw.body("v1", "DeleteOptions", pw.field(2, pw.field(1, b"00000000-0000-0000-0000-000000000000")))
    answers = [
        http.request("DELETE", f"{path}/cm", content=wrong, headers=PB),
        http.request("DELETE", f"{path}/cm", json={"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
    ]
    assert [a.status_code for a in answers] == [409, 409]
    assert answers[0].json()["message"] == answers[1].json()["message"]
    dry_run = (FIXTURES / "encoded" / "deleteoptions-apps-v1.pb").read_bytes()  # dryRun: [All]
    answers = [
        http.request("DELETE", f"{path}/cm", content=dry_run, headers=PB),
        http.request("DELETE", f"{path}/cm", json={"dryRun": ["All"]}),
    ]
    # Dry runs: answered as the delete would be (the captured body's preconditions name another uid: 409),
    # and nothing is deleted.
    assert [a.status_code for a in answers] == [409, 200]
    assert http.get(f"{path}/cm").status_code == 200
    right = pw.body(
        "v1", "DeleteOptions", pw.field(1, 0) + pw.field(2, pw.field(1, uid.encode())) + pw.field(4, b"Background")
    )
    assert http.request("DELETE", f"{path}/cm", content=right, headers=PB).status_code == 200
    assert http.get(f"{path}/cm").status_code == 404


# ---- what is refused -----------------------------------------------------------------------------------------


def _message(response: httpx.Response, code: int) -> str:
    assert response.status_code == code, response.text
    status = response.json()
    assert status["kind"] == "Status" and status["code"] == code
    return str(status["message"])


def test_unsupported_kinds_and_fields_are_415_naming_them(http: httpx.Client, namespace: str) -> None:
    limits = pw.body("v1", "LimitRange", pw.meta("l1"))
    message = _message(http.post(f"/api/v1/namespaces/{namespace}/limitranges", content=limits, headers=PB), 415)
    assert "does not decode protobuf bodies of LimitRange (v1)" in message and "send it as JSON" in message
    configmap = pw.body("v1", "ConfigMap", pw.meta("cm") + pw.field(99, b"x"))
    message = _message(http.post(f"/api/v1/namespaces/{namespace}/configmaps", content=configmap, headers=PB), 415)
    assert "unknown field 99 of ConfigMap" in message
    assert http.get(f"/api/v1/namespaces/{namespace}/configmaps/cm").status_code == 404
    review = pw.body("authentication.k8s.io/v1", "TokenReview", pw.field(2, pw.field(1, b"t")))
    assert "TokenReview" in _message(
        http.post("/apis/authentication.k8s.io/v1/tokenreviews", content=review, headers=PB), 415
    )
    delete = pw.body("v1", "ConfigMap", pw.meta("cm"))
    assert "must be DeleteOptions" in _message(
        http.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/cm", content=delete, headers=PB), 415
    )


def test_malformed_protobuf_is_400_and_patches_take_no_protobuf(http: httpx.Client, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    assert "does not start with the bytes" in _message(http.post(path, content=b"\x0a\x00", headers=PB), 400)
    truncated = pw.body("v1", "ConfigMap", pw.meta("cm"))[:-6]
    _message(http.post(path, content=truncated, headers=PB), 400)
    http.post(path, json={"metadata": {"name": "cm"}})
    patch = pw.body("v1", "ConfigMap", pw.meta("cm"))
    assert "unsupported media type" in _message(http.patch(f"{path}/cm", content=patch, headers=PB), 415)


def test_a_large_body_is_decoded_off_the_event_loop(http: httpx.Client, namespace: str) -> None:
    """Above 64 KiB the decode runs in a worker thread; the answer is the same."""
    entries = b"".join(pw.field(2, pw.field(1, f"k{i}".encode()) + pw.field(2, b"v" * 64)) for i in range(2000))
    big = pw.body("v1", "ConfigMap", pw.meta("big") + entries)
    assert len(big) > 128 * 1024
    created = http.post(f"/api/v1/namespaces/{namespace}/configmaps", content=big, headers=PB)
    assert created.status_code == 201, created.text
    assert len(created.json()["data"]) == 2000 and created.json()["data"]["k1999"] == "v" * 64
