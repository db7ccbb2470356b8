"""A sharded test controller that owns a Secret and a Service per ``Certificate`` (``certificates.tls.example.org``).

Purpose
    The issue-23 user story, run by the test kit: a controller of our own
    (not built into rangeshard) whose dependents are built-in kinds the local
    API server serves generically. For each Certificate ``<name>`` it keeps

    * a Secret ``<name>-tls`` of type ``kubernetes.io/tls`` whose ``tls.crt``
      and ``tls.key`` are derived from the spec (a fake PEM: no crypto here),
    * a ClusterIP Service ``<name>-tls`` exposing ``spec.port``,

    both with a controller ownerReference to the Certificate (so the
    informers shard them by the owner's uid and the API server's garbage
    collector deletes them with it), and records both names and the Service's
    allocated clusterIP in the Certificate's ``status``.

Invariants
    * Every API call passes ``_request_timeout=ctx.timeout()``.
    * The reconcile reads only the informer stores and is idempotent: it
      writes only what differs from the desired Secret, Service and status.

Concurrency model
    The framework's: ``reconcile`` runs on worker threads, never twice at once
    for one key in the whole deployment.
"""

from __future__ import annotations

import base64
from typing import Any, ClassVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext
from controller_manager.resources import Resource

CERTIFICATES = Resource("certificates", "tls.example.org", "v1", "Certificate", namespaced=True)
SECRETS = Resource("secrets", "", "v1", "Secret", namespaced=True)
SERVICES = Resource("services", "", "v1", "Service", namespaced=True)

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "certificates.tls.example.org"},
    "spec": {
        "group": "tls.example.org",
        "scope": "Namespaced",
        "names": {"plural": "certificates", "singular": "certificate", "kind": "Certificate", "shortNames": ["tcert"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["commonName"],
                                "properties": {
                                    "commonName": {"type": "string"},
                                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 443},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "secretName": {"type": "string"},
                                    "serviceName": {"type": "string"},
                                    "clusterIP": {"type": "string"},
                                    "observedGeneration": {"type": "integer"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def owned_name(certificate_name: str) -> str:
    """The name of the Secret and of the Service a Certificate owns."""
    return f"{certificate_name}-tls"


def desired_secret_data(cert: dict[str, Any]) -> dict[str, str]:
    """The Secret's ``data`` (base64, as stored) for a Certificate's spec."""
    spec = cert.get("spec") or {}
    names = ",".join(str(n) for n in spec.get("dnsNames") or [])
    crt = f"-----BEGIN CERTIFICATE-----\nCN={spec.get('commonName', '')}\nDNS={names}\n-----END CERTIFICATE-----\n"
    key = f"-----BEGIN PRIVATE KEY-----\nfor {spec.get('commonName', '')}\n-----END PRIVATE KEY-----\n"
    return {"tls.crt": base64.b64encode(crt.encode()).decode(), "tls.key": base64.b64encode(key.encode()).decode()}


def desired_ports(cert: dict[str, Any]) -> list[dict[str, Any]]:
    """The Service's ``spec.ports`` for a Certificate's spec."""
    port = int((cert.get("spec") or {}).get("port") or 443)
    return [{"name": "https", "protocol": "TCP", "port": port, "targetPort": 8443}]


def _ports_match(current: Any, desired: list[dict[str, Any]]) -> bool:
    have = [(p.get("name"), p.get("port"), p.get("targetPort")) for p in current or [] if isinstance(p, dict)]
    return have == [(p["name"], p["port"], p["targetPort"]) for p in desired]


class CertificateController(Controller):
    """A Secret and a Service per Certificate (see module docstring)."""

    name: ClassVar[str] = "tlscert"
    main: ClassVar[Resource] = CERTIFICATES  # sharded by the Certificate's uid
    dependents: ClassVar[tuple[Resource, ...]] = (SECRETS, SERVICES)  # sharded by their controller owner's uid
    crds: ClassVar[tuple[dict[str, Any], ...]] = (CRD,)

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        self.core: Any = k8s.CoreV1Api(self.api)
        self.custom: Any = k8s.CustomObjectsApi(self.api)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        cert = self.rt.store(CERTIFICATES).get(key)
        if cert is None or (cert.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted: the garbage collector removes the owned Secret and Service
        ns, name = key.split("/", 1)
        meta = cert["metadata"]
        child = owned_name(name)
        owner = {
            "apiVersion": CERTIFICATES.api_version,
            "kind": CERTIFICATES.kind,
            "name": name,
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        child_meta = {"name": child, "namespace": ns, "labels": {"certificate": name}, "ownerReferences": [owner]}

        data = desired_secret_data(cert)
        secret = self.rt.store(SECRETS).get(f"{ns}/{child}")
        if secret is None:
            body = {"metadata": child_meta, "type": "kubernetes.io/tls", "data": data}
            self._create(lambda: self.core.create_namespaced_secret(ns, body, _request_timeout=ctx.timeout()))
        elif (secret.get("data") or {}) != data:
            self.core.patch_namespaced_secret(
                child, ns, {"data": data}, _content_type="application/merge-patch+json", _request_timeout=ctx.timeout()
            )

        ports = desired_ports(cert)
        service = self.rt.store(SERVICES).get(f"{ns}/{child}")
        if service is None:
            body = {"metadata": child_meta, "spec": {"type": "ClusterIP", "selector": {"app": name}, "ports": ports}}
            self._create(lambda: self.core.create_namespaced_service(ns, body, _request_timeout=ctx.timeout()))
        elif not _ports_match((service.get("spec") or {}).get("ports"), ports):
            self.core.patch_namespaced_service(
                child,
                ns,
                {"spec": {"ports": ports}},
                _content_type="application/merge-patch+json",
                _request_timeout=ctx.timeout(),
            )

        cluster_ip = ((service or {}).get("spec") or {}).get("clusterIP")
        want = {"secretName": child, "serviceName": child, "observedGeneration": meta.get("generation")}
        if cluster_ip:
            want["clusterIP"] = cluster_ip
        status = cert.get("status") or {}
        if any(status.get(k) != v for k, v in want.items()):
            self.custom.patch_namespaced_custom_object_status(
                CERTIFICATES.group,
                CERTIFICATES.version,
                ns,
                CERTIFICATES.name,
                name,
                {"status": want},
                _request_timeout=ctx.timeout(),
            )

    @staticmethod
    def _create(call: Any) -> None:
        try:
            call()
        except ApiException as e:
            if e.status != 409:  # 409: created by us a moment ago; the cache will catch up
                raise
