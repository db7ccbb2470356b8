"""How to reach etcd: the one endpoint grammar, TLS and credentials.

Purpose
    :func:`parse_endpoint` reads every etcd endpoint of rangeshard (``--etcd URL[,URL...]``,
    ``$RANGESHARD_ETCD``, the manager's ``etcd.endpoints``): ``http://HOST[:PORT]``,
    ``https://HOST[:PORT]`` (port 2379 by default) or ``HOST:PORT`` (http, as etcdctl reads it).
    :class:`EtcdConfig` adds TLS files, credentials and the call deadline.

Invariants
    Anything else is a :class:`~rangeshard.core.errors.ConfigError` naming the value; credentials in a
    URL are refused and shown as ``***``; ``password`` is in no ``repr``, message or log line.

Concurrency model
    Frozen values and pure functions; no gRPC here (cheap to import).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rangeshard.core.errors import ConfigError

ENV_ENDPOINTS = "RANGESHARD_ETCD"
DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_TIMEOUT = 5.0
DEFAULT_PORT = 2379
_WANT = "want http(s)://HOST[:PORT] or HOST:PORT"


@dataclass(frozen=True)
class EtcdEndpoint:
    """One etcd endpoint: ``host:port`` and whether it speaks TLS."""

    host: str
    port: int
    secure: bool

    @property
    def address(self) -> str:
        """``host:port`` (an IPv6 host in brackets), as gRPC and URLs spell it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.address}"


def parse_endpoint(url: str) -> EtcdEndpoint:
    """Read one endpoint in the grammar of the module docstring; :class:`ConfigError` naming it otherwise."""
    text = url.strip()
    try:
        return _parse(text)
    except ValueError as e:
        shown = re.sub(r"(^|//)[^/@]*@", r"\1***@", text)
        raise ConfigError(f"etcd endpoint {shown!r}: {e}; {_WANT}") from e


def _parse(text: str) -> EtcdEndpoint:
    if not text or any(c.isspace() for c in text):
        raise ValueError("a URL is one word with no spaces")
    try:
        parts = urlsplit(text if "://" in text else f"http://{text}")
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid URL ({e})") from e
    if parts.scheme not in ("http", "https"):
        raise ValueError("scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials do not belong in the URL (use the etcd user and password settings)")
    if not parts.hostname:
        raise ValueError("no host")
    if "://" not in text and port is None:
        # A bare word such as "foo" is a typo far more often than a host on the default port.
        raise ValueError("not a valid URL")
    if port == 0:
        raise ValueError("port must be 1-65535")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("expected scheme://host:port and nothing else")
    return EtcdEndpoint(parts.hostname, port or DEFAULT_PORT, parts.scheme == "https")


def parse_endpoints(urls: str | Sequence[str]) -> tuple[EtcdEndpoint, ...]:
    """Read ``URL[,URL...]`` (or a list); one :class:`ConfigError` listing every bad endpoint."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    endpoints: list[EtcdEndpoint] = []
    problems: list[str] = []
    for item in (u for u in items if u.strip()):
        try:
            endpoints.append(parse_endpoint(item))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError(problems[0], problems)
    if not endpoints:
        raise ConfigError("etcd: no endpoint given")
    return tuple(endpoints)


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd. Secrets (``password``) are never logged or printed."""

    endpoints: tuple[EtcdEndpoint, ...]
    ca_cert: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_urls(
        cls,
        urls: str | Sequence[str] | None = None,
        *,
        ca_cert: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> EtcdConfig:
        """Build a config from ``URL[,URL...]`` (or a list); fall back to ``$RANGESHARD_ETCD``, then the default.

        Raises :class:`ConfigError` naming the bad URL.
        """
        endpoints = parse_endpoints(urls or os.environ.get(ENV_ENDPOINTS) or DEFAULT_ENDPOINT)
        if (cert_file is None) != (key_file is None):
            raise ConfigError("etcd: a client certificate needs both cert and key files")
        if (username is None) != (password is None):
            raise ConfigError("etcd: authentication needs both username and password")
        if timeout <= 0:
            raise ConfigError(f"etcd: timeout must be positive, got {timeout}")
        return cls(endpoints, ca_cert, cert_file, key_file, username, password, timeout)

    @property
    def urls(self) -> str:
        """The endpoints as a comma-separated URL list (no secrets)."""
        return ",".join(e.url for e in self.endpoints)

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None or any(e.secure for e in self.endpoints)

    def tls_files(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The PEM bytes of (CA, client key, client certificate); :class:`ConfigError` naming an unreadable file."""

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ConfigError(f"etcd TLS file {path}: {e.strerror}") from e

        return read(self.ca_cert), read(self.key_file), read(self.cert_file)
