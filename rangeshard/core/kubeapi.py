"""Kubernetes API building blocks shared by the local API server and the range filter proxy.

Purpose
    Both HTTP servers speak the Kubernetes REST conventions; what they share
    lives here once:

    * :class:`ApiError` and :func:`status_object`: a failure answered as a
      ``meta/v1 Status`` (code, reason, message, details);
    * the one ``410 Expired`` (kube's ``NewResourceExpired``): :func:`gone`
      is the error a handler raises, :func:`expired_status` its ``Status``
      for a watch's ``ERROR`` event, with kube-apiserver's two messages
      (:func:`too_old_message`, :data:`EXPIRED_CONTINUE_MESSAGE`);
    * a watch stream's lines, ``{"type":"T","object":<object>}`` (:func:`event_line`),
      a kubeconfig for a server (:func:`kubeconfig`), and the media ranges of
      an ``Accept`` header (:func:`media_ranges`: JSON or a Table);
    * bearer-token files in kube-apiserver's ``--token-auth-file`` format
      (CSV lines ``token,user,uid[,"group1,group2"]``): :func:`parse_token_file`,
      :func:`load_token_file`, :class:`UserInfo`; the one static-token
      authenticator (:class:`StaticTokens`, :func:`bearer_token`) and the
      ``401``/``403`` answers worded as kube-apiserver words them
      (:func:`unauthorized`, :func:`forbidden`), for both servers;
    * :class:`BodyLimit`, the ASGI middleware answering ``413
      RequestEntityTooLarge`` for a request body larger than the limit (3 MiB
      by default, like kube-apiserver's ``MaxRequestBodyBytes``): at once
      when ``Content-Length`` says so, otherwise as soon as a streamed body
      crosses it (the handler reading it gets :class:`RequestTooLarge`).

Invariants
    * This module imports nothing of ours but :mod:`rangeshard.core.errors`
      (import-linter contract), so both servers may use it.
    * Tokens are never kept in clear (users are keyed by the SHA-256 of their
      token), never logged and never part of an error message.
    * A body is never read, buffered or forwarded past the limit.

Concurrency model
    Plain values and pure functions; the middleware is stateless per request.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson

from rangeshard.core.errors import ConfigError, RangeshardError

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# ---- Status ---------------------------------------------------------------------------------


class ApiError(RangeshardError):
    """A client-visible failure, answered as a Kubernetes ``Status`` (4xx/5xx ``code``, ``reason``)."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` object for this error."""
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Kubernetes ``meta/v1 Status`` of a failure (always ``kind: Status, apiVersion: v1``)."""
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def read_status(body: bytes | str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Kubernetes ``Status`` an answer's body (JSON bytes or text, or parsed) holds; ``None`` for anything else.

    The one reader of Status bodies: an API error's body, a watch's ``ERROR`` event object, a fenced 409.
    """
    doc: Any = body
    if isinstance(body, bytes | str):
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(doc, Mapping) or doc.get("kind", "Status") != "Status":
        return None
    return dict(doc)


def status_message(body: bytes | str | Mapping[str, Any] | None, default: str) -> str:
    """The ``message`` of the ``Status`` in ``body`` (:func:`read_status`); ``default`` when it has none."""
    status = read_status(body)
    message = status.get("message") if status is not None else None
    return message if isinstance(message, str) and message else default


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


#: kube-apiserver's message for a continue token whose snapshot is gone (etcd compacted it).
EXPIRED_CONTINUE_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter."
)


def gone(message: str) -> ApiError:
    """410 Expired: a resourceVersion or continue token too old to serve (the client relists)."""
    return ApiError(410, "Expired", message)


def expired_status(message: str) -> dict[str, Any]:
    """The ``Status`` of :func:`gone`, as a watch's ``ERROR`` event carries it."""
    return gone(message).status()


def too_old_message(requested: int, oldest: int) -> str:
    """kube-apiserver's 410 message for a watch from ``requested`` when history starts at ``oldest``."""
    return f"too old resource version: {requested} ({oldest})"


#: How a watch line of each type begins in kube-apiserver's encoding (``{"type":"T","object":<object>}``).
WATCH_LINE_PREFIXES = {t: b'{"type":"%b","object":' % t.encode() for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")}


def watch_line_prefix(etype: str) -> bytes:
    return WATCH_LINE_PREFIXES.get(etype) or b'{"type":"' + etype.encode() + b'","object":'


def event_line(etype: str, obj: bytes | memoryview | Mapping[str, Any]) -> bytes:
    """One line of a JSON watch stream; ``obj`` as its JSON bytes (copied once) or as an object to encode."""
    raw = obj if isinstance(obj, bytes | memoryview) else orjson.dumps(obj)
    return b"".join((watch_line_prefix(etype), raw, b"}\n"))


def media_ranges(accept: str) -> list[tuple[str, dict[str, str]]]:
    """The media ranges of an ``Accept`` header in order: lower-case type and its parameters (``as``, ``g``, ``v``)."""
    ranges = []
    for item in accept.split(","):
        parts = [p.strip() for p in item.split(";")]
        params = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in parts[1:])}
        ranges.append((parts[0].lower(), params))
    return ranges


def kubeconfig(server: str, name: str = "rangeshard", *, skip_tls_verify: bool = False) -> dict[str, Any]:
    """A kubeconfig with one cluster, user and context ``name`` for ``server``, no credentials.

    ``skip_tls_verify`` for a plain ``http://`` server too: the JavaScript client
    (``@kubernetes/client-node``) refuses plain HTTP without it.
    """
    cluster: dict[str, Any] = {"server": server, **({"insecure-skip-tls-verify": True} if skip_tls_verify else {})}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


# ---- token files ----------------------------------------------------------------------------

#: The group every authenticated user is in.
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True)
class Attributes:
    """What a request does, as an authorizer sees it (``resource == ""``: a non-resource ``path``).

    The fields of a SubjectAccessReview's ``resourceAttributes`` (or
    ``nonResourceAttributes`` for ``path``); both servers' authorizers use it.
    """

    verb: str
    resource: str = ""
    group: str = ""
    version: str = ""
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    path: str = ""


@dataclass(frozen=True)
class UserInfo:
    """An authenticated user, as a token file or a TokenReview tells it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``UserInfo`` of a ``TokenReview`` status."""
        out: dict[str, Any] = {"username": self.username, "uid": self.uid, "groups": list(self.groups)}
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


def token_digest(token: str) -> str:
    """The SHA-256 of a token: the only form in which tokens are kept."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def parse_token_file(text: str, source: str = "token file") -> dict[str, UserInfo]:
    """Parse ``token,user,uid[,"g1,g2"]`` lines into users keyed by token digest.

    ``#`` comment lines and blank lines are skipped; every user gets the group
    ``system:authenticated``. Raises :class:`ConfigError` naming the line,
    never the token.
    """
    users: dict[str, UserInfo] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3:
            raise ConfigError(f"{source}:{lineno}: want token,user,uid[,groups], got {len(row)} field(s)")
        token, user, uid = (f.strip() for f in row[:3])
        if not token or not user:
            raise ConfigError(f"{source}:{lineno}: token and user must not be empty")
        groups = [g.strip() for g in row[3].split(",") if g.strip()] if len(row) > 3 else []
        if AUTHENTICATED not in groups:
            groups.append(AUTHENTICATED)
        key = token_digest(token)
        if key in users:
            raise ConfigError(f"{source}:{lineno}: duplicate token (user {user!r})")
        users[key] = UserInfo(user, uid, tuple(groups))
    if not users:
        raise ConfigError(f"{source}: no tokens")
    return users


def load_token_file(path: str) -> dict[str, UserInfo]:
    """Read and parse a token file (:class:`ConfigError` if unreadable or malformed)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--token-file {path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    return parse_token_file(text, path)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class StaticTokens:
    """Users of a token file, by token digest: the static-token authenticator of both servers."""

    def __init__(self, users: dict[str, UserInfo]) -> None:
        self._users = dict(users)

    def __bool__(self) -> bool:
        return bool(self._users)

    def authenticate(self, token: str | None) -> UserInfo | None:
        """The user of ``token``, or None."""
        return self._users.get(token_digest(token)) if token else None


def unauthorized() -> ApiError:
    """401 Unauthorized, worded as kube-apiserver does."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(user: UserInfo, attrs: Attributes, reason: str = "") -> ApiError:
    """403 Forbidden, worded as kube-apiserver does (name and subresource included; ``reason`` appended)."""
    who = f'User "{user.username}"'
    suffix = f": {reason}" if reason else ""
    if not attrs.resource:
        return ApiError(403, "Forbidden", f'forbidden: {who} cannot {attrs.verb} path "{attrs.path}"{suffix}', {})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    group_resource = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    subject = f'{group_resource} "{attrs.name}"' if attrs.name else group_resource
    message = (
        f'{subject} is forbidden: {who} cannot {attrs.verb} resource "{resource}" '
        f'in API group "{attrs.group}" {scope}{suffix}'
    )
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.group:
        details["group"] = attrs.group
    if attrs.name:
        details["name"] = attrs.name
    return ApiError(403, "Forbidden", message, details)


# ---- request body limit ---------------------------------------------------------------------

#: kube-apiserver's limit of a request body (``MaxRequestBodyBytes``).
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024


class RequestTooLarge(ApiError):
    """The request body is larger than the configured limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


async def send_status(send: Send, error: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send ``error`` as a complete JSON ``Status`` response."""
    body = orjson.dumps(error.status())
    await send(
        {
            "type": "http.response.start",
            "status": error.code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def declared_too_large(headers: Iterable[tuple[bytes, bytes]], max_bytes: int) -> bool:
    """Whether an ASGI request's ``Content-Length`` is over ``max_bytes``."""
    for key, value in headers:
        if key.lower() == b"content-length":
            text = bytes(value).decode("latin-1").strip()
            return text.isascii() and text.isdigit() and int(text) > max_bytes
    return False


class ClientGone(RangeshardError):
    """The client disconnected before its request body was read (not an error of ours)."""


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """An ASGI request's whole body; :class:`RequestTooLarge` over ``max_bytes``, :class:`ClientGone`."""
    parts: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        data = message.get("body", b"")
        seen += len(data)
        if seen > max_bytes:
            raise RequestTooLarge(max_bytes)
        parts.append(data)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


class BodyLimit:
    """Reject request bodies larger than ``max_bytes`` with 413 (see module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_too_large(scope.get("headers") or [], self.max_bytes):
            await send_status(send, RequestTooLarge(self.max_bytes), [(b"connection", b"close")])
            return
        seen = 0
        limit = self.max_bytes

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise RequestTooLarge(limit)
            return message

        await self.app(scope, limited, send)
