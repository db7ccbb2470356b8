"""A controller entry and the whole manager config (:class:`ManagerConfig`).

Invariants
    ``reconcileTimeoutSeconds < leaseTTLSeconds / 2``; an entry is a class or an external controller.

Concurrency model
    Frozen models.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from controller_manager.config.common import (
    DEFAULT_RECONCILE_TIMEOUT,
    INSTANCE_PREFIX_RE,
    KNOWN_CONTROLLERS,
    MAX_WORKERS,
    Section,
    check_controller_name,
    derived_reconcile_timeout,
    none_to_empty_mapping,
)
from controller_manager.config.external import ExternalSection, ShardResourceSection
from controller_manager.config.sections import EtcdSection, MetricsSection, ProxySection
from rangeshard.core.settings import KeyPrefix, field_error


class ControllerSection(Section):
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

    shard: list[ShardResourceSection] = Field(
        default_factory=list,
        description="In-process controllers only: place a resource the controller reads (its main resource or "
        "a dependent, `plural.group`) by a label instead of its built-in rule (main by `uid`, dependents by "
        "`owner`): `{resource: R, by: label, label: KEY}` puts an object by FNV of that label's value (without "
        "the label by its own uid), so objects that share the value land on one instance. Only `by: label` may "
        "be set here (the other rules are the controller's own); external controllers say it in `external.shard`.",
    )

    @field_validator("shard")
    @classmethod
    def _label_only(cls, value: list[ShardResourceSection]) -> list[ShardResourceSection]:
        seen: set[str] = set()
        for i, item in enumerate(value):
            if item.by != "label":
                raise ValueError(
                    f"[{i}].by: an in-process controller's rules are its own (main by uid, dependents by owner); "
                    f"only by: label may be set here, got by: {item.by}"
                )
            if item.via or item.main:
                raise ValueError(f"[{i}]: via and main are for external.shard only")
            if item.resource in seen:
                raise ValueError(f"resource {item.resource!r} is listed twice")
            seen.add(item.resource)
        return value

    @model_validator(mode="after")
    def _external_alone(self) -> ControllerSection:
        if self.external is not None and self.shard:
            raise ValueError("shard: an external controller says it in external.shard")
        if self.external is not None:
            clash = [f for f in ("class_", "workers") if f in self.model_fields_set]
            if clash:
                names = " and ".join("class" if f == "class_" else f for f in clash)
                raise ValueError(f"external excludes {names} (the external program is the controller)")
        return self


ControllerName = Annotated[str, AfterValidator(check_controller_name)]


class WatchdogSection(Section):
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


class ManagerConfig(Section):
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
    registry_prefix: KeyPrefix = Field(
        "/rangeshard",
        alias="registryPrefix",
        description="etcd key prefix of the registry (`/name[/name...]`, a trailing slash dropped, as for the "
        "proxy's `--registry-prefix`); records live at `<prefix>/controllers/<type>/<instance-id>`.",
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
        dict[ControllerName, Annotated[ControllerSection, BeforeValidator(none_to_empty_mapping)]],
        BeforeValidator(none_to_empty_mapping),
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

    @field_validator("instance_id_prefix")
    @classmethod
    def _instance_id_prefix(cls, value: str | None) -> str | None:
        if value is not None and not INSTANCE_PREFIX_RE.match(value):
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
            raise field_error(
                "reconcileTimeoutSeconds", f"must be less than leaseTTLSeconds / 2 ({self.lease_ttl_seconds / 2:g})"
            )
        return self

    @model_validator(mode="after")
    def _delay_below_timeout(self) -> ManagerConfig:
        for name, section in self.controllers.items():
            if not section.reconcile_delay_seconds < self.reconcile_timeout_seconds:
                raise field_error(
                    f"controllers.{name}.reconcileDelaySeconds",
                    f"must be less than reconcileTimeoutSeconds ({self.reconcile_timeout_seconds:g})",
                )
        return self
