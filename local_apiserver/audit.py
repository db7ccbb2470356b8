"""The local API server's audit log: one ``audit.k8s.io/v1`` ``Event`` per request, as kube-apiserver writes.

Purpose
    ``--audit-log-path FILE`` turns it on; ``--audit-level`` chooses how much
    of each request is kept, with kube-apiserver's level names:

    * ``Metadata``: who (``user``, ``userAgent``, ``sourceIPs``), what
      (``verb``, ``requestURI``, ``objectRef``), the answer
      (``responseStatus.code``) and when (``requestReceivedTimestamp``,
      ``stageTimestamp``);
    * ``Request``: plus ``requestObject`` (the decoded request body; a
      protobuf body as the JSON it decodes to, nothing if it does not);
    * ``RequestResponse``: plus ``responseObject`` (the decoded answer).

    Every event is written at stage ``ResponseComplete`` only (a watch's event
    is written when its stream ends). ``objectRef`` carries ``resource``,
    ``namespace``, ``name``, ``apiGroup``, ``apiVersion``, ``subresource``
    and, for single objects, the ``uid`` (and ``resourceVersion``) of the
    answered object, so a reader can attribute every write to an object even
    when the request did not name it (``create`` with ``generateName``).

Invariants
    * One event is one JSON line, written with a single ``os.write`` on an
      ``O_APPEND`` descriptor: lines never interleave, and a reader may read
      the file while the server writes (a partial last line is the only
      possible tear).
    * Timestamps are RFC 3339 in UTC with microseconds, as kube-apiserver
      writes them (``2026-01-01T00:00:00.000000Z``).
    * Secrets never enter the log: ``Authorization`` is not recorded, and
      bodies of TokenReviews are never recorded (their ``spec.token`` is a
      credential), whatever the level.

Concurrency model
    Called on the server's event loop; the write is one small system call
    under a lock (it is also safe from threads).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from rangeshard.core.errors import ConfigError
from rangeshard.core.kubeapi import Attributes, UserInfo
from rangeshard.core.protobuf_decode import decode_delete_options, decode_object
from rangeshard.core.protobuf_wire import MAGIC, ProtobufError
from rangeshard.core.requestinfo import is_write
from rangeshard.core.timestamps import format_micro_time

API_VERSION = "audit.k8s.io/v1"
STAGE = "ResponseComplete"


class AuditLevel(StrEnum):
    """How much of each request the log keeps (kube-apiserver's level names)."""

    METADATA = "Metadata"
    REQUEST = "Request"
    REQUEST_RESPONSE = "RequestResponse"

    @classmethod
    def parse(cls, value: str) -> AuditLevel:
        for level in cls:
            if level.value.lower() == value.lower():
                return level
        raise ConfigError(f"--audit-level must be Metadata, Request or RequestResponse, got {value!r}")


def facts_from_info(info: Mapping[str, str]) -> Attributes:
    """The request's verb and object, as the request handler recorded them in ``info``."""
    keys = ("verb", "resource", "subresource", "namespace", "name", "group", "version")
    return Attributes(**{key: info.get(key, "") for key in keys})


class AuditLog:
    """An append-only JSON-lines file of audit events (see module docstring)."""

    def __init__(self, path: str, level: AuditLevel = AuditLevel.METADATA) -> None:
        self.path = path
        self.level = level
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ConfigError(f"--audit-log-path: directory {parent} does not exist")
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            raise ConfigError(f"--audit-log-path: cannot open {path}: {e.strerror}") from e
        self._lock = threading.Lock()

    def write(self, event: Mapping[str, Any]) -> None:
        line = orjson.dumps(event) + b"\n"
        with self._lock:
            if self._fd is None:
                return
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- building events -----------------------------------------------------------
    async def record(self, request: Request, facts: Attributes, response: Response, received: datetime) -> Response:
        """Write the event of one answered request (for a stream: when it ends); returns the response to send."""
        request_object = await self._request_object(request, facts)
        if isinstance(response, StreamingResponse):
            original = response.body_iterator

            async def audited() -> AsyncIterator[Any]:
                try:
                    async for chunk in original:
                        yield chunk
                finally:
                    self.write(self.event(request, facts, response.status_code, received, request_object, None))

            response.body_iterator = audited()
            return response
        response_object = _decode(bytes(response.body)) if response.body else None
        self.write(self.event(request, facts, response.status_code, received, request_object, response_object))
        return response

    async def _request_object(self, request: Request, facts: Attributes) -> Any:
        if self.level is AuditLevel.METADATA or not is_write(request.method):
            return None
        if facts.resource == "tokenreviews":
            return None  # the body holds a credential
        try:
            body = await request.body()  # cached by Starlette when the handler read it
        except Exception:  # the client went away or the body was too large: nothing to record
            return None
        if body.startswith(MAGIC):
            try:
                return decode_delete_options(body) if request.method == "DELETE" else decode_object(body)
            except ProtobufError:
                return None  # refused with a 415/400: the metadata still says what happened
        return _decode(body) if body else None

    def event(
        self,
        request: Request,
        facts: Attributes,
        code: int,
        received: datetime,
        request_object: Any,
        response_object: Any,
    ) -> dict[str, Any]:
        """The ``audit.k8s.io/v1`` ``Event`` of one request."""
        user = request.scope.get("state", {}).get("user")
        client = request.client
        uri = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        event: dict[str, Any] = {
            "kind": "Event",
            "apiVersion": API_VERSION,
            "level": self.level.value,
            "auditID": str(uuid.uuid4()),
            "stage": STAGE,
            "requestURI": uri,
            "verb": facts.verb,
            "user": _user(user),
            "sourceIPs": [client.host] if client is not None else [],
            "userAgent": request.headers.get("user-agent", ""),
            "responseStatus": _response_status(code, response_object),
            "requestReceivedTimestamp": format_micro_time(received),
            "stageTimestamp": format_micro_time(),
        }
        if facts.resource:
            event["objectRef"] = _object_ref(facts, response_object if code < 300 else None, request_object)
        if self.level is not AuditLevel.METADATA and request_object is not None:
            event["requestObject"] = request_object
        if self.level is AuditLevel.REQUEST_RESPONSE and response_object is not None and facts.verb != "watch":
            event["responseObject"] = response_object
        return event


def _decode(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # YAML or garbage: the metadata still says what happened


def _user(user: object) -> dict[str, Any]:
    if isinstance(user, UserInfo):
        out: dict[str, Any] = {"username": user.username, "groups": list(user.groups)}
        if user.uid:
            out["uid"] = user.uid
        return out
    return {"username": "system:anonymous", "groups": ["system:unauthenticated"]}


def _response_status(code: int, response_object: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"metadata": {}, "code": code}
    if isinstance(response_object, dict) and response_object.get("kind") == "Status":
        for field in ("status", "message", "reason"):
            if response_object.get(field):
                status[field] = response_object[field]
    return status


def _object_ref(facts: Attributes, answered: Any, sent: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": facts.resource}
    if facts.namespace:
        ref["namespace"] = facts.namespace
    name = facts.name
    meta: Mapping[str, Any] = {}
    if isinstance(answered, dict) and answered.get("kind") not in (None, "Status") and "items" not in answered:
        meta = answered.get("metadata") or {}
    elif isinstance(sent, dict):
        meta = sent.get("metadata") or {}
    if not name and facts.verb == "create" and isinstance(meta.get("name"), str):
        name = meta["name"]
    if name:
        ref["name"] = name
    if isinstance(meta.get("uid"), str) and name:
        ref["uid"] = meta["uid"]
    ref["apiGroup"] = facts.group
    if facts.version:
        ref["apiVersion"] = facts.version
    if isinstance(meta.get("resourceVersion"), str) and name:
        ref["resourceVersion"] = meta["resourceVersion"]
    if facts.subresource:
        ref["subresource"] = facts.subresource
    return ref
