"""Reading Kubernetes protobuf bodies (``rangeshard.core.protobuf``) from real captured bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hashing import ShardBy, hash_key
from rangeshard.core.protobuf import read_write_body
from rangeshard.core.protobuf_decode import object_identity
from rangeshard.core.protobuf_wire import MAGIC, ProtobufError, is_protobuf, iter_fields, read_envelope

FIXTURES = Path(__file__).parents[1] / "fixtures" / "protobuf"
CRONJOB_UID = "6d1aeb6d-3722-4e6a-9413-18aad6ad73e2"
RS_UID = "0b8f3c1e-5a2d-4e8b-9c71-2f6a1d3e4b5c"


def _read(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize(
    ("name", "api_version", "kind", "metadata"),
    [
        ("kubectl-create-namespace.pb", "v1", "Namespace", {"name": "capns"}),
        ("kubectl-create-configmap.pb", "v1", "ConfigMap", {"name": "cm1", "namespace": "default"}),
        ("kubectl-create-secret-generic.pb", "v1", "Secret", {"name": "s1"}),
        ("kubectl-create-deployment.pb", "apps/v1", "Deployment", {"name": "d1", "labels": {"app": "d1"}}),
        (
            "kubectl-create-job-from-cronjob.pb",
            "batch/v1",
            "Job",
            {
                "name": "j1",
                "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                "ownerReferences": [
                    {"kind": "CronJob", "name": "cj", "uid": CRONJOB_UID, "apiVersion": "batch/v1", "controller": True}
                ],
            },
        ),
        (
            "pod-with-controller-owner.pb",
            "v1",
            "Pod",
            {
                "generateName": "web-7d4b9c5f8-",
                "namespace": "demo",
                "labels": {"app": "web"},
                "ownerReferences": [
                    {
                        "kind": "ReplicaSet",
                        "name": "web-7d4b9c5f8",
                        "uid": RS_UID,
                        "apiVersion": "apps/v1",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
        ),
    ],
)
def test_captured_bodies(name: str, api_version: str, kind: str, metadata: dict[str, object]) -> None:
    data = _read(name)
    assert data.startswith(MAGIC)
    ident = object_identity(data)
    assert ident == {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    assert read_write_body(data, "application/vnd.kubernetes.protobuf") == ident
    assert read_write_body(data, None) == ident  # the magic bytes alone say protobuf


def test_the_owner_of_a_protobuf_body_places_it_as_the_json_would() -> None:
    pod = object_identity(_read("pod-with-controller-owner.pb"))
    assert ShardBy.OWNER.key(pod) == hash_key(RS_UID)
    assert ShardBy.NAMESPACE.key(pod) == hash_key("demo")
    assert ShardBy.UID.key(pod) is None  # a create: the server assigns the uid
    job = object_identity(_read("kubectl-create-job-from-cronjob.pb"))
    assert ShardBy.OWNER.key(job) == hash_key(CRONJOB_UID)
    secret = object_identity(_read("kubectl-create-secret-generic.pb"))
    assert ShardBy.NAMESPACE.key(secret, "from-url") == hash_key("from-url")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "does not start with"),
        (b"{}", "does not start with"),
        (MAGIC + b"\x0a\x05\x0a\x02v1", "announced"),  # typeMeta says 5 bytes, 4 follow
        (MAGIC + b"\x12\x04\xff\xff\xff\xff", "varint"),  # raw holds a garbled message
        (MAGIC + b"\x0b", "wire type 3"),  # a group
        (MAGIC + b"\x0a\x04\x12\x02\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_bodies_raise_protobuf_error(data: bytes, message: str) -> None:
    with pytest.raises(ProtobufError, match=message):
        if data.startswith(MAGIC) and message == "varint":
            # a body whose raw object is garbage: the envelope reads, the object does not
            envelope = read_envelope(data)
            list(iter_fields(envelope.raw))
        else:
            object_identity(data)


def test_a_truncated_capture_never_reads_as_another_object() -> None:
    data = _read("pod-with-controller-owner.pb")
    whole = object_identity(data)
    for cut in range(len(MAGIC), len(data)):
        try:
            ident = object_identity(data[:cut])
        except ProtobufError:
            continue
        # Only the envelope's trailing fields (contentEncoding, contentType) can go unnoticed.
        assert ident == whole, cut


def test_an_envelope_without_metadata_is_refused() -> None:
    raw_without_meta = b"\x12\x00"  # only an empty field 2 (spec)
    type_meta = b"\x0a\x02v1\x12\x03Pod"
    body = MAGIC + b"\x0a" + bytes([len(type_meta)]) + type_meta + b"\x12" + bytes([len(raw_without_meta)])
    body += raw_without_meta
    with pytest.raises(ProtobufError, match="has no metadata"):
        object_identity(body)
    with pytest.raises(ProtobufError, match="names no kind"):
        object_identity(MAGIC + b"\x12\x00")


def test_other_media_types() -> None:
    assert is_protobuf("application/vnd.kubernetes.protobuf; charset=utf-8")
    assert not is_protobuf("application/json") and not is_protobuf(None)
    assert read_write_body(b'{"metadata": {"uid": "u"}}', "application/json") == {"metadata": {"uid": "u"}}
    apply = b"metadata:\n  name: x\n  ownerReferences: [{uid: o, controller: true}]\n"
    assert ShardBy.OWNER.key(read_write_body(apply, "application/apply-patch+yaml")) == hash_key("o")
    assert read_write_body(b"{not json", "application/json") is None
    assert read_write_body(b"", "application/json") is None
    assert read_write_body(b"a: [", "application/apply-patch+yaml") is None
