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
      logs or error messages (errors echo no input value but a bad etcd
      endpoint, whose credentials show as ``***``).
    * etcd endpoints follow the one grammar of ``--etcd``
      (:func:`rangeshard.core.etcd.parse_endpoint`).
    * Relative certificate paths are resolved against the config file's
      directory and must name existing files.
    * ``external.livenessProbe`` is spelled as in a pod spec (kubelet's names
      and defaults) and needs ``command``: a sidecar controller is probed by
      the kubelet, from the pod manifest.

Modules
    ``common`` (the section base, URL and name checks, defaults),
    ``sections`` (``etcd``, ``proxy``, ``metrics``), ``external`` (an
    ``external:`` entry: shard resources, liveness probe), ``models`` (a
    controller entry, :class:`ManagerConfig`), ``loading`` (the strict YAML
    loader and problem reporting, :func:`load_config`), ``reference`` (the
    Markdown field reference). Import from this package, not the modules.

Concurrency model
    Pure functions and frozen (immutable) models: safe to share between threads.
"""

from __future__ import annotations

from controller_manager.config.common import (
    DEFAULT_ETCD,
    DEFAULT_PROXY,
    DEFAULT_RECONCILE_TIMEOUT,
    KNOWN_CONTROLLERS,
    MAX_WORKERS,
    derived_reconcile_timeout,
)
from controller_manager.config.external import (
    ExecSection,
    ExternalSection,
    HttpGetSection,
    HttpHeaderSection,
    LivenessProbeSection,
    ShardResourceSection,
)
from controller_manager.config.loading import load_config, with_overrides
from controller_manager.config.models import ControllerSection, ManagerConfig, WatchdogSection
from controller_manager.config.reference import config_reference_markdown
from controller_manager.config.sections import EtcdSection, MetricsSection, ProxySection

__all__ = [
    "DEFAULT_ETCD",
    "DEFAULT_PROXY",
    "DEFAULT_RECONCILE_TIMEOUT",
    "KNOWN_CONTROLLERS",
    "MAX_WORKERS",
    "ControllerSection",
    "EtcdSection",
    "ExecSection",
    "ExternalSection",
    "HttpGetSection",
    "HttpHeaderSection",
    "LivenessProbeSection",
    "ManagerConfig",
    "MetricsSection",
    "ProxySection",
    "ShardResourceSection",
    "WatchdogSection",
    "config_reference_markdown",
    "derived_reconcile_timeout",
    "load_config",
    "with_overrides",
]
