"""Component settings as pydantic models: the shared field types and the command-line reader.

Purpose
    Every input the components share has one grammar and one error, wherever
    it is read (a flag of ``rangeshard proxy`` or ``rangeshard
    local-apiserver``, a key of the manager's config file):

    ==================  ================================================================
    type                grammar
    ==================  ================================================================
    :data:`Port`        a TCP port 1..65535 (:data:`PortOrAny`: 0 means any free port)
    :data:`KeyPrefix`   an absolute etcd key prefix ``/name[/name...]``; a trailing
                        slash is dropped, so ``/rangeshard/`` is ``/rangeshard``
    :data:`ApiUrl`      ``http(s)://host[:port][/path]``, no credentials, query or
                        fragment (returned without a trailing slash)
    :data:`EtcdUrl`     one etcd endpoint (:func:`rangeshard.core.etcd.parse_endpoint`);
                        :data:`EtcdEndpoints` ``URL[,URL...]`` or a list of them
    :data:`ResourceNames`  comma-separated resources as kubectl names them
                        (:func:`hashing.resources.parse_resource_name`)
    :data:`ExistingFile`  a path naming an existing file
    :data:`LogLevel`    ``debug|info|warning|error`` (any case)
    ==================  ================================================================

    :func:`flag_command` turns a :class:`Flags` model into a typer command:
    each field is one option, ``--field-name`` (help from its description,
    the environment variable from ``json_schema_extra={"envvar": ...}``),
    and the command validates the values into the model before it runs, so a
    bad value exits 2 with ``error: --flag: problem`` (every problem at once),
    never a traceback.

Invariants
    * A check raises ``ValueError`` with a message that does not repeat a
      credential; :func:`read_flags` turns each pydantic error into one
      ``--flag: problem`` line of a :class:`~rangeshard.core.errors.ConfigError`.
    * Cross-field problems use :func:`field_error` so they are reported at the
      field they belong to.

Concurrency model
    Pure functions and frozen models.
"""

from __future__ import annotations

import inspect
import os
import re
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Self, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

import typer
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from hashing.resources import parse_resource_name
from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import EtcdConfig, parse_endpoint, parse_endpoints
from rangeshard.core.logs import LEVELS

ENV_USER = "RANGESHARD_ETCD_USER"
ENV_PASSWORD = "RANGESHARD_ETCD_PASSWORD"  # noqa: S105 (the name of a variable, not a password)
#: Error type of cross-field problems; ``ctx["field"]`` names the field (alias) the problem belongs to.
FIELD_ERROR = "rangeshard_field"


def field_error(field: str, message: str) -> PydanticCustomError:
    """A problem a model validator reports at ``field`` (its alias in a file, its flag on a command line)."""
    return PydanticCustomError(FIELD_ERROR, message, {"field": field})


_KEY_PREFIX_RE = re.compile(r"^(/[A-Za-z0-9._-]+)+$")


def check_key_prefix(value: str) -> str:
    """An absolute key prefix ``/name[/name...]``, returned without its trailing slash."""
    text = value[:-1] if value.endswith("/") and len(value) > 1 else value
    if not _KEY_PREFIX_RE.match(text):
        raise ValueError("must be an absolute key prefix such as /rangeshard (/name[/name...], no empty segments)")
    return text


def check_api_url(value: str) -> str:
    """An ``http(s)://host[:port][/path]`` URL without credentials, query or fragment; no trailing slash."""
    text = value.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("URL scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("URL must not contain credentials (user:password@): give a token or a kubeconfig instead")
    if not parts.hostname:
        raise ValueError("URL has no host")
    if port == 0:
        raise ValueError("URL port must be 1..65535")
    if parts.query or parts.fragment:
        raise ValueError("URL must not have a query or fragment")
    return text.rstrip("/")


def _etcd_url(value: str) -> str:
    try:
        return parse_endpoint(value).url
    except ConfigError as e:
        raise ValueError(str(e)) from e


def _etcd_endpoints(value: object) -> object:
    if not isinstance(value, str | list | tuple):
        return value
    try:
        return tuple(e.url for e in parse_endpoints(value))
    except ConfigError as e:
        raise ValueError("; ".join(e.problems)) from e


def check_resource_names(value: object) -> object:
    """``pods,replicasets.apps`` (or a list) as a tuple of names, each read by the one kubectl-style parser."""
    if not isinstance(value, str | list | tuple):
        return value
    names = tuple(n.strip() for n in (value.split(",") if isinstance(value, str) else value) if str(n).strip())
    for name in names:
        parse_resource_name(name)  # ValueError naming the name
    return names


def _existing_file(value: str) -> str:
    if not os.path.isfile(value):
        raise ValueError(f"file not found: {value}")
    return value


def _log_level(value: str) -> str:
    if value.lower() not in LEVELS:
        raise ValueError(f"unknown level {value!r} (use {', '.join(LEVELS)})")
    return value.lower()


Port = Annotated[int, Field(ge=1, le=65535)]
PortOrAny = Annotated[int, Field(ge=0, le=65535)]
KeyPrefix = Annotated[str, AfterValidator(check_key_prefix)]
ApiUrl = Annotated[str, AfterValidator(check_api_url)]
EtcdUrl = Annotated[str, AfterValidator(_etcd_url)]
EtcdEndpoints = Annotated[tuple[str, ...], BeforeValidator(_etcd_endpoints)]
ResourceNames = Annotated[tuple[str, ...], BeforeValidator(check_resource_names)]
ExistingFile = Annotated[str, AfterValidator(_existing_file)]
LogLevel = Annotated[str, AfterValidator(_log_level)]


class Flags(BaseModel):
    """Base of a component's command-line settings: unknown fields are errors, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def flag_name(field: str) -> str:
    """The option of a field: ``max_request_body_bytes`` -> ``--max-request-body-bytes``."""
    return "--" + field.replace("_", "-")


def problems_of(e: ValidationError, name: Callable[[str], str]) -> list[str]:
    """``name(field): problem`` for each error of a validation (``field`` the first step of its location)."""
    out: list[str] = []
    for err in e.errors():
        ctx = err.get("ctx") or {}
        field = str(ctx["field"]) if err["type"] == FIELD_ERROR else str(err["loc"][0]) if err["loc"] else ""
        message = str(ctx["error"]) if err["type"] == "value_error" and "error" in ctx else err["msg"]
        out.append(f"{name(field)}: {message}" if field else message)
    return out


M = TypeVar("M", bound=BaseModel)


def read_flags(model: type[M], values: Mapping[str, Any]) -> M:
    """Validate option values into ``model``; :class:`ConfigError` with one ``--flag: problem`` line each."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as e:
        problems = problems_of(e, flag_name)
        raise ConfigError("; ".join(problems), problems) from None


def _cli_type(annotation: Any) -> Any:
    """What typer parses a field as: ``bool``/``int``/``float`` as such, anything else as text (or ``None``)."""
    if get_origin(annotation) is Annotated:
        return _cli_type(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return _cli_type(inner[0]) | None if len(inner) == 1 else str | None
    return annotation if annotation in (bool, int, float) else str


def flag_command(model: type[M], run: Callable[[M], None], doc: str) -> Callable[..., None]:
    """A typer command whose options are ``model``'s fields; it reads them into the model, then calls ``run``.

    A bad value prints ``error: --flag: problem`` (each) and exits 2.
    """
    params = []
    own = inspect.get_annotations(model)
    for name in sorted(model.model_fields, key=lambda n: n not in own):  # the command's own options first
        field = model.model_fields[name]
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        envvar = extra.get("envvar")
        option = typer.Option(
            flag_name(name),
            help=field.description,
            envvar=envvar if isinstance(envvar, str) else None,
            show_default=field.repr,
        )
        default = field.default
        if isinstance(default, tuple):  # a parsed list (resources): the option takes the text
            default = ",".join(default)
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[_cli_type(field.annotation), option],
            )
        )

    def command(**values: Any) -> None:
        try:
            settings = read_flags(model, values)
        except ConfigError as e:
            for problem in e.problems:
                typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2) from e
        run(settings)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    command.__name__ = f"{model.__name__.lower()}_command"
    return command


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class ServingFlags(Flags):
    """What the two HTTP servers (proxy, local API server) share: address, TLS, log level, body limit."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on")
    tls_cert: ExistingFile | None = Field(None, description="Serve HTTPS with this certificate (PEM)")
    tls_key: ExistingFile | None = Field(None, description="Private key (PEM) of --tls-cert")
    log_level: LogLevel = Field("info", description="debug, info, warning, error")
    max_request_body_bytes: int = Field(
        3 * 1024 * 1024, ge=1024, description="Largest accepted request body (413 beyond)"
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise field_error("tls_key" if self.tls_key is None else "tls_cert", "--tls-cert and --tls-key go together")
        return self

    @property
    def loopback(self) -> bool:
        """Whether the server listens on the loopback interface only."""
        return self.host in LOOPBACK_HOSTS


class EtcdClientFlags(Flags):
    """etcd TLS and authentication, spelled as every command spells them (:mod:`rangeshard.core.options`)."""

    etcd_cacert: ExistingFile | None = Field(None, description="CA bundle for etcd TLS.")
    etcd_cert: ExistingFile | None = Field(None, description="Client certificate for etcd TLS.")
    etcd_key: ExistingFile | None = Field(None, description="Client key for etcd TLS.")
    etcd_user: str | None = Field(None, description="etcd username.", json_schema_extra={"envvar": ENV_USER})
    etcd_password: str | None = Field(
        None, description="etcd password.", repr=False, json_schema_extra={"envvar": ENV_PASSWORD}
    )

    @model_validator(mode="after")
    def _pairs(self) -> Self:
        if (self.etcd_cert is None) != (self.etcd_key is None):
            raise field_error(
                "etcd_key" if self.etcd_key is None else "etcd_cert", "--etcd-cert and --etcd-key go together"
            )
        if (self.etcd_user is None) != (self.etcd_password is None):
            missing = "etcd_password" if self.etcd_password is None else "etcd_user"
            raise field_error(missing, "--etcd-user and --etcd-password go together")
        return self

    def etcd_options_given(self) -> bool:
        """Whether any etcd TLS or authentication option is set."""
        values = (self.etcd_cacert, self.etcd_cert, self.etcd_key, self.etcd_user, self.etcd_password)
        return any(v is not None for v in values)

    def etcd_config(self, endpoints: tuple[str, ...] | None) -> EtcdConfig:
        """The etcd config of these flags and ``endpoints`` (``$RANGESHARD_ETCD`` or the default when ``None``)."""
        return EtcdConfig.from_urls(
            endpoints,
            ca_cert=self.etcd_cacert,
            cert_file=self.etcd_cert,
            key_file=self.etcd_key,
            username=self.etcd_user,
            password=self.etcd_password,
        )
