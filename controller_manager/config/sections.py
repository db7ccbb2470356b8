"""The `etcd`, `proxy` and `metrics` sections of a manager config.

Concurrency model
    Frozen models.
"""

from __future__ import annotations

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from controller_manager.config.common import DEFAULT_ETCD, DEFAULT_PROXY, Section
from rangeshard.core.settings import ApiUrl, EtcdUrl, PortOrAny, field_error


class EtcdSection(Section):
    """How the manager reaches etcd (the registry). Relative file paths are relative to the config file."""

    endpoints: tuple[EtcdUrl, ...] = Field(
        (DEFAULT_ETCD,),
        description="etcd client URLs: `http://host[:port]`, `https://host[:port]` (port 2379 by default) "
        "or `host:port` (http), as for `--etcd`.",
    )
    ca_cert: str | None = Field(
        None, alias="caCert", description="PEM file of the CA that signed etcd's server certificate (https endpoints)."
    )
    cert: str | None = Field(None, description="PEM client certificate for mutual TLS; needs `key`.")
    key: str | None = Field(None, description="PEM private key of `cert`.")
    username: str | None = Field(None, description="etcd user name; needs `password`.")
    password: SecretStr | None = Field(None, description="Password of `username`. Never logged or printed.")

    @field_validator("endpoints")
    @classmethod
    def _not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # After item validation, so a list of bad URLs is not also reported as "empty".
        if not value:
            raise ValueError("at least one endpoint is required")
        return value

    @model_validator(mode="after")
    def _pairs(self) -> EtcdSection:
        if (self.cert is None) != (self.key is None):
            raise field_error("key" if self.key is None else "cert", "cert and key must be given together")
        if (self.username is None) != (self.password is None):
            raise field_error(
                "password" if self.password is None else "username", "username and password must be given together"
            )
        return self


class ProxySection(Section):
    """Where the range filter proxy listens; informers list and watch through it."""

    url: ApiUrl = Field(DEFAULT_PROXY, description="Base URL of the range filter proxy (`http(s)://host:port[/path]`).")
    token_file: str | None = Field(
        None,
        alias="tokenFile",
        description=(
            "File holding the bearer token sent to the proxy (e.g. a projected ServiceAccount token); "
            "needed when the proxy runs with `--auth-mode static|delegate`. Re-read on every start, never logged."
        ),
    )
    ca_cert: str | None = Field(None, alias="caCert", description="PEM CA bundle to verify an `https://` proxy URL.")


class MetricsSection(Section):
    """The HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`. `metrics: null` disables it."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on.")
    port: PortOrAny = Field(
        0,
        strict=True,
        description="TCP port; 0 picks a free port (the manager logs the address it got).",
    )
