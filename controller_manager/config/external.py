"""The `external:` entry of a controller: shard resources (the one shard rule), liveness probe, endpoint.

Invariants
    ``shard[].by`` is read by :class:`hashing.ShardBy`, ``shard[].resource`` and ``.via`` with the one
    kubectl-style parser (:mod:`hashing.resources`); ``livenessProbe`` is spelled and defaulted as in a pod
    spec and needs ``command``.

Concurrency model
    Frozen models.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from controller_manager.config.common import Section
from hashing import ShardBy, check_label_key
from hashing.resources import resource_label
from rangeshard.core.settings import field_error
from registry.models import MainResource

_LISTEN_RE = re.compile(r"^(?P<host>[^\s:\[\]]+|\[[0-9a-fA-F:]+\]):(?P<port>[0-9]{1,5})$")


class ShardResourceSection(Section):
    """A resource whose lists and watches the endpoint cuts to the instance's range."""

    resource: str = Field(
        min_length=1,
        strict=True,
        description="`plural.group` (core resources: `plural`), as kubectl names them: `configmaps`, "
        "`deployments.apps`, `gadgets.bars.example.org`; `plural.version.group` (`deployments.v1.apps`) "
        "names the same resource (every version of it is sharded).",
    )
    by: Literal["uid", "owner", "namespace", "root", "label"] = Field(
        "uid",
        description="What places an object in the hash space (the one shard rule, `hashing.ShardBy`): its own "
        "`uid`; its controller `owner`'s uid (an object without a controller owner is seen by every instance, "
        "so orphans can be adopted); its `namespace`; or its `root`: the uid of the top of its chain of "
        "controller owners through the `via` kinds (itself without a controller owner), resolved by the proxy "
        "from its caches, so a pod lands with its Deployment; or a `label`: the value of the label named in "
        "`label` (an object without that label by its own uid), so objects that belong together without an "
        "owner reference land together. Reads and the proxy's write fence use the same rule.",
    )
    label: str | None = Field(
        None,
        strict=True,
        description="`by: label` only (and required there): the label key whose value places an object, e.g. "
        "`tenant` or `tekton.dev/pipelineRun`. An object without the label is placed by its own uid; changing "
        "the label moves the object (a write by the old owner that moves it out of its range is fenced).",
    )
    via: list[str] = Field(
        default_factory=list,
        description="`by: root` only: the kinds a chain of controller owners may pass through, as kubectl names "
        "them (`replicasets.apps`; `[replicasets.apps]` puts a pod with the Deployment of its ReplicaSet). The "
        "first owner of another kind is the root; an intermediate the proxy has not cached yet counts as the "
        "root until it appears (its dependents then move). Chains stop after 8 owners.",
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
        try:
            return resource_label(value)  # the one kubectl-style parser (hashing.resources)
        except ValueError:
            problem = "must be plural or plural.group in lowercase (e.g. configmaps, deployments.apps)"
            raise ValueError(problem) from None

    @field_validator("by")
    @classmethod
    def _by(cls, value: str) -> str:
        return ShardBy.parse(value).value

    @field_validator("via")
    @classmethod
    def _via(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for i, name in enumerate(value):
            try:
                label = resource_label(name)  # the parse canonical_via (the selector path) makes too
            except ValueError:
                raise ValueError(f"[{i}] must be plural or plural.group in lowercase (e.g. replicasets.apps)") from None
            if label in out:
                raise ValueError(f"{label!r} is listed twice")
            out.append(label)
        return out

    @field_validator("label")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        return check_label_key(value) if value is not None else None

    @model_validator(mode="after")
    def _via_needs_root(self) -> ShardResourceSection:
        if self.via and self.by != "root":
            raise ValueError(f"via: only for by: root (this entry is by: {self.by})")
        if self.by == "label" and self.label is None:
            raise ValueError("label: required with by: label (the label key whose value places an object)")
        if self.label is not None and self.by != "label":
            raise ValueError(f"label: only for by: label (this entry is by: {self.by})")
        if self.resource in self.via:
            raise ValueError(f"via: {self.resource} cannot pass through itself")
        return self

    @property
    def path(self) -> str:
        """The ``shardSelector`` path of this entry's rule (``root``: through its ``via`` kinds; ``label``: its key)."""
        return self.rule.path_for(via=self.via, label=self.label)

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


class HttpHeaderSection(Section):
    """A header of the probe's request (kubelet's `httpHeaders` item)."""

    name: str = Field(min_length=1, strict=True, description="Header name.")
    value: str = Field(strict=True, description="Header value.")


class HttpGetSection(Section):
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


class ExecSection(Section):
    """A command run by the manager (kubelet's `exec`): exit code 0 within `timeoutSeconds` passes.

    It runs without a shell, with the controller's environment (`KUBECONFIG`, `RANGESHARD_*`); on timeout
    it is killed (SIGKILL, with its process group) and the probe fails.
    """

    command: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description='Command line, e.g. `["cat", "/tmp/healthy"]`.'
    )


class LivenessProbeSection(Section):
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


class ExternalSection(Section):
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
    handover_step_seconds: float = Field(
        10.0,
        alias="handoverStepSeconds",
        gt=0,
        le=600,
        strict=True,
        description="A range change reaches the controller in steps: the resources placed by another object "
        "(`by: owner`, `by: root`) before the ones that own them when the range grows, owners first when it "
        "shrinks. Each step waits until the controller took it in (relisted and watched again, or a streaming "
        "list's initial-events-end bookmark) or this many seconds passed (logged as a WARNING).",
    )
    handover_settle_seconds: float = Field(
        1.0,
        alias="handoverSettleSeconds",
        ge=0,
        le=60,
        strict=True,
        description="After a step of a handover was taken in, how long the controller is given to process what it "
        "relisted before the next step: a streaming list's initial-events-end bookmark is sent by the endpoint, not "
        "acknowledged by the client, and kopf fills its indexes in per-object workers after the list arrived (give "
        "kopf 2-3 s on a loaded host). A list-then-watch client-go controller replaced its store before it watched "
        "again and needs none.",
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
            raise field_error(
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
        return MainResource(group=group, resource=resource, by=main.rule, label_key=main.label)
