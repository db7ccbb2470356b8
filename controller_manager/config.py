"""The controller-manager's local configuration file (YAML), validated by pydantic.

Purpose
    ``rangeshard controller-manager --config FILE`` reads one YAML file that
    says where etcd and the range filter proxy are, how the instance registers
    (lease TTL, registry prefix, instance id prefix), how long one reconcile may
    take, where metrics are served, and which controllers run with how many
    workers (Arktos proposal C: every manager runs the same code; the local
    config decides what it does). :func:`load_config` turns the file into a
    frozen :class:`ManagerConfig` or raises :class:`ConfigError` listing *every*
    problem as ``FILE: dotted.path: problem``, paths spelled as in the file
    (camelCase). :func:`config_reference_markdown` renders the field reference
    (``docs/configuration.md``) from the models' descriptions, so the docs
    cannot drift from the code.

Invariants
    * Unknown keys are errors at every level (``extra="forbid"``); the file
      uses camelCase names only.
    * Numbers are strict: ``workers: "4"`` or ``workers: true`` are errors, not
      coerced. Whole numbers are accepted where a float is expected.
    * ``reconcileTimeoutSeconds < leaseTTLSeconds / 2``: a reconcile (and the
      API calls in it, whose timeouts derive from it) must be able to finish
      between the moment an instance fences itself and the moment its lease can
      expire. Omitted, it is ``min(3, 0.3 * leaseTTLSeconds)``, so every valid
      TTL works without it.
    * The etcd ``password`` is a :class:`pydantic.SecretStr`: never in ``repr``,
      logs or error messages (errors never echo input values).
    * Relative certificate paths are resolved against the config file's
      directory and must name existing files.
    * ``external.livenessProbe`` is spelled as in a pod spec (kubelet's names
      and defaults) and needs ``command``: a sidecar controller is probed by
      the kubelet, from the pod manifest.

Concurrency model
    Pure functions and frozen (immutable) models: safe to share between threads.
"""

from __future__ import annotations

import inspect
import ipaddress
import re
from collections.abc import Hashable
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hashing import ShardBy
from rangeshard.core.errors import ConfigError
from rangeshard.core.rest import parse_resource_name
from registry.models import MainResource

KNOWN_CONTROLLERS: tuple[str, ...] = ("replicaset", "deployment")
"""Controller types a manager can run, in the order they are documented."""

MAX_WORKERS = 64
DEFAULT_ETCD = "http://127.0.0.1:2379"
DEFAULT_PROXY = "http://127.0.0.1:8001"

# Registry names are lowercase DNS-ish (see registry.models.NAME_RE); a prefix may end in "-", "." or "_".
_INSTANCE_PREFIX_RE = re.compile(r"^[a-z0-9][-a-z0-9_.]{0,199}$")
_REGISTRY_PREFIX_RE = re.compile(r"^(/[A-Za-z0-9._-]+)+$")

# Error type for cross-field problems raised from model validators; ctx["field"] names the
# field (alias) the problem belongs to, so it is reported at that path.
_FIELD_ERROR = "rangeshard_field"


def _field_error(field: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(_FIELD_ERROR, message, {"field": field})


def check_url(value: str, *, allow_path: bool) -> str:
    """Validate an ``http(s)://host[:port][/path]`` URL; return it without a trailing slash.

    Raises ``ValueError`` with a message that does not repeat credentials.
    """
    text = value.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("URL scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("URL must not contain credentials (use etcd.username/password)")
    if not parts.hostname:
        raise ValueError("URL has no host")
    if port == 0:
        raise ValueError("URL port must be 1..65535")
    if parts.query or parts.fragment:
        raise ValueError("URL must not have a query or fragment")
    if not allow_path and parts.path not in ("", "/"):
        raise ValueError("URL must be scheme://host:port with no path")
    return text.rstrip("/")


def _etcd_url(value: str) -> str:
    return check_url(value, allow_path=False)


def _proxy_url(value: str) -> str:
    return check_url(value, allow_path=True)


_CONTROLLER_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


def _controller_name(name: str) -> str:
    # Which class runs it is decided by controller_manager.plugins (built-ins, `class:`, entry points).
    if not _CONTROLLER_NAME_RE.match(name):
        raise ValueError(
            f"controller name {name!r} must be 1..63 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return name


def _none_to_empty_mapping(value: object) -> object:
    return {} if value is None else value


DEFAULT_RECONCILE_TIMEOUT = 3.0


def derived_reconcile_timeout(lease_ttl_seconds: int) -> float:
    """The default ``reconcileTimeoutSeconds`` for a TTL: ``min(3, 0.3 * TTL)``, below ``TTL / 2`` for any TTL."""
    return min(DEFAULT_RECONCILE_TIMEOUT, round(0.3 * lease_ttl_seconds, 3))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EtcdSection(_Section):
    """How the manager reaches etcd (the registry). Relative file paths are relative to the config file."""

    endpoints: tuple[Annotated[str, AfterValidator(_etcd_url)], ...] = Field(
        (DEFAULT_ETCD,), description="etcd client URLs, `http://host:port` or `https://host:port`."
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
            raise _field_error("key" if self.key is None else "cert", "cert and key must be given together")
        if (self.username is None) != (self.password is None):
            raise _field_error(
                "password" if self.password is None else "username", "username and password must be given together"
            )
        return self


class ProxySection(_Section):
    """Where the range filter proxy listens; informers list and watch through it."""

    url: Annotated[str, AfterValidator(_proxy_url)] = Field(
        DEFAULT_PROXY, description="Base URL of the range filter proxy (`http(s)://host:port[/path]`)."
    )
    token_file: str | None = Field(
        None,
        alias="tokenFile",
        description=(
            "File holding the bearer token sent to the proxy (e.g. a projected ServiceAccount token); "
            "needed when the proxy runs with `--auth-mode static|delegate`. Re-read on every start, never logged."
        ),
    )
    ca_cert: str | None = Field(None, alias="caCert", description="PEM CA bundle to verify an `https://` proxy URL.")


class MetricsSection(_Section):
    """The HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`. `metrics: null` disables it."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on.")
    port: int = Field(
        0,
        ge=0,
        le=65535,
        strict=True,
        description="TCP port; 0 picks a free port (the manager logs the address it got).",
    )


_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LISTEN_RE = re.compile(r"^(?P<host>[^\s:\[\]]+|\[[0-9a-fA-F:]+\]):(?P<port>[0-9]{1,5})$")


class ShardResourceSection(_Section):
    """A resource whose lists and watches the endpoint cuts to the instance's range."""

    resource: str = Field(
        min_length=1,
        strict=True,
        description="`plural.group` (core resources: `plural`), as kubectl names them: `configmaps`, "
        "`deployments.apps`, `gadgets.bars.example.org`; `plural.version.group` (`deployments.v1.apps`) "
        "names the same resource (every version of it is sharded).",
    )
    by: Literal["uid", "owner", "namespace"] = Field(
        "uid",
        description="What places an object in the hash space (the one shard rule, `hashing.ShardBy`): its own "
        "`uid`; its controller `owner`'s uid (an object without a controller owner is seen by every instance, "
        "so orphans can be adopted); or its `namespace`. Reads and the proxy's write fence use the same rule.",
    )
    main: bool = Field(
        False,
        strict=True,
        description="The controller's main resource: the one whose `metadata.generation` it answers with "
        "`status.observedGeneration`, published in the registry so the proxy measures each instance's progress "
        "on it (`rangeshard_unreconciled_objects`). At most one entry; without one, the first entry is the main.",
    )

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not _RESOURCE_RE.match(value):
            raise ValueError("must be plural or plural.group in lowercase (e.g. configmaps, deployments.apps)")
        resource, _version, group = parse_resource_name(value)  # the proxy's kubectl-style parser
        return f"{resource}.{group}" if group else resource

    @field_validator("by")
    @classmethod
    def _by(cls, value: str) -> str:
        return ShardBy.parse(value).value

    @property
    def label(self) -> str:
        """``plural.group`` (``plural`` for the core group): how requests name the resource."""
        return self.resource

    @property
    def rule(self) -> ShardBy:
        """The shard rule of this resource."""
        return ShardBy(self.by)


_PROBE_HOST_RE = re.compile(r"^[^\s/\[\]@?#]+$")


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _probe_port(value: object) -> object:
    """A port number; a name (the kubelet looks it up in the pod's container ports) means nothing here."""
    if isinstance(value, str):
        raise ValueError(
            "must be a port number 1..65535 (or 0: a free port the manager picks); a named port needs a pod's "
            "container ports, which a controller run by the manager has not"
        )
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 65535:
        raise ValueError("must be a port number 1..65535 (or 0: a free port the manager picks)")
    return value


class HttpHeaderSection(_Section):
    """A header of the probe's request (kubelet's `httpHeaders` item)."""

    name: str = Field(min_length=1, strict=True, description="Header name.")
    value: str = Field(strict=True, description="Header value.")


class HttpGetSection(_Section):
    """An HTTP GET to the controller (kubelet's `httpGet`): a status of 200..399 within `timeoutSeconds` passes.

    Redirects are not followed (a 3xx passes). HTTPS is not verified, as the kubelet does not verify it.
    """

    path: str = Field("/", strict=True, description="Path (and query) to request; starts with `/`.")
    port: Annotated[int, BeforeValidator(_probe_port)] = Field(
        ge=0,
        le=65535,
        strict=True,
        description="TCP port, a number (a named port means nothing outside a pod). 0: the manager picks a free "
        "port once and gives it to the controller as `RANGESHARD_PROBE_PORT` (and `$(RANGESHARD_PROBE_PORT)` in "
        "`command`), so several managers on one host can run the same config.",
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        strict=True,
        description="Host to connect to. The kubelet defaults to the pod's IP; the manager and its controller "
        "share the host, so here it is loopback.",
    )
    scheme: Literal["HTTP", "HTTPS"] = Field("HTTP", description="`HTTP` or `HTTPS` (certificate not verified).")
    http_headers: list[HttpHeaderSection] = Field(
        default_factory=list, alias="httpHeaders", description="Headers added to the request."
    )

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or any(c.isspace() for c in value):
            raise ValueError("must start with / and contain no whitespace, e.g. /healthz")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not _PROBE_HOST_RE.match(value) or (":" in value and not _is_ip(value)):
            raise ValueError("must be a host name or IP address (no scheme, port, path or brackets)")
        return value


class ExecSection(_Section):
    """A command run by the manager (kubelet's `exec`): exit code 0 within `timeoutSeconds` passes.

    It runs without a shell, with the controller's environment (`KUBECONFIG`, `RANGESHARD_*`); on timeout
    it is killed (SIGKILL, with its process group) and the probe fails.
    """

    command: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description='Command line, e.g. `["cat", "/tmp/healthy"]`.'
    )


class LivenessProbeSection(_Section):
    """Kubelet's liveness probe, for a controller the manager runs (`command`).

    The first probe runs `initialDelaySeconds` after each start, then one every `periodSeconds`;
    `failureThreshold` failures in a row kill the controller (SIGKILL) and the usual backoff restarts it.
    Exactly one of `httpGet` and `exec`.
    """

    http_get: HttpGetSection | None = Field(None, alias="httpGet", description="Probe with an HTTP GET.")
    exec_: ExecSection | None = Field(None, alias="exec", description="Probe by running a command.")
    initial_delay_seconds: int = Field(
        0,
        alias="initialDelaySeconds",
        ge=0,
        strict=True,
        description="Seconds after the controller started before the first probe.",
    )
    period_seconds: int = Field(10, alias="periodSeconds", ge=1, strict=True, description="Seconds between probes.")
    timeout_seconds: int = Field(
        1, alias="timeoutSeconds", ge=1, strict=True, description="Seconds after which a probe counts as failed."
    )
    failure_threshold: int = Field(
        3,
        alias="failureThreshold",
        ge=1,
        strict=True,
        description="Failures in a row that kill the controller.",
    )
    success_threshold: int = Field(
        1,
        alias="successThreshold",
        strict=True,
        description="Must be 1 for a liveness probe (as the kubelet requires).",
    )

    @field_validator("success_threshold")
    @classmethod
    def _success_threshold(cls, value: int) -> int:
        if value != 1:
            raise ValueError("must be 1 for a liveness probe (as the kubelet requires)")
        return value

    @model_validator(mode="after")
    def _one_handler(self) -> LivenessProbeSection:
        if (self.http_get is None) == (self.exec_ is None):
            raise ValueError("give exactly one of httpGet and exec")
        return self


class ExternalSection(_Section):
    """A controller that is not a `Controller` class: any program, sharded through a local endpoint."""

    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="The controller's command line; the manager starts it with `KUBECONFIG` pointing at the "
        "endpoint (plus `RANGESHARD_INSTANCE_ID`, `RANGESHARD_CONTROLLER_TYPE` and, with an `httpGet` probe, "
        "`RANGESHARD_PROBE_PORT`; `$(NAME)` of these in the command line is replaced, as the kubelet spells it), "
        "restarts it with backoff and stops it on shutdown. Without it only the endpoint runs (a sidecar beside "
        "the controller).",
    )
    listen: str = Field(
        "127.0.0.1:0",
        strict=True,
        description="`host:port` of the endpoint the controller talks to (port 0: any free port).",
    )
    shard: list[ShardResourceSection] = Field(
        min_length=1,
        description="Resources whose lists and watches are cut to this instance's range; every other request "
        "passes through unchanged.",
    )
    drain_seconds: float = Field(
        2.0,
        alias="drainSeconds",
        ge=0,
        le=300,
        strict=True,
        description="After a range shrinks (its watches were reset), how long the giver waits, with no write of "
        "the controller to a `shard` resource in flight, before it unlocks the receiver.",
    )
    liveness_probe: LivenessProbeSection | None = Field(
        None,
        alias="livenessProbe",
        description="Kubelet's liveness probe for the controller the manager runs (needs `command`): after "
        "`failureThreshold` failed probes in a row it is killed (SIGKILL) and restarted with the usual backoff. "
        "A sidecar's probe belongs on its container in the pod manifest.",
    )

    @model_validator(mode="after")
    def _probe_needs_command(self) -> ExternalSection:
        if self.liveness_probe is not None and not self.command:
            raise _field_error(
                "livenessProbe",
                "needs command: the manager probes only a controller it runs; a sidecar controller is probed "
                "by the kubelet, so put livenessProbe on its container in the pod manifest",
            )
        return self

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        found = _LISTEN_RE.match(value)
        if found is None or int(found.group("port")) > 65535:
            raise ValueError("must be host:port (port 0..65535), e.g. 127.0.0.1:0")
        return value

    @field_validator("shard")
    @classmethod
    def _unique(cls, value: list[ShardResourceSection]) -> list[ShardResourceSection]:
        seen: set[str] = set()
        for item in value:
            if item.resource in seen:
                raise ValueError(f"resource {item.resource!r} is listed twice")
            seen.add(item.resource)
        mains = [item.resource for item in value if item.main]
        if len(mains) > 1:
            raise ValueError(f"at most one entry may be the main resource (main: true), got {', '.join(mains)}")
        return value

    @property
    def main_resource(self) -> ShardResourceSection:
        """The entry marked ``main: true``, else the first one."""
        return next((item for item in self.shard if item.main), self.shard[0])

    def published_main(self) -> MainResource:
        """The main resource as the registry record publishes it (no version: readers take the preferred one)."""
        main = self.main_resource
        resource, _, group = main.resource.partition(".")
        return MainResource(group=group, resource=resource, by=main.rule)


class ControllerSection(_Section):
    """One controller type run by this manager. `name:` with no mapping means all defaults."""

    workers: int = Field(
        1, ge=1, le=MAX_WORKERS, strict=True, description="Worker threads reconciling keys of this controller."
    )
    reconcile_delay_seconds: float = Field(
        0.0,
        alias="reconcileDelaySeconds",
        ge=0,
        strict=True,
        description="Fault injection for tests: every reconcile holds its key this long before doing its work "
        "(a slow controller). Must be less than `reconcileTimeoutSeconds`; leave 0 in production.",
    )
    reconcile_hold_file: str | None = Field(
        None,
        alias="reconcileHoldFile",
        min_length=1,
        strict=True,
        description="Fault injection for tests: while this file exists, every reconcile holds its claimed key "
        "(at most until its deadline; a reconcile held to its deadline times out) before doing its work, so a "
        "test can keep keys in flight until a handover has happened. Leave unset in production.",
    )
    class_: str | None = Field(
        None,
        alias="class",
        description="`module:Class` of a `Controller` subclass in your own code, imported with the process's "
        "`sys.path`/`PYTHONPATH`. Without it, `<name>` is a built-in controller or an installed plugin "
        "(entry-point group `rangeshard.controllers`).",
    )
    external: ExternalSection | None = Field(
        None,
        description="Run an unmodified controller (kopf, client-go, any language) instead of a `Controller` "
        "class: see docs/external-controllers.md. Excludes `class` and `workers`.",
    )

    @model_validator(mode="after")
    def _external_alone(self) -> ControllerSection:
        if self.external is not None:
            clash = [f for f in ("class_", "workers") if f in self.model_fields_set]
            if clash:
                names = " and ".join("class" if f == "class_" else f for f in clash)
                raise ValueError(f"external excludes {names} (the external program is the controller)")
        return self


ControllerName = Annotated[str, AfterValidator(_controller_name)]


class WatchdogSection(_Section):
    """How a manager notices that one of its built-in controllers stopped working without exiting.

    A controller is *stuck* while `reconcileTimeouts` reconciles in a row ended at their deadline (or one
    still runs past it), or while one of its informers has a watch open that brought no event and no
    bookmark for `informerSilenceSeconds`. A stuck controller makes `/readyz` answer 503 naming it; one
    stuck for `exitAfterSeconds` makes the manager leave the registry and exit 1, so its supervisor (the
    StatefulSet, a systemd unit) restarts it: a stuck manager never keeps a range. External controllers
    are watched by their liveness probe (`external.livenessProbe`) and the proxy's progress metrics.
    """

    reconcile_timeouts: int = Field(
        3,
        alias="reconcileTimeouts",
        ge=1,
        strict=True,
        description="Reconciles of one controller in a row that ended at their deadline (timed out), with no "
        "other result between, that make it stuck; a reconcile still running 1 s past its deadline makes it "
        "stuck at once. Any other result (success, conflict, error) clears it.",
    )
    informer_silence_seconds: float = Field(
        30.0,
        alias="informerSilenceSeconds",
        gt=0,
        strict=True,
        description="An open watch of an informer that brought no event and no bookmark for this long makes "
        "its controller stuck (the proxy bookmarks a quiet watch every `--bookmark-interval`, 10 s by default: "
        "keep this several intervals).",
    )
    exit_after_seconds: float = Field(
        60.0,
        alias="exitAfterSeconds",
        ge=0,
        strict=True,
        description="A controller stuck this long makes the manager leave the registry (graceful stop) and "
        "exit 1 for its supervisor to restart it. 0: never exit (only `/readyz` says it).",
    )


class ManagerConfig(_Section):
    """The whole controller-manager configuration file."""

    etcd: EtcdSection = Field(default_factory=EtcdSection, description="The etcd registry.")
    proxy: ProxySection = Field(default_factory=ProxySection, description="The range filter proxy.")
    lease_ttl_seconds: int = Field(
        10,
        alias="leaseTTLSeconds",
        ge=3,
        le=300,
        strict=True,
        description="TTL of the instance's etcd lease: a dead manager's range is taken over after at most this long.",
    )
    rejoin_grace_seconds: float = Field(
        0.0,
        alias="rejoinGraceSeconds",
        ge=0,
        le=86400,
        strict=True,
        description="How long a gracefully stopped manager's instances stay *parked*: each record keeps its "
        "`hashKey` (no neighbour absorbs the range, nobody owns it) so a process with the same instance ids "
        "(`--instance-prefix`, e.g. the StatefulSet pod name) takes the same ranges back with no split and no "
        "handover. When the grace runs out the record expires and the range is taken over as after a crash. "
        "0 (the default) leaves the registry on a graceful stop. A crash is never parked.",
    )
    cost_window_seconds: float = Field(
        300.0,
        alias="costWindowSeconds",
        gt=0,
        le=86400,
        strict=True,
        description="Window of the measured reconcile cost each instance publishes with its histogram (for "
        "`rangeshard rebalance --by cost`): each key's reconcile seconds per window, measured as a rate over the "
        "time this instance has observed the key (no warm-up after a move); a measurement `t` seconds old "
        "weighs `exp(-t / costWindowSeconds)`.",
    )
    registry_prefix: str = Field(
        "/rangeshard",
        alias="registryPrefix",
        description="etcd key prefix of the registry; records live at `<prefix>/controllers/<type>/<instance-id>`.",
    )
    instance_id_prefix: str | None = Field(
        None,
        alias="instanceIdPrefix",
        description="Prefix of this manager's instance ids (lowercase letters, digits, `-`, `_`, `.`); "
        "default: derived from the host name and process id.",
    )
    reconcile_timeout_seconds: float = Field(
        DEFAULT_RECONCILE_TIMEOUT,
        alias="reconcileTimeoutSeconds",
        gt=0,
        strict=True,
        description="Upper bound of one reconcile; API call timeouts derive from it. "
        "Must be less than `leaseTTLSeconds / 2` so in-flight work ends before a fenced instance's lease expires. "
        "When omitted it derives from the TTL: `min(3, 0.3 * leaseTTLSeconds)` "
        "(3 for the default TTL of 10, 1.2 for `leaseTTLSeconds: 4`), so any valid TTL works alone.",
        json_schema_extra={"defaultText": "min(3, 0.3 * leaseTTLSeconds)"},
    )
    stuck_after_seconds: float = Field(
        120.0,
        alias="stuckAfterSeconds",
        gt=0,
        le=86400,
        strict=True,
        description="Published in the registry with each controller's main resource: the range filter proxy "
        "(started with `--etcd`) reports an instance whose oldest unanswered change of a main object "
        "(`metadata.generation` newer than `status.observedGeneration`) is older than this as stuck "
        "(`rangeshard_unreconciled_stuck`), and so do `rangeshard status`, `rangeshard registry list -o wide` "
        "and the dashboard.",
    )
    watchdog: WatchdogSection = Field(
        default_factory=WatchdogSection, description="Stuck detection of the built-in controllers."
    )
    metrics: MetricsSection | None = Field(
        default_factory=MetricsSection, description="Metrics and health endpoint; `null` disables it."
    )
    controllers: Annotated[
        dict[ControllerName, Annotated[ControllerSection, BeforeValidator(_none_to_empty_mapping)]],
        BeforeValidator(_none_to_empty_mapping),
    ] = Field(
        description=f"Controllers this manager runs, by name (built-ins: {', '.join(KNOWN_CONTROLLERS)}; "
        "plugins by `class:` or entry point); at least one."
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_reconcile_timeout(cls, data: Any) -> Any:
        """Omitted ``reconcileTimeoutSeconds`` = ``min(3, 0.3 * leaseTTLSeconds)`` (always < TTL / 2)."""
        if isinstance(data, dict) and "reconcileTimeoutSeconds" not in data:
            ttl = data.get("leaseTTLSeconds")
            if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0:
                return {**data, "reconcileTimeoutSeconds": derived_reconcile_timeout(ttl)}
        return data

    @field_validator("registry_prefix")
    @classmethod
    def _registry_prefix(cls, value: str) -> str:
        if not _REGISTRY_PREFIX_RE.match(value):
            raise ValueError("must look like /name[/name...] (no trailing slash, no empty or blank segments)")
        return value

    @field_validator("instance_id_prefix")
    @classmethod
    def _instance_id_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _INSTANCE_PREFIX_RE.match(value):
            raise ValueError(
                "must be 1..200 characters of lowercase letters, digits, '-', '_' or '.', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("controllers")
    @classmethod
    def _at_least_one(cls, value: dict[str, ControllerSection]) -> dict[str, ControllerSection]:
        if not value:
            raise ValueError(f"at least one controller is required (known: {', '.join(KNOWN_CONTROLLERS)})")
        return value

    @model_validator(mode="after")
    def _timeout_below_half_ttl(self) -> ManagerConfig:
        if not self.reconcile_timeout_seconds < self.lease_ttl_seconds / 2:
            raise _field_error(
                "reconcileTimeoutSeconds", f"must be less than leaseTTLSeconds / 2 ({self.lease_ttl_seconds / 2:g})"
            )
        return self

    @model_validator(mode="after")
    def _delay_below_timeout(self) -> ManagerConfig:
        for name, section in self.controllers.items():
            if not section.reconcile_delay_seconds < self.reconcile_timeout_seconds:
                raise _field_error(
                    f"controllers.{name}.reconcileDelaySeconds",
                    f"must be less than reconcileTimeoutSeconds ({self.reconcile_timeout_seconds:g})",
                )
        return self


# -- loading -----------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that rejects duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
    seen: dict[Hashable, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first on line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        if isinstance(key, Hashable):
            seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(path: Path, e: yaml.YAMLError) -> str:
    # Only the problem and its position: never str(e), whose source snippet could show a password.
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {e.problem}"
    if isinstance(e, yaml.reader.ReaderError):
        return f"{path}: invalid YAML: unacceptable character #x{e.character:04x} at byte {e.position}"
    return f"{path}: invalid YAML: {type(e).__name__}"


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, int]:
    """The model an annotation holds and how many ``loc`` steps (list index, dict key) lie before it."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _model_in(get_args(annotation)[0])
    if origin in (Union, UnionType):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found[0] is not None:
                return found
        return None, 0
    if origin in (list, tuple, dict):
        inner, steps = _model_in(get_args(annotation)[-1 if origin is dict else 0])
        return inner, steps + 1
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, 0
    return None, 0


def _model_at(loc: tuple[str, ...]) -> type[BaseModel] | None:
    """The model of the mapping at ``loc`` (field names as in the file), or ``None``."""
    model: type[BaseModel] = ManagerConfig
    rest = list(loc)
    while rest:
        key = rest.pop(0)
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == key), None)
        if field is None:
            return None
        inner, steps = _model_in(field.annotation)
        if inner is None or len(rest) < steps:
            return None
        del rest[:steps]
        model = inner
    return model


def _field_names(model: type[BaseModel]) -> list[str]:
    return sorted(f.alias or name for name, f in model.model_fields.items())


def _problems(e: ValidationError) -> list[tuple[str, str]]:
    """``(dotted.path, problem)`` for each error of a validation, spelled as in the file."""
    out: list[tuple[str, str]] = []
    for err in e.errors():
        loc = tuple(str(x) for x in err["loc"] if x != "[key]")
        typ = err["type"]
        ctx = err.get("ctx") or {}
        if typ == _FIELD_ERROR:
            loc = (*loc, str(ctx["field"]))
            msg = err["msg"]
        elif typ == "value_error" and "error" in ctx:
            msg = str(ctx["error"])
        elif typ == "missing":
            msg = "required field is missing"
        elif typ == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = f"unknown field; expected one of: {', '.join(_field_names(model))}" if model else "unknown field"
        elif typ in ("model_type", "model_attributes_type", "dict_type"):
            msg = "expected a mapping"
        else:
            msg = err["msg"]
        out.append((".".join(loc), msg))
    return out


_FILE_FIELDS = (("etcd", "ca_cert"), ("etcd", "cert"), ("etcd", "key"), ("proxy", "token_file"), ("proxy", "ca_cert"))


def _resolve_cert_paths(cfg: ManagerConfig, path: Path) -> tuple[ManagerConfig, list[str]]:
    updates: dict[str, dict[str, str]] = {"etcd": {}, "proxy": {}}
    problems: list[str] = []
    for section, field in _FILE_FIELDS:
        model = getattr(cfg, section)
        value = getattr(model, field)
        if value is None:
            continue
        resolved = (path.parent / Path(value).expanduser()).resolve()
        # A token file may be provided later (a projected token appears when the pod
        # starts); the manager reports it at start-up if it is still missing.
        if field != "token_file" and not resolved.is_file():
            alias = type(model).model_fields[field].alias or field
            problems.append(f"{path}: {section}.{alias}: file not found: {resolved}")
        updates[section][field] = str(resolved)
    changed = {name: getattr(cfg, name).model_copy(update=u) for name, u in updates.items() if u}
    return cfg.model_copy(update=changed) if changed else cfg, problems


def _class_problems(raw: Any, reported: set[str], path: Path) -> list[str]:
    """Resolution problems of the controller entries that are otherwise valid (reported with the others)."""
    from controller_manager.plugins import resolve_controllers  # noqa: PLC0415 (imports user code)

    if not isinstance(raw, dict):
        return []
    sections: dict[str, ControllerSection] = {}
    for name, section in raw.items():
        entry = f"controllers.{name}"
        if any(f == entry or f.startswith(entry + ".") for f in reported):
            continue
        try:
            sections[str(name)] = ControllerSection.model_validate(section or {})
        except ValidationError:
            continue
    try:
        resolve_controllers(sections, path)
    except ConfigError as e:
        return e.problems
    return []


def load_config(path: str | Path, *, resolve: bool = True) -> ManagerConfig:
    """Read and validate a manager config file.

    Raises :class:`ConfigError` whose ``problems`` has one ``FILE: field.path: problem``
    line per problem (``FILE:LINE:COLUMN: invalid YAML: ...`` for syntax errors). With
    ``resolve`` (the default) every controller's class is imported and checked too
    (:func:`controller_manager.plugins.resolve_controllers`).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(
            f"cannot read config {path}: {e.strerror or e}", [f"{path}: cannot read: {e.strerror or e}"]
        ) from e
    except UnicodeDecodeError as e:
        problem = f"{path}: not valid UTF-8 (byte {e.start})"
        raise ConfigError(f"invalid config {path}: not UTF-8", [problem]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        problem = _yaml_problem(path, e)
        raise ConfigError(f"invalid config {path}: invalid YAML", [problem]) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"invalid config {path}", [f"{path}: top level must be a mapping, got {got}"])
    try:
        cfg = ManagerConfig.model_validate(data)
    except ValidationError as e:
        found = _problems(e)
        problems = [f"{path}: {field}: {msg}" if field else f"{path}: {msg}" for field, msg in found]
        if resolve:
            problems += _class_problems(data.get("controllers"), {field for field, _ in found}, path)
        raise ConfigError(f"invalid config {path}: {len(problems)} problem(s)", problems) from None
    cfg, problems = _resolve_cert_paths(cfg, path)
    if problems:
        raise ConfigError(f"invalid config {path}: {len(problems)} problem(s)", problems)
    if resolve:
        from controller_manager.plugins import resolve_controllers  # noqa: PLC0415 (imports user code)

        resolve_controllers(cfg.controllers, path)
    return cfg


def with_overrides(cfg: ManagerConfig, *, etcd: str | None = None, proxy: str | None = None) -> ManagerConfig:
    """Apply the CLI's ``--etcd URL[,URL...]`` and ``--proxy URL`` to a loaded config.

    ``None`` keeps the file's value. Raises :class:`ConfigError` naming the option.
    """
    if etcd is not None:
        urls = [u.strip() for u in etcd.split(",") if u.strip()]
        if not urls:
            raise ConfigError("--etcd: no endpoint given")
        endpoints: list[str] = []
        problems: list[str] = []
        for u in urls:
            try:
                endpoints.append(_etcd_url(u))
            except ValueError as e:
                problems.append(f"--etcd: {u}: {e}")
        if problems:
            raise ConfigError(problems[0], problems)
        cfg = cfg.model_copy(update={"etcd": cfg.etcd.model_copy(update={"endpoints": tuple(endpoints)})})
    if proxy is not None:
        try:
            url = _proxy_url(proxy)
        except ValueError as e:
            raise ConfigError(f"--proxy: {proxy}: {e}") from None
        cfg = cfg.model_copy(update={"proxy": cfg.proxy.model_copy(update={"url": url})})
    return cfg


# -- reference documentation -------------------------------------------------


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _type_name(get_args(annotation)[0])
    if origin in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not NoneType]
        name = " or ".join(_type_name(a) for a in args)
        return f"{name} or null" if len(args) < len(get_args(annotation)) else name
    if origin in (tuple, list):
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is Literal:
        return " or ".join(f"`{v}`" for v in get_args(annotation))
    if origin is dict:
        return "mapping"
    if annotation is SecretStr:
        return "string (secret)"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _range(metadata: list[Any]) -> str:
    bounds = {attr: getattr(m, attr) for m in metadata for attr in ("ge", "gt", "le", "lt") if hasattr(m, attr)}
    if "ge" in bounds and "le" in bounds:
        return f"{bounds['ge']}..{bounds['le']}"
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(f"{symbols[k]} {v}" for k, v in bounds.items())


def _plain(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    return str(value)


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "defaultText" in extra:
        return f"`{extra['defaultText']}`"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{_plain(value)}`"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        rng = _range(field.metadata)
        typ = _type_name(field.annotation) + (f", {rng}" if rng else "")
        rows.append(f"| `{prefix}{key}` | {typ} | {_default(field)} | {field.description or ''} |")
    return rows


_EXAMPLE: dict[str, Any] = {"controllers": {"replicaset": {"workers": 4}, "deployment": {"workers": 2}}}


def config_reference_markdown() -> str:
    """The field reference of the manager config, as Markdown (``docs/configuration.md``)."""
    example = ManagerConfig.model_validate(_EXAMPLE).model_dump(mode="json", by_alias=True)
    header = "| field | type | default | description |\n|---|---|---|---|"
    sections: list[tuple[str, type[BaseModel], str]] = [
        ("Top level", ManagerConfig, ""),
        ("`etcd`", EtcdSection, "etcd."),
        ("`proxy`", ProxySection, "proxy."),
        ("`metrics`", MetricsSection, "metrics."),
        ("`watchdog`", WatchdogSection, "watchdog."),
        ("`controllers.<name>`", ControllerSection, "controllers.<name>."),
        ("`controllers.<name>.external`", ExternalSection, "external."),
        ("`external.shard[]`", ShardResourceSection, "shard[]."),
        ("`external.livenessProbe`", LivenessProbeSection, "livenessProbe."),
        ("`livenessProbe.httpGet`", HttpGetSection, "httpGet."),
        ("`livenessProbe.exec`", ExecSection, "exec."),
    ]
    parts = [
        "# Controller-manager configuration",
        "",
        "<!-- Generated by controller_manager.config.config_reference_markdown(); do not edit by hand.",
        "     tests/controller_manager/test_config.py fails when this file and the code disagree. -->",
        "",
        "`rangeshard controller-manager --config FILE` reads one YAML file. Every manager runs the same code;",
        "the file decides which controllers it runs and how many workers each gets. Field names are camelCase;",
        "unknown fields are errors, and every problem is reported as `FILE: field.path: problem`.",
        "`--etcd URL[,URL...]` and `--proxy URL` on the command line override the file.",
        "",
        f"Built-in controllers: {', '.join(f'`{c}`' for c in KNOWN_CONTROLLERS)}.",
        "A controller listed without a mapping (`deployment:` or `deployment: {}`) runs with the defaults (1 worker).",
        "Your own controllers are named",
        'by `class: "module:Class"` or installed as plugins (entry-point group `rangeshard.controllers`);',
        "see docs/writing-a-controller.md and docs/packaging-controllers.md.",
        "",
        "Example (all defaults spelled out; see also `config/local.yaml` and `config/example.yaml`):",
        "",
        "```yaml",
        yaml.safe_dump(example, sort_keys=False).rstrip(),
        "```",
    ]
    for title, model, prefix in sections:
        doc = inspect.cleandoc(model.__doc__ or "")
        parts += ["", f"## {title}", "", doc, "", header, *_rows(model, prefix)]
    return "\n".join(parts) + "\n"
