"""Issue 23's user story: a sharded controller of our own owning a Secret and a Service per custom resource.

Run by the test kit (``rangeshard_cluster``, ``rangeshard_namespace``,
``rangeshard_managers``) with three real manager processes: every Certificate
gets its ``kubernetes.io/tls`` Secret and ClusterIP Service, each key is
reconciled by the manager whose range holds its uid, a spec change updates
the Secret and the Service, a Certificate's delete garbage-collects both, and
the kit's reconcile and write audits find no overlap and no stale write.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from hashing import hash_key
from rangeshard.testing import TestCluster, wait_until
from tests.e2e.certificate_controller import CERTIFICATES, CRD, CertificateController, owned_name

N_CERTS = 12


@pytest.fixture
def api(rangeshard_cluster: TestCluster) -> Iterator[Any]:
    rangeshard_cluster.apply(CRD)
    with rangeshard_cluster.api_client() as client:
        yield client


def certificate(name: str, port: int = 443) -> dict[str, Any]:
    return {
        "apiVersion": CERTIFICATES.api_version,
        "kind": "Certificate",
        "metadata": {"name": name},
        "spec": {"commonName": f"{name}.example.org", "dnsNames": [f"{name}.example.org"], "port": port},
    }


def _decoded(secret: Any) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def test_three_managers_own_secrets_and_services(api: Any, rangeshard_namespace: str, rangeshard_managers: Any) -> None:
    ns = rangeshard_namespace
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    managers = rangeshard_managers(CertificateController, n=3, workers=2)
    for i in range(N_CERTS):
        custom.create_namespaced_custom_object(
            CERTIFICATES.group, CERTIFICATES.version, ns, CERTIFICATES.name, certificate(f"c{i}")
        )

    def converged(port: int, alt: str = "") -> bool:
        secrets = {s.metadata.name: s for s in core.list_namespaced_secret(ns, label_selector="certificate").items}
        services = {s.metadata.name: s for s in core.list_namespaced_service(ns, label_selector="certificate").items}
        for i in range(N_CERTS):
            child = owned_name(f"c{i}")
            secret, service = secrets.get(child), services.get(child)
            if secret is None or service is None or service.spec.ports[0].port != port:
                return False
            if f"CN=c{i}.example.org\nDNS=c{i}.example.org{alt}\n" not in _decoded(secret).get("tls.crt", ""):
                return False
        return True

    wait_until(lambda: converged(443), 60, "a Secret and a Service per Certificate")

    certs = {
        c["metadata"]["name"]: c
        for c in custom.list_namespaced_custom_object(CERTIFICATES.group, CERTIFICATES.version, ns, CERTIFICATES.name)[
            "items"
        ]
    }
    secret = core.read_namespaced_secret("c0-tls", ns)
    service = core.read_namespaced_service("c0-tls", ns)
    assert secret.type == "kubernetes.io/tls"
    assert set(_decoded(secret)) == {"tls.crt", "tls.key"}
    for child in (secret, service):
        (ref,) = child.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == (
            "Certificate",
            "c0",
            certs["c0"]["metadata"]["uid"],
            True,
        )
    assert service.spec.type == "ClusterIP"
    assert ipaddress.ip_address(service.spec.cluster_ip) in ipaddress.ip_network("10.96.0.0/12")
    wait_until(
        lambda: (
            custom.get_namespaced_custom_object(CERTIFICATES.group, CERTIFICATES.version, ns, CERTIFICATES.name, "c0")
            .get("status", {})
            .get("clusterIP")
            == service.spec.cluster_ip
        ),
        30,
        "the Certificate's status naming its Service's clusterIP",
    )

    # Every key was reconciled by the manager whose range holds its uid; a manager may be idle only if its
    # range holds no Certificate.
    snapshot = managers.snapshot()
    assert len(snapshot) == 3

    def by_key() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for r in managers.audit_records():
            found.setdefault(r.key, set()).add(r.instance_id)
        return found

    def owners_recorded() -> dict[str, set[str]] | None:
        # A reconcile is recorded when it ends, after its last write: the children may exist a moment before.
        found = by_key()
        for name, cert in certs.items():
            member = snapshot.owner_of(hash_key(cert["metadata"]["uid"]))
            if member is None or member.instance_id not in found.get(f"{ns}/{name}", set()):
                return None
        return found

    reconciled = wait_until(owners_recorded, 30, "every Certificate's reconcile recorded by its owner") or by_key()
    owners = set()
    for name, cert in certs.items():
        member = snapshot.owner_of(hash_key(cert["metadata"]["uid"]))
        assert member is not None
        owners.add(member.instance_id)
        assert member.instance_id in reconciled.get(f"{ns}/{name}", set()), (name, member.instance_id, reconciled)
    idle = set(managers.states()) - {i for ids in reconciled.values() for i in ids}
    assert not idle & owners, f"managers {idle & owners} own Certificates but reconciled nothing"

    # A spec change updates the Secret (new CN) and the Service (new port).
    for i in range(N_CERTS):
        custom.patch_namespaced_custom_object(
            CERTIFICATES.group,
            CERTIFICATES.version,
            ns,
            CERTIFICATES.name,
            f"c{i}",
            {
                "spec": {
                    "commonName": f"c{i}.example.org",
                    "dnsNames": [f"c{i}.example.org", "alt.example.org"],
                    "port": 8443,
                }
            },
        )
    wait_until(lambda: converged(8443, ",alt.example.org"), 60, "Secrets and Services following their Certificates")
    assert "DNS=c3.example.org,alt.example.org" in _decoded(core.read_namespaced_secret("c3-tls", ns))["tls.crt"]

    # Deleting a Certificate garbage-collects its Secret and Service.
    custom.delete_namespaced_custom_object(CERTIFICATES.group, CERTIFICATES.version, ns, CERTIFICATES.name, "c1")

    def collected() -> bool:
        secrets = {s.metadata.name for s in core.list_namespaced_secret(ns).items}
        services = {s.metadata.name for s in core.list_namespaced_service(ns).items}
        return "c1-tls" not in secrets and "c1-tls" not in services

    wait_until(collected, 30, "c1's Secret and Service to be collected")
    assert {s.metadata.name for s in core.list_namespaced_secret(ns, label_selector="certificate").items} == {
        owned_name(f"c{i}") for i in range(N_CERTS) if i != 1
    }

    assert managers.assert_no_overlap() >= N_CERTS
    assert managers.assert_no_stale_writes() >= 2 * N_CERTS  # every Secret and Service create at least
