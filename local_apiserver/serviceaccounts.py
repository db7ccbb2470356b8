"""ServiceAccount tokens of the local API server: ``TokenRequest`` and their authentication.

Purpose
    ``POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`` (what
    ``kubectl create token NAME`` sends, and what a kubelet does for a
    projected ``serviceAccountToken`` volume) answers a ``TokenRequest``
    (authentication.k8s.io/v1) whose ``status.token`` is a JWT signed by this
    server (HS256 with a key of the process). With authentication on
    (``--token-file``) such a token authenticates as kube-apiserver's do:

    * user ``system:serviceaccount:<ns>:<name>``, uid the ServiceAccount's uid;
    * groups ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``,
      ``system:authenticated``;
    * only while it has not expired and the ServiceAccount still exists with
      the same uid (a deleted and re-created account's old tokens are refused);
    * ``TokenReview`` accepts it too (a proxy in ``delegate`` mode).

Invariants
    * Tokens are never logged; only their claims are read back.
    * The signing key lives in the process only: tokens do not survive a
      restart of the server (request new ones, as a kubelet does).
    * ``spec.expirationSeconds`` is at least 600 (kube's minimum, 422 below),
      default 3600.

Concurrency model
    :class:`ServiceAccountTokens` is immutable after construction and
    thread-safe; the ServiceAccount lookup is a blocking store read, run in a
    worker thread by its callers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from local_apiserver.errors import bad_request, invalid
from rangeshard.core.kubeapi import UserInfo

ISSUER = "rangeshard-local-apiserver"
#: The audience of a token requested without one (kube-apiserver's default ``--api-audiences``).
DEFAULT_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
MIN_EXPIRATION = 600
DEFAULT_EXPIRATION = 3600
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
API_VERSION = "authentication.k8s.io/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def service_account_user(namespace: str, name: str, uid: str) -> UserInfo:
    """The user a ServiceAccount's token authenticates as (module docstring)."""
    groups = (SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}", "system:authenticated")
    return UserInfo(f"system:serviceaccount:{namespace}:{name}", uid, groups)


class ServiceAccountTokens:
    """Issues and verifies the server's ServiceAccount tokens (HS256 JWTs)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _sign(self, signing_input: str) -> str:
        return _b64(hmac.new(self._key, signing_input.encode("ascii"), hashlib.sha256).digest())

    def issue(
        self, namespace: str, name: str, uid: str, audiences: list[str], expiration: int, now: float | None = None
    ) -> tuple[str, int]:
        """A token for the ServiceAccount and its expiry (seconds since the epoch)."""
        issued = int(now if now is not None else time.time())
        expires = issued + expiration
        claims = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{namespace}:{name}",
            "aud": audiences,
            "iat": issued,
            "nbf": issued,
            "exp": expires,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}},
        }
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = f"{header}.{payload}"
        return f"{signing_input}.{self._sign(signing_input)}", expires

    def claims(self, token: str, now: float | None = None) -> tuple[str, str, str, list[str]] | None:
        """``(namespace, name, uid, audiences)`` of a valid, unexpired token of this server, else None."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        signing_input = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._sign(signing_input), parts[2]):
            return None
        try:
            doc = json.loads(_unb64(parts[1]))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(doc, dict) or doc.get("iss") != ISSUER:
            return None
        exp = doc.get("exp")
        if not isinstance(exp, int) or exp <= (now if now is not None else time.time()):
            return None
        ref = doc.get("kubernetes.io") or {}
        sa = ref.get("serviceaccount") or {}
        namespace, name, uid = ref.get("namespace"), sa.get("name"), sa.get("uid")
        audiences = doc.get("aud") or []
        if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)):
            return None
        if not isinstance(audiences, list):
            return None
        return namespace, name, uid, [a for a in audiences if isinstance(a, str)]


def parse_token_request(body: Any) -> tuple[list[str], int]:
    """``(audiences, expirationSeconds)`` of a TokenRequest body (400/422 as kube answers)."""
    if body is None or body == {}:
        body = {"spec": {}}
    if not isinstance(body, dict):
        raise bad_request("the request body must be a TokenRequest object")
    if body.get("kind") not in (None, "TokenRequest"):
        raise bad_request(f"expected kind TokenRequest, got {body.get('kind')!r}")
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise bad_request("TokenRequest: spec must be an object")
    audiences = spec.get("audiences") or [DEFAULT_AUDIENCE]
    if not isinstance(audiences, list) or not all(isinstance(a, str) and a for a in audiences):
        raise bad_request("spec.audiences must be a list of non-empty strings")
    expiration = DEFAULT_EXPIRATION if spec.get("expirationSeconds") is None else spec["expirationSeconds"]
    if not isinstance(expiration, int) or isinstance(expiration, bool):
        raise bad_request("spec.expirationSeconds must be an integer")
    if expiration < MIN_EXPIRATION:
        why = f"Invalid value: {expiration}: may not specify a duration less than 10 minutes"
        raise invalid("TokenRequest", "", [("spec.expirationSeconds", why)])
    return audiences, expiration


def token_request_answer(audiences: list[str], expiration: int, token: str, expires: int) -> dict[str, Any]:
    """The TokenRequest kube answers: the spec as asked, the token and its expiry in ``status``."""
    stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "kind": "TokenRequest",
        "apiVersion": API_VERSION,
        "metadata": {"creationTimestamp": None},
        "spec": {"audiences": audiences, "expirationSeconds": expiration, "boundObjectRef": None},
        "status": {"token": token, "expirationTimestamp": stamp},
    }
