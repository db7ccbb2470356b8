"""rangeshard.core.protobuf_decode: protobuf bodies of the built-in kinds decode to the JSON of the same object.

Two sets of real bytes (tests/fixtures/protobuf/README.md says how each was made):
``kubectl/`` holds what kubectl 1.32's ``create`` generators POST, each beside the JSON the same kubectl prints for
the same object (``--dry-run=client -o json``); ``encoded/`` holds objects as Kubernetes' controllers write them,
encoded by Google's protobuf runtime from protoc's descriptors of Kubernetes' own ``generated.proto`` files (not
from our table), each beside the JSON it was encoded from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rangeshard.core.protobuf_decode import (
    UnsupportedProtobuf,
    decode_delete_options,
    decode_object,
    known_kinds,
    object_identity,
)
from rangeshard.core.protobuf_schema import KINDS
from rangeshard.core.protobuf_wire import ProtobufError
from tests.protobuf_wire import body as _body
from tests.protobuf_wire import field as _f
from tests.protobuf_wire import meta
from tests.protobuf_wire import varint as _varint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protobuf"
KUBECTL = sorted((FIXTURES / "kubectl").glob("*.pb"))
ENCODED = sorted((FIXTURES / "encoded").glob("*.pb"))


@pytest.mark.parametrize("body", KUBECTL, ids=[p.stem for p in KUBECTL])
def test_kubectl_create_bodies_decode_to_the_json_kubectl_prints(body: Path) -> None:
    expected = json.loads(body.with_suffix(".json").read_text())
    assert decode_object(body.read_bytes()) == expected


@pytest.mark.parametrize("body", ENCODED, ids=[p.stem for p in ENCODED])
def test_controller_bodies_decode_to_the_json_they_were_encoded_from(body: Path) -> None:
    expected = json.loads(body.with_suffix(".json").read_text())
    decode = decode_delete_options if expected["kind"] == "DeleteOptions" else decode_object
    assert decode(body.read_bytes()) == expected


def test_every_kind_the_issue_names_is_covered_by_real_bytes() -> None:
    covered = {(d["apiVersion"], d["kind"]) for d in map(_fixture_json, [*KUBECTL, *ENCODED])}
    assert set(known_kinds()) <= covered | {("v1", "DeleteOptions")}
    assert len(KUBECTL) >= 16 and {
        "namespace",
        "configmap",
        "secret-generic",
        "deployment",
        "job-from-cronjob",
        "cronjob",
        "service-clusterip",
        "serviceaccount",
        "role",
        "rolebinding",
        "clusterrole",
        "clusterrolebinding",
        "quota",
        "priorityclass",
        "pdb",
        "ingress",
    } <= {p.stem for p in KUBECTL}


def _fixture_json(body: Path) -> Any:
    return json.loads(body.with_suffix(".json").read_text())


def test_the_first_captures_decode_whole() -> None:
    pod = decode_object((FIXTURES / "pod-with-controller-owner.pb").read_bytes())
    assert pod["metadata"]["generateName"] == "web-7d4b9c5f8-"
    assert pod["metadata"]["ownerReferences"][0]["controller"] is True
    assert pod["spec"]["containers"] == [{"name": "web", "image": "nginx:1.27", "resources": {}}]
    for name in ("namespace", "configmap", "secret-generic", "deployment", "job-from-cronjob"):
        data = (FIXTURES / f"kubectl-create-{name}.pb").read_bytes()
        decoded = decode_object(data)
        identity = object_identity(data)  # the fence's reader agrees on what it reads
        assert {k: decoded[k] for k in ("apiVersion", "kind")} == {k: identity[k] for k in ("apiVersion", "kind")}
        assert {k: v for k, v in decoded["metadata"].items() if v is not None} == identity["metadata"]
    secret = decode_object((FIXTURES / "kubectl-create-secret-generic.pb").read_bytes())
    assert secret["data"] == {"x": "eQ=="}  # []byte: base64, as in JSON


# ---- hand-made bodies: the wire rules -----------------------------------------------------------------------


def test_absent_fields_take_go_json_zero_values() -> None:
    # A Pod with only a name: spec and status are struct values (always written), containers has no omitempty.
    pod = decode_object(_body("v1", "Pod", meta("p")))
    assert pod == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p", "creationTimestamp": None},  # a zero Time is null
        "spec": {"containers": None},
        "status": {},
    }
    # A container without fields: name (no omitempty) "", resources {} (a struct); omitempty scalars left out.
    spec = _f(2, b"")
    pod = decode_object(_body("v1", "Pod", meta("p") + _f(2, spec)))
    assert pod["spec"]["containers"] == [{"name": "", "resources": {}}]


def test_zero_values_on_the_wire_follow_omitempty_and_pointers() -> None:
    # Go writes every non-pointer field; JSON leaves omitempty zeros out but keeps pointer zeros.
    deployment_spec = _f(1, 0) + _f(5, 0) + _f(7, 0)  # replicas *int32 = 0, minReadySeconds 0, paused false
    deployment = decode_object(_body("apps/v1", "Deployment", meta("d") + _f(2, deployment_spec)))
    assert deployment["spec"]["replicas"] == 0
    assert "minReadySeconds" not in deployment["spec"] and "paused" not in deployment["spec"]
    scale = decode_object(_body("autoscaling/v1", "Scale", meta("s") + _f(2, _f(1, 0)) + _f(3, _f(1, 0))))
    assert scale["spec"] == {} and scale["status"] == {"replicas": 0}  # spec omitempty, status not


def test_special_types() -> None:
    # Time drops nanoseconds, MicroTime truncates them to microseconds; negative ints are sign-extended varints.
    lease_spec = (
        _f(1, b"me")
        + _f(2, -1)
        + _f(3, _f(1, 1_764_039_845) + _f(2, 123_456_789))
        + _f(4, _f(1, 1_764_039_845) + _f(2, 999))
    )
    lease = decode_object(_body("coordination.k8s.io/v1", "Lease", meta("l") + _f(2, lease_spec)))
    assert lease["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": -1,
        "acquireTime": "2025-11-25T03:04:05.123456Z",
        "renewTime": "2025-11-25T03:04:05.000000Z",
    }
    condition = _f(1, b"Ready") + _f(2, b"True") + _f(3, _f(1, 1_764_039_845) + _f(2, 5)) + _f(4, b"")
    rs_status = _f(1, 2) + _f(6, condition)
    rs = decode_object(_body("apps/v1", "ReplicaSet", meta("r") + _f(3, rs_status)))
    assert rs["status"]["conditions"] == [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-11-25T03:04:05Z"}
    ]
    # IntOrString: type 0 is intVal, 1 strVal; a PDB's maxUnavailable is a pointer.
    pdb = decode_object(_body("policy/v1", "PodDisruptionBudget", meta("b") + _f(2, _f(3, _f(1, 1) + _f(3, b"50%")))))
    assert pdb["spec"] == {"maxUnavailable": "50%"}
    # Quantity maps, and a Secret's []byte values.
    quota = decode_object(_body("v1", "ResourceQuota", meta("q") + _f(2, _f(1, _f(1, b"cpu") + _f(2, _f(1, b"2"))))))
    assert quota["spec"] == {"hard": {"cpu": "2"}}
    secret = decode_object(_body("v1", "Secret", meta("s") + _f(2, _f(1, b"k") + _f(2, b"\x00\xff"))))
    assert secret["data"] == {"k": "AP8="}


def test_repeated_scalars_packed_or_not_and_merged_messages() -> None:
    unpacked = _f(4, 3000) + _f(4, 4000)
    packed = _f(4, _varint(3000) + _varint(4000))
    for groups in (unpacked, packed):
        spec = _f(14, groups)  # PodSpec.securityContext (14) -> PodSecurityContext.supplementalGroups (4)
        pod = decode_object(_body("v1", "Pod", meta("p") + _f(2, spec)))
        assert pod["spec"]["securityContext"] == {"supplementalGroups": [3000, 4000]}
    # A singular message given twice merges (protobuf's rule); a scalar given twice: the last wins.
    twice = _f(1, _f(1, b"first") + _f(11, _f(1, b"a") + _f(2, b"1"))) + _f(1, _f(1, b"second"))
    cm = decode_object(_body("v1", "ConfigMap", twice))
    assert cm["metadata"] == {"name": "second", "creationTimestamp": None, "labels": {"a": "1"}}


def test_unknown_fields_and_kinds_are_refused_never_dropped() -> None:
    with pytest.raises(UnsupportedProtobuf, match=r"unknown field 99 of ConfigMap \(in core\.v1\.ConfigMap\)"):
        decode_object(_body("v1", "ConfigMap", meta("c") + _f(99, b"x")))
    with pytest.raises(
        UnsupportedProtobuf, match=r"unknown field 77 of Pod \(in core\.v1\.Container at spec\.containers\)"
    ):
        decode_object(_body("v1", "Pod", meta("p") + _f(2, _f(2, _f(1, b"c") + _f(77, 1)))))
    with pytest.raises(UnsupportedProtobuf, match=r"unknown field 3 of Lease \(MicroTime at spec\.renewTime\)"):
        decode_object(_body("coordination.k8s.io/v1", "Lease", meta("l") + _f(2, _f(4, _f(3, 1)))))
    with pytest.raises(UnsupportedProtobuf, match=r"does not decode protobuf bodies of LimitRange \(v1\)"):
        decode_object(_body("v1", "LimitRange", meta("n")))
    with pytest.raises(UnsupportedProtobuf, match=r"Deployment \(apps/v1beta1\)"):
        decode_object(_body("apps/v1beta1", "Deployment", meta("d")))
    with pytest.raises(UnsupportedProtobuf, match="must be DeleteOptions, not Pod"):
        decode_delete_options(_body("v1", "Pod", meta("p")))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (meta("p") + _f(2, 5), r"wire type 0 for a message field \(length-delimited\)"),
        (_f(1, _f(1, 7)), r"wire type 0 for a string field \(length-delimited\)"),
        (_f(1, _f(7, b"x")), r"wire type 2 for an int64 field \(a varint\)"),
        (_f(1, _f(1, b"\xff\xfe")), "not UTF-8"),
        (meta("p") + _f(2, _f(2, _f(16, b"x"))), r"wire type 2 for a bool field \(a varint\)"),
    ],
)
def test_malformed_bodies_are_protobuf_errors(raw: bytes, message: str) -> None:
    with pytest.raises(ProtobufError, match=message) as caught:
        decode_object(_body("v1", "Pod", raw))
    assert not isinstance(caught.value, UnsupportedProtobuf)


def test_bad_special_values_are_protobuf_errors() -> None:
    bad_int_or_string = _f(2, _f(3, _f(1, 7)))  # PodDisruptionBudgetSpec.maxUnavailable of type 7
    with pytest.raises(ProtobufError, match="IntOrString of type 7"):
        decode_object(_body("policy/v1", "PodDisruptionBudget", meta("b") + bad_int_or_string))
    revision = meta("r") + _f(2, _f(1, b"not json"))
    with pytest.raises(ProtobufError, match="RawExtension bytes are not JSON"):
        decode_object(_body("apps/v1", "ControllerRevision", revision))


def test_every_truncation_of_a_body_is_a_protobuf_error() -> None:
    data = (FIXTURES / "encoded" / "pod-from-replicaset.pb").read_bytes()
    for end in range(len(data) - 1, 3, -7):
        try:
            decode_object(data[:end])
        except ProtobufError:
            continue  # a truncation may still parse (a shorter envelope); it must never raise anything else


def test_the_table_names_only_messages_it_has() -> None:
    assert all(isinstance(k, tuple) and len(k) == 2 for k in KINDS)
    assert ("v1", "Pod") in known_kinds() and ("events.k8s.io/v1", "Event") in known_kinds()
