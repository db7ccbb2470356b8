"""``rangeshard deploy``: manifests derived from a manager config, for the cluster path (``deploy/``).

Purpose
    ``deploy rbac --config FILE`` prints the range filter proxy's read access
    for the resources the config's controllers read through it: a ClusterRole
    with ``list`` and ``watch`` on exactly those resources, one rule per API
    group, and a ClusterRoleBinding of it to the proxy's ServiceAccount. The
    resources are each external entry's ``shard[].resource`` and each
    in-process controller's main, dependent and chained resources (its class's
    ``main``, ``dependents`` and ``chained``: ``replicaset`` reads ReplicaSets
    and pods, ``deployment`` Deployments, ReplicaSets and, two levels down,
    pods), plus the ``via`` kinds of a ``root`` rule (the proxy caches them
    to place the objects and reads an owner of a write by name when it
    fences it), plus ``--unsharded`` ones
    (resources a controller lists or watches through the proxy without a
    shard, e.g. kopf's watch of CustomResourceDefinitions). The proxy serves
    every list and watch of them from a cache it fills with its *own*
    credentials, so it needs exactly these two verbs; it never reads a single
    object or writes with its own identity under ``--auth-mode delegate``
    (pass-through carries the caller's token), so the write RBAC belongs to
    the controllers' ServiceAccounts, not here.

    An external entry whose ``command`` runs kopf without
    ``--unsharded customresourcedefinitions.apiextensions.k8s.io`` gets a
    warning on stderr: kopf lists and watches the CRDs through the proxy, which
    would answer 403 and leave kopf retrying forever.

Invariants
    * Least privilege: only ``list`` and ``watch``, only the named resources,
      no wildcards, no subresources, no ``resourceNames``.
    * Deterministic output (groups and resources sorted, core group first), so
      a checked-in file can be compared with a fresh run (``tests/deploy``).
    * A bad config exits 2 with one ``FILE: field: problem`` line per problem,
      as ``controller-manager --config`` does (the same loader); the config's
      controller classes are imported to read their resources.
    * Without ``--namespace`` the binding's subject has no namespace: the
      output is meant for a kustomization, whose ``namespace:`` fills it in.

Concurrency model
    Main thread; pure apart from reading the file and importing the
    controller classes it names.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from hashing.resources import parse_resource_name
from rangeshard.cli.common import fail
from rangeshard.core.errors import ConfigError, RangeshardError

log = logging.getLogger(__name__)

app = typer.Typer(help="Manifests derived from a manager config (deploy/README.md).", no_args_is_help=True)


@app.callback()
def deploy() -> None:
    """Manifests derived from a manager config, for the cluster path (deploy/README.md)."""


#: What the proxy's own identity does with a cached resource (range_filter_proxy.upstream: list, watch).
PROXY_VERBS = ("list", "watch")
#: The proxy's ServiceAccount in deploy/base.
PROXY_SERVICE_ACCOUNT = "rangeshard-proxy"
_LABELS = {"app.kubernetes.io/name": "rangeshard", "app.kubernetes.io/component": "proxy"}

GroupResource = tuple[str, str]
"""``(api group, plural)``; the core group is ``""``."""

_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _group_resource(spec: str) -> GroupResource:
    resource, _version, group = parse_resource_name(spec)
    return group, resource


def config_resources(path: Path) -> dict[str, set[GroupResource]]:
    """The resources each controller of the config at ``path`` reads through the proxy, by controller type.

    Raises :class:`ConfigError` (``FILE: field: problem`` lines) for a bad config.
    """
    from controller_manager.config import load_config  # noqa: PLC0415 (the manager only when asked)
    from controller_manager.plugins import controller_type, resolve_controllers  # noqa: PLC0415

    cfg = load_config(path)
    classes = resolve_controllers(cfg.controllers, path)
    found: dict[str, set[GroupResource]] = {}
    for name, section in cfg.controllers.items():
        if section.external is not None:
            shard = section.external.shard
            found[name] = {_group_resource(spec) for s in shard for spec in (s.resource, *s.via)}
        else:
            cls = classes[name]
            reads = [(r.group, r.name) for r in (cls.main, *cls.dependents, *(r for r, _via in cls.chained))]
            vias = [_group_resource(spec) for _r, via in cls.chained for spec in via]
            found[controller_type(name, cls)] = {*reads, *vias}
    return found  # never empty: the loader requires at least one controller


#: What kopf lists and watches besides its handlers' resources (to notice new resources).
CRDS: GroupResource = ("apiextensions.k8s.io", "customresourcedefinitions")


def runs_kopf(command: Sequence[str]) -> bool:
    """Whether an external entry's ``command`` runs kopf (``kopf run``, ``python -m kopf``, ``sh -c 'kopf ...'``)."""
    words = [w for arg in command for w in arg.split()]
    for i, word in enumerate(words):
        if Path(word).name == "kopf" or (word == "-m" and i + 1 < len(words) and words[i + 1] == "kopf"):
            return True
    return False


def kopf_types(path: Path) -> list[str]:
    """The controller types of the config whose external ``command`` runs kopf."""
    from controller_manager.config import load_config  # noqa: PLC0415

    cfg = load_config(path)
    return sorted(
        name
        for name, section in cfg.controllers.items()
        if section.external is not None and runs_kopf(section.external.command or [])
    )


def parse_unsharded(values: Iterable[str]) -> set[GroupResource]:
    """``--unsharded`` values (``customresourcedefinitions.apiextensions.k8s.io``, ``pods``); ConfigError if bad."""
    out: set[GroupResource] = set()
    problems: list[str] = []
    for value in values:
        for item in value.split(","):
            text = item.strip()
            if not _RESOURCE_RE.match(text):
                problems.append(f"--unsharded: {item!r}: not a resource name (plural or plural.group, lowercase)")
            else:
                out.add(_group_resource(text))
    if problems:
        raise ConfigError("invalid --unsharded", problems)
    return out


def rules(resources: Iterable[GroupResource]) -> list[dict[str, Any]]:
    """One rule per API group (core first, then by name), its resources sorted, verbs :data:`PROXY_VERBS`."""
    by_group: dict[str, set[str]] = {}
    for group, resource in resources:
        by_group.setdefault(group, set()).add(resource)
    return [
        {"apiGroups": [group], "resources": sorted(by_group[group]), "verbs": list(PROXY_VERBS)}
        for group in sorted(by_group)
    ]


def default_name(controller_types: Iterable[str]) -> str:
    """``rangeshard-proxy-<types>``: distinct per config, since controller types are distinct per registry."""
    return "rangeshard-proxy-" + "-".join(sorted(controller_types))


def proxy_rbac(
    resources: Iterable[GroupResource], name: str, namespace: str | None, service_account: str = PROXY_SERVICE_ACCOUNT
) -> list[dict[str, Any]]:
    """The ClusterRole and ClusterRoleBinding (as dicts) granting the proxy's reads of ``resources``."""
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": service_account}
    if namespace is not None:
        subject["namespace"] = namespace
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": dict(_LABELS)},
        "rules": rules(resources),
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(_LABELS)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject],
    }
    return [role, binding]


def _names(resources: Iterable[GroupResource]) -> str:
    return ", ".join(f"{r}.{g}" if g else r for g, r in sorted(resources))


def render(
    docs: Sequence[dict[str, Any]],
    command: str,
    controllers: dict[str, set[GroupResource]],
    unsharded: set[GroupResource] | None = None,
) -> str:
    """The YAML text: a header naming the command that made it and what each controller reads, then ``docs``."""
    header = [
        "# The range filter proxy's read access: it serves every list and watch of these resources from a",
        "# cache it fills with its own credentials (list + watch, cluster-wide; every object in memory).",
        f"# Generated by: {command}",
        "# Do not edit; run the command again after changing the config.",
    ]
    header += [f"#   {name}: {_names(controllers[name])}" for name in sorted(controllers)]
    if unsharded:
        header.append(f"#   unsharded: {_names(unsharded)}")
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, width=120) for d in docs)
    return "\n".join(header) + "\n" + body


@app.command("rbac")
def rbac_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Manager config file (YAML).")],
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Namespace of the proxy's ServiceAccount. Default: none in the output, for a kustomization "
            "whose `namespace:` sets it.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Name of the ClusterRole and its binding (default rangeshard-proxy-<controller types>).",
            show_default=False,
        ),
    ] = None,
    service_account: Annotated[
        str, typer.Option("--service-account", help="The proxy's ServiceAccount.")
    ] = PROXY_SERVICE_ACCOUNT,
    unsharded: Annotated[
        list[str] | None,
        typer.Option(
            "--unsharded",
            help="Also a resource the controllers list or watch through the proxy without a shard "
            "(plural[.group], repeatable or comma-separated), e.g. customresourcedefinitions.apiextensions.k8s.io "
            "for kopf: the proxy caches it too.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print the proxy's least-privilege read RBAC for the resources of a manager config (YAML on stdout).

    A ClusterRole with list and watch on each resource the config's controllers
    read through the proxy (external entries' shard resources, in-process
    controllers' main and dependent resources), and its ClusterRoleBinding to
    the proxy's ServiceAccount. Writes are not the proxy's: they pass through
    with the controller's own token (--auth-mode delegate).
    """
    try:
        found = config_resources(config)
        extra = parse_unsharded(unsharded or [])
        kopf = kopf_types(config)
    except RangeshardError as e:
        fail(e)
    if kopf and CRDS not in extra and not any(CRDS in r for r in found.values()):
        verb = "runs" if len(kopf) == 1 else "run"
        typer.echo(
            f"warning: {', '.join(kopf)} {verb} kopf, which lists and watches customresourcedefinitions"
            ".apiextensions.k8s.io through the proxy: without read access the proxy answers 403 and kopf "
            "retries forever; add --unsharded customresourcedefinitions.apiextensions.k8s.io "
            "(and give the operator's own role get/list/watch on them)",
            err=True,
        )
    resources = set().union(*found.values()) | extra
    role_name = name or default_name(found)
    docs = proxy_rbac(resources, role_name, namespace, service_account)
    log.debug("proxy RBAC %s: %d resources", role_name, len(resources))
    command = command_line(config, namespace, name, service_account, unsharded)
    typer.echo(render(docs, command, found, extra), nl=False)


def command_line(
    config: Path, namespace: str | None, name: str | None, service_account: str, unsharded: list[str] | None
) -> str:
    """The command that makes this output, for the header (the options as given, in a fixed order)."""
    args = ["rangeshard", "deploy", "rbac", "--config", str(config)]
    if namespace is not None:
        args += ["--namespace", namespace]
    if name is not None:
        args += ["--name", name]
    if service_account != PROXY_SERVICE_ACCOUNT:
        args += ["--service-account", service_account]
    for value in unsharded or []:
        args += ["--unsharded", value]
    return shlex.join(args)
